package function

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/response"
	"google.golang.org/protobuf/types/known/structpb"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/egressip"
)

// Recycling: egress-discovery's summaries name the proxies whose address
// spec.recycling judges burned; the fleet replaces them through the
// rollout machinery (the holder due, a surge replacement, lease-aware,
// within maxUnavailable; never in place), within the policy's bounds. The
// replacement carries the decision (its recycle-* annotations), applied
// with it, and the fleet's status lists the day's recycles: the bounds
// count both, so neither a status written late nor one lost frees the
// budget, and the function keeps no state of its own.

const (
	// keyReason is the reason field of a status entry (a recycle, a
	// fault, a recommendation).
	keyReason = "reason"
	// recycleMemory is how long a recycle stays in the fleet's status.
	recycleMemory = 24 * time.Hour
	// maxRecycleRecords bounds the recycles the status lists.
	maxRecycleRecords = 100
	// maxReason bounds a recorded reason.
	maxReason = 256
	// maxWaiting bounds status.egress.recycleWaiting.
	maxWaiting = 1024
)

// recycling is what pickRecycles decided: the fleet's recycles of the last
// day, how many proxies leave from an address one of them gave back, and
// the members picked now, which settle records once the plan started them.
type recycling struct {
	records   []fleetv1alpha1.RecycleRecord
	seenAgain int
	picked    []*member
	started   []fleetv1alpha1.RecycleRecord
	// waiting are the burned members no recycle replaces, by name, with
	// why each waits; settle adds the picks the plan could not start.
	waiting map[string]string
	// atBound: some wait for the hourly bound or the back-off alone;
	// wanted counts them (a pool's fleet grants recycles by it).
	atBound bool
	wanted  int
}

// pickRecycles marks the members being recycled (Recycle, their due
// reason): those a replacement made to recycle them is replacing, and new
// ones among the burned (by name) as many as the policy allows now. A
// burned member is picked only while it serves (Ready, healthy, not
// draining, nothing replacing it yet), and not when its address is one a
// recycle gave back already (the backend hands the same one out again:
// recycling it again would loop); the floor is replicas - maxUnavailable
// healthy proxies; nothing is picked while the rollout is paused.
func pickRecycles(f *Fleet, members []*member, burned map[string]string, xrStatus *structpb.Struct, now time.Time) *recycling {
	fl := survey(members)
	rc := &recycling{records: mergeRecords(previousRecycles(xrStatus, now), members, now)}
	for _, m := range members {
		// In flight: the replacement names its holder.
		if h := fl.byName[m.RecycleOf]; h != nil && m.Replaces == h.Ordinal {
			h.Recycle, h.recycleWhy = "recycling: "+m.RecycleReason, m.RecycleReason
		}
	}
	gaveBack := rc.countSeenAgain(members)
	burned = withBeyondLimit(f, members, burned)
	if !f.recycles() || len(burned) == 0 {
		return rc
	}
	n, bound, atBound := f.recycleAllowance(members, rc.records, fl.healthy, now)
	rc.waiting = map[string]string{}
	for _, name := range recycleOrder(burned, fl.byName) {
		m := fl.byName[name]
		switch {
		case m == nil || m.Recycle != "":
			// Gone, or being recycled already.
		case f.Paused:
			rc.waiting[name] = "the rollout is paused (spec.rollout.paused)"
		case gaveBack[m.EgressIP] != "":
			rc.waiting[name] = "its address came back from a recycle of the last day: recycling it again would draw it again"
		case sameNetworkAgain(m, burned[name]):
			rc.waiting[name] = "a recycle beyond spec.diversity made it, and the backend gave it an address in the same network again: it is not replaced again for that"
		case !fl.recyclable(m):
			rc.waiting[name] = "it does not serve, is being replaced already, or is a replacement whose holder is still there"
		case n == 0:
			rc.waiting[name] = bound
			if atBound {
				rc.atBound = true
				rc.wanted++
			}
		default:
			why := truncateTo(burned[name], maxReason)
			m.Recycle, m.recycleWhy = "recycling: "+why, why
			rc.picked = append(rc.picked, m)
			n--
		}
	}
	return rc
}

// recyclePolicy is the fleet's spec.recycling; without it, a fleet that
// replaces proxies beyond its diversity caps has the policy's default
// bounds (it burns nothing by bans). nil for neither.
func recyclePolicy(f *Fleet) *egressip.RecyclePolicy {
	if pol := egressip.PolicyOf(f.spec.Recycling); pol != nil {
		return pol
	}
	if replacesBeyondLimit(f) {
		return egressip.PolicyOf(&fleetv1alpha1.Recycling{})
	}
	return nil
}

