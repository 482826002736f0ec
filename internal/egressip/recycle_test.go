package egressip_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/egressip"
)

var t0 = time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)

func TestBurned(t *testing.T) {
	p := egressip.RecyclePolicy{ByDomains: 3, Times: 4, Window: time.Hour}
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	cases := map[string]struct {
		bans []egressip.Ban
		want bool
	}{
		"ThreeDomains":      {[]egressip.Ban{{"a", at(1)}, {"b", at(2)}, {"c", at(3)}}, true},
		"TwoDomains":        {[]egressip.Ban{{"a", at(1)}, {"b", at(2)}, {"b", at(3)}}, false},
		"FourTimesOne":      {[]egressip.Ban{{"a", at(1)}, {"a", at(2)}, {"a", at(3)}, {"a", at(4)}}, true},
		"OutsideTheWindow":  {[]egressip.Ban{{"a", at(-70)}, {"b", at(-65)}, {"c", at(3)}}, false},
		"FromTheFuture":     {[]egressip.Ban{{"a", at(1)}, {"b", at(2)}, {"c", at(90)}}, false},
		"NoBans":            {nil, false},
		"ThreeTimesTwoEach": {[]egressip.Ban{{"a", at(1)}, {"a", at(2)}, {"b", at(3)}, {"b", at(4)}}, false},
	}
	kinds := map[string]string{"ThreeDomains": egressip.ReasonDomains, "FourTimesOne": egressip.ReasonTimes}
	for name, tc := range cases {
		got, why := p.Burned(tc.bans, at(10))
		if got != tc.want || got != (why != "") {
			t.Errorf("%s: burned %v (%q), want %v", name, got, why, tc.want)
		}
		if k := kinds[name]; k != "" && egressip.ReasonKind("203.0.113.7 "+why) != k {
			t.Errorf("%s: the kind of %q is %s, want %s", name, why, egressip.ReasonKind(why), k)
		}
	}
	if k := egressip.ReasonKind("203.0.113.7 " + egressip.BeyondLimitReason + "203.0.113.0/24 holds its limit of 2 proxies already"); k != egressip.ReasonDiversity {
		t.Errorf("the kind of a replacement beyond a diversity cap: %s", k)
	}
	if k := egressip.ReasonKind("set by hand"); k != egressip.ReasonOther {
		t.Errorf("the kind of a reason of neither rule: %s", k)
	}
	if got, _ := (egressip.RecyclePolicy{Window: time.Hour}).Burned([]egressip.Ban{{"a", at(1)}}, at(2)); got {
		t.Error("a policy with no threshold burns nothing")
	}
}

// fleetSim replays a ban timeline over a fleet of proxies, minute by
// minute, with a controller that recycles burned addresses as the policy
// allows (or, in a broken variant, as it should not).
type fleetSim struct {
	policy egressip.RecyclePolicy
	// broken: "" the real controller; "unbounded" recycles every burned
	// address at once; "belowFloor" ignores the floor.
	broken string
	// proxies' current IPs; bans by IP; the recycles started; healthy by
	// minute; the floor.
	ips     []string
	bans    map[string][]egressip.Ban
	started []egressip.Recycle
	healthy map[int]int
	floor   int
	// recycling are the proxies whose replacement is under way, and when
	// it is Ready.
	recycling map[int]time.Time
	next      int
	rng       *rand.Rand
}

func newSim(policy egressip.RecyclePolicy, broken string, seed uint64) *fleetSim {
	s := &fleetSim{policy: policy, broken: broken, bans: map[string][]egressip.Ban{}, healthy: map[int]int{}, floor: 8,
		recycling: map[int]time.Time{}, rng: rand.New(rand.NewPCG(seed, 1))}
	for range 10 {
		s.ips = append(s.ips, s.newIP())
	}
	return s
}

// newIP draws an address; one in five is one the fleet had before.
func (s *fleetSim) newIP() string {
	s.next++
	if s.next > 12 && s.rng.IntN(5) == 0 {
		return fmt.Sprintf("203.0.113.%d", 1+s.rng.IntN(s.next-1))
	}
	return fmt.Sprintf("203.0.113.%d", s.next)
}

// run replays minutes of the timeline: targets ban the fleet's addresses
// (the "hot" ones, the first three proxies' lines, often), the fleet has
// an outage (below its floor) in minutes 100-160, and the controller
// recycles.
func (s *fleetSim) run(minutes int) {
	for m := range minutes {
		now := t0.Add(time.Duration(m) * time.Minute)
		for i, ip := range s.ips {
			rate := 30
			if i < 3 {
				rate = 4
			}
			if s.rng.IntN(rate) == 0 {
				s.bans[ip] = append(s.bans[ip], egressip.Ban{Domain: fmt.Sprintf("d%d.example", s.rng.IntN(6)), At: now})
			}
		}
		for i, ready := range s.recycling {
			if !now.Before(ready) {
				s.ips[i] = s.newIP()
				delete(s.recycling, i)
			}
		}
		healthy := len(s.ips)
		if m >= 100 && m < 160 {
			healthy = s.floor - 1
		}
		s.healthy[m] = healthy
		s.step(now, healthy)
	}
}

