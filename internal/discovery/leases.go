package discovery

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"sort"
	"time"

	"github.com/pkg/errors"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// granted is a lease just granted, and its proxy.
type granted struct {
	g *lease.Grant
	m catalog.Member
}

// acquisition is one acquire request, validated.
type acquisition struct {
	req       *apiv1.AcquireRequest
	ns, fleet string
	ttl, wait time.Duration
	id        *auth.Identity
	policy    *catalog.Policy
	// exclude are proxies not to grant (the gateway moving a session off
	// a failed upstream).
	exclude map[string]bool
	// seat is a gateway seat, leased for many callers: no caller's quota
	// counts it (each of its connections does), and the caller whose
	// connection asked for it is charged its place among the waiting.
	seat   bool
	caller *auth.Identity
	// only, for the gateway's rotation, is the one proxy to take a seat
	// on: a refusal is no demand (the gateway tries another proxy).
	only string
}

func (s *Server) acquire(w http.ResponseWriter, r *http.Request, id *auth.Identity) error {
	start := time.Now()
	g, domain, err := s.grant(r, id)
	if err != nil {
		s.Metrics.Denials.WithLabelValues(problem.ReasonOf(err)).Inc()
		return err
	}
	u, err := s.Catalog.ProxyURL(r.Context(), g.m)
	if err != nil {
		// Given back at once, not left to its TTL; counted against the
		// quota until it is.
		if s.Leases.Release(context.WithoutCancel(r.Context()), g.g.ID, id.User) == nil {
			s.released(g.g.Namespace, g.g.Fleet, id.User, g.g.ID)
		}
		s.Metrics.Denials.WithLabelValues(problem.ReasonOf(err)).Inc()
		return err
	}
	s.Metrics.Acquisitions.Inc()
	s.Metrics.AcquireLatency.Observe(time.Since(start).Seconds())
	problem.WriteJSON(w, http.StatusCreated, apiv1.Lease{LeaseID: g.g.ID, Proxy: g.g.Proxy, ProxyURL: u, ExpiresAt: g.g.ExpiresAt, TTLSeconds: int64(g.g.TTL / time.Second),
		Pacing: s.pacingOf(r.Context(), g, domain)})
	return nil
}

// pacingOf is the pacing of g's proxy for domain, as this replica paces
// it, or nil when the fleet paces none for it.
func (s *Server) pacingOf(ctx context.Context, g *granted, domain string) *apiv1.LeasePacing {
	if domain == "" {
		return nil
	}
	p, err := s.Catalog.Policy(ctx, g.g.Namespace, g.g.Fleet)
	if err != nil {
		return nil
	}
	rule := p.PacingFor(domain)
	if rule == nil {
		return nil
	}
	next := s.pace.next(paceKey(g.g.Namespace+"/"+g.g.Fleet, rule, ipOf(&g.m)), rule, s.now())
	return &apiv1.LeasePacing{IntervalSeconds: rule.Interval.Seconds(), Burst: rule.Burst, NextUseAt: next}
}

// grant validates an acquisition, counts it against the caller's quota,
// and takes a slot, waiting for one if the fleet and the request allow.
func (s *Server) grant(r *http.Request, id *auth.Identity) (*granted, string, error) {
	a, err := s.decodeAcquisition(r, id)
	if err != nil {
		return nil, "", err
	}
	g, err := s.grantFor(r.Context(), a)
	return g, a.req.Domain, err
}