// replacesBeyondLimit: the fleet replaces its proxies beyond a cap of
// spec.diversity, to draw other addresses (a VM backend's fleet only).
func replacesBeyondLimit(f *Fleet) bool {
	d := f.spec.Diversity
	return d != nil && d.ReplaceBeyondLimit && (f.spec.Placement.GCP != nil || f.spec.Placement.AWS != nil)
}

// withBeyondLimit is burned and, where the fleet replaces them, the
// members beyond a cap of spec.diversity (assessEgress marked them), with
// which cap; a member burned by bans keeps that reason.
func withBeyondLimit(f *Fleet, members []*member, burned map[string]string) map[string]string {
	if !replacesBeyondLimit(f) {
		return burned
	}
	out := make(map[string]string, len(burned))
	for _, m := range members {
		if m.Beyond != "" {
			out[m.Name] = m.EgressIP + " " + egressip.BeyondLimitReason + m.Beyond
		}
	}
	for name, why := range burned {
		out[name] = why
	}
	return out
}

// countSeenAgain counts the members leaving from an address a recycle of
// the day gave back, and returns those addresses with whose they were.
func (rc *recycling) countSeenAgain(members []*member) map[string]string {
	gaveBack := map[string]string{}
	for _, r := range rc.records {
		gaveBack[r.EgressIP] = r.Proxy
	}
	for _, m := range members {
		if p, ok := gaveBack[m.EgressIP]; ok && m.EgressIP != "" && p != m.Name {
			rc.seenAgain++
		}
	}
	return gaveBack
}

// recycleOrder is the order burned members are picked in: those burned
// by bans before those only beyond a diversity cap, each by ordinal (a
// name's string order would put crawlers-12 before crawlers-5).
func recycleOrder(burned map[string]string, byName map[string]*member) []string {
	names := make([]string, 0, len(burned))
	for name := range burned {
		names = append(names, name)
	}
	key := func(name string) (bool, int) {
		ord := -1
		if m := byName[name]; m != nil {
			ord = m.Ordinal
		}
		return strings.Contains(burned[name], egressip.BeyondLimitReason), ord
	}
	sort.Slice(names, func(i, j int) bool {
		di, oi := key(names[i])
		dj, oj := key(names[j])
		if di != dj {
			return !di
		}
		if oi != oj {
			return oi < oj
		}
		return names[i] < names[j]
	})
	return names
}

// sameNetworkAgain: m is due only for a diversity cap, and was itself
// made by a recycle whose address was in the network it leaves from now:
// the backend hands out that network again, and replacing m would loop.
func sameNetworkAgain(m *member, why string) bool {
	if m == nil || m.RecycleOf == "" || !strings.Contains(why, egressip.BeyondLimitReason) {
		return false
	}
	was, err1 := netip.ParseAddr(m.RecycleIP)
	now, err2 := netip.ParseAddr(m.EgressIP)
	return err1 == nil && err2 == nil && egressip.PrefixOf(was) == egressip.PrefixOf(now)
}

// boundWhy says why no more recycles may start: the floor, or the
// policy's hourly bound and back-off (with next, when one may).
func boundWhy(pol *egressip.RecyclePolicy, healthy, floor int, next time.Time) string {
	if healthy < floor {
		return fmt.Sprintf("the fleet has %d healthy proxies, below its floor of %d (replicas - maxUnavailable)", healthy, floor)
	}
	why := fmt.Sprintf("spec.recycling's bounds: at most %d recycles an hour, a back-off of %s after each, doubled for each other recycle of the last hour", max(pol.MaxPerHour, 1), pol.Backoff)
	if !next.IsZero() {
		why += ": the next may start at " + next.UTC().Format(time.RFC3339)
	}
	return why
}

// waitingSummary counts the burned members no recycle replaces and says
// why they wait, the commonest reason first, each with the proxies it
// holds back (at most three named); "" when none waits.
func (rc *recycling) waitingSummary() (int, string) {
	if len(rc.waiting) == 0 {
		return 0, ""
	}
	by := map[string][]string{}
	for name, why := range rc.waiting {
		by[why] = append(by[why], name)
	}
	whys := make([]string, 0, len(by))
	for why, names := range by {
		sort.Strings(names)
		whys = append(whys, why)
	}
	sort.Slice(whys, func(i, j int) bool {
		if len(by[whys[i]]) != len(by[whys[j]]) {
			return len(by[whys[i]]) > len(by[whys[j]])
		}
		return whys[i] < whys[j]
	})
	parts := make([]string, 0, len(whys))
	for _, why := range whys {
		names := by[why]
		named := strings.Join(names[:min(len(names), 3)], ", ")
		if len(names) > 3 {
			named += fmt.Sprintf(" and %d more", len(names)-3)
		}
		parts = append(parts, named+": "+why)
	}
	return len(rc.waiting), truncateTo(strings.Join(parts, "; "), maxWaiting)
}

