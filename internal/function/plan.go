package function

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// member is one observed Proxy of the fleet.
type member struct {
	Ordinal  int
	Name     string
	Zone     string
	Created  time.Time
	Ready    bool
	Since    time.Time // when Ready last changed
	Healthy  bool
	Endpoint string
	EgressIP string
	Error    string
	// Replaces is the ordinal this member was created to replace, or -1.
	Replaces   int
	Generation int
	// Leased is true when a crawler holds an unexpired lease on it.
	Leased bool
}

// replica is one of the spec.replicas places of the fleet: the member
// holding it and, while it is being replaced, its replacement.
type replica struct {
	holder      *member
	replacement *member
	reason      string // why the holder is being replaced
}

// plan is what the function decides for one request.
type plan struct {
	// keep are the members (observed or new) the fleet keeps, by ordinal.
	keep []*member
	// created and removed are for the fleet's message.
	created, removed int
	inFlight         int
	// blocked says why a due replacement is waiting.
	blocked []string
}

// decide computes the fleet's next state from what was observed. It is a
// pure function of its arguments: the same observation at the same time
// gives the same plan, and a decision is only ever taken on observed state,
// so no create/delete loop can arise.
func decide(f *Fleet, observed []*member, leasesKnown bool, now time.Time) *plan {
	p := &plan{}
	byOrdinal := map[int]*member{}
	next := 0
	for _, m := range observed {
		byOrdinal[m.Ordinal] = m
		next = max(next, m.Ordinal+1)
	}

	// Members replacing one that still exists belong to that member's replica.
	var replicas []*replica
	byReplica := map[int]*replica{}
	for _, m := range observed {
		if _, ok := byOrdinal[m.Replaces]; ok && m.Replaces != m.Ordinal {
			continue
		}
		s := &replica{holder: m}
		replicas = append(replicas, s)
		byReplica[m.Ordinal] = s
	}
	for _, m := range observed {
		if s, ok := byReplica[m.Replaces]; ok && m.Replaces != m.Ordinal {
			if s.replacement == nil || m.Ordinal > s.replacement.Ordinal {
				s.replacement = m
			}
		}
	}

	ready := 0
	for _, m := range observed {
		if m.Ready {
			ready++
		}
	}
	total := len(observed)

	// Scale down: drop whole replicas, unhealthiest first, then from the most
	// crowded zone, then the newest.
	if len(replicas) > f.Replicas {
		perZone := zoneCounts(replicas)
		sort.SliceStable(replicas, func(i, j int) bool {
			a, b := replicas[i].holder, replicas[j].holder
			if a.Ready != b.Ready {
				return !a.Ready
			}
			if perZone[a.Zone] != perZone[b.Zone] {
				return perZone[a.Zone] > perZone[b.Zone]
			}
			return a.Ordinal > b.Ordinal
		})
		drop := len(replicas) - f.Replicas
		for _, s := range replicas[:drop] {
			p.removed++
			total--
			if s.holder.Ready {
				ready--
			}
			if s.replacement != nil {
				total--
				if s.replacement.Ready {
					ready--
				}
			}
		}
		replicas = replicas[drop:]
	}

	// Scale up: new replicas in the least crowded zones.
	for len(replicas) < f.Replicas {
		perZone := zoneCounts(replicas)
		zone := f.Zones[0]
		for _, z := range f.Zones {
			if perZone[z] < perZone[zone] {
				zone = z
			}
		}
		m := &member{Ordinal: next, Zone: zone, Replaces: -1, Created: now}
		next++
		replicas = append(replicas, &replica{holder: m})
		p.created++
		total++
	}

	// Replacement: a holder older than maxAge, or unavailable for longer
	// than replaceUnhealthyAfter, gets a surge replacement in its zone.
	sort.SliceStable(replicas, func(i, j int) bool { return replicas[i].holder.Ordinal < replicas[j].holder.Ordinal })
	for _, s := range replicas {
		h := s.holder
		if h.Created.Equal(now) {
			continue // made in this very plan
		}
		switch {
		case !h.Ready && !h.Since.IsZero() && now.Sub(h.Since) >= f.ReplaceUnhealthyAfter && now.Sub(h.Created) >= f.ReplaceUnhealthyAfter:
			s.reason = fmt.Sprintf("unavailable since %s", h.Since.UTC().Format(time.RFC3339))
		case f.MaxAge > 0 && now.Sub(h.Created) >= f.MaxAge:
			s.reason = fmt.Sprintf("older than maxAge %s", f.MaxAge)
		default:
			continue
		}
		if s.replacement != nil {
			continue
		}
		if total >= f.Replicas+f.MaxSurge {
			// No surge left. With maxUnavailable, a drained healthy holder
			// may go first and its replica is refilled at once.
			if f.MaxSurge == 0 && h.Ready && (h.Leased || !leasesKnown) {
				p.blocked = append(p.blocked, fmt.Sprintf("%s waits for its leases to drain", h.Name))
				continue
			}
			if f.MaxSurge == 0 && (!h.Ready || ready-1 >= f.Replicas-f.MaxUnavailable) {
				if h.Ready {
					ready--
				}
				s.holder = &member{Ordinal: next, Zone: h.Zone, Replaces: -1, Created: now, Generation: h.Generation + 1}
				next++
				p.removed++
				p.created++
				continue
			}
			p.blocked = append(p.blocked, fmt.Sprintf("%s waits for surge capacity (maxSurge %d)", h.Name, f.MaxSurge))
			continue
		}
		s.replacement = &member{Ordinal: next, Zone: h.Zone, Replaces: h.Ordinal, Created: now, Generation: h.Generation + 1}
		next++
		p.created++
		total++
	}

	// Completion: a holder goes once its replacement is Ready, and, if it
	// still serves, only when no crawler holds a lease on it and the fleet
	// stays at or above replicas - maxUnavailable ready proxies.
	for _, s := range replicas {
		r := s.replacement
		if r == nil {
			continue
		}
		h := s.holder
		switch {
		case !r.Ready:
			p.inFlight++
		case !h.Ready:
			s.holder, s.replacement = r, nil
			p.removed++
		case h.Leased || !leasesKnown:
			p.inFlight++
			p.blocked = append(p.blocked, fmt.Sprintf("%s waits for its leases to drain", h.Name))
		case ready-1 < f.Replicas-f.MaxUnavailable:
			p.inFlight++
			p.blocked = append(p.blocked, fmt.Sprintf("%s waits: removing it would leave fewer than %d ready proxies", h.Name, f.Replicas-f.MaxUnavailable))
		default:
			ready--
			s.holder, s.replacement = r, nil
			p.removed++
		}
	}

	for _, s := range replicas {
		p.keep = append(p.keep, s.holder)
		if s.replacement != nil {
			p.keep = append(p.keep, s.replacement)
		}
	}
	sort.Slice(p.keep, func(i, j int) bool { return p.keep[i].Ordinal < p.keep[j].Ordinal })
	return p
}

func zoneCounts(replicas []*replica) map[string]int {
	c := map[string]int{}
	for _, s := range replicas {
		c[s.holder.Zone]++
	}
	return c
}

// resourceName is the composition resource name of a member: stable for the
// member's life, never reused while it exists.
func resourceName(ordinal int) string { return "proxy-" + strconv.Itoa(ordinal) }

// ordinalOf reads a member's ordinal back from its resource name.
func ordinalOf(name string) (int, bool) {
	n, ok := strings.CutPrefix(name, "proxy-")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(n)
	return i, err == nil && i >= 0
}
