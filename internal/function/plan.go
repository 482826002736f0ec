package function

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
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
	// Refused is true when the provider refuses it by policy.
	Refused bool
	// Revision is the template revision it was made from.
	Revision string
	// CredentialsOutdated: its instance accepts the auth Secret's previous
	// credentials only and cannot change them in place (a GCP VM), so it
	// is replaced as a Proxy of an old revision is.
	CredentialsOutdated bool
	// Duplicate: another member leaves from the same egress IP.
	Duplicate bool
	// Beyond says which cap of spec.diversity the member is beyond; "" when
	// none.
	Beyond string
	// Recycle says why it is replaced to draw another egress IP
	// (spec.recycling), as its due reason; recycleWhy is why its address
	// is burned, which its replacement records. "" when it is not.
	Recycle, recycleWhy string
	// RecycleOf, RecycleIP, RecycleReason and RecycleAt are, on a member
	// made to recycle another, that one's name and egress IP, why and
	// when (its recycle-* annotations).
	RecycleOf, RecycleIP, RecycleReason string
	RecycleAt                           time.Time
	// RecycleGrant is the pool's recycle grant it was made on (its
	// AnnotationRecycleGrant); "" for none.
	RecycleGrant string
	// Streak counts the unhealthy proxies replaced in a row, none of which
	// turned Ready, that led to this member.
	Streak int
	// DrainSince is when it began to drain (LabelDrainingSince), as
	// observed; Draining says the plan has it drain. DrainSeen says every
	// live egress-discovery replica saw it draining, in the LeaseSummary
	// it wrote last.
	DrainSince time.Time
	Draining   bool
	DrainSeen  bool
	// spec is its observed spec, which a Proxy of an old revision keeps
	// until it goes.
	spec *structpb.Value
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
	// leaseWait says one waits for a lease to end or a drain to be
	// seen: the fleet is composed again when its LeaseSummaries change
	// (a watch event) or, unannounced, at leasesChange.
	leaseWait bool
	// leasesChange is the soonest the fleet's LeaseSummaries say
	// otherwise with none written (leaseView.next).
	leasesChange time.Time
	// due counts the Ready holders due for replacement, replaced or not
	// yet: what a pool asks its fleet's budget for; dueFree those of them
	// no lease holds.
	due, dueFree int
	// repairsWanted counts the holders that are down and due, replaced or
	// waiting; repairsInFlight the replacements of proxies that are down
	// not Ready yet: what a pool asks its fleet's repairs for.
	repairsWanted, repairsInFlight int
}

// decide computes the fleet's next state from what was observed. It is a
// pure function of its arguments: the same observation at the same time
// gives the same plan, and a decision is only ever taken on observed state,
// so no create/delete loop can arise. The steps run in this order, each on
// the replicas the one before left.
func decide(f *Fleet, observed []*member, leasesKnown bool, now time.Time) *plan {
	pl := newPlanner(f, observed, leasesKnown, now)
	pl.scaleDown()
	pl.scaleUp()
	pl.replace()
	pl.complete()
	return pl.result()
}

// planner holds one decision in progress.
type planner struct {
	f           *Fleet
	leasesKnown bool
	now         time.Time
	p           *plan
	replicas    []*replica
	// next is the next free ordinal; ready and total count the members the
	// plan keeps so far. used holds the ordinals taken, once a pool's
	// ran past its span.
	next, ready, total int
	used               map[int]bool
	observed           []*member
}

// newPlanner groups the observed members into replicas: members replacing
// one that still exists belong to that member's replica.
func newPlanner(f *Fleet, observed []*member, leasesKnown bool, now time.Time) *planner {
	pl := &planner{f: f, leasesKnown: leasesKnown, now: now, p: &plan{}, total: len(observed), next: f.OrdinalBase, observed: observed}
	byOrdinal := map[int]*member{}
	for _, m := range observed {
		byOrdinal[m.Ordinal] = m
		pl.next = max(pl.next, m.Ordinal+1)
		if m.Ready {
			pl.ready++
		}
	}
	byReplica := map[int]*replica{}
	for _, m := range observed {
		if _, ok := byOrdinal[m.Replaces]; ok && m.Replaces != m.Ordinal {
			continue
		}
		s := &replica{holder: m}
		pl.replicas = append(pl.replicas, s)
		byReplica[m.Ordinal] = s
	}
	for _, m := range observed {
		if s, ok := byReplica[m.Replaces]; ok && m.Replaces != m.Ordinal {
			if s.replacement == nil || m.Ordinal > s.replacement.Ordinal {
				s.replacement = m
			}
		}
	}
	return pl
}

