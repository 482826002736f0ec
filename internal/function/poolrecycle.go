package function

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/response"
	"google.golang.org/protobuf/types/known/structpb"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/egressip"
)

// Recycling in a pooled fleet. The fleet holds the bound (spec.recycling's
// recycles an hour, its back-off, its floor) over every pool, and hands a
// pool a grant: at most k recycles started since a time. A pool recycles
// the burned Proxies the fleet names in its spec (egress-discovery's
// summary of the fleet names them) and those beyond its caps of
// spec.diversity (replaceBeyondLimit), as a fleet without pools does, but
// within its grant. Each grant is a fresh one: a recycle ageing out of the
// hour frees nothing a pool may act on, only the fleet grants again, and
// only once every unit it granted before is spent or given back (the pool
// acknowledged, the fleet's own status records what it granted last). So
// however many pools recycle, the fleet starts no more than its bound
// allows, and waits its back-off after each.

// Keys of a pool's recycle grant, in its spec's budget and its status'.
const (
	keyMaxRecycles      = "maxRecycles"
	keyRecyclesSince    = "recyclesSince"
	keyRecyclesUsed     = "recyclesUsed"
	keyRecyclesWanted   = "recyclesWanted"
	keyRecyclesLastHour = "recyclesLastHour"
)

// recycleGrant is a pool's share of its fleet's recycles: at most k
// started on it; since, when the fleet made it (RFC 3339), names it.
type recycleGrant struct {
	k     int
	since string
}

// put writes the grant into a budget's fields; nothing for none.
func (g recycleGrant) put(b *structpb.Struct) {
	if g.k > 0 {
		b.Fields[keyMaxRecycles] = structpb.NewNumberValue(float64(g.k))
		b.Fields[keyRecyclesSince] = structpb.NewStringValue(g.since)
	}
}

// grantOf reads a grant from a budget's fields.
func grantOf(b *structpb.Struct) recycleGrant {
	return recycleGrant{k: whole(field(b, keyMaxRecycles)), since: str(b, keyRecyclesSince)}
}

// poolRecycling is a pool's part: the burned Proxies its fleet names, its
// grant, and how many recycles its status said it started on that grant
// when it was composed with it last. nil for a pool whose fleet recycles
// nothing.
type poolRecycling struct {
	burned   map[string]string
	grant    recycleGrant
	prevUsed int
}

// used counts the recycles started on the grant: the members made on it
// (their AnnotationRecycleGrant, whatever the clock of the replica that
// made them), or what the pool's status said, if more (one of them gone
// since).
func (pr *poolRecycling) used(members []*member) int {
	if pr == nil || pr.grant.k == 0 {
		return 0
	}
	n := 0
	for _, m := range members {
		if m.RecycleGrant == pr.grant.since {
			n++
		}
	}
	return max(n, pr.prevUsed)
}

// parsePoolRecycling reads a pool's spec.burned and its recycle grant,
// and from its status what it used of the grant.
func parsePoolRecycling(spec, status map[string]any) (*poolRecycling, error) {
	budget, _ := spec["budget"].(map[string]any)
	pr := &poolRecycling{burned: map[string]string{}}
	pr.grant.k = number(budget[keyMaxRecycles])
	if pr.grant.k < 0 {
		return nil, fieldError("spec.budget.maxRecycles", "must not be negative")
	}
	pr.grant.since, _ = budget[keyRecyclesSince].(string)
	if _, err := time.Parse(time.RFC3339, pr.grant.since); err != nil && (pr.grant.since != "" || pr.grant.k > 0) {
		return nil, fieldError("spec.budget.recyclesSince", "must be an RFC 3339 time naming the grant of maxRecycles, not %q", pr.grant.since)
	}
	list, _ := spec["burned"].([]any)
	if len(list) > fleetv1alpha1.MaxPoolBurned {
		return nil, fieldError("spec.burned", "lists %d Proxies, more than %d", len(list), fleetv1alpha1.MaxPoolBurned)
	}
	for _, v := range list {
		e, _ := v.(map[string]any)
		name, _ := e["name"].(string)
		reason, _ := e["reason"].(string)
		if name == "" {
			return nil, fieldError("spec.burned", "has an entry without a name")
		}
		pr.burned[name] = truncateTo(reason, fleetv1alpha1.MaxPoolBurnedReason)
	}
	if pr.grant.k == 0 && len(pr.burned) == 0 {
		return nil, nil
	}
	sb, _ := status["budget"].(map[string]any)
	if since, _ := sb[keyRecyclesSince].(string); since == pr.grant.since && number(sb[keyMaxRecycles]) == pr.grant.k {
		pr.prevUsed = max(number(sb[keyRecyclesUsed]), 0)
	}
	return pr, nil
}