// grantFor grants a validated acquisition: the API's and the gateway's
// leases go through the same quota, admission and waiting.
func (s *Server) grantFor(ctx context.Context, a *acquisition) (*granted, error) {
	id := a.id
	done := func(string) {}
	var err error
	if !a.seat {
		if done, err = s.reserve(ctx, a.ns, a.fleet, id, a.policy); err != nil {
			return nil, err
		}
	}
	var g *granted
	defer func() {
		if g != nil {
			done(g.g.ID)
			return
		}
		done("")
	}()
	key := queueKey(a.ns, a.fleet, a.req.Zone, a.req.Domain)
	// Acquisitions waiting on this replica for the same proxies go
	// first: one that may not wait finds no slot while they do.
	if s.queues.depth(key) > 0 {
		err = s.noFreeSlot(ctx, a, -1, nil)
	} else {
		g, err = s.tryAcquire(ctx, a, false)
	}
	if err != nil && refusal(err) && a.wait > 0 {
		// Waiting, it tries only slots its cache shows free, so that a
		// full fleet costs no write per retry.
		waiter := id.User
		if a.caller != nil {
			waiter = a.caller.User
		}
		g, err = s.wait(ctx, key, waiter, a.wait, func() (*granted, error) { return s.tryAcquire(ctx, a, true) }, err)
	}
	if err != nil && refusal(err) && a.policy.Autoscaled && a.policy.Serves(a.req.Zone) && a.only == "" {
		crawler := id
		if a.caller != nil {
			crawler = a.caller
		}
		quota, _, _ := quotaOf(a.policy.Quotas, crawler)
		s.refused.record(a.ns+"/"+a.fleet, crawler.User, a.req.Holder, quota, s.now())
	}
	return g, err
}

// decodeAcquisition reads an acquire request and the fleet's policy.
func (s *Server) decodeAcquisition(r *http.Request, id *auth.Identity) (*acquisition, error) {
	req, ns, name, err := DecodeAcquire(r)
	if err != nil {
		return nil, err
	}
	return s.acquisitionOf(r.Context(), req, ns, name, id)
}

