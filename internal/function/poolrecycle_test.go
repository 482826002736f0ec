package function

import (
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"testing"
	"time"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"google.golang.org/protobuf/types/known/structpb"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
)

// recycleRun is what a pooled fleet did while its burned proxies were
// recycled: when each recycle started (its replacement made), the fewest
// proxies available and the most there were at once, and the burned
// proxies left.
type recycleRun struct {
	starts       []time.Time
	fewest, most int
	left         []string
	records      int
	// atBound is a status.egress the fleet wrote while some waited for
	// its bound alone; mostBurned the most burned it counted.
	atBound    *structpb.Struct
	mostBurned int
}

// recyclePooled burns every proxy of a settled pooled fleet of 6 proxies in
// 3 pools (spec.recycling: maxPerHour 2, backoff 5m; maxSurge 1,
// maxUnavailable 0) and runs it, its fleet and pools reconciled in any
// order from observations a few reconciles old, for steps of up to 16 s.
func recyclePooled(t *testing.T, seed int64, steps int, v variant, skew time.Duration) recycleRun {
	t.Helper()
	spec := withSpec(t, "replicas", "6")
	spec = withSpecIn(t, spec, "pools", `{"proxiesPerPool": 2}`)
	spec = withSpecIn(t, spec, "rotation", `{"maxSurge": 1, "maxUnavailable": 0}`)
	spec = withSpecIn(t, spec, "recycling", `{"bannedTimes": 1, "maxPerHour": 2, "backoff": "5m"}`)
	c := newSim(t, spec)
	c.mutate, c.mutateXR, c.poolSkew = v.pools, v.xr, skew
	if v.lag {
		c.lag, c.view = rand.New(rand.NewSource(seed+100)), map[string]*fnv1.Resource{} //nolint:gosec // A test's reproducible lag.
	}
	rng := rand.New(rand.NewSource(seed)) //nolint:gosec // A test's reproducible interleaving.
	for range 300 {
		c.step(rng, 4*time.Second)
	}
	if total, available, _ := c.counts(""); total != 6 || available != 6 {
		t.Fatalf("the pooled fleet did not settle: %d proxies, %d available", total, available)
	}
	c.burned = map[string]bool{}
	for _, p := range c.pools {
		for _, x := range p.proxies {
			c.burned[str(x.obj, "metadata", "name")] = true
		}
	}
	run := recycleRun{fewest: 6, most: 6}
	seen := map[string]bool{}
	for range steps {
		c.step(rng, 16*time.Second)
		total, available, _ := c.counts("")
		run.fewest, run.most = min(run.fewest, available), max(run.most, total)
		egress := field(c.fleetSt, "egress").GetStructValue()
		run.mostBurned = max(run.mostBurned, whole(field(egress, "burned")))
		if field(egress, "recyclesAtBound").GetBoolValue() && run.atBound == nil {
			run.atBound = egress
		}
		for _, p := range c.pools {
			for _, x := range p.proxies {
				name := str(x.obj, "metadata", "name")
				if str(x.obj, "metadata", "annotations", fleetv1alpha1.AnnotationRecycleOf) != "" && !seen[name] {
					seen[name] = true
					run.starts = append(run.starts, x.created)
				}
			}
		}
	}
	for _, p := range c.pools {
		for _, x := range p.proxies {
			if name := str(x.obj, "metadata", "name"); c.burned[name] {
				run.left = append(run.left, name)
			}
		}
	}
	sort.Slice(run.starts, func(i, j int) bool { return run.starts[i].Before(run.starts[j]) })
	run.records = len(field(c.fleetSt, "egress", "recycles").GetListValue().GetValues())
	return run
}

// boundBroken says how the starts break spec.recycling's bound (2 an hour,
// 5 minutes after each; by the fleet's clock, which may be off the pools'
// by skew) or the floor; "" when they do not.
func (r recycleRun) boundBroken(skew time.Duration) string {
	var broken []string
	skew = max(skew, -skew)
	for i, s := range r.starts {
		if i > 0 && s.Sub(r.starts[i-1]) < 5*time.Minute-skew {
			broken = append(broken, fmt.Sprintf("a recycle %s after the one before", s.Sub(r.starts[i-1])))
		}
		if i >= 2 && s.Sub(r.starts[i-2]) < time.Hour-skew {
			broken = append(broken, fmt.Sprintf("3 recycles within %s", s.Sub(r.starts[i-2])))
		}
	}
	if r.fewest < 6 {
		broken = append(broken, fmt.Sprintf("%d proxies available at one moment, below the floor of 6", r.fewest))
	}
	if r.most > 7 {
		broken = append(broken, fmt.Sprintf("%d proxies at one moment, above replicas + maxSurge", r.most))
	}
	return strings.Join(broken, "; ")
}