// recycles says whether the fleet (or pool) may recycle anything.
func (f *Fleet) recycles() bool {
	if f.Pool != "" {
		return f.poolRecycling != nil || replacesBeyondLimit(f)
	}
	return recyclePolicy(f) != nil
}

// recycleAllowance is how many recycles may start now, after records,
// with healthy proxies serving; when none may, why, and whether the bound
// alone holds them (not the floor). A pool's bound is its grant.
func (f *Fleet) recycleAllowance(members []*member, records []fleetv1alpha1.RecycleRecord, healthy int, now time.Time) (n int, why string, atBound bool) {
	floor := f.servingFloor()
	if f.Pool == "" {
		return policyAllowance(recyclePolicy(f), records, healthy, floor, now)
	}
	if healthy < floor {
		return 0, fmt.Sprintf("the pool has %d healthy proxies, below its floor of %d", healthy, floor), false
	}
	if pr := f.poolRecycling; pr != nil {
		if n = pr.grant.k - pr.used(members); n > 0 {
			return n, "", false
		}
	}
	return 0, "the fleet's bound (spec.recycling of the ProxyFleet, over every pool): its status.egress.recycleWaiting says when the next may start", true
}

// policyAllowance is how many recycles pol allows now after records, with
// healthy proxies serving and floor needed; when none, why, and whether
// the bound alone holds them (not the floor).
func policyAllowance(pol *egressip.RecyclePolicy, records []fleetv1alpha1.RecycleRecord, healthy, floor int, now time.Time) (int, string, bool) {
	recent := make([]egressip.Recycle, 0, len(records))
	for _, r := range records {
		at, _ := time.Parse(time.RFC3339, r.Time)
		recent = append(recent, egressip.Recycle{Proxy: r.Proxy, IP: r.EgressIP, At: at})
	}
	n, next := pol.Allowed(recent, healthy, floor, now)
	return n, boundWhy(pol, healthy, floor, next), healthy >= floor
}

// lastHour counts the records of the last hour (one from a clock ahead
// counts as now).
func lastHour(records []fleetv1alpha1.RecycleRecord, now time.Time) int {
	n := 0
	for _, r := range records {
		if inLastHour(r, now) {
			n++
		}
	}
	return n
}

// inLastHour: r started in the last hour (or from a clock ahead).
func inLastHour(r fleetv1alpha1.RecycleRecord, now time.Time) bool {
	at, err := time.Parse(time.RFC3339, r.Time)
	return err == nil && now.Sub(at) < time.Hour
}

// setPoolRecycleStatus writes what a pool did with its grant into its
// status' budget, and bounds the recycles its status lists (its fleet
// lists the day's).
func setPoolRecycleStatus(desired *fnv1.State, f *Fleet, rc *recycling, members []*member, now time.Time) {
	status := compositeStatus(desired)
	n := func(v int) *structpb.Value { return structpb.NewNumberValue(float64(v)) }
	if budget := field(status, "budget").GetStructValue(); budget != nil {
		if pr := f.poolRecycling; pr != nil && pr.grant.k > 0 {
			pr.grant.put(budget)
			budget.Fields[keyRecyclesUsed] = n(pr.used(members))
		}
		if rc.wanted > 0 {
			budget.Fields[keyRecyclesWanted] = n(rc.wanted)
		}
		// The fleet's own list may be lost: what it needs of the hour
		// to hold its bound.
		if h := lastHour(rc.records, now); h > 0 {
			budget.Fields[keyRecyclesLastHour] = n(h)
		}
	}
	egress := field(status, "egress").GetStructValue()
	list := field(egress, "recycles").GetListValue()
	if vs := list.GetValues(); len(vs) > fleetv1alpha1.MaxPoolRecycleRecords {
		list.Values = vs[len(vs)-fleetv1alpha1.MaxPoolRecycleRecords:]
	}
	for _, v := range list.GetValues() {
		r := v.GetStructValue()
		r.Fields[keyReason] = structpb.NewStringValue(truncateTo(str(r, keyReason), fleetv1alpha1.MaxPoolBurnedReason))
	}
	if why := str(egress, "recycleWaiting"); why != "" {
		egress.Fields["recycleWaiting"] = structpb.NewStringValue(truncateTo(why, fleetv1alpha1.MaxPoolWaiting))
	}
}

