package gateway

import (
	"context"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/ttlcache"
)

// Rotation: a connection without a session goes out through the proxy the
// strategy chooses among all of the fleet's proxies that serve it (of the
// zone, not banned for the target's domain, serving), not among the
// replica's seats: sequential connections spread over the fleet whatever
// the caller holds open. The chosen proxy's seat carries the connection,
// and one is leased on it when it has none (a seat is still one lease per
// proxy in use, shared by every caller). A replica holds at most MaxSeats
// seats per fleet and zone: at that bound the strategy chooses among the
// seated proxies, and one seat idle for at least SeatTurnover/MaxSeats
// gives way to an unseated proxy at most every SeatTurnover/MaxSeats; so a
// fleet larger than MaxSeats is reached whole over time, at a bounded cost
// in lease writes (two per turnover, MaxSeats turnovers a SeatTurnover at
// most). A fleet larger than SampleFrom is chosen among a random sample of
// SampleSize of its proxies and its seated ones, so that a connection
// costs what a sample does, not the fleet.

const (
	// rotationChoices bounds the proxies one connection tries to take a
	// seat on (each full one costs a write) before it falls back to the
	// seats it has.
	rotationChoices = 3
	// rotationMemory is how long the use of an egress IP is remembered
	// for the least recently used strategy; rotationKeys bounds the
	// (caller, fleet, zone, domain) keys remembered, and rotationIPs the
	// IPs and networks of one key.
	rotationMemory = 10 * time.Minute
	rotationKeys   = 4096
	rotationIPs    = 512
)

// rotor is a replica's rotation state: when each caller last used each
// egress IP for a domain, and each fleet's round-robin position.
type rotor struct {
	mu   sync.Mutex
	used *ttlcache.Cache[map[string]time.Time]
	next map[string]int
}

// uses are when key last used each egress IP, lately (r.mu held).
func (r *rotor) uses(key string, now time.Time) map[string]time.Time {
	if r.used == nil {
		r.used = ttlcache.New[map[string]time.Time](rotationKeys)
	}
	u, _ := r.used.Get(key, now, rotationMemory)
	return u
}

// netUse keys a network's last use among the IPs' in a rotor's uses.
func netUse(m *catalog.Member) string { return "net " + m.NetworkKey() }

// note records that key used m's egress IP, and its network, at now.
func (r *rotor) note(key string, m *catalog.Member, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	u := r.uses(key, now)
	if u == nil {
		u = map[string]time.Time{}
	}
	u[allocator.IPOf(m)] = now
	u[netUse(m)] = now
	if len(u) > rotationIPs {
		// The older half is forgotten: those IPs count as unused again,
		// which is what least recently used would pick next anyway.
		ips := slices.SortedFunc(maps.Keys(u), func(a, b string) int { return u[a].Compare(u[b]) })
		for _, k := range ips[:len(ips)-rotationIPs/2] {
			delete(u, k)
		}
	}
	r.used.Add(key, u, now)
}

// order returns up to n of the candidates (members, in the fleet's order
// by name), those of tiers[0] first, in the strategy's preference: load is each proxy's connections on this
// replica, for leastConnections; key is the caller's, fleet's, zone's
// and domain's, for leastRecentlyUsed; ring is the fleet's and zone's,
// for roundRobin. A target counts an IPv4 /24 (IPv6 /64) as one client,
// so the strategies spread over networks first: least recently used takes
// the least recently used network's least recently used IP, and round
// robin goes through the networks in turn, one proxy of each a round. Of
// equally recently used networks, an IP with no ban in its history within
// allocator.RecentBans (tainted names those with one) comes first.
func (r *rotor) order(strategy string, tiers [2][]*catalog.Member, n int, key, ring string, load map[string]int, tainted map[string]bool, now time.Time) []*catalog.Member {
	out := r.orderTier(strategy, tiers[0], n, key, ring, load, tainted, now)
	if len(out) < n {
		out = append(out, r.orderTier(strategy, tiers[1], n-len(out), key, ring+" crowded", load, tainted, now)...)
	}
	return out
}

