package allocator

import (
	"math"
	"slices"
	"sync"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
)

// How the gateway's connections spread over a fleet's proxies, so that a
// platform team sees rotation work: per fleet and proxy, this replica's
// connections in each of the last spreadMinutes minutes. The status page
// and the fleet metrics show the distribution over the fleet's serving
// proxies (those that carried none count as 0).

// spreadMinutes is the window the spread is shown over.
const spreadMinutes = 10

// spreadBook counts connections by fleet and proxy, per minute.
type spreadBook struct {
	mu      sync.Mutex
	fleets  map[string]map[string]*minuteCounts
	records int
}

// minuteCounts are one proxy's connections in the minutes of the window:
// n[i] of the minute at[i] (a Unix minute).
type minuteCounts struct {
	at [spreadMinutes]int64
	n  [spreadMinutes]uint32
}

// record counts a connection of fleet (namespace/name) through proxy.
func (b *spreadBook) record(fleet, proxy string, now time.Time) {
	m := now.Unix() / 60
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fleets == nil {
		b.fleets = map[string]map[string]*minuteCounts{}
	}
	ps := b.fleets[fleet]
	if ps == nil {
		ps = map[string]*minuteCounts{}
		b.fleets[fleet] = ps
	}
	c := ps[proxy]
	if c == nil {
		c = &minuteCounts{}
		ps[proxy] = c
	}
	i := m % spreadMinutes
	if c.at[i] != m {
		c.at[i], c.n[i] = m, 0
	}
	c.n[i]++
	if b.records++; b.records%4096 == 0 {
		b.pruneLocked(m)
	}
}

// pruneLocked forgets proxies with nothing in the window; b.mu is held.
func (b *spreadBook) pruneLocked(m int64) {
	for f, ps := range b.fleets {
		for p, c := range ps {
			if c.sum(m) == 0 {
				delete(ps, p)
			}
		}
		if len(ps) == 0 {
			delete(b.fleets, f)
		}
	}
}

// sum is c's connections in the window ending at minute m.
func (c *minuteCounts) sum(m int64) uint64 {
	var s uint64
	for i := range c.at {
		if c.at[i] > m-spreadMinutes && c.at[i] <= m {
			s += uint64(c.n[i])
		}
	}
	return s
}

// Spread is how a fleet's gateway connections of the window spread over
// its serving proxies: the total, how many proxies carried any, and the
// least, median, 90th percentile and most one proxy carried.
type Spread struct {
	Connections, Used, Serving int
	Min, Median, P90, Max      uint64
}

// ServingNames are the names of the serving proxies of ms.
func ServingNames(ms []catalog.Member) []string {
	var out []string
	for i := range ms {
		if ms[i].Serving() {
			out = append(out, ms[i].Name)
		}
	}
	return out
}

// of is the spread of fleet's connections over serving (the names of its
// serving proxies) as of now; those that carried none count as 0, and a
// proxy that carried some but serves no more counts too.
func (b *spreadBook) of(fleet string, serving []string, now time.Time) Spread {
	m := now.Unix() / 60
	b.mu.Lock()
	counts := make(map[string]uint64, len(serving))
	for p, c := range b.fleets[fleet] {
		if s := c.sum(m); s > 0 {
			counts[p] = s
		}
	}
	b.mu.Unlock()
	all := make([]uint64, 0, len(serving)+len(counts))
	for _, p := range serving {
		all = append(all, counts[p])
		delete(counts, p)
	}
	for _, n := range counts {
		all = append(all, n)
	}
	sp := Spread{Serving: len(serving)}
	if len(all) == 0 {
		return sp
	}
	slices.Sort(all)
	for _, n := range all {
		sp.Connections += int(n)
		if n > 0 {
			sp.Used++
		}
	}
	// Nearest rank: the smallest count at least q of the proxies carry
	// no more than.
	at := func(q float64) uint64 { return all[max(int(math.Ceil(q*float64(len(all))))-1, 0)] }
	sp.Min, sp.Median, sp.P90, sp.Max = all[0], at(0.5), at(0.9), all[len(all)-1]
	return sp
}

// RecordSpread counts a gateway connection of the fleet (namespace/name)
// through proxy, at now.
func (s *Allocator) RecordSpread(fleet, proxy string, now time.Time) {
	s.spread.record(fleet, proxy, now)
}

// SpreadOf is how the fleet's gateway connections spread over its
// serving proxies lately.
func (s *Allocator) SpreadOf(fleet string, serving []string, now time.Time) Spread {
	return s.spread.of(fleet, serving, now)
}