// observedPoolRecycling is what a pooled fleet reads of one pool's
// recycling: the grant in its spec, the one it was composed with and how
// much of that it used, what it wants, and its status' egress.
type observedPoolRecycling struct {
	granted, acked, ledger recycleGrant
	reported               bool
	used, wanted, lastHour int
	records                []fleetv1alpha1.RecycleRecord
	seenAgain, burned      int
	waiting                string
}

// readPoolRecycling reads a pool's recycling from its spec and status;
// ledger is the grant the fleet's own status says it made last.
func readPoolRecycling(spec, status *structpb.Struct, ledger recycleGrant, now time.Time) observedPoolRecycling {
	o := observedPoolRecycling{granted: grantOf(field(spec, "budget").GetStructValue()), ledger: ledger}
	if b := field(status, "budget").GetStructValue(); b != nil {
		o.reported = true
		o.acked = grantOf(b)
		o.used = whole(field(b, keyRecyclesUsed))
		o.wanted = whole(field(b, keyRecyclesWanted))
		o.lastHour = whole(field(b, keyRecyclesLastHour))
	} else {
		o.acked = o.granted
	}
	o.records = previousRecycles(status, now)
	egress := field(status, "egress").GetStructValue()
	o.seenAgain = whole(field(egress, "seenAgain"))
	o.burned = whole(field(egress, "burned"))
	o.waiting = str(egress, "recycleWaiting")
	return o
}

// unused is how many recycles the pool may still start on what it was
// granted: of the grant it acknowledged, what it did not use; of one it
// did not acknowledge (in its spec, or in the fleet's record), all.
func (o observedPoolRecycling) unused() int {
	// Without a report, acked is what it was granted, and used 0.
	n := max(o.acked.k-o.used, 0)
	for _, g := range []recycleGrant{o.granted, o.ledger} {
		if g != o.acked {
			n = max(n, g.k)
		}
	}
	return n
}

// pooledRecycling is what a pooled fleet decides of recycling: the day's
// recycles of every pool, those new since its status last listed them,
// and the burned Proxies of each pool to name in its spec.
type pooledRecycling struct {
	records, started []fleetv1alpha1.RecycleRecord
	burned           map[int][]fleetv1alpha1.PoolBurned
	// unnamed counts the burned Proxies the summaries name that no pool's
	// spec lists (beyond MaxPoolBurned).
	unnamed int
	// free is how many recycles the fleet may grant now; why says why it
	// may grant none.
	free    int
	why     string
	atBound bool
}

// planPoolRecycles merges the pools' recycles into the fleet's, names
// each pool's burned Proxies, and grants recycles: as many as the fleet's
// bound allows now less every unit granted and not yet used, one to each
// pool that wants one in turn. A pool that wants none gives its unused
// grant back.
func planPoolRecycles(fleet *Fleet, plans []*poolPlan, burned map[string]string, xrStatus *structpb.Struct, healthy int, now time.Time) *pooledRecycling {
	pr := &pooledRecycling{burned: map[int][]fleetv1alpha1.PoolBurned{}}
	pr.mergeRecords(previousRecycles(xrStatus, now), plans)
	pol := recyclePolicy(fleet)
	if pol == nil {
		return pr
	}
	pr.nameBurned(fleet, burned)
	pr.grant(fleet, pol, plans, healthy, now)
	return pr
}