// TestPooledRecyclingKeepsTheFleetsBound: every proxy of a pooled fleet
// burned at once, its pools each holding some, is recycled within the
// fleet's bound over all pools: no more than maxPerHour in any hour, the
// back-off after each, never below the floor, surge first; and all are
// recycled in time, the fleet's status listing each. So too with the
// fleet's view of its pools lagging, with the pools' function replica's
// clock two minutes behind or ahead of the fleet's (the bound then holds
// to within the skew), and with the fleet's own list of its recycles lost
// at every read. The checker is
// proven by a fleet that reads no recycle of its pools (their status'
// and its own records hidden from it), which grants recycles as if none
// had happened, and must be caught.
func TestPooledRecyclingKeepsTheFleetsBound(t *testing.T) {
	// 6 recycles at 2 an hour: about three hours; steps average 8.5 s.
	const steps = 1800
	// The fleet's own list of its recycles lost at every read: its pools'
	// counts of their last hour hold the bound.
	losesItsList := func(x *structpb.Struct) {
		delete(field(x, "status", "egress").GetStructValue().GetFields(), "recycles")
	}
	for name, c := range map[string]struct {
		seed int64
		v    variant
		skew time.Duration
	}{
		"InStep":              {0, variant{}, 0},
		"Lagging":             {1, variant{lag: true}, 0},
		"PoolClocksBehind":    {2, variant{lag: true}, -2 * time.Minute},
		"PoolClocksAheadLost": {3, variant{xr: losesItsList}, 2 * time.Minute},
	} {
		r := recyclePooled(t, c.seed, steps, c.v, c.skew)
		if why := r.boundBroken(c.skew); why != "" {
			t.Errorf("%s: %s (recycles started at %v)", name, why, r.starts)
		}
		want := 6
		if c.v.xr != nil {
			want = 1 // the list lost: only what merged at the last read
		}
		if len(r.left) > 0 || len(r.starts) != 6 || r.records < want {
			t.Errorf("%s: %d recycles started, %d in the fleet's status, burned proxies left %v", name, len(r.starts), r.records, r.left)
		}
		// What a platform team sees: the burned proxies waiting, why,
		// and that the bound holds them.
		if r.mostBurned < 4 || r.atBound == nil || !strings.Contains(str(r.atBound, "recycleWaiting"), "at most 2 recycles an hour") {
			t.Errorf("%s: the fleet's status counted at most %d burned proxies waiting, at the bound %v", name, r.mostBurned, r.atBound)
		}
	}

	blind := variant{
		pools: func(o *structpb.Struct) {
			delete(field(o, "status", "egress").GetStructValue().GetFields(), "recycles")
			delete(field(o, "status", "budget").GetStructValue().GetFields(), keyRecyclesLastHour)
		},
		xr: func(x *structpb.Struct) {
			delete(field(x, "status", "egress").GetStructValue().GetFields(), "recycles")
		},
	}
	caught := 0
	for seed := range int64(2) {
		if r := recyclePooled(t, seed, steps/3, blind, 0); r.boundBroken(0) != "" {
			caught++
		}
	}
	t.Logf("a fleet blind to its recycles broke the bound in %d of 2 runs", caught)
	if caught == 0 {
		t.Error("the fleet blind to its pools' recycles never broke the bound: the checker cannot tell it from the function")
	}
}

