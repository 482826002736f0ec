package allocator

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
)

// ReasonPaced is the refusal when every proxy that serves a connection is
// paced for its domain.
const ReasonPaced = "Paced"

// MaxPaceWait bounds how long a connection waits for a paced IP before it
// is answered 429.
const MaxPaceWait = 2 * time.Second

// maxBuckets bounds the buckets a replica keeps: past it, full ones (which
// count as absent) are forgotten, then the least recently spent.
const maxBuckets = 1 << 16

// maxPaceScan bounds the distinct IPs a connection that finds every IP
// paced looks at for the soonest turn: a fleet of 10 000 is not scanned
// under the lock every fleet's connections share. Past it, the turn is the
// soonest of a random run of that many, as a rotation's sample is.
const maxPaceScan = 256

// pacer holds a replica's buckets.
type pacer struct {
	mu sync.Mutex
	b  map[string]*bucket
}

// bucket is one (fleet, rule, IP)'s tokens as of at, and its rule's
// interval and burst (so that a full one can be told and forgotten).
type bucket struct {
	tokens   float64
	at       time.Time
	interval time.Duration
	burst    int
}

// PaceKey names the bucket of fleet (namespace/name), rule and ip.
func PaceKey(fleet string, r *catalog.PacingRule, ip string) string {
	return fleet + "\x00" + strconv.Itoa(r.Index) + "\x00" + ip
}

// level is b's tokens at now under r (a clock gone back adds none).
func (b *bucket) level(r *catalog.PacingRule, now time.Time) float64 {
	return math.Min(float64(r.Burst), b.tokens+float64(max(now.Sub(b.at), 0))/float64(r.Interval))
}

// next is when the bucket key next has a token under r (now or before:
// it has one).
func (p *pacer) next(key string, r *catalog.PacingRule, now time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nextLocked(key, r, now)
}

// nextLocked is next with p.mu held.
func (p *pacer) nextLocked(key string, r *catalog.PacingRule, now time.Time) time.Time {
	b := p.b[key]
	if b == nil {
		return now
	}
	l := b.level(r, now)
	if l >= 1 {
		return now
	}
	return now.Add(time.Duration((1 - l) * float64(r.Interval)))
}

// bucketLocked is key's bucket, made full under r if it has none (p.mu
// held): past maxBuckets, the full ones are forgotten first.
func (p *pacer) bucketLocked(key string, r *catalog.PacingRule, now time.Time) *bucket {
	if p.b == nil {
		p.b = map[string]*bucket{}
	}
	b := p.b[key]
	if b == nil {
		if len(p.b) >= maxBuckets {
			p.forgetFullLocked(now)
		}
		b = &bucket{tokens: float64(r.Burst), at: now, interval: r.Interval, burst: r.Burst}
		p.b[key] = b
	}
	return b
}