// mergeRecords adds to the fleet's records of the day (prev) those its
// pools list that it lacks: the recycles they started since. One older
// than every record the fleet kept (it keeps the newest
// maxRecycleRecords) is not new.
func (pr *pooledRecycling) mergeRecords(prev []fleetv1alpha1.RecycleRecord, plans []*poolPlan) {
	var theirs []fleetv1alpha1.RecycleRecord
	for _, p := range plans {
		if o := p.observed; o != nil {
			for _, r := range o.recycling.records {
				if len(prev) < maxRecycleRecords || r.Time >= prev[0].Time {
					theirs = append(theirs, r)
				}
			}
		}
	}
	all, added := addRecords(prev, theirs)
	if len(all) > maxRecycleRecords {
		all = all[len(all)-maxRecycleRecords:]
	}
	pr.records, pr.started = all, added
}

// grant sets each pool's recycle grant: a fresh one of 1 to a pool that
// wants one and holds none unused, in turn, while the fleet's bound
// leaves some free; a grant spent, no longer wanted, or held while the
// fleet is below its floor is taken back; any other stays as the fleet
// made it (its ledger: never one edited by hand).
func (pr *pooledRecycling) grant(fleet *Fleet, pol *egressip.RecyclePolicy, plans []*poolPlan, healthy int, now time.Time) {
	floor := fleet.servingFloor()
	n, why, atBound := policyAllowance(pol, pr.hour(fleet, plans, now), healthy, floor, now)
	unused, wanted := 0, 0
	for _, p := range plans {
		if o := p.observed; o != nil {
			unused += o.recycling.unused()
			wanted += o.recycling.wanted
		}
	}
	pr.free, pr.why = max(n-unused, 0), why
	if n > 0 && pr.free == 0 {
		pr.why = "a recycle the fleet granted a pool is not started yet"
	}
	pr.atBound = atBound && n == 0 && wanted > 0
	belowFloor := healthy < floor
	free := pr.free
	for _, p := range pr.turns(fleet, plans) {
		r := p.observed.recycling
		switch {
		case belowFloor:
			// Given back: it is free once the pool acknowledges.
			p.recycles = recycleGrant{}
		case r.unused() == 0 && r.wanted > 0 && free > 0:
			p.recycles = recycleGrant{k: 1, since: now.UTC().Format(time.RFC3339)}
			free--
		case r.reported && r.granted == r.acked && (r.unused() == 0 || r.wanted == 0):
			// Spent, or no longer wanted: taken back.
			p.recycles = recycleGrant{}
		case r.ledger.k <= 1:
			p.recycles = r.ledger
		}
	}
}

// hour is what the fleet knows of its recycles for its bound: its
// records, and where a pool says it started more in the last hour than
// the fleet's records hold (the fleet's status lost), as many more, as
// recent as that pool's newest.
func (pr *pooledRecycling) hour(fleet *Fleet, plans []*poolPlan, now time.Time) []fleetv1alpha1.RecycleRecord {
	out := append([]fleetv1alpha1.RecycleRecord{}, pr.records...)
	known := map[int]int{}
	for _, r := range pr.records {
		if inLastHour(r, now) {
			k, _ := poolOfProxy(fleet, r.Proxy)
			known[k]++
		}
	}
	for _, p := range plans {
		o := p.observed
		if o == nil || o.recycling.lastHour <= known[p.index] {
			continue
		}
		at := now.UTC().Format(time.RFC3339)
		if rs := o.recycling.records; len(rs) > 0 {
			at = rs[len(rs)-1].Time
		}
		for range o.recycling.lastHour - known[p.index] {
			out = append(out, fleetv1alpha1.RecycleRecord{Proxy: o.name, Time: at})
		}
	}
	return out
}

// turns orders the pools for fresh grants: those with proxies burned by
// bans first (the fleet names them), then those replacing proxies beyond
// their caps; each starting after the pool of the newest recycle, so that
// no pool takes every grant.
func (pr *pooledRecycling) turns(fleet *Fleet, plans []*poolPlan) []*poolPlan {
	last := -1
	if len(pr.records) > 0 {
		last, _ = poolOfProxy(fleet, pr.records[len(pr.records)-1].Proxy)
	}
	var out []*poolPlan
	for _, p := range plans {
		if p.observed != nil {
			out = append(out, p)
		}
	}
	key := func(p *poolPlan) (bool, bool) { return len(pr.burned[p.index]) == 0, p.index <= last }
	sort.SliceStable(out, func(i, j int) bool {
		bi, wi := key(out[i])
		bj, wj := key(out[j])
		if bi != bj {
			return !bi
		}
		if wi != wj {
			return !wi
		}
		return out[i].index < out[j].index
	})
	return out
}