// newMember makes a member of the current revision with the next free
// ordinal, in zone if the fleet still has it, else in its least crowded
// zone.
func (pl *planner) newMember(zone string, replaces, generation int) *member {
	if !slices.Contains(pl.f.Zones, zone) {
		zone = pl.emptiestZone()
	}
	m := &member{Ordinal: pl.nextOrdinal(), Zone: zone, Replaces: replaces, Created: pl.now, Generation: generation, Revision: pl.f.Revision}
	return m
}

// nextOrdinal is the next free ordinal. A pool's stay within its span:
// past its end (ten million replacements on), they start again from the
// lowest its members do not hold, so that a pool never names a Proxy in
// the next pool's span.
func (pl *planner) nextOrdinal() int {
	if pl.f.Pool == "" || pl.next < pl.f.OrdinalBase+fleetv1alpha1.PoolOrdinalSpan {
		pl.next++
		return pl.next - 1
	}
	if pl.used == nil {
		// Every ordinal observed, removed in this plan or not (Crossplane
		// has not deleted it yet), and every one this plan made.
		pl.used = map[int]bool{}
		for _, m := range pl.observed {
			pl.used[m.Ordinal] = true
		}
		for _, s := range pl.replicas {
			for _, m := range []*member{s.holder, s.replacement} {
				if m != nil {
					pl.used[m.Ordinal] = true
				}
			}
		}
	}
	o := pl.f.OrdinalBase
	for pl.used[o] {
		o++
	}
	pl.used[o] = true
	return o
}

// zoneLoad counts the members planned so far in each zone, replacements
// included.
func (pl *planner) zoneLoad() map[string]int {
	c := map[string]int{}
	for _, s := range pl.replicas {
		c[s.holder.Zone]++
		if s.replacement != nil {
			c[s.replacement.Zone]++
		}
	}
	return c
}

// emptiestZone is the fleet's zone with the fewest members planned so far,
// replacements included; the first listed among equals.
func (pl *planner) emptiestZone() string {
	c := pl.zoneLoad()
	zone := pl.f.Zones[0]
	for _, z := range pl.f.Zones {
		if c[z] < c[zone] {
			zone = z
		}
	}
	return zone
}

// replacementZone is where h's replacement goes: h's zone, unless the
// fleet has a zone with at least two members fewer (one added to
// spec.zones), which a replacement then fills: zones are rebalanced
// through replacement and scaling, never by moving a running proxy.
func (pl *planner) replacementZone(h *member) string {
	c := pl.zoneLoad()
	z := pl.emptiestZone()
	if !slices.Contains(pl.f.Zones, h.Zone) || c[h.Zone]-1 > c[z] {
		return z
	}
	return h.Zone
}

// outdated says why a member is not of the fleet's current template (see
// Fleet.outdated); "" when it is current.
func (pl *planner) outdated(m *member) string { return pl.f.outdated(m) }

// forget takes a member out of the counts of what the plan keeps.
func (pl *planner) forget(m *member) {
	pl.total--
	if m.Ready {
		pl.ready--
	}
}

// drainSettle is how long an autoscaled fleet's proxy drains before it is
// removed: long enough for every discovery replica to see it drain.
const drainSettle = 10 * time.Second

// drained says whether m has drained for drainSettle, and every live
// discovery replica saw it draining: none hands it out any more.
func (pl *planner) drained(m *member) bool {
	return !m.DrainSince.IsZero() && pl.now.Sub(m.DrainSince) >= drainSettle && m.DrainSeen
}

// free says whether no crawler can hold a lease on m, so that it may go
// while it still serves: the leases are known, none is listed on it, and
// it drained. The summaries are up to a few seconds old, so a proxy that
// was handed out until now may have a lease none lists yet; one that
// drained, seen by every replica, has none it was not already listed
// with.
func (pl *planner) free(m *member) bool {
	return pl.leasesKnown && !m.Leased && pl.drained(m)
}