// spend takes one token of b under r at now (it may go below empty: a
// turn reserved). Its clock never goes back: a take whose now was read
// before another's (a connection that waited on a lease write) must not
// refill the bucket a second time over the same interval.
func (b *bucket) spend(r *catalog.PacingRule, now time.Time) {
	l := b.level(r, now)
	b.tokens, b.at, b.interval, b.burst = l-1, maxTime(b.at, now), r.Interval, r.Burst
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// take spends a token of key under r, if it has one.
func (p *pacer) take(key string, r *catalog.PacingRule, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.bucketLocked(key, r, now)
	if b.level(r, now) < 1 {
		return false
	}
	b.spend(r, now)
	return true
}

// reserve spends the next token of key under r: now when it has one,
// else the time its turn comes, when that is within maxWait; the token is
// spent either way (the bucket goes below empty), so that connections
// waiting for one IP are served in turn, one an interval, instead of all
// waking for the same token. ok is false when the turn would come later:
// nothing is spent, and at says when one would be free.
func (p *pacer) reserve(key string, r *catalog.PacingRule, now time.Time, maxWait time.Duration) (at time.Time, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.bucketLocked(key, r, now)
	l := b.level(r, now)
	at = now
	if l < 1 {
		at = now.Add(time.Duration((1 - l) * float64(r.Interval)))
	}
	if at.Sub(now) > maxWait {
		return at, false
	}
	b.spend(r, now)
	return at, true
}

// reserveSoonest reserves, of the IPs of ms that serve a connection
// (serving), the one whose turn comes first under rule for fleet (as
// reserve does), when that is within maxWait: one lock for all of them,
// so that concurrent connections queue over the IPs instead of waking for
// one token. ok false, nothing spent, when no turn comes within maxWait
// (at is the first, zero when none serves).
func (p *pacer) reserveSoonest(fleet string, rule *catalog.PacingRule, ms []catalog.Member, serving func(*catalog.Member) bool, now time.Time, maxWait time.Duration) (ip string, at time.Time, ok bool) {
	keys := paceKeys(fleet, rule, ms, serving)
	p.mu.Lock()
	defer p.mu.Unlock()
	var key string
	for _, k := range keys {
		t := p.nextLocked(k.key, rule, now)
		if ip == "" || t.Before(at) {
			ip, key, at = k.ip, k.key, t
		}
	}
	if ip == "" || at.Sub(now) > maxWait {
		return "", at, false
	}
	p.bucketLocked(key, rule, now).spend(rule, now)
	return ip, at, true
}

// ipKey is an egress IP and its bucket's key.
type ipKey struct{ ip, key string }

// paceKeys are the distinct IPs of ms that serve a connection (serving),
// with their buckets' keys, worked out before the pacer's lock is taken:
// at most maxPaceScan of them, from a random start when ms has more.
func paceKeys(fleet string, rule *catalog.PacingRule, ms []catalog.Member, serving func(*catalog.Member) bool) []ipKey {
	start := 0
	if len(ms) > maxPaceScan {
		start = rand.IntN(len(ms)) //nolint:gosec // A sample, not a secret.
	}
	var out []ipKey
	for i := range ms {
		m := &ms[(start+i)%len(ms)]
		if !serving(m) {
			continue
		}
		ip := IPOf(m)
		if slices.ContainsFunc(out, func(k ipKey) bool { return k.ip == ip }) {
			continue
		}
		if out = append(out, ipKey{ip: ip, key: PaceKey(fleet, rule, ip)}); len(out) == maxPaceScan {
			break
		}
	}
	return out
}

// soonest is, of the IPs of ms that serve a connection (serving), the
// first time one has a token under rule for fleet: now when one has, zero
// when none serves. One lock for all of them; at most maxPaceScan IPs
// looked at (paceKeys).
func (p *pacer) soonest(fleet string, rule *catalog.PacingRule, ms []catalog.Member, serving func(*catalog.Member) bool, now time.Time) time.Time {
	keys := paceKeys(fleet, rule, ms, serving)
	p.mu.Lock()
	defer p.mu.Unlock()
	var first time.Time
	for _, k := range keys {
		t := p.nextLocked(k.key, rule, now)
		if !t.After(now) {
			return now
		}
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	return first
}

// pacedAmong are the proxies of ms whose IP has no token under rule now.
func (p *pacer) pacedAmong(fleet string, rule *catalog.PacingRule, ms []catalog.Member, now time.Time) map[string]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]bool{}
	for i := range ms {
		if p.nextLocked(PaceKey(fleet, rule, IPOf(&ms[i])), rule, now).After(now) {
			out[ms[i].Name] = true
		}
	}
	return out
}

// forgetFullLocked drops the buckets full by now, which count as absent
// ones do; if that frees too little, the least recently spent half of
// them (a forgotten bucket starts again full: under that much pressure
// pacing errs on the side of one burst more, for the IPs used longest
// ago, never for every fleet's at once). p.mu is held.
func (p *pacer) forgetFullLocked(now time.Time) {
	for k, b := range p.b {
		if b.level(&catalog.PacingRule{Interval: b.interval, Burst: b.burst}, now) >= float64(b.burst) {
			delete(p.b, k)
		}
	}
	if len(p.b) < maxBuckets/2 {
		return
	}
	type aged struct {
		key string
		at  time.Time
	}
	all := make([]aged, 0, len(p.b))
	for k, b := range p.b {
		all = append(all, aged{k, b.at})
	}
	slices.SortFunc(all, func(a, b aged) int { return a.at.Compare(b.at) })
	for _, a := range all[:len(all)/2] {
		delete(p.b, a.key)
	}
}

// IPOf is what a target sees of m: its egress IP, or the proxy itself
// while its IP is unknown.
func IPOf(m *catalog.Member) string {
	if m.EgressIP != "" {
		return m.EgressIP
	}
	return "proxy:" + m.Name
}