// orderTier is order within one tier of candidates.
func (r *rotor) orderTier(strategy string, cands []*catalog.Member, n int, key, ring string, load map[string]int, tainted map[string]bool, now time.Time) []*catalog.Member {
	if len(cands) == 0 {
		return nil
	}
	n = min(n, len(cands))
	out := make([]*catalog.Member, 0, n)
	switch strategy {
	case apiv1.RotateRoundRobin:
		cands = byNetworkInTurn(cands)
		r.mu.Lock()
		if r.next == nil || len(r.next) >= rotationKeys {
			r.next = map[string]int{}
		}
		at := r.next[ring] % len(cands)
		r.next[ring] = at + 1
		r.mu.Unlock()
		for i := range n {
			out = append(out, cands[(at+i)%len(cands)])
		}
		return out
	case apiv1.RotateRandom:
		picked := make(map[int]bool, n)
		for len(out) < n {
			if i := rand.IntN(len(cands)); !picked[i] {
				picked[i] = true
				out = append(out, cands[i])
			}
		}
		return out
	}
	// leastRecentlyUsed, and leastConnections with it as the tie-break:
	// the n smallest of (load, last use), scanned from a random start so
	// that equals are taken in random order.
	r.mu.Lock()
	used := r.uses(key, now)
	last := make([]time.Time, len(cands))
	lastNet := make([]time.Time, len(cands))
	taint := make([]bool, len(cands))
	for i, m := range cands {
		last[i] = used[allocator.IPOf(m)]
		lastNet[i] = used[netUse(m)]
		taint[i] = len(tainted) > 0 && tainted[m.CanonicalIP()]
	}
	r.mu.Unlock()
	less := func(i, j int) bool {
		if strategy == apiv1.RotateLeastConnections {
			if li, lj := load[cands[i].Name], load[cands[j].Name]; li != lj {
				return li < lj
			}
		}
		if !lastNet[i].Equal(lastNet[j]) {
			return lastNet[i].Before(lastNet[j])
		}
		if ti, tj := taint[i], taint[j]; ti != tj {
			return !ti
		}
		return last[i].Before(last[j])
	}
	start := rand.IntN(len(cands))
	taken := make(map[int]bool, n)
	for range n {
		best := -1
		for k := range cands {
			i := (start + k) % len(cands)
			if !taken[i] && (best < 0 || less(i, best)) {
				best = i
			}
		}
		taken[best] = true
		out = append(out, cands[best])
	}
	return out
}

// byNetworkInTurn orders ms (by name) so that networks take turns: the
// first proxy of each network (in the order networks first appear), then
// the second of each, and so on; within a network by name.
func byNetworkInTurn(ms []*catalog.Member) []*catalog.Member {
	var nets []string
	groups := map[string][]*catalog.Member{}
	for _, m := range ms {
		k := m.NetworkKey()
		if _, ok := groups[k]; !ok {
			nets = append(nets, k)
		}
		groups[k] = append(groups[k], m)
	}
	if len(nets) == len(ms) || len(nets) == 1 {
		return ms
	}
	out := make([]*catalog.Member, 0, len(ms))
	for round := 0; len(out) < len(ms); round++ {
		for _, k := range nets {
			if g := groups[k]; round < len(g) {
				out = append(out, g[round])
			}
		}
	}
	return out
}

