package allocator

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// Granted is a lease just granted, and its proxy.
type Granted struct {
	Grant  *lease.Grant
	Member catalog.Member
}

// Acquisition is one acquire request, validated.
type Acquisition struct {
	Req              *apiv1.AcquireRequest
	Namespace, Fleet string
	TTL, Wait        time.Duration
	ID               *auth.Identity
	Policy           *catalog.Policy
	// Exclude are proxies not to grant (the gateway moving a session off
	// a failed upstream).
	Exclude map[string]bool
	// Seat is a gateway seat, leased for many callers: no caller's quota
	// counts it (each of its connections does), and the Caller whose
	// connection asked for it is charged its place among the waiting.
	Seat   bool
	Caller *auth.Identity
	// Only, for the gateway's rotation, is the one proxy to take a seat
	// on: a refusal is no demand (the gateway tries another proxy).
	Only string
}

// PacingOf is the pacing of g's proxy for domain, as this replica paces
// it, or nil when the fleet paces none for it.
func (s *Allocator) PacingOf(ctx context.Context, g *Granted, domain string) *apiv1.LeasePacing {
	if domain == "" {
		return nil
	}
	p, err := s.Catalog.Policy(ctx, g.Grant.Namespace, g.Grant.Fleet)
	if err != nil {
		return nil
	}
	rule := p.PacingFor(domain)
	if rule == nil {
		return nil
	}
	// The fleet's rule, which a crawler on leases keeps to itself; the
	// next use as this replica's share of it paces the gateway's.
	share := s.PacingFor(ctx, g.Grant.Namespace, g.Grant.Fleet, p, domain)
	next := s.pace.next(PaceKey(g.Grant.Namespace+"/"+g.Grant.Fleet, share, IPOf(&g.Member)), share, s.Now())
	return &apiv1.LeasePacing{IntervalSeconds: rule.Interval.Seconds(), Burst: rule.Burst, NextUseAt: next}
}

// GrantFor grants a validated acquisition: the API's and the gateway's
// leases go through the same quota, admission and waiting.
func (s *Allocator) GrantFor(ctx context.Context, a *Acquisition) (*Granted, error) {
	id := a.ID
	done := func(string) {}
	var err error
	if !a.Seat {
		if done, err = s.Reserve(ctx, a.Namespace, a.Fleet, id, a.Policy); err != nil {
			return nil, err
		}
	}
	var g *Granted
	defer func() {
		if g != nil {
			done(g.Grant.ID)
			return
		}
		done("")
	}()
	key := queueKey(a.Namespace, a.Fleet, a.Req.Zone, a.Req.Domain)
	// Acquisitions waiting on this replica for the same proxies go
	// first: one that may not wait finds no slot while they do.
	if s.queues.depth(key) > 0 {
		err = s.noFreeSlot(ctx, a, -1, nil)
	} else {
		g, err = s.tryAcquire(ctx, a, false)
	}
	if err != nil && Refusal(err) && a.Wait > 0 {
		// Waiting, it tries only slots its cache shows free, so that a
		// full fleet costs no write per retry.
		waiter := id.User
		if a.Caller != nil {
			waiter = a.Caller.User
		}
		g, err = s.wait(ctx, key, waiter, a.Wait, func() (*Granted, error) { return s.tryAcquire(ctx, a, true) }, err)
	}
	if err != nil && Refusal(err) && a.Policy.Autoscaled && a.Policy.Serves(a.Req.Zone) && a.Only == "" {
		crawler := id
		if a.Caller != nil {
			crawler = a.Caller
		}
		quota, _, _ := QuotaOf(a.Policy.Quotas, crawler)
		s.refused.record(a.Namespace+"/"+a.Fleet, crawler.User, a.Req.Holder, quota, s.Now())
	}
	return g, err
}