// truncateTo bounds s to n bytes, cut on a rune boundary and ended with
// "..." where it was cut.
func truncateTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - 3
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// settle records the recycles the plan started: those of the picked
// members it made a replacement for now. A pick it could not start (no
// surge slot) is no recycle: picked again later, within the bounds then.
func (rc *recycling) settle(p *plan, now time.Time) {
	started := map[string]bool{}
	for _, m := range p.keep {
		if m.RecycleOf == "" || !m.Created.Equal(now) {
			continue
		}
		started[m.RecycleOf] = true
		r := fleetv1alpha1.RecycleRecord{Proxy: m.RecycleOf, EgressIP: m.RecycleIP, Reason: m.RecycleReason, Time: now.UTC().Format(time.RFC3339)}
		rc.records = append(rc.records, r)
		rc.started = append(rc.started, r)
	}
	if len(rc.records) > maxRecycleRecords {
		rc.records = rc.records[len(rc.records)-maxRecycleRecords:]
	}
	for _, m := range rc.picked {
		if !started[m.Name] {
			rc.waiting[m.Name] = "no surge slot is free (spec.rotation.maxSurge): a recycle never replaces a serving proxy in place"
			// What waits behind it waits for the surge slot, not the bound;
			// a pool keeps the recycle it was granted for it.
			rc.atBound = false
			rc.wanted++
		}
	}
}

// mergeRecords adds to the status' records those the members' recycle-*
// annotations carry that it lacks (a status written late, or lost), the
// day's only, oldest first.
func mergeRecords(records []fleetv1alpha1.RecycleRecord, members []*member, now time.Time) []fleetv1alpha1.RecycleRecord {
	var made []fleetv1alpha1.RecycleRecord
	for _, m := range members {
		if m.RecycleOf == "" || m.RecycleAt.IsZero() || now.Sub(m.RecycleAt) >= recycleMemory {
			continue
		}
		at := egressip.NotAfter(m.RecycleAt, now).UTC().Format(time.RFC3339)
		made = append(made, fleetv1alpha1.RecycleRecord{Proxy: m.RecycleOf, EgressIP: m.RecycleIP, Reason: truncateTo(m.RecycleReason, maxReason), Time: at})
	}
	all, _ := addRecords(records, made)
	return all
}

// addRecords adds to records those of more it lacks, and returns them
// all, oldest first, and those it added. A proxy leaving from an address
// is recycled once: its record is known by the two, whatever time a
// replica with a skewed clock gave it.
func addRecords(records, more []fleetv1alpha1.RecycleRecord) (all, added []fleetv1alpha1.RecycleRecord) {
	seen := map[string]bool{}
	all = make([]fleetv1alpha1.RecycleRecord, 0, len(records)+len(more))
	for i, r := range append(records[:len(records):len(records)], more...) {
		if seen[r.Proxy+"/"+r.EgressIP] {
			continue
		}
		seen[r.Proxy+"/"+r.EgressIP] = true
		all = append(all, r)
		if i >= len(records) {
			added = append(added, r)
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].Time < all[j].Time })
	return all, added
}

// fleetSurvey is what pickRecycles reads of the members: them by name,
// the replacement of each ordinal being replaced, and how many are
// healthy.
type fleetSurvey struct {
	byName   map[string]*member
	replaced map[int]*member
	ordinals map[int]bool
	healthy  int
}

func survey(members []*member) fleetSurvey {
	fl := fleetSurvey{byName: map[string]*member{}, replaced: map[int]*member{}, ordinals: map[int]bool{}}
	for _, m := range members {
		fl.byName[m.Name] = m
		fl.ordinals[m.Ordinal] = true
		if m.Replaces >= 0 && m.Replaces != m.Ordinal {
			fl.replaced[m.Replaces] = m
		}
		if m.Healthy {
			fl.healthy++
		}
	}
	return fl
}

// recyclable says whether a burned member may start a recycle: it serves
// (Ready, healthy, not draining, its address known), is not being
// recycled, nothing replaces it yet, and it is not itself the replacement
// of a holder still there (the plan replaces holders only: a recycle of
// it could not start, and would spend the budget for nothing).
func (fl fleetSurvey) recyclable(m *member) bool {
	return m != nil && m.Recycle == "" && m.Ready && m.Healthy && m.DrainSince.IsZero() && fl.replaced[m.Ordinal] == nil && m.EgressIP != "" &&
		!fl.holderThere(m)
}