// rotate gives a connection without a session the seat of the proxy the
// strategy chooses, leasing one on it when it has none; nil (no error)
// when it found none to take, and the caller falls back to the seats as
// they are (pickSeat). A pin, when set, is the egress IP whose paced turn
// the connection holds: only a proxy leaving from it serves it, as the
// members are now (one added while it waited has no turn).
func (gw *Gateway[S]) rotate(ctx context.Context, key, strategy string, id *auth.Identity, u User, domain string, exclude map[string]bool, rule *catalog.PacingRule, pin string) (*upstream, error) {
	f, err := gw.Server.Allocator().Catalog.Members(ctx, u.Namespace, u.Fleet)
	if err != nil {
		return nil, err
	}
	if len(f.Items) == 0 {
		return nil, nil
	}
	ms := f.Items
	serving, err := gw.Server.Allocator().Admits(ctx, ms, u.Zone, exclude, domain)
	if err != nil {
		return nil, err
	}
	tainted, err := gw.Server.Allocator().Tainted(ctx, u.Namespace, u.Fleet)
	if err != nil {
		return nil, err
	}
	if pin != "" {
		admits := serving
		serving = func(m *catalog.Member) bool { return admits(m) && allocator.IPOf(m) == pin }
	}
	now := gw.Server.Allocator().Time()
	fleet := u.Namespace + "/" + u.Fleet
	// A proxy whose egress IP is paced for the domain is passed over.
	admit, diverted := serving, false
	if rule != nil {
		admit = func(m *catalog.Member) bool {
			if !serving(m) {
				return false
			}
			if gw.Server.Allocator().PaceNext(allocator.PaceKey(fleet, rule, allocator.IPOf(m)), rule, now).After(now) {
				diverted = true
				return false
			}
			return true
		}
	}
	// The seats of key, as the members show their proxies now: one whose
	// proxy serves no more is retired, one that does not serve this
	// connection (banned for its domain, excluded) is passed over.
	seated, load, drop, full := gw.seatsOf(key, ms, admit)
	if full && rule != nil && len(seated) == 0 {
		// Every seat's IP is paced: one gives way to an unpaced proxy
		// now, rather than the connection wait for a turnover.
		full = false
	}
	for _, up := range drop {
		gw.release(ctx, up)
	}
	if strategy == apiv1.RotateLeastConnections {
		gw.mu.Lock()
		gw.sessionLoadLocked(u.Namespace, u.Fleet, load)
		gw.mu.Unlock()
	}
	cands := gw.candidates(f, admit, seated, full, now, key)
	lru := id.User + "\x00" + key + "\x00" + domain
	up, err := gw.takeChosen(ctx, key, id, u, domain, exclude, rule, seated, gw.rotor.order(strategy, cands, rotationChoices, lru, key, load, tainted, now), lru, now)
	if up != nil && diverted {
		// A proxy that would have served was passed over for its paced IP.
		gw.Metrics.Paced.WithLabelValues(fleet, "diverted").Inc()
	}
	if up != nil || err != nil {
		return up, err
	}
	if rule != nil {
		return nil, gw.pacedUntil(ms, serving, fleet, domain, rule, now)
	}
	return nil, nil
}

// takeChosen takes a connection's place on the first of chosen that has
// a seat for it, or gets one, within rule's pacing (nil: none); nil when
// none could.
func (gw *Gateway[S]) takeChosen(ctx context.Context, key string, id *auth.Identity, u User, domain string, exclude map[string]bool, rule *catalog.PacingRule, seated map[string]*upstream, chosen []*catalog.Member, lru string, now time.Time) (*upstream, error) {
	fleet := u.Namespace + "/" + u.Fleet
	var err error
	for _, m := range chosen {
		up := seated[m.Name]
		if up == nil {
			if up, err = gw.seatOn(ctx, key, id, u, domain, exclude, m.Name); err != nil && !allocator.Refusal(err) {
				return nil, err
			}
		} else if ok, _ := gw.check(ctx, up, u.Zone, domain); !ok {
			up = nil
		} else {
			gw.mu.Lock()
			if up.retired {
				up = nil
			} else {
				up.refs++
			}
			gw.mu.Unlock()
		}
		// The time now, not when the choice began: seatOn may have waited
		// on a lease write.
		if up != nil && rule != nil && !gw.Server.Allocator().PaceTake(allocator.PaceKey(fleet, rule, allocator.IPOf(m)), rule, gw.Server.Allocator().Time()) {
			// Another connection took the IP's last token meanwhile.
			gw.unref(up)
			up = nil
		}
		if up != nil {
			gw.rotor.note(lru, m, now)
			return up, nil
		}
	}
	return nil, nil
}