// scaleDownOrder sorts the replicas in the order scaleDown drops them:
// for an autoscaled fleet those draining already first, so that the choice
// stays put from one composition to the next; then the unhealthiest, then
// those of an old template or a removed zone, then from the most crowded
// zone, then the newest.
func (pl *planner) scaleDownOrder() {
	perZone := zoneCounts(pl.replicas)
	sort.SliceStable(pl.replicas, func(i, j int) bool {
		a, b := pl.replicas[i].holder, pl.replicas[j].holder
		if da, db := !a.DrainSince.IsZero(), !b.DrainSince.IsZero(); pl.f.autoscale != nil && da != db {
			return da
		}
		if a.Ready != b.Ready {
			return !a.Ready
		}
		if oa, ob := pl.outdated(a) != "", pl.outdated(b) != ""; oa != ob {
			return oa
		}
		if perZone[a.Zone] != perZone[b.Zone] {
			return perZone[a.Zone] > perZone[b.Zone]
		}
		return a.Ordinal > b.Ordinal
	})
}

// leasedOrUnknown says whether a crawler may hold a lease on a replica's
// holder or replacement: the autoscaler removes neither then.
func (pl *planner) leasedOrUnknown(s *replica) bool {
	return !pl.leasesKnown || s.holder.Leased || (s.replacement != nil && s.replacement.Leased)
}

// drains has an autoscaled fleet's replica drain before it goes, and says
// whether it still must: discovery hands a draining proxy to nobody, so one
// leased while its removal is decided stays.
func (pl *planner) drains(s *replica) bool {
	h, r := s.holder, s.replacement
	if pl.f.autoscale == nil || pl.drained(h) && (r == nil || pl.drained(r)) {
		return false
	}
	h.Draining = true
	if r != nil {
		r.Draining = true
	}
	pl.p.leaseWait = true
	return true
}

// scaleDown drops whole replicas in scaleDownOrder. The autoscaler drops
// only replicas no crawler holds a lease on, once they drained.
func (pl *planner) scaleDown() {
	if len(pl.replicas) <= pl.f.Replicas {
		return
	}
	pl.scaleDownOrder()
	drop := len(pl.replicas) - pl.f.Replicas
	kept := pl.replicas[:0:0]
	held := 0
	for _, s := range pl.replicas {
		switch {
		case drop == 0:
			kept = append(kept, s)
		case pl.f.autoscale != nil && pl.leasedOrUnknown(s):
			// The fleet shrinks further as leases end.
			kept = append(kept, s)
			held++
		case pl.drains(s):
			drop--
			kept = append(kept, s)
		default:
			drop--
			pl.p.removed++
			pl.forget(s.holder)
			if s.replacement != nil {
				pl.forget(s.replacement)
			}
		}
	}
	pl.replicas = kept
	if held > 0 && drop > 0 {
		pl.p.leaseWait = true
		pl.p.blocked = append(pl.p.blocked, fmt.Sprintf("%d proxies above the %d aimed at stay until their leases end", drop, pl.f.Replicas))
	}
}

// scaleUp adds replicas in the least crowded zones.
func (pl *planner) scaleUp() {
	for len(pl.replicas) < pl.f.Replicas {
		pl.replicas = append(pl.replicas, &replica{holder: pl.newMember(pl.emptiestZone(), -1, 0)})
		pl.p.created++
		pl.total++
	}
}

// dueReason says why a holder is due for replacement: unavailable for
// longer than replaceUnhealthyAfter, of an old template or a removed zone
// (unless the rollout is paused), or older than maxAge; "" when it is not.
func (pl *planner) dueReason(h *member) string {
	f, now := pl.f, pl.now
	outdated := pl.outdated(h)
	if f.Paused {
		outdated = ""
	}
	switch {
	case h.Created.Equal(now):
		return "" // made in this very plan
	case h.Refused && outdated == "":
		return "" // a replacement would be refused alike
	case !h.Ready && !h.Since.IsZero() && now.Sub(h.Since) >= f.unhealthyHold(h) && now.Sub(h.Created) >= f.unhealthyHold(h):
		return fmt.Sprintf("unavailable since %s", h.Since.UTC().Format(time.RFC3339))
	case outdated != "":
		return outdated
	case h.Recycle != "" && !f.Paused:
		return h.Recycle
	case f.MaxAge > 0 && now.Sub(h.Created) >= f.MaxAge:
		return fmt.Sprintf("older than maxAge %s", f.MaxAge)
	}
	return ""
}