// PaceNext is when the bucket key (PaceKey) next has a token for rule.
func (s *Allocator) PaceNext(key string, rule *catalog.PacingRule, now time.Time) time.Time {
	return s.pace.next(key, rule, now)
}

// PaceTake takes a token of the bucket key for rule, if it has one.
func (s *Allocator) PaceTake(key string, rule *catalog.PacingRule, now time.Time) bool {
	return s.pace.take(key, rule, now)
}

// PaceReserve spends the next token of the bucket key for rule: now, or
// at its turn within maxWait (see reserve); ok false, nothing spent, when
// the turn would come later than that.
func (s *Allocator) PaceReserve(key string, rule *catalog.PacingRule, now time.Time, maxWait time.Duration) (time.Time, bool) {
	return s.pace.reserve(key, rule, now, maxWait)
}

// PaceReserveSoonest reserves the turn of the IP of ms that comes first
// under rule (see reserveSoonest).
func (s *Allocator) PaceReserveSoonest(fleet string, rule *catalog.PacingRule, ms []catalog.Member, serving func(*catalog.Member) bool, now time.Time, maxWait time.Duration) (string, time.Time, bool) {
	return s.pace.reserveSoonest(fleet, rule, ms, serving, now, maxWait)
}

// PaceSoonest is the soonest that one of ms that serving keeps has a token
// for rule.
func (s *Allocator) PaceSoonest(fleet string, rule *catalog.PacingRule, ms []catalog.Member, serving func(*catalog.Member) bool, now time.Time) time.Time {
	return s.pace.soonest(fleet, rule, ms, serving, now)
}

// PacedAmong are the egress IPs of ms that rule paces now.
func (s *Allocator) PacedAmong(fleet string, rule *catalog.PacingRule, ms []catalog.Member, now time.Time) map[string]bool {
	return s.pace.pacedAmong(fleet, rule, ms, now)
}

// replicaCount is a fleet's replica count, as read at a time.
type replicaCount struct {
	n  int
	at time.Time
}

// replicasTTL is how long a fleet's replica count is used before it is
// read again; maxShares bounds the fleets remembered.
const (
	replicasTTL = time.Second
	maxShares   = 4096
)

// replicasOf is how many replicas serve the fleet (at least 1). When they
// cannot be counted, the last count stands (it only ever paces slower than
// a fresh one would), else 1, and it is tried again at the next call.
func (s *Allocator) replicasOf(ctx context.Context, namespace, fleet string) int {
	if s.Replicas == nil {
		return 1
	}
	key := namespace + "/" + fleet
	now := s.Now()
	s.sharesMu.Lock()
	c, ok := s.shares[key]
	s.sharesMu.Unlock()
	if ok && now.Sub(c.at) < replicasTTL && !now.Before(c.at) {
		return c.n
	}
	n, err := s.Replicas(ctx, namespace, fleet)
	if err != nil {
		if ok {
			return c.n
		}
		return 1
	}
	n = max(n, 1)
	s.sharesMu.Lock()
	if s.shares == nil || len(s.shares) >= maxShares {
		s.shares = map[string]replicaCount{}
	}
	s.shares[key] = replicaCount{n: n, at: now}
	s.sharesMu.Unlock()
	return n
}

// PacingFor is the fleet's pacing rule for domain as this replica applies
// it (nil when none covers it): its share of the rule when n replicas
// serve the fleet, the interval n times as long and the burst split
// (rounded up, at least 1), so that the replicas together keep to the
// rule's rate whichever replica each connection reaches. The burst is the
// exception: each replica's bucket holds at least one token, so behind n
// replicas an IP may see n*ceil(burst/n) connections at once (n for a
// burst of 1) before the interval applies. A replica counts itself from
// its start; the others count it once its first summary of the fleet
// shows (its summaries are written a fleet at a time, so in a cluster of
// many fleets that can take a while, during which they pace faster than
// their share); one that died is counted until its summary stops
// counting (leasewire.SummaryFreshness), which paces slower.
func (s *Allocator) PacingFor(ctx context.Context, namespace, fleet string, p *catalog.Policy, domain string) *catalog.PacingRule {
	rule := p.PacingFor(domain)
	if rule == nil {
		return nil
	}
	n := s.replicasOf(ctx, namespace, fleet)
	if n <= 1 {
		return rule
	}
	share := *rule
	share.Interval *= time.Duration(n)
	share.Burst = max((rule.Burst+n-1)/n, 1)
	return &share
}