// TestPoolRecyclesWithinItsGrant: a pool of a fleet that replaces proxies
// beyond its caps (its own addresses counted) recycles none without a
// grant, says it wants one, and recycles as many as its grant allows, the
// recycles since the grant counted against it (those a minute before too,
// for skewed clocks); a burned proxy its fleet names is recycled first.
// Bad grants are refused, naming the field, with nothing composed.
func TestPoolRecyclesWithinItsGrant(t *testing.T) {
	base := fleetv1alpha1.PoolOrdinalSpan
	old := t0.Add(-2 * time.Hour)
	observed := map[string]*fnv1.Resource{
		resourceName(base):     withIP(observedProxy(base, "a", true, old, ""), "203.0.113.10"),
		resourceName(base + 1): withIP(observedProxy(base+1, "b", true, old, ""), "198.51.100.1"),
		resourceName(base + 2): withIP(observedProxy(base+2, "a", true, old, ""), "203.0.113.11"),
		resourceName(base + 3): withIP(observedProxy(base+3, "b", true, old, ""), "192.0.2.7"),
	}
	tmpl := withSpecIn(t, withSpec(t, "replicas", "4"), "placement", `{"gcp": {"machineType": "e2-small", "networkTags": ["crawl"]}}`)
	tmpl = withSpecIn(t, tmpl, "diversity", `{"maxPerIPv4Prefix": 1, "replaceBeyondLimit": true}`)
	spec := func(budget map[string]any, burned ...any) map[string]any {
		s := map[string]any{"fleet": "crawlers", "index": 1, "template": mustMap(t, tmpl), "budget": budget}
		if len(burned) > 0 {
			s["burned"] = burned
		}
		return s
	}
	compose := func(s map[string]any, st *structpb.Struct) *fnv1.RunFunctionResponse {
		x := poolXR(t, s)
		if st != nil {
			x.Fields["status"] = structpb.NewStructValue(st)
		}
		return run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: x}, Resources: observed}, RequiredResources: poolSummaries(inPool("crawlers-pool-1", leaseSummary("crawlers", "r1", t0, nil, nil, leasewire.Demand{})))})
	}
	budgetOf := func(rsp *fnv1.RunFunctionResponse) *structpb.Struct {
		return field(rsp.GetDesired().GetComposite().GetResource(), "status", "budget").GetStructValue()
	}

	rsp := compose(spec(map[string]any{"maxSurge": 1}), nil)
	if got := replacing(rsp); len(got) != 0 {
		t.Errorf("without a grant the pool recycles nothing: %v", got)
	}
	if w := whole(field(budgetOf(rsp), keyRecyclesWanted)); w != 1 {
		t.Errorf("the pool wants 1 recycle (crawlers-%d beyond the /24's cap), says %d", base+2, w)
	}
	if why := str(rsp.GetDesired().GetComposite().GetResource(), "status", "egress", "recycleWaiting"); !strings.Contains(why, "the fleet's bound") {
		t.Errorf("the pool says its proxy waits for the fleet's bound: %q", why)
	}

	grant := map[string]any{"maxSurge": 1, keyMaxRecycles: 1, keyRecyclesSince: t0.Format(time.RFC3339)}
	rsp = compose(spec(grant), nil)
	if got := replacing(rsp); len(got) != 1 || got[0] != fmt.Sprintf("proxy-%d->%d", base+4, base+2) {
		t.Errorf("with a grant of 1 the pool replaces crawlers-%d: %v", base+2, got)
	}
	if b := budgetOf(rsp); whole(field(b, keyMaxRecycles)) != 1 || whole(field(b, keyRecyclesUsed)) != 1 || str(b, keyRecyclesSince) != t0.Format(time.RFC3339) {
		t.Errorf("the pool acknowledges its grant and counts the recycle on it: %v", b)
	}

	// A burned proxy its fleet names goes before one beyond a cap.
	rsp = compose(spec(grant, map[string]any{"name": fmt.Sprintf("crawlers-%d", base+3), "reason": "192.0.2.7 banned 1 or more times by one domain within 1h0m0s"}), nil)
	if got := replacing(rsp); len(got) != 1 || got[0] != fmt.Sprintf("proxy-%d->%d", base+4, base+3) {
		t.Errorf("the burned proxy the fleet names is recycled first: %v", got)
	}

	// A recycle made on the grant spends it, whatever time the clock of
	// the replica that made it gave it; so does what the pool's status
	// said it used of the grant; one made on an earlier grant does not.
	since := t0.Add(-10 * time.Minute).Format(time.RFC3339)
	grant = map[string]any{"maxSurge": 1, keyMaxRecycles: 1, keyRecyclesSince: since}
	made := func(on string) {
		r := recycledFrom(withIP(observedProxy(base+5, "a", true, t0.Add(-3*time.Hour), ""), "192.0.2.99"), "crawlers-gone", "203.0.113.99", t0.Add(-3*time.Hour))
		field(r.GetResource(), "metadata", "annotations").GetStructValue().Fields[fleetv1alpha1.AnnotationRecycleGrant] = structpb.NewStringValue(on)
		observed[resourceName(base+5)] = r
	}
	for on, spent := range map[string]bool{since: true, t0.Add(-time.Hour).Format(time.RFC3339): false} {
		made(on)
		if got := replacing(compose(spec(grant), nil)); (len(got) == 0) != spent {
			t.Errorf("a recycle made on grant %s (the grant is %s): spent %t, yet the pool replaces %v", on, since, spent, got)
		}
	}
	delete(observed, resourceName(base+5))
	said := &structpb.Struct{Fields: map[string]*structpb.Value{"budget": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
		keyMaxRecycles: structpb.NewNumberValue(1), keyRecyclesSince: structpb.NewStringValue(since), keyRecyclesUsed: structpb.NewNumberValue(1),
	}})}}
	if got := replacing(compose(spec(grant), said)); len(got) != 0 {
		t.Errorf("the pool's status said it used its grant (its replacement gone since): it recycles nothing more, yet replaces %v", got)
	}

	for name, c := range map[string]struct {
		s    map[string]any
		want string
	}{
		"NegativeGrant": {spec(map[string]any{keyMaxRecycles: -1}), "spec.budget.maxRecycles must not be negative"},
		"BadSince":      {spec(map[string]any{keyMaxRecycles: 1, keyRecyclesSince: "yesterday"}), "spec.budget.recyclesSince must be an RFC 3339 time"},
		"NoSince":       {spec(map[string]any{keyMaxRecycles: 1}), "spec.budget.recyclesSince must be an RFC 3339 time naming the grant"},
		"Nameless":      {spec(grant, map[string]any{"reason": "x"}), "spec.burned has an entry without a name"},
	} {
		rsp := compose(c.s, nil)
		rs := rsp.GetResults()
		if len(rs) != 1 || rs[0].GetSeverity() != fnv1.Severity_SEVERITY_FATAL || !strings.Contains(rs[0].GetMessage(), c.want) || len(rsp.GetDesired().GetResources()) != 0 {
			t.Errorf("%s: want one Fatal saying %q and nothing composed, got %v", name, c.want, rs)
		}
	}
}