// maxUnhealthyHold caps the back-off of replacements that never turn Ready.
const maxUnhealthyHold = time.Hour

// unhealthyHold is how long an unready member is left to recover before it
// is replaced: replaceUnhealthyAfter, doubled for each replacement in a row
// that led to it without turning Ready, up to an hour.
func (f *Fleet) unhealthyHold(m *member) time.Duration {
	d := f.ReplaceUnhealthyAfter
	for range min(m.Streak, 16) {
		if d *= 2; d >= maxUnhealthyHold {
			return max(maxUnhealthyHold, f.ReplaceUnhealthyAfter)
		}
	}
	return d
}

// unhealthyInFlight counts the replacements of unhealthy proxies that are
// not Ready yet, besides except.
func (pl *planner) unhealthyInFlight(except *member) int {
	n := 0
	for _, s := range pl.replicas {
		for _, m := range []*member{s.holder, s.replacement} {
			// In flight while it has its chance to turn Ready; not a
			// refused one, which the provider will not make, nor a
			// holder that only carries on its line's streak.
			if m != nil && m != except && !m.Ready && m.Streak > 0 && !m.Refused && pl.now.Sub(later(m.Since, m.Created)) < pl.f.unhealthyHold(m) {
				n++
			}
		}
	}
	return n
}

// dropReplacement drops a replica's replacement that is not serving yet
// and should not go on: one of an older template, which a newer one
// overtakes, and one replacing a proxy that is down which never turned
// Ready, after its own, longer hold; dropping either costs nothing. It
// returns the unhealthy streak of a replacement dropped for the latter.
func (pl *planner) dropReplacement(s *replica) int {
	r := s.replacement
	if r == nil || r.Ready || r.Created.Equal(pl.now) {
		return 0
	}
	stale := !pl.f.Paused && pl.outdated(r) != ""
	failed := r.Streak > 0 && pl.now.Sub(later(r.Since, r.Created)) >= pl.f.unhealthyHold(r)
	// A recycle whose replacement does not come up within the progress
	// deadline is given up: it holds the surge slot no longer, and the
	// holder is recycled again only as the policy's bounds allow.
	abandoned := r.RecycleOf != "" && pl.now.Sub(r.Created) >= pl.f.ProgressDeadline
	if !stale && !failed && !abandoned {
		return 0
	}
	pl.forget(r)
	s.replacement = nil
	pl.p.removed++
	if abandoned && r.RecycleOf == s.holder.Name {
		// The holder is no longer being recycled: only a new pick,
		// within the policy's bounds, recycles it again.
		s.holder.Recycle, s.holder.recycleWhy = "", ""
		pl.p.blocked = append(pl.p.blocked, fmt.Sprintf("the recycle of %s was given up: its replacement %s was not Ready within progressDeadline %s", s.holder.Name, r.Name, pl.f.ProgressDeadline))
	}
	if stale {
		return 0
	}
	return r.Streak
}