// AcquisitionOf authorises an acquisition of a fleet and reads its policy.
func (s *Allocator) AcquisitionOf(ctx context.Context, req *apiv1.AcquireRequest, ns, name string, id *auth.Identity) (*Acquisition, error) {
	if err := s.AuthorizeFleet(ctx, id, ns, name); err != nil {
		return nil, err
	}
	p, err := s.Catalog.Policy(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	a := &Acquisition{Req: req, Namespace: ns, Fleet: name, ID: id, Policy: p}
	if a.TTL, err = ParseTTL("ttl", req.TTL, p.DefaultTTL, p.MaxTTL); err != nil {
		return nil, err
	}
	if a.Wait, err = ParseDuration("maxWait", req.MaxWait, p.MaxWait, 0, p.MaxWait, "the fleet's spec.leases.admission.maxWait"); err != nil {
		return nil, err
	}
	return a, nil
}

// Acquisition in a large fleet ranks a sample of it: at 10 000 proxies
// with 10 000 leases, ranking all of them cost discovery 35 ms of CPU per
// try. A fleet of more than SampleFrom proxies is ranked on up to
// SampleSize of its admissible ones, drawn at random (and the sticky
// key's last proxy), and only their slots are read; only when none of
// those has a free slot is the whole fleet ranked, so that a lease is
// refused only when no proxy of the fleet has a slot.
const (
	SampleSize = 32
	SampleFrom = 4 * SampleSize
)

// tryAcquire takes a slot on the best proxy of the fleet, now: the sticky
// key's last proxy first, then the least loaded. It is refused while the
// fleet is below its minimum healthy share, and when no slot is free.
func (s *Allocator) tryAcquire(ctx context.Context, a *Acquisition, freeOnly bool) (*Granted, error) {
	f, err := s.Catalog.Members(ctx, a.Namespace, a.Fleet)
	if err != nil {
		return nil, err
	}
	if len(f.Items) == 0 {
		if !a.Policy.Autoscaled {
			return nil, problem.ErrFleetNotFound
		}
		// An autoscaled fleet at zero: no slot yet, so the acquisition
		// waits (and counts as demand) while the fleet wakes.
	}
	if frac := membersHealthyFraction(f, a.Policy); frac < a.Policy.MinHealthyFraction {
		return nil, tooFewHealthy(a.Namespace, a.Fleet, frac, a.Policy)
	}
	admit, err := s.Admits(ctx, f.Items, a.Req.Zone, a.Exclude, a.Req.Domain)
	if err != nil {
		return nil, err
	}
	if a.Req.Zone != "" && f.Zones[a.Req.Zone] == 0 {
		// No proxy of the fleet is in the zone: nothing to rank.
		return nil, s.noFreeSlot(ctx, a, 0, map[string][]*coordLease{})
	}
	req := lease.Request{Identity: a.ID.User, Holder: a.Req.Holder, TTL: a.TTL, StickyKey: a.Req.StickyKey, FreeOnly: freeOnly}
	if a.Only != "" {
		return s.acquireOnly(ctx, a, f, admit, req)
	}
	if len(f.Items) > SampleFrom {
		g, err := s.acquireSampled(ctx, a, f, admit, req)
		if g != nil || err != nil && !errors.Is(err, lease.ErrUnavailable) {
			if g != nil {
				s.Metrics.Rankings.WithLabelValues("sample").Inc()
			}
			return g, err
		}
	}
	s.Metrics.Rankings.WithLabelValues("fleet").Inc()
	// One read of the fleet's slots ranks the proxies, finds the sticky
	// key's last one and orders each proxy's slots.
	view, err := s.Leases.View(ctx, a.Namespace, a.Fleet)
	if err != nil {
		return nil, err
	}
	var all []*catalog.Member
	for i := range f.Items {
		if admit(&f.Items[i]) {
			all = append(all, &f.Items[i])
		}
	}
	g, err := s.acquireAmong(ctx, a, f, all, view, s.Leases.StickyIn(view, a.Namespace, a.Fleet, a.Req.StickyKey), req)
	if errors.Is(err, lease.ErrUnavailable) {
		return nil, s.noFreeSlot(ctx, a, len(all), view.Live)
	}
	return g, err
}

// acquireOnly takes a slot on the acquisition's one proxy (a.only), which
// the gateway's rotation chose: refused when it does not serve the
// acquisition or has no free slot.
func (s *Allocator) acquireOnly(ctx context.Context, a *Acquisition, f *catalog.Members, admit func(*catalog.Member) bool, req lease.Request) (*Granted, error) {
	m := catalog.MemberNamed(f.Items, a.Only)
	if m == nil || !admit(m) {
		return nil, s.noFreeSlot(ctx, a, 0, map[string][]*coordLease{})
	}
	view, err := s.Leases.ViewOf(ctx, a.Namespace, a.Fleet, []string{m.Name})
	if err != nil {
		return nil, err
	}
	// Only the slots the cache shows free: a full proxy costs no write,
	// and the gateway tries another.
	req.SkipHeld = true
	g, err := s.acquireAmong(ctx, a, f, []*catalog.Member{m}, view, "", req)
	if errors.Is(err, lease.ErrUnavailable) {
		return nil, s.noFreeSlot(ctx, a, 1, view.Live)
	}
	return g, err
}

// acquireSampled tries a random sample of a large fleet's admissible
// proxies, their free slots only: ErrUnavailable when none is free (or
// the sample was the whole fleet's admissible proxies, all taken), and
// the caller ranks the whole fleet.
func (s *Allocator) acquireSampled(ctx context.Context, a *Acquisition, f *catalog.Members, admit func(*catalog.Member) bool, req lease.Request) (*Granted, error) {
	var pick []*catalog.Member
	sticky := ""
	if a.Req.StickyKey != "" {
		name, err := s.Leases.Sticky(ctx, a.Namespace, a.Fleet, a.Req.StickyKey)
		if err != nil {
			return nil, err
		}
		if m := catalog.MemberNamed(f.Items, name); m != nil && admit(m) {
			pick, sticky = append(pick, m), name
		}
	}
	// Proxies leaving from an egress IP of their own first, as the whole
	// fleet's ranking puts them: the sample is drawn from them, and from
	// the others only when they are too few. At most MaxDraws are looked
	// at: a request few proxies admit (a domain most are banned for) goes
	// to the whole fleet's ranking rather than walk it here.
	budget := MaxDraws
	limit := len(pick) + SampleSize
	for _, idx := range [][]int32{f.Own, f.Shared} {
		pick = Draw(f.Items, idx, pick, limit, &budget, func(m *catalog.Member) bool { return m.Name != sticky && admit(m) })
	}
	if len(pick) == 0 {
		return nil, lease.ErrUnavailable
	}
	names := make([]string, len(pick))
	for i, m := range pick {
		names[i] = m.Name
	}
	view, err := s.Leases.ViewOf(ctx, a.Namespace, a.Fleet, names)
	if err != nil {
		return nil, err
	}
	// Of the slots the cache shows held, only the sticky proxy's: the
	// others are tried by the whole fleet's ranking, which a sample with
	// none free falls back to.
	req.SkipHeld = true
	return s.acquireAmong(ctx, a, f, pick, view, sticky, req)
}

// MaxDraws bounds the members one sampled try looks at.
const MaxDraws = 8 * SampleSize

// Draw appends to pick, until it holds limit, members of ms at idx that
// keep takes, in random order: a permutation drawn lazily (Fisher-Yates,
// the swaps kept in a map), uniform and costing what is drawn, not the
// fleet. Each member looked at spends one of budget.
func Draw(ms []catalog.Member, idx []int32, pick []*catalog.Member, limit int, budget *int, keep func(*catalog.Member) bool) []*catalog.Member {
	n := len(idx)
	moved := map[int]int32{}
	at := func(i int) int32 {
		if v, ok := moved[i]; ok {
			return v
		}
		return idx[i]
	}
	for i := 0; i < n && len(pick) < limit && *budget > 0; i++ {
		*budget--
		j := i + rand.IntN(n-i)
		vi, vj := at(i), at(j)
		moved[j] = vi
		if m := &ms[vj]; keep(m) {
			pick = append(pick, m)
		}
	}
	return pick
}

// acquireAmong takes a slot on the best of cands, as view shows their
// slots: the sticky key's last proxy first, then those leaving from an
// egress IP of their own (within the fleet's diversity caps), then those
// of the network (IPv4 /24, IPv6 /64) with the fewest leases among cands,
// since a target counts a network as one client, then, of equals, those
// whose IP has no ban in its history within RecentBans (a tie-break, so
// that a fleet whose addresses mostly have one does not pile onto the few
// clean ones), then the least loaded.
func (s *Allocator) acquireAmong(ctx context.Context, a *Acquisition, f *catalog.Members, cands []*catalog.Member, view *lease.SlotView, sticky string, req lease.Request) (*Granted, error) {
	// Equally loaded proxies in random order, so that concurrent crawlers
	// (and replicas) spread out instead of racing for the same slot. Each
	// proxy's rank is worked out once, and the small ranks are sorted, not
	// the large members. Proxies sharing an egress IP are one client to a
	// target: those leaving from an IP of their own come first.
	type rank struct {
		m                       *catalog.Member
		sticky, shared, tainted bool
		network                 int
		load                    float64
	}
	var tainted map[string]bool
	if len(cands) > 1 {
		var err error
		if tainted, err = s.Tainted(ctx, a.Namespace, a.Fleet); err != nil {
			return nil, err
		}
	}
	rs := make([]rank, len(cands))
	perNetwork := make(map[string]int, len(cands))
	for _, m := range cands {
		perNetwork[m.NetworkKey()] += len(view.Live[m.Name])
	}
	for i, m := range cands {
		rs[i] = rank{m: m, sticky: m.Name == sticky, shared: f.Crowded(m), tainted: len(tainted) > 0 && tainted[m.CanonicalIP()], network: perNetwork[m.NetworkKey()], load: float64(len(view.Live[m.Name])) / float64(m.MaxLeases)}
	}
	rand.Shuffle(len(rs), func(i, j int) { rs[i], rs[j] = rs[j], rs[i] })
	sort.SliceStable(rs, func(i, j int) bool {
		if rs[i].sticky != rs[j].sticky {
			return rs[i].sticky
		}
		if rs[i].shared != rs[j].shared {
			return !rs[i].shared
		}
		if rs[i].network != rs[j].network {
			return rs[i].network < rs[j].network
		}
		if rs[i].tainted != rs[j].tainted {
			return !rs[i].tainted
		}
		return rs[i].load < rs[j].load
	})
	lcs := make([]lease.Candidate, 0, len(rs))
	for _, r := range rs {
		lcs = append(lcs, lease.Candidate{Namespace: a.Namespace, Fleet: a.Fleet, Proxy: r.m.Name, MaxLeases: r.m.MaxLeases, Sticky: r.sticky})
	}
	g, err := s.Leases.AcquireIn(ctx, view, lcs, req)
	if err != nil {
		return nil, err
	}
	for _, r := range rs {
		if r.m.Name == g.Proxy {
			return &Granted{Grant: g, Member: *r.m}, nil
		}
	}
	return nil, &problem.Error{Code: problem.StatusInternalServerError, Reason: apiv1.ReasonInternal, Msg: "granted a lease on a proxy that was no candidate: a bug, please report it"}
}

// noFreeSlot is the refusal when every healthy proxy is taken (healthy < 0:
// when others wait already), with a Retry-After of the soonest expiry of
// the fleet's live slots (read when nil).
func (s *Allocator) noFreeSlot(ctx context.Context, a *Acquisition, healthy int, live map[string][]*coordLease) error {
	retry := 5
	if live == nil {
		if slots, err := s.Leases.Slots(ctx, a.Namespace, a.Fleet); err == nil {
			live = slots
		}
	}
	if live != nil {
		retry = s.retryAfter(live)
	}
	msg := fmt.Sprintf("no healthy proxy of %s/%s has a free slot (%d healthy, none with fewer than maxLeases holders); retry in %ds", a.Namespace, a.Fleet, healthy, retry)
	if healthy < 0 {
		msg = fmt.Sprintf("acquisitions of %s/%s are waiting for a slot already, and this one may not wait (maxWait 0); retry in %ds", a.Namespace, a.Fleet, retry)
	}
	return &problem.Error{Code: problem.StatusConflict, Reason: apiv1.ReasonNoFreeSlot, RetryAfter: retry, Msg: msg}
}

// retryAfter suggests when a slot is likely free: the soonest expiry.
func (s *Allocator) retryAfter(slots map[string][]*coordLease) int {
	soonest := math.MaxFloat64
	for _, ls := range slots {
		for _, l := range ls {
			soonest = min(soonest, lease.ExpiresAt(l).Sub(s.Now()).Seconds())
		}
	}
	if soonest == math.MaxFloat64 || soonest < 1 {
		return 5
	}
	return int(math.Ceil(min(soonest, 60)))
}

// DrainedTTL bounds the renewal of a lease of a proxy being replaced since
// since: only up to the drain start plus maxTTL, so that one crawler
// renewing forever cannot hold the rollout up; past it, the lease is not
// renewed.
func (s *Allocator) DrainedTTL(proxy string, since time.Time, maxTTL, ttl time.Duration) (time.Duration, error) {
	// A start in the future (a skewed clock, an edited label) counts as
	// now: it never extends a lease past now plus maxTTL.
	if now := s.Now(); since.After(now) {
		since = now
	}
	left := since.Add(maxTTL).Sub(s.Now()).Truncate(time.Second)
	if left < time.Second {
		return 0, &problem.Error{Code: problem.StatusConflict, Reason: apiv1.ReasonDraining,
			Msg: fmt.Sprintf("proxy %s is being replaced since %s and its leases are no longer renewed: release this lease and take a new one", proxy, since.Format(time.RFC3339))}
	}
	return min(ttl, left), nil
}
