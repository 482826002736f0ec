package egressip

import (
	"fmt"
	"sort"
	"strings"
	"time"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
)

// Recycling: an address targets keep banning is burned, and its proxy is
// replaced so that the new one draws another address. Storms are
// impossible by construction: a fleet starts at most MaxPerHour recycles
// in any hour, waits a back-off after each that doubles with every
// recycle of the last hour, and starts none while its healthy proxies
// are below its floor.

// RecyclePolicy says when an address is burned and how fast a fleet may
// recycle. Zero ByDomains and Times recycle nothing.
type RecyclePolicy struct {
	// ByDomains: an address banned by at least this many distinct
	// domains within Window is burned.
	ByDomains int
	// Times: an address banned by one domain at least this many times
	// within Window is burned.
	Times int
	// Window is how far back bans count.
	Window time.Duration
	// MaxPerHour bounds the recycles a fleet starts in any hour (at least
	// one).
	MaxPerHour int
	// Backoff is the least wait after a recycle before the next; it
	// doubles with each other recycle of the last hour.
	Backoff time.Duration
}

// PolicyOf reads spec.recycling, its defaults where unset; nil for none.
func PolicyOf(r *fleetv1alpha1.Recycling) *RecyclePolicy {
	if r == nil {
		return nil
	}
	p := &RecyclePolicy{Window: time.Hour, MaxPerHour: 2, Backoff: 10 * time.Minute}
	if r.BannedByDomains != nil {
		p.ByDomains = int(*r.BannedByDomains)
	}
	if r.BannedTimes != nil {
		p.Times = int(*r.BannedTimes)
	}
	if r.Window != nil && r.Window.Duration > 0 {
		p.Window = r.Window.Duration
	}
	if r.MaxPerHour != nil && *r.MaxPerHour > 0 {
		p.MaxPerHour = int(*r.MaxPerHour)
	}
	if r.Backoff != nil && r.Backoff.Duration >= 0 {
		p.Backoff = r.Backoff.Duration
	}
	return p
}

// Ban is one ban in an address's history.
type Ban struct {
	Domain string
	At     time.Time
}

// Burned says whether an address with bans is burned at now, and why.
func (p RecyclePolicy) Burned(bans []Ban, now time.Time) (bool, string) {
	if p.ByDomains <= 0 && p.Times <= 0 {
		return false, ""
	}
	from := now.Add(-p.Window)
	per := map[string]int{}
	for _, b := range bans {
		if b.At.After(from) && !b.At.After(now) {
			per[b.Domain]++
		}
	}
	if p.ByDomains > 0 && len(per) >= p.ByDomains {
		// The threshold, not the count: the reason stays the same while
		// more bans come, so that saying it again writes nothing.
		return true, fmt.Sprintf("banned by %d or more domains within %s", p.ByDomains, p.Window)
	}
	if p.Times > 0 {
		domains := make([]string, 0, len(per))
		for d := range per {
			domains = append(domains, d)
		}
		sort.Strings(domains)
		for _, d := range domains {
			if per[d] >= p.Times {
				return true, fmt.Sprintf("banned %d or more times by one domain within %s", p.Times, p.Window)
			}
		}
	}
	return false, ""
}

// Kinds of recycle reason (ReasonKind): a metric label, where the
// reason's text would make a series per threshold.
const (
	ReasonDomains   = "domains"
	ReasonTimes     = "times"
	ReasonDiversity = "diversity"
	ReasonOther     = "other"
)

// BeyondLimitReason is in the reason of a recycle of a proxy beyond a cap
// of spec.diversity (replaceBeyondLimit), after its address.
const BeyondLimitReason = "beyond spec.diversity: "

// ReasonKind says which of Burned's rules a recorded reason is of:
// ReasonDomains (banned by K domains), ReasonTimes (banned K times by one
// domain), ReasonDiversity (beyond a cap of spec.diversity), else
// ReasonOther.
func ReasonKind(reason string) string {
	switch {
	case strings.Contains(reason, "or more domains within"):
		return ReasonDomains
	case strings.Contains(reason, "or more times by one domain within"):
		return ReasonTimes
	case strings.Contains(reason, BeyondLimitReason):
		return ReasonDiversity
	}
	return ReasonOther
}

// Recycle is one recycle a fleet started.
type Recycle struct {
	Proxy, IP, Reason string
	At                time.Time
}

// Allowed says how many recycles the fleet may start at now, after the
// recycles it started (any order), with healthy proxies serving and its
// floor (the fewest healthy proxies it keeps: replicas - maxUnavailable):
// none while healthy is below the floor, none before the back-off after
// the last recycle has passed, and no more than keep any hour within
// MaxPerHour. When none may start, next is the soonest one may (zero
// when only the floor stops it).
func (p RecyclePolicy) Allowed(recent []Recycle, healthy, floor int, now time.Time) (n int, next time.Time) {
	per := max(p.MaxPerHour, 1)
	if healthy < floor {
		return 0, time.Time{}
	}
	ats := make([]time.Time, 0, len(recent))
	for _, r := range recent {
		if r.At.After(now.Add(-time.Hour)) {
			// One from the future (a skewed clock) counts as now: it
			// never frees the budget early.
			ats = append(ats, NotAfter(r.At, now))
		}
	}
	sort.Slice(ats, func(i, j int) bool { return ats[i].Before(ats[j]) })
	if len(ats) > 0 {
		wait := p.Backoff
		for range min(len(ats)-1, 16) {
			wait *= 2
		}
		if until := ats[len(ats)-1].Add(wait); now.Before(until) {
			return 0, until
		}
	}
	if len(ats) >= per {
		// The hour's budget is spent: the oldest of the hour frees it.
		return 0, ats[len(ats)-per].Add(time.Hour)
	}
	// A back-off lets one start at a time.
	if p.Backoff > 0 {
		return 1, time.Time{}
	}
	return per - len(ats), time.Time{}
}

// NotAfter is t, or now when t is later: a time from a skewed clock's
// future counts as now.
func NotAfter(t, now time.Time) time.Time {
	if t.After(now) {
		return now
	}
	return t
}