// TestPooledFleetGrantsOnlyItsOwn: a recycle grant written into a pool's
// spec by hand (50 recycles) is not adopted: the fleet composes the pool
// with the grant its own ledger holds, none. A grant the pool does not
// acknowledge for ten minutes holds every other pool's, and the fleet
// warns, naming the pool. Pools with proxies burned by bans get grants
// before those only beyond their caps, and after the pool of the newest
// recycle.
func TestPooledFleetGrantsOnlyItsOwn(t *testing.T) {
	spec := withSpec(t, "replicas", "6")
	spec = withSpecIn(t, spec, "pools", `{"proxiesPerPool": 2}`)
	spec = withSpecIn(t, spec, "recycling", `{"bannedTimes": 1}`)
	c := newSim(t, spec)
	rng := rand.New(rand.NewSource(1)) //nolint:gosec // A test's reproducible interleaving.
	for range 300 {
		c.step(rng, 4*time.Second)
	}
	budgetOf := func(pool string) *structpb.Struct {
		return field(c.pools[pool].spec, "spec", "budget").GetStructValue()
	}
	budgetOf("pool-2").Fields[keyMaxRecycles] = structpb.NewNumberValue(50)
	budgetOf("pool-2").Fields[keyRecyclesSince] = structpb.NewStringValue(c.now.Format(time.RFC3339))
	c.readFleet()()
	if k := whole(field(budgetOf("pool-2"), keyMaxRecycles)); k != 0 {
		t.Errorf("the fleet composed pool-2 with a grant of %d recycles, written into its spec by hand; want none (its ledger holds none)", k)
	}

	// Pool 2 granted one 11 minutes ago, in the fleet's ledger too, and
	// never composed since (paused).
	since := c.now.Add(-11 * time.Minute).Format(time.RFC3339)
	budgetOf("pool-2").Fields[keyMaxRecycles] = structpb.NewNumberValue(1)
	budgetOf("pool-2").Fields[keyRecyclesSince] = structpb.NewStringValue(since)
	for _, v := range field(c.fleetSt, "pools").GetListValue().GetValues() {
		if e := v.GetStructValue(); strings.HasSuffix(str(e, "name"), "-pool-2") {
			e.Fields["budget"] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				keyMaxRecycles: structpb.NewNumberValue(1), keyRecyclesSince: structpb.NewStringValue(since),
			}})
		}
	}
	x := xr(c.spec)
	x.Fields["status"] = structpb.NewStructValue(c.fleetSt)
	observed := map[string]*fnv1.Resource{}
	for name, p := range c.pools {
		observed[name] = c.observedPool(p, true)
	}
	rsp := c.runFn(c.fn, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: x}, Resources: observed}, RequiredResources: c.summary("")})
	warned := false
	for _, r := range rsp.GetResults() {
		warned = warned || r.GetSeverity() == fnv1.Severity_SEVERITY_WARNING && strings.Contains(r.GetMessage(), "pool crawlers-pool-2 has not acknowledged the recycle it was granted at "+since)
	}
	if !warned {
		t.Errorf("no Warning names the pool holding an unacknowledged grant: %v", rsp.GetResults())
	}
	if k := whole(field(rsp.GetDesired().GetResources()["pool-2"].GetResource(), "spec", "budget", keyMaxRecycles)); k != 1 {
		t.Errorf("the fleet's own grant to pool-2 stays until acknowledged: %d", k)
	}

	// Turns: pool 3 has a proxy burned by bans; pool 1 recycled last.
	f, err := parseFleet("crawlers", "team", mustMap(t, spec))
	if err != nil {
		t.Fatal(err)
	}
	plans := []*poolPlan{{index: 1, observed: &observedPool{}}, {index: 2, observed: &observedPool{}}, {index: 3, observed: &observedPool{}}, {index: 4, observed: &observedPool{}}}
	pr := &pooledRecycling{
		burned:  map[int][]fleetv1alpha1.PoolBurned{3: {{Name: "crawlers-30000001"}}},
		records: []fleetv1alpha1.RecycleRecord{{Proxy: "crawlers-10000000", Time: t0.Format(time.RFC3339)}},
	}
	var order []int
	for _, p := range pr.turns(f, plans) {
		order = append(order, p.index)
	}
	if fmt.Sprint(order) != "[3 2 4 1]" {
		t.Errorf("turns: %v, want [3 2 4 1] (bans first, then after the pool of the newest recycle)", order)
	}
}