// poolOfProxy is the index of the pool a Proxy of the fleet belongs to
// (by its ordinal), and the ordinal; -1 for a name that is none.
func poolOfProxy(fleet *Fleet, name string) (pool int, ordinal int) {
	rest, ok := strings.CutPrefix(name, fleet.Name+"-")
	ord, err := strconv.Atoi(rest)
	if !ok || err != nil || ord < fleetv1alpha1.PoolOrdinalSpan {
		return -1, -1
	}
	return ord / fleetv1alpha1.PoolOrdinalSpan, ord
}

// nameBurned sorts the burned Proxies the summaries name (bans: a pool
// replaces its proxies beyond its own caps itself) by pool, each by
// ordinal, those whose address a recycle of the day gave back left out
// (recycling them again would draw it again), at most MaxPoolBurned a
// pool.
func (pr *pooledRecycling) nameBurned(fleet *Fleet, burned map[string]string) {
	gaveBack := map[string]bool{}
	for _, r := range pr.records {
		gaveBack[r.EgressIP] = true
	}
	type entry struct {
		ord          int
		name, reason string
	}
	byPool := map[int][]entry{}
	for name, reason := range burned {
		k, ord := poolOfProxy(fleet, name)
		if k < 1 {
			continue
		}
		if ip, _, _ := strings.Cut(reason, " "); gaveBack[ip] {
			continue
		}
		byPool[k] = append(byPool[k], entry{ord, name, truncateTo(reason, fleetv1alpha1.MaxPoolBurnedReason)})
	}
	for k, es := range byPool {
		sort.Slice(es, func(i, j int) bool { return es[i].ord < es[j].ord })
		if len(es) > fleetv1alpha1.MaxPoolBurned {
			pr.unnamed += len(es) - fleetv1alpha1.MaxPoolBurned
			es = es[:fleetv1alpha1.MaxPoolBurned]
		}
		list := make([]fleetv1alpha1.PoolBurned, len(es))
		for i, e := range es {
			list[i] = fleetv1alpha1.PoolBurned{Name: e.name, Reason: e.reason}
		}
		pr.burned[k] = list
	}
}

// setPooledRecycles writes a pooled fleet's status.egress: the day's
// recycles of every pool, the addresses seen again and the burned
// Proxies waiting in each, why they wait; says each recycle a pool
// started since, in a Normal result, and each pool that leaves a grant
// unacknowledged, in a Warning.
func setPooledRecycles(rsp *fnv1.RunFunctionResponse, plans []*poolPlan, pr *pooledRecycling, now time.Time) {
	e := egressSummary{records: pr.records, started: pr.started, burned: pr.unnamed, atBound: pr.atBound}
	var parts []string
	for _, p := range plans {
		if o := p.observed; o != nil {
			e.seenAgain += o.recycling.seenAgain
			e.burned += o.recycling.burned
			if o.recycling.waiting != "" {
				parts = append(parts, o.name+": "+o.recycling.waiting)
			}
		}
	}
	e.waiting = strings.Join(parts, "; ")
	if pr.free == 0 && pr.why != "" {
		e.waiting = "the fleet grants no recycle now: " + pr.why + "; " + e.waiting
	}
	if pr.unnamed > 0 {
		e.waiting += fmt.Sprintf("; %d more wait for their pool's list (at most %d each)", pr.unnamed, fleetv1alpha1.MaxPoolBurned)
	}
	e.write(rsp)
	for _, p := range plans {
		o := p.observed
		if o == nil || o.recycling.granted.k == 0 || o.recycling.granted == o.recycling.acked {
			continue
		}
		if since, err := time.Parse(time.RFC3339, o.recycling.granted.since); err == nil && now.Sub(since) >= unacknowledgedGrant {
			response.Warning(rsp, errors.Errorf("pool %s has not acknowledged the recycle it was granted at %s: the fleet grants no other pool one until it does (is the pool paused, or failing? its conditions say)", o.name, o.recycling.granted.since)).TargetCompositeAndClaim()
		}
	}
}

// unacknowledgedGrant is how long a pool may take to acknowledge a
// recycle grant before its fleet warns: it holds every other pool's.
const unacknowledgedGrant = 10 * time.Minute