// pacedUntil is, when every proxy of ms that serves a connection is paced
// under rule, the error saying until when; nil when one is free (no
// proxy was taken for another reason than pacing).
func (gw *Gateway[S]) pacedUntil(ms []catalog.Member, serving func(*catalog.Member) bool, fleet, domain string, rule *catalog.PacingRule, now time.Time) error {
	soonest := gw.Server.Allocator().PaceSoonest(fleet, rule, ms, serving, now)
	if soonest.IsZero() || !soonest.After(now) {
		return nil
	}
	return &pacedError{rule: rule, domain: domain, fleet: fleet, next: soonest}
}

// pacedError says every proxy that serves a connection is paced for its
// domain until next.
type pacedError struct {
	rule   *catalog.PacingRule
	domain string
	fleet  string
	next   time.Time
}

func (e *pacedError) Error() string {
	return "every proxy of " + e.fleet + " that serves " + e.domain + " is paced for it (one connection an egress IP every " + e.rule.Interval.String() + ", burst " + strconv.Itoa(e.rule.Burst) + ")"
}

// candidates are the proxies a connection may rotate to: the seated ones
// that serve it, and, unless the seats are full with none due to give way
// (turnover is due at most every SeatTurnover/MaxSeats per key), the
// others that do: all of them, or in a fleet larger than SampleFrom a
// random sample of SampleSize. They come in two tiers, as the catalogue
// splits the fleet (f.Own, f.Shared): those leaving from an IP of their
// own within the fleet's diversity caps, and the crowded rest, which
// are chosen only when fewer of the others serve than a connection
// tries.
func (gw *Gateway[S]) candidates(f *catalog.Members, admit func(*catalog.Member) bool, seated map[string]*upstream, full bool, now time.Time, key string) [2][]*catalog.Member {
	var tiers [2][]*catalog.Member
	for t, idx := range [2][]int32{f.Own, f.Shared} {
		for _, i := range idx {
			if seated[f.Items[i].Name] != nil {
				tiers[t] = append(tiers[t], &f.Items[i])
			}
		}
	}
	if full && !gw.turnoverDue(key, now) {
		return tiers
	}
	keep := func(m *catalog.Member) bool { return seated[m.Name] == nil && admit(m) }
	if len(f.Items) <= allocator.SampleFrom {
		for t, idx := range [2][]int32{f.Own, f.Shared} {
			for _, i := range idx {
				if keep(&f.Items[i]) {
					tiers[t] = append(tiers[t], &f.Items[i])
				}
			}
		}
		return tiers
	}
	// One sample over both tiers: the crowded drawn only when the others
	// leave room.
	budget := allocator.MaxDraws
	limit := len(tiers[0]) + len(tiers[1]) + allocator.SampleSize
	for t, idx := range [2][]int32{f.Own, f.Shared} {
		tiers[t] = allocator.Draw(f.Items, idx, tiers[t], limit-len(tiers[1-t]), &budget, keep)
	}
	return tiers
}

// turnoverDue says whether a seat of key may give way to another proxy
// now, and if so counts it done: at most one every SeatTurnover/MaxSeats.
func (gw *Gateway[S]) turnoverDue(key string, now time.Time) bool {
	gw.mu.Lock()
	defer gw.mu.Unlock()
	if now.Before(gw.turnover[key]) {
		return false
	}
	if len(gw.turnover) >= rotationKeys {
		clear(gw.turnover)
	}
	gw.turnover[key] = now.Add(gw.SeatTurnover / time.Duration(gw.MaxSeats))
	return true
}

// seatsOf reads key's seats against ms (the fleet's members, sorted) and
// admit: the usable ones by proxy, every seat's connections by proxy, the
// leases of seats retired for good (to give back), and whether the seats
// are at MaxSeats.
func (gw *Gateway[S]) seatsOf(key string, ms []catalog.Member, admit func(*catalog.Member) bool) (seated map[string]*upstream, load map[string]int, drop []*upstream, full bool) {
	seated, load = map[string]*upstream{}, map[string]int{}
	gw.mu.Lock()
	defer gw.mu.Unlock()
	live := 0
	for _, up := range gw.seats[key] {
		if up.retired {
			continue
		}
		m := catalog.MemberNamed(ms, up.g.Member.Name)
		if m == nil || !m.Serving() {
			if back := gw.retireLocked(up); back != nil {
				drop = append(drop, back)
			}
			continue
		}
		live++
		load[m.Name] += up.refs
		if admit(m) && seated[m.Name] == nil {
			seated[m.Name] = up
		}
	}
	return seated, load, drop, live >= gw.MaxSeats
}