// holderThere: m was made to replace a member that is still there.
func (fl fleetSurvey) holderThere(m *member) bool {
	return m.Replaces >= 0 && m.Replaces != m.Ordinal && fl.ordinals[m.Replaces]
}

// previousRecycles reads the recycles of the last day from the XR's
// status.egress.recycles, oldest first; entries that do not parse, or
// from the future beyond a skew, are dropped.
func previousRecycles(xrStatus *structpb.Struct, now time.Time) []fleetv1alpha1.RecycleRecord {
	var out []fleetv1alpha1.RecycleRecord
	for _, v := range field(xrStatus, "egress", "recycles").GetListValue().GetValues() {
		s := v.GetStructValue()
		r := fleetv1alpha1.RecycleRecord{Proxy: str(s, "proxy"), EgressIP: str(s, "egressIP"), Reason: str(s, keyReason), Time: str(s, "time")}
		at, err := time.Parse(time.RFC3339, r.Time)
		if err != nil || r.Proxy == "" || now.Sub(at) >= recycleMemory {
			continue
		}
		if at.After(now) {
			// Written by a clock ahead: it counts as now, never later.
			r.Time = now.UTC().Format(time.RFC3339)
		}
		r.Reason = truncateTo(r.Reason, maxReason)
		out = append(out, r)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time < out[j].Time })
	return out
}

// recordsValue is status.egress.recycles.
func recordsValue(records []fleetv1alpha1.RecycleRecord) *structpb.Value {
	list := make([]*structpb.Value, 0, len(records))
	for _, r := range records {
		list = append(list, structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"proxy": structpb.NewStringValue(r.Proxy), "egressIP": structpb.NewStringValue(r.EgressIP),
			keyReason: structpb.NewStringValue(r.Reason), "time": structpb.NewStringValue(r.Time),
		}}))
	}
	return structpb.NewListValue(&structpb.ListValue{Values: list})
}

// setRecycles writes status.egress's recycling, and says, in a Normal
// result, each recycle started now.
func setRecycles(rsp *fnv1.RunFunctionResponse, rc *recycling) {
	n, why := rc.waitingSummary()
	egressSummary{records: rc.records, started: rc.started, seenAgain: rc.seenAgain, burned: n, waiting: why, atBound: rc.atBound}.write(rsp)
}

// egressSummary is what a fleet's status.egress says of recycling: the
// day's recycles, how many proxies leave from an address one gave back,
// how many burned proxies wait and why, and whether the bound alone holds
// them; and the recycles started now.
type egressSummary struct {
	records, started  []fleetv1alpha1.RecycleRecord
	seenAgain, burned int
	waiting           string
	atBound           bool
}

// write sets the summary's fields of status.egress, and says each recycle
// started now in a Normal result.
func (e egressSummary) write(rsp *fnv1.RunFunctionResponse) {
	egress := field(rsp.GetDesired().GetComposite().GetResource(), "status", "egress").GetStructValue()
	if egress == nil {
		return
	}
	if len(e.records) > 0 {
		egress.Fields["recycles"] = recordsValue(e.records)
	}
	if e.seenAgain > 0 {
		egress.Fields["seenAgain"] = structpb.NewNumberValue(float64(e.seenAgain))
	}
	if e.burned > 0 {
		egress.Fields["burned"] = structpb.NewNumberValue(float64(e.burned))
		egress.Fields["recycleWaiting"] = structpb.NewStringValue(truncateTo(e.waiting, maxWaiting))
		if e.atBound {
			egress.Fields["recyclesAtBound"] = structpb.NewBoolValue(true)
		}
	}
	for _, r := range e.started {
		response.Normalf(rsp, "Recycling proxy %s: its egress IP %s", r.Proxy, r.Reason).TargetCompositeAndClaim()
	}
}

// recycleNote is the warning of a fleet that cannot apply spec.recycling
// or spec.diversity.replaceBeyondLimit (one without surge); "" for one
// that can.
func recycleNote(f *Fleet) string {
	if recyclePolicy(f) != nil && f.MaxSurge == 0 {
		// The schema refuses it now; a fleet stored before is told.
		return fmt.Sprintf("spec.rotation.maxSurge is 0: %s/%s recycles no proxy, since a recycle replaces a serving proxy through a surge proxy, never in place; set maxSurge to at least 1", f.Namespace, f.Name)
	}
	return ""
}