// replace gives each holder that is due a surge replacement in its zone,
// within maxSurge; without surge, a drained holder may go first within
// maxUnavailable, and a holder that is down is replaced in place whatever
// maxSurge is, which takes nothing Ready away. Replacements that should not
// go on are dropped first; then holders that are down come first, the line
// that failed least first, so that one line that keeps failing does not
// starve the others of the few replacements of unhealthy proxies allowed
// in flight.
func (pl *planner) replace() {
	f := pl.f
	for _, s := range pl.replicas {
		if failed := pl.dropReplacement(s); failed > s.holder.Streak {
			// The holder carries the line's streak on while it waits.
			s.holder.Streak = failed
		}
	}
	sort.SliceStable(pl.replicas, func(i, j int) bool { return downFirst(pl.replicas[i].holder, pl.replicas[j].holder) })
	for _, s := range pl.replicas {
		h := s.holder
		if s.reason = pl.dueReason(h); s.reason == "" || s.replacement != nil {
			continue
		}
		if pl.f.autoscale != nil && h.Draining {
			// The autoscaler removes it: no replacement is made.
			continue
		}
		streak := 0
		if !h.Ready {
			// Replacing a proxy that is down: at most max(maxSurge, 1)
			// such replacements are under way at once, so that a backend
			// that cannot run proxies is not flooded with them.
			streak = h.Streak + 1
			pl.p.repairsWanted++
			if limit := f.repairLimit(); pl.unhealthyInFlight(h) >= limit {
				pl.p.blocked = append(pl.p.blocked, fmt.Sprintf("%s waits: %d replacements of unhealthy proxies are not Ready yet", h.Name, limit))
				continue
			}
		}
		if pl.total < f.Replicas+f.MaxSurge {
			s.replacement = pl.newMember(pl.replacementZone(h), h.Ordinal, h.Generation+1)
			s.replacement.Streak = streak
			if h.Recycle != "" && h.Ready {
				// A recycle starts: the replacement carries it.
				s.replacement.RecycleOf, s.replacement.RecycleIP, s.replacement.RecycleReason, s.replacement.RecycleAt = h.Name, h.EgressIP, h.recycleWhy, pl.now
				if pr := f.poolRecycling; pr != nil {
					s.replacement.RecycleGrant = pr.grant.since
				}
			}
			pl.p.created++
			pl.total++
			continue
		}
		if h.Recycle != "" && h.Ready {
			// A recycle replaces a proxy that serves: surge first, never
			// in place.
			pl.p.blocked = append(pl.p.blocked, fmt.Sprintf("%s waits for a surge slot to be recycled", h.Name))
			continue
		}
		if !pl.goesFirst(h) {
			continue
		}
		if h.Ready {
			pl.ready--
		}
		s.holder = pl.newMember(pl.replacementZone(h), -1, h.Generation+1)
		s.holder.Streak = streak
		pl.p.removed++
		pl.p.created++
	}
	sort.SliceStable(pl.replicas, func(i, j int) bool { return pl.replicas[i].holder.Ordinal < pl.replicas[j].holder.Ordinal })
}

// downFirst orders holders for replacement: those that are down first, the
// line that failed least first; then those already draining, which keep
// their place in the unavailability budget; then those no crawler holds a
// lease on, so
// that a leased proxy, which must wait for its leases to end, takes the
// surge last instead of holding it while others could go; then by ordinal.
func downFirst(a, b *member) bool {
	if a.Ready != b.Ready {
		return !a.Ready
	}
	if !a.Ready && a.Streak != b.Streak {
		return a.Streak < b.Streak
	}
	if da, db := !a.DrainSince.IsZero(), !b.DrainSince.IsZero(); da != db {
		return da
	}
	if a.Leased != b.Leased {
		return !a.Leased
	}
	return a.Ordinal < b.Ordinal
}

// goesFirst decides, when no surge is left, whether a due holder goes
// before its replacement is made: one that is down serves nobody and goes
// at once; with maxUnavailable, a drained healthy one may go first. It
// records why one that may not waits.
func (pl *planner) goesFirst(h *member) bool {
	f := pl.f
	switch {
	case !h.Ready && pl.down(h):
		return true
	case f.MaxSurge == 0 && (h.Leased || !pl.leasesKnown):
		pl.p.blocked = append(pl.p.blocked, fmt.Sprintf("%s waits for its leases to drain", h.Name))
		pl.p.leaseWait = true
		// Only as many drain at once as may be unavailable: the
		// others keep taking leases until it is their turn. Holders
		// already draining come first (downFirst), so they keep it.
		if !h.Ready || pl.ready-1 >= f.Replicas-f.MaxUnavailable {
			h.Draining = true
			if h.Ready {
				pl.ready--
			}
		}
		return false
	case f.MaxSurge == 0 && (!h.Ready || pl.ready-1 >= f.Replicas-f.MaxUnavailable) && !pl.free(h):
		// No summary lists a lease on it, but one handed out since
		// they were written may be on none yet: it drains first, and
		// goes once every discovery replica saw it draining.
		pl.p.blocked = append(pl.p.blocked, fmt.Sprintf("%s drains before it goes", h.Name))
		pl.p.leaseWait = true
		h.Draining = true
		if h.Ready {
			pl.ready--
		}
		return false
	case f.MaxSurge == 0 && (!h.Ready || pl.ready-1 >= f.Replicas-f.MaxUnavailable):
		return true
	}
	pl.p.blocked = append(pl.p.blocked, fmt.Sprintf("%s waits for surge capacity (maxSurge %d)", h.Name, f.MaxSurge))
	return false
}