// seatOn leases a seat of key on the proxy named, for a connection, unless
// it has one already or another connection is leasing one there: then it
// shares that one. At MaxSeats, the seat idle longest gives way first (a
// turnover the caller found due); with none idle, nil. It does not wait
// for a slot: a full proxy is refused at once, and the rotation tries
// another.
func (gw *Gateway[S]) seatOn(ctx context.Context, key string, id *auth.Identity, u User, domain string, exclude map[string]bool, name string) (*upstream, error) {
	tk := key + "\x00" + name
	gw.mu.Lock()
	if take, busy := gw.taking[tk]; busy {
		gw.mu.Unlock()
		select {
		case <-take.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if take.err != nil && !take.gone && allocator.Refusal(take.err) {
			return nil, take.err
		}
		// Leased (or failed for its own caller's reason): shared if there.
		gw.mu.Lock()
		defer gw.mu.Unlock()
		return gw.seatNamedLocked(key, name), nil
	}
	if up := gw.seatNamedLocked(key, name); up != nil {
		// Leased since the caller looked.
		gw.mu.Unlock()
		return up, nil
	}
	var yield *upstream
	for _, up := range gw.seats[key] {
		if !up.retired && up.refs == 0 && (yield == nil || up.idle.Before(yield.idle)) {
			yield = up
		}
	}
	var back *upstream
	if gw.seatCountLocked(key) >= gw.MaxSeats {
		if yield == nil {
			gw.mu.Unlock()
			return nil, nil
		}
		back = gw.retireLocked(yield)
	}
	take := &seatTake{done: make(chan struct{})}
	gw.taking[tk] = take
	gw.mu.Unlock()
	if back != nil {
		gw.release(ctx, back)
	}
	up, err := gw.lease(ctx, id, u, domain, SeatHolder(gw.Replica), exclude, true, false, name)
	gw.mu.Lock()
	delete(gw.taking, tk)
	take.err, take.gone = err, ctx.Err() != nil
	close(take.done)
	if err == nil && gw.closed {
		// Shut down meanwhile: releaseAll has given the others back.
		delete(gw.live, up)
		gw.mu.Unlock()
		gw.release(context.WithoutCancel(ctx), up)
		return nil, &gwError{code: http.StatusServiceUnavailable, reason: reasonShuttingDown, retryAfter: 1, msg: "this gateway replica is shutting down; retry"}
	}
	defer gw.mu.Unlock()
	if err != nil {
		return nil, err
	}
	gw.seats[key] = append(gw.seats[key], up)
	up.refs++
	return up, nil
}

// seatCountLocked counts key's seats, those being leased included; gw.mu
// is held.
func (gw *Gateway[S]) seatCountLocked(key string) int {
	n := 0
	for _, up := range gw.seats[key] {
		if !up.retired {
			n++
		}
	}
	prefix := key + "\x00"
	for k := range gw.taking {
		if k == key || strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}

// seatNamedLocked is key's seat on the proxy named, taken for a
// connection (refs counted), or nil; gw.mu is held.
func (gw *Gateway[S]) seatNamedLocked(key, name string) *upstream {
	for _, up := range gw.seats[key] {
		if up.g.Member.Name == name && !up.retired {
			up.refs++
			return up
		}
	}
	return nil
}

// sessionLoadLocked adds to load the connections of this replica's
// sessions on each proxy of a fleet, for leastConnections; gw.mu is held.
func (gw *Gateway[S]) sessionLoadLocked(namespace, fleet string, load map[string]int) {
	for _, s := range gw.sessions {
		if up := s.up; up != nil && up.g.Member.Namespace == namespace && up.g.Member.Fleet == fleet {
			load[up.g.Member.Name] += up.refs
		}
	}
}