// TestPooledRecordsKnownOnce: a pooled fleet knows a recycle by its proxy
// and address, as a fleet without pools does: a duplicate in its own list
// (a hand edit, an older writer) counts once towards the bound, and a
// pool's copy of a recycle the fleet lists starts nothing new; one the
// fleet lacks is added and said to have started.
func TestPooledRecordsKnownOnce(t *testing.T) {
	known := fleetv1alpha1.RecycleRecord{Proxy: "crawlers-100", EgressIP: "203.0.113.5", Time: "2026-12-06T10:00:00Z"}
	fresh := fleetv1alpha1.RecycleRecord{Proxy: "crawlers-101", EgressIP: "203.0.113.6", Time: "2026-12-06T10:05:00Z"}
	pr := &pooledRecycling{}
	pool := &poolPlan{observed: &observedPool{recycling: observedPoolRecycling{records: []fleetv1alpha1.RecycleRecord{known, fresh}}}}
	pr.mergeRecords([]fleetv1alpha1.RecycleRecord{known, known}, []*poolPlan{pool})
	if len(pr.records) != 2 || pr.records[0] != known || pr.records[1] != fresh {
		t.Errorf("records: %+v, want the known recycle once, then the pool's new one", pr.records)
	}
	if len(pr.started) != 1 || pr.started[0] != fresh {
		t.Errorf("started: %+v, want only the pool's new recycle", pr.started)
	}
}