// down reports whether an unready member has been unready for longer than
// replaceUnhealthyAfter: one that merely flickered may still serve the
// crawlers holding leases on it.
func (pl *planner) down(m *member) bool {
	return !m.Ready && pl.now.Sub(m.Since) >= pl.f.ReplaceUnhealthyAfter
}

// complete lets a holder go once its replacement is Ready, and, if it still
// serves, only when no crawler holds a lease on it and the fleet stays at or
// above replicas - maxUnavailable ready proxies.
func (pl *planner) complete() {
	f := pl.f
	for _, s := range pl.replicas {
		r := s.replacement
		if r == nil {
			continue
		}
		h := s.holder
		switch {
		case !r.Ready && r.Created.Equal(pl.now):
			// Made in this very plan: counted as created.
		case s.reason == "" && !f.Paused && pl.outdated(r) != "" && pl.outdated(h) == "":
			pl.rollBack(s)
		case !r.Ready:
			pl.p.inFlight++
		case !h.Ready && (pl.free(h) || pl.down(h)):
			s.holder, s.replacement = r, nil
			pl.p.removed++
		case !h.Ready && pl.leasesKnown && !h.Leased:
			// It serves nobody now, and no summary lists a lease on it;
			// but one handed out just before it failed may be on none
			// yet (a replica writes its summary only so often, and one
			// that cannot write keeps its last counting): it drains,
			// which costs nothing, and goes once every discovery
			// replica saw it draining.
			h.Draining = true
			pl.waits("%s drains before it goes", h.Name)
		case h.Leased || !pl.leasesKnown:
			pl.waits("%s waits for its leases to drain", h.Name)
		case pl.ready-1 < f.Replicas-f.MaxUnavailable:
			pl.p.inFlight++
			pl.p.blocked = append(pl.p.blocked, fmt.Sprintf("%s waits: removing it would leave fewer than %d ready proxies", h.Name, f.Replicas-f.MaxUnavailable))
		case !pl.free(h):
			// Unleased as the summaries say; it drains, and goes once
			// every discovery replica saw it draining (also when it is
			// no longer due: recovered, or the rollout paused).
			h.Draining = true
			pl.waits("%s drains before it goes", h.Name)
		default:
			pl.ready--
			s.holder, s.replacement = r, nil
			pl.p.removed++
		}
	}
}

// rollBack handles a replica rolled back: the holder is of the current
// template again, and its replacement, of the abandoned one, goes instead,
// once no lease names it; the holder stays meanwhile.
func (pl *planner) rollBack(s *replica) {
	r := s.replacement
	if !pl.free(r) {
		r.Draining = true
		pl.waits("%s, of an abandoned template, waits for its leases to drain", r.Name)
		return
	}
	pl.forget(r)
	s.replacement = nil
	pl.p.removed++
}

// waits counts a replacement in flight whose holder waits for a lease to
// end or a drain to be seen, and says why.
func (pl *planner) waits(format string, args ...any) {
	pl.p.inFlight++
	pl.p.blocked = append(pl.p.blocked, fmt.Sprintf(format, args...))
	pl.p.leaseWait = true
}

// result lists the members the plan keeps, by ordinal. A holder whose
// replacement is Ready, and which only waits for its leases or the Ready
// floor, drains: it takes no new leases, and once it began to drain it
// keeps draining while it is being replaced, so that its drain start, which
// bounds its leases, does not restart. Until then it serves as before, so
// a replacement booting costs no capacity.
func (pl *planner) result() *plan {
	for _, s := range pl.replicas {
		if r := s.replacement; r != nil && s.reason != "" && (r.Ready || !s.holder.DrainSince.IsZero() && !pl.down(r)) {
			// Its replacement serves, or served and only flickered:
			// the holder goes once its leases end. A replacement down
			// for good gives the holder its leases back.
			s.holder.Draining = true
		}
		if s.reason != "" && s.holder.Ready {
			pl.p.due++
			if !s.holder.Leased {
				pl.p.dueFree++
			}
		}
		pl.p.keep = append(pl.p.keep, s.holder)
		if s.replacement != nil {
			pl.p.keep = append(pl.p.keep, s.replacement)
		}
	}
	sort.Slice(pl.p.keep, func(i, j int) bool { return pl.p.keep[i].Ordinal < pl.p.keep[j].Ordinal })
	pl.p.repairsInFlight = pl.unhealthyInFlight(nil)
	return pl.p
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