// step is the controller: the burned addresses not being recycled yet,
// recycled within what the policy allows.
func (s *fleetSim) step(now time.Time, healthy int) {
	allowed, _ := s.policy.Allowed(s.started, healthy, s.floor, now)
	switch s.broken {
	case "unbounded":
		allowed = len(s.ips)
	case "belowFloor":
		allowed, _ = s.policy.Allowed(s.started, s.floor, s.floor, now)
	}
	for i, ip := range s.ips {
		if allowed == 0 {
			return
		}
		if _, busy := s.recycling[i]; busy {
			continue
		}
		if burned, why := s.policy.Burned(s.bans[ip], now); burned {
			s.started = append(s.started, egressip.Recycle{Proxy: fmt.Sprint(i), IP: ip, Reason: why, At: now})
			s.recycling[i] = now.Add(3 * time.Minute)
			allowed--
		}
	}
}

// checkRecycles is the checker: what a replayed timeline's recycles must
// keep to. It returns what they broke.
func checkRecycles(p egressip.RecyclePolicy, started []egressip.Recycle, healthy map[int]int, floor int, bans map[string][]egressip.Ban) []string {
	var bad []string
	for i, r := range started {
		m := int(r.At.Sub(t0) / time.Minute)
		if healthy[m] < floor {
			bad = append(bad, fmt.Sprintf("recycle %d at minute %d with %d healthy, below the floor %d", i, m, healthy[m], floor))
		}
		inHour := 0
		var last time.Time
		for _, o := range started[:i] {
			if o.At.After(r.At.Add(-time.Hour)) {
				inHour++
				last = o.At
			}
		}
		if inHour+1 > max(p.MaxPerHour, 1) {
			bad = append(bad, fmt.Sprintf("recycle %d at minute %d is the %d-th within an hour, above %d", i, m, inHour+1, p.MaxPerHour))
		}
		if inHour > 0 {
			wait := p.Backoff
			for range inHour - 1 {
				wait *= 2
			}
			if r.At.Sub(last) < wait {
				bad = append(bad, fmt.Sprintf("recycle %d at minute %d came %s after the last, within its back-off %s", i, m, r.At.Sub(last), wait))
			}
		}
		if burned, _ := p.Burned(bans[r.IP], r.At); !burned {
			bad = append(bad, fmt.Sprintf("recycle %d at minute %d of %s, which was not burned", i, m, r.IP))
		}
	}
	return bad
}

// TestRecyclingBounds replays ban timelines over a fleet: recycles happen
// when an address is burned, never more than the hour's bound, never
// within the back-off, never below the floor; the checker is proven by
// broken controllers that recycle without bound or below the floor.
func TestRecyclingBounds(t *testing.T) {
	p := egressip.RecyclePolicy{ByDomains: 3, Times: 3, Window: time.Hour, MaxPerHour: 3, Backoff: 5 * time.Minute}
	for seed := range uint64(20) {
		s := newSim(p, "", seed)
		s.run(6 * 60)
		if bad := checkRecycles(p, s.started, s.healthy, s.floor, s.bans); len(bad) > 0 {
			t.Fatalf("seed %d: %s", seed, strings.Join(bad, "; "))
		}
		if len(s.started) < 6 {
			t.Errorf("seed %d: %d recycles in 6 hours of hot addresses; the fleet should recycle about 3 an hour", seed, len(s.started))
		}
		for _, r := range s.started {
			if m := int(r.At.Sub(t0) / time.Minute); m >= 100 && m < 160 {
				t.Errorf("seed %d: a recycle during the outage, minute %d", seed, m)
			}
		}
	}
	for _, broken := range []string{"unbounded", "belowFloor"} {
		caught := false
		for seed := range uint64(20) {
			s := newSim(p, broken, seed)
			s.run(6 * 60)
			if len(checkRecycles(p, s.started, s.healthy, s.floor, s.bans)) > 0 {
				caught = true
				break
			}
		}
		if !caught {
			t.Errorf("the checker missed the %s controller", broken)
		}
	}
}

// TestAllowed: the budget's edges.
func TestAllowed(t *testing.T) {
	p := egressip.RecyclePolicy{MaxPerHour: 2, Backoff: 10 * time.Minute}
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	rec := func(ms ...int) []egressip.Recycle {
		var out []egressip.Recycle
		for _, m := range ms {
			out = append(out, egressip.Recycle{At: at(m)})
		}
		return out
	}
	cases := map[string]struct {
		recent         []egressip.Recycle
		healthy, floor int
		now, wantNext  time.Time
		wantN          int
	}{
		"Fresh":           {nil, 5, 4, at(0), time.Time{}, 1},
		"BelowFloor":      {nil, 3, 4, at(0), time.Time{}, 0},
		"InBackoff":       {rec(0), 5, 4, at(5), at(10), 0},
		"PastBackoff":     {rec(0), 5, 4, at(10), time.Time{}, 1},
		"DoubledBackoff":  {rec(0, 10), 5, 4, at(25), at(30), 0},
		"HourSpent":       {rec(0, 30), 5, 4, at(55), at(60), 0},
		"HourFreed":       {rec(0, 30), 5, 4, at(61), time.Time{}, 1},
		"FromTheFuture":   {rec(90), 5, 4, at(0), at(10), 0},
		"NoBackoffBudget": {nil, 5, 4, at(0), time.Time{}, 1},
	}
	for name, tc := range cases {
		n, next := p.Allowed(tc.recent, tc.healthy, tc.floor, tc.now)
		if n != tc.wantN || !next.Equal(tc.wantNext) {
			t.Errorf("%s: %d, next %v; want %d, next %v", name, n, next, tc.wantN, tc.wantNext)
		}
	}
	if n, _ := (egressip.RecyclePolicy{MaxPerHour: 3}).Allowed(nil, 5, 4, at(0)); n != 3 {
		t.Errorf("without a back-off the hour's whole budget may start: %d", n)
	}
}