// acquisitionOf authorises an acquisition of a fleet and reads its policy.
func (s *Server) acquisitionOf(ctx context.Context, req *apiv1.AcquireRequest, ns, name string, id *auth.Identity) (*acquisition, error) {
	if err := s.authorizeFleet(ctx, id, ns, name); err != nil {
		return nil, err
	}
	p, err := s.Catalog.Policy(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	a := &acquisition{req: req, ns: ns, fleet: name, id: id, policy: p}
	if a.ttl, err = parseTTL("ttl", req.TTL, p.DefaultTTL, p.MaxTTL); err != nil {
		return nil, err
	}
	if a.wait, err = parseDuration("maxWait", req.MaxWait, p.MaxWait, 0, p.MaxWait, "the fleet's spec.leases.admission.maxWait"); err != nil {
		return nil, err
	}
	return a, nil
}

// Acquisition in a large fleet ranks a sample of it: at 10 000 proxies
// with 10 000 leases, ranking all of them cost discovery 35 ms of CPU per
// try. A fleet of more than sampleFrom proxies is ranked on up to
// sampleSize of its admissible ones, drawn at random (and the sticky
// key's last proxy), and only their slots are read; only when none of
// those has a free slot is the whole fleet ranked, so that a lease is
// refused only when no proxy of the fleet has a slot.
const (
	sampleSize = 32
	sampleFrom = 4 * sampleSize
)

// tryAcquire takes a slot on the best proxy of the fleet, now: the sticky
// key's last proxy first, then the least loaded. It is refused while the
// fleet is below its minimum healthy share, and when no slot is free.
func (s *Server) tryAcquire(ctx context.Context, a *acquisition, freeOnly bool) (*granted, error) {
	f, err := s.Catalog.Members(ctx, a.ns, a.fleet)
	if err != nil {
		return nil, err
	}
	if len(f.Items) == 0 {
		if !a.policy.Autoscaled {
			return nil, problem.ErrFleetNotFound
		}
		// An autoscaled fleet at zero: no slot yet, so the acquisition
		// waits (and counts as demand) while the fleet wakes.
	}
	if frac := membersHealthyFraction(f, a.policy); frac < a.policy.MinHealthyFraction {
		return nil, tooFewHealthy(a.ns, a.fleet, frac, a.policy)
	}
	admit, err := s.admits(ctx, f.Items, a.req.Zone, a.exclude, a.req.Domain)
	if err != nil {
		return nil, err
	}
	if a.req.Zone != "" && f.Zones[a.req.Zone] == 0 {
		// No proxy of the fleet is in the zone: nothing to rank.
		return nil, s.noFreeSlot(ctx, a, 0, map[string][]*coordLease{})
	}
	req := lease.Request{Identity: a.id.User, Holder: a.req.Holder, TTL: a.ttl, StickyKey: a.req.StickyKey, FreeOnly: freeOnly}
	if a.only != "" {
		return s.acquireOnly(ctx, a, f, admit, req)
	}
	if len(f.Items) > sampleFrom {
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
	view, err := s.Leases.View(ctx, a.ns, a.fleet)
	if err != nil {
		return nil, err
	}
	var all []*catalog.Member
	for i := range f.Items {
		if admit(&f.Items[i]) {
			all = append(all, &f.Items[i])
		}
	}
	g, err := s.acquireAmong(ctx, a, f, all, view, s.Leases.StickyIn(view, a.ns, a.fleet, a.req.StickyKey), req)
	if errors.Is(err, lease.ErrUnavailable) {
		return nil, s.noFreeSlot(ctx, a, len(all), view.Live)
	}
	return g, err
}

// acquireOnly takes a slot on the acquisition's one proxy (a.only), which
// the gateway's rotation chose: refused when it does not serve the
// acquisition or has no free slot.
func (s *Server) acquireOnly(ctx context.Context, a *acquisition, f *catalog.Members, admit func(*catalog.Member) bool, req lease.Request) (*granted, error) {
	m := catalog.MemberNamed(f.Items, a.only)
	if m == nil || !admit(m) {
		return nil, s.noFreeSlot(ctx, a, 0, map[string][]*coordLease{})
	}
	view, err := s.Leases.ViewOf(ctx, a.ns, a.fleet, []string{m.Name})
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
func (s *Server) acquireSampled(ctx context.Context, a *acquisition, f *catalog.Members, admit func(*catalog.Member) bool, req lease.Request) (*granted, error) {
	var pick []*catalog.Member
	sticky := ""
	if a.req.StickyKey != "" {
		name, err := s.Leases.Sticky(ctx, a.ns, a.fleet, a.req.StickyKey)
		if err != nil {
			return nil, err
		}
		if m := catalog.MemberNamed(f.Items, name); m != nil && admit(m) {
			pick, sticky = append(pick, m), name
		}
	}
	// Proxies leaving from an egress IP of their own first, as the whole
	// fleet's ranking puts them: the sample is drawn from them, and from
	// the others only when they are too few. At most maxDraws are looked
	// at: a request few proxies admit (a domain most are banned for) goes
	// to the whole fleet's ranking rather than walk it here.
	budget := maxDraws
	limit := len(pick) + sampleSize
	for _, idx := range [][]int32{f.Own, f.Shared} {
		pick = draw(f.Items, idx, pick, limit, &budget, func(m *catalog.Member) bool { return m.Name != sticky && admit(m) })
	}
	if len(pick) == 0 {
		return nil, lease.ErrUnavailable
	}
	names := make([]string, len(pick))
	for i, m := range pick {
		names[i] = m.Name
	}
	view, err := s.Leases.ViewOf(ctx, a.ns, a.fleet, names)
	if err != nil {
		return nil, err
	}
	// Of the slots the cache shows held, only the sticky proxy's: the
	// others are tried by the whole fleet's ranking, which a sample with
	// none free falls back to.
	req.SkipHeld = true
	return s.acquireAmong(ctx, a, f, pick, view, sticky, req)
}

// maxDraws bounds the members one sampled try looks at.
const maxDraws = 8 * sampleSize

// draw appends to pick, until it holds limit, members of ms at idx that
// keep takes, in random order: a permutation drawn lazily (Fisher-Yates,
// the swaps kept in a map), uniform and costing what is drawn, not the
// fleet. Each member looked at spends one of budget.
func draw(ms []catalog.Member, idx []int32, pick []*catalog.Member, limit int, budget *int, keep func(*catalog.Member) bool) []*catalog.Member {
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
// egress IP of their own, then the least loaded.
func (s *Server) acquireAmong(ctx context.Context, a *acquisition, f *catalog.Members, cands []*catalog.Member, view *lease.SlotView, sticky string, req lease.Request) (*granted, error) {
	// Equally loaded proxies in random order, so that concurrent crawlers
	// (and replicas) spread out instead of racing for the same slot. Each
	// proxy's rank is worked out once, and the small ranks are sorted, not
	// the large members. Proxies sharing an egress IP are one client to a
	// target: those leaving from an IP of their own come first.
	type rank struct {
		m              *catalog.Member
		sticky, shared bool
		load           float64
	}
	rs := make([]rank, len(cands))
	for i, m := range cands {
		rs[i] = rank{m: m, sticky: m.Name == sticky, shared: f.PerIP[m.EgressIP] > 1, load: float64(len(view.Live[m.Name])) / float64(m.MaxLeases)}
	}
	rand.Shuffle(len(rs), func(i, j int) { rs[i], rs[j] = rs[j], rs[i] })
	sort.SliceStable(rs, func(i, j int) bool {
		if rs[i].sticky != rs[j].sticky {
			return rs[i].sticky
		}
		if rs[i].shared != rs[j].shared {
			return !rs[i].shared
		}
		return rs[i].load < rs[j].load
	})
	lcs := make([]lease.Candidate, 0, len(rs))
	for _, r := range rs {
		lcs = append(lcs, lease.Candidate{Namespace: a.ns, Fleet: a.fleet, Proxy: r.m.Name, MaxLeases: r.m.MaxLeases, Sticky: r.sticky})
	}
	g, err := s.Leases.AcquireIn(ctx, view, lcs, req)
	if err != nil {
		return nil, err
	}
	for _, r := range rs {
		if r.m.Name == g.Proxy {
			return &granted{g: g, m: *r.m}, nil
		}
	}
	return nil, &problem.Error{Code: http.StatusInternalServerError, Reason: apiv1.ReasonInternal, Msg: "granted a lease on a proxy that was no candidate: a bug, please report it"}
}

// noFreeSlot is the refusal when every healthy proxy is taken (healthy < 0:
// when others wait already), with a Retry-After of the soonest expiry of
// the fleet's live slots (read when nil).
func (s *Server) noFreeSlot(ctx context.Context, a *acquisition, healthy int, live map[string][]*coordLease) error {
	retry := 5
	if live == nil {
		if slots, err := s.Leases.Slots(ctx, a.ns, a.fleet); err == nil {
			live = slots
		}
	}
	if live != nil {
		retry = s.retryAfter(live)
	}
	msg := fmt.Sprintf("no healthy proxy of %s/%s has a free slot (%d healthy, none with fewer than maxLeases holders); retry in %ds", a.ns, a.fleet, healthy, retry)
	if healthy < 0 {
		msg = fmt.Sprintf("acquisitions of %s/%s are waiting for a slot already, and this one may not wait (maxWait 0); retry in %ds", a.ns, a.fleet, retry)
	}
	return &problem.Error{Code: http.StatusConflict, Reason: apiv1.ReasonNoFreeSlot, RetryAfter: retry, Msg: msg}
}

// retryAfter suggests when a slot is likely free: the soonest expiry.
func (s *Server) retryAfter(slots map[string][]*coordLease) int {
	soonest := math.MaxFloat64
	for _, ls := range slots {
		for _, l := range ls {
			soonest = min(soonest, lease.ExpiresAt(l).Sub(s.now()).Seconds())
		}
	}
	if soonest == math.MaxFloat64 || soonest < 1 {
		return 5
	}
	return int(math.Ceil(min(soonest, 60)))
}

// leaseOf reads the lease named in the path and authorises its fleet. The
// fleet comes from the cached Proxy the slot belongs to, so renew and
// release cost one API call each.
func (s *Server) leaseOf(r *http.Request, id *auth.Identity) (leaseID, namespace, fleet string, p *v1alpha1.Proxy, err error) {
	leaseID = r.PathValue("namespace") + "/" + r.PathValue("name") + "/" + r.PathValue("token")
	namespace, name, _, err := lease.ParseID(leaseID)
	if err != nil {
		return "", "", "", nil, lease.ErrNotFound
	}
	proxy, ok := lease.ProxyOf(name)
	if !ok {
		return "", "", "", nil, lease.ErrNotFound
	}
	p = &v1alpha1.Proxy{}
	if err := s.Catalog.Cache.Get(r.Context(), types.NamespacedName{Namespace: namespace, Name: proxy}, p); err != nil {
		if kerrors.IsNotFound(err) {
			return "", "", "", nil, lease.ErrNotFound
		}
		return "", "", "", nil, err
	}
	fleet = fleetv1alpha1.FleetName(p)
	if err := s.Auth.Authorize(r.Context(), id, namespace, fleet); err != nil {
		return "", "", "", nil, err
	}
	return leaseID, namespace, fleet, p, nil
}

func (s *Server) renew(w http.ResponseWriter, r *http.Request, id *auth.Identity) error {
	leaseID, ns, fleet, p, err := s.leaseOf(r, id)
	if err != nil {
		return err
	}
	req := &apiv1.RenewRequest{}
	if err := decode(r, req); err != nil && !errors.Is(err, errEmptyBody) {
		return err
	}
	def, maxTTL, err := s.Catalog.TTLs(r.Context(), ns, fleet)
	if err != nil {
		return err
	}
	ttl, err := parseTTL("ttl", req.TTL, def, maxTTL)
	if err != nil {
		return err
	}
	if since := catalog.DrainSince(p); !since.IsZero() {
		if ttl, err = s.drainedTTL(p.Name, since, maxTTL, ttl); err != nil {
			return err
		}
	}
	g, err := s.Leases.Renew(r.Context(), leaseID, id.User, ttl)
	if err != nil {
		return err
	}
	out := apiv1.Lease{LeaseID: g.ID, Proxy: g.Proxy, ExpiresAt: g.ExpiresAt, TTLSeconds: int64(ttl / time.Second)}
	// The URL with the credentials the proxy takes now, so that a crawler
	// renewing across a password change moves to the new one before the
	// previous one's grace ends; none for a proxy that still takes only
	// the credentials the crawler was given.
	if m := catalog.ToMember(p); !m.CredentialsOutdated {
		// The lease is renewed whatever happens here: a failure to read
		// the credentials leaves the URL out, never answers an error
		// that would make the crawler drop a lease it holds.
		if out.ProxyURL, err = s.Catalog.ProxyURL(r.Context(), m); err != nil {
			s.Log.Info("Renewed a lease without its proxy's URL", "lease", leaseID, "error", err)
		}
	}
	problem.WriteJSON(w, http.StatusOK, out)
	return nil
}

// drainedTTL bounds the renewal of a lease of a proxy being replaced since
// since: only up to the drain start plus maxTTL, so that one crawler
// renewing forever cannot hold the rollout up; past it, the lease is not
// renewed.
func (s *Server) drainedTTL(proxy string, since time.Time, maxTTL, ttl time.Duration) (time.Duration, error) {
	// A start in the future (a skewed clock, an edited label) counts as
	// now: it never extends a lease past now plus maxTTL.
	if now := s.now(); since.After(now) {
		since = now
	}
	left := since.Add(maxTTL).Sub(s.now()).Truncate(time.Second)
	if left < time.Second {
		return 0, &problem.Error{Code: http.StatusConflict, Reason: apiv1.ReasonDraining,
			Msg: fmt.Sprintf("proxy %s is being replaced since %s and its leases are no longer renewed: release this lease and take a new one", proxy, since.Format(time.RFC3339))}
	}
	return min(ttl, left), nil
}

func (s *Server) release(w http.ResponseWriter, r *http.Request, id *auth.Identity) error {
	leaseID, ns, fleet, _, err := s.leaseOf(r, id)
	if err != nil {
		return err
	}
	if err := s.Leases.Release(r.Context(), leaseID, id.User); err != nil {
		return err
	}
	s.released(ns, fleet, id.User, leaseID)
	w.WriteHeader(http.StatusNoContent)
	return nil
}
