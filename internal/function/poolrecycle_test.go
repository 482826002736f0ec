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
// order from observations a few reconciles old, for steps of up to 8 s.
func recyclePooled(t *testing.T, seed int64, steps int, v variant) recycleRun {
	t.Helper()
	spec := withSpec(t, "replicas", "6")
	spec = withSpecIn(t, spec, "pools", `{"proxiesPerPool": 2}`)
	spec = withSpecIn(t, spec, "rotation", `{"maxSurge": 1, "maxUnavailable": 0}`)
	spec = withSpecIn(t, spec, "recycling", `{"bannedTimes": 1, "maxPerHour": 2, "backoff": "5m"}`)
	c := newSim(t, spec)
	c.mutate, c.mutateXR = v.pools, v.xr
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
		c.step(rng, 8*time.Second)
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
// 5 minutes after each) or the floor; "" when they do not.
func (r recycleRun) boundBroken() string {
	var broken []string
	for i, s := range r.starts {
		if i > 0 && s.Sub(r.starts[i-1]) < 5*time.Minute {
			broken = append(broken, fmt.Sprintf("a recycle %s after the one before", s.Sub(r.starts[i-1])))
		}
		if i >= 2 && s.Sub(r.starts[i-2]) < time.Hour {
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
// recycled in time, the fleet's status listing each. The checker is
// proven by a fleet that reads no recycle of its pools (their status'
// and its own records hidden from it), which grants recycles as if none
// had happened, and must be caught.
func TestPooledRecyclingKeepsTheFleetsBound(t *testing.T) {
	// 6 recycles at 2 an hour: about three hours; steps average 4.5 s.
	const steps = 3400
	for _, lag := range []bool{false, true} {
		for seed := range int64(2) {
			r := recyclePooled(t, seed, steps, variant{lag: lag})
			if why := r.boundBroken(); why != "" {
				t.Errorf("lagging %t, seed %d: %s (recycles started at %v)", lag, seed, why, r.starts)
			}
			if len(r.left) > 0 || len(r.starts) != 6 || r.records != 6 {
				t.Errorf("lagging %t, seed %d: %d recycles started, %d in the fleet's status, burned proxies left %v", lag, seed, len(r.starts), r.records, r.left)
			}
			// What a platform team sees: the burned proxies waiting, why,
			// and that the bound holds them.
			if r.mostBurned < 4 || r.atBound == nil || !strings.Contains(str(r.atBound, "recycleWaiting"), "at most 2 recycles an hour") {
				t.Errorf("lagging %t, seed %d: the fleet's status counted at most %d burned proxies waiting, at the bound %v", lag, seed, r.mostBurned, r.atBound)
			}
		}
	}

	blind := variant{
		pools: func(o *structpb.Struct) {
			delete(field(o, "status", "egress").GetStructValue().GetFields(), "recycles")
		},
		xr: func(x *structpb.Struct) {
			delete(field(x, "status", "egress").GetStructValue().GetFields(), "recycles")
		},
	}
	caught := 0
	for seed := range int64(2) {
		if r := recyclePooled(t, seed, steps/3, blind); r.boundBroken() != "" {
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

	// A recycle since the grant (or within a minute before it) spends
	// it; one before, of an earlier grant, does not.
	since := t0.Add(-10 * time.Minute)
	for at, spent := range map[time.Duration]bool{time.Minute: true, -30 * time.Second: true, -2 * time.Minute: false} {
		st := &structpb.Struct{Fields: map[string]*structpb.Value{"egress": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"recycles": structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				"proxy": structpb.NewStringValue("crawlers-gone"), "egressIP": structpb.NewStringValue("203.0.113.99"),
				"reason": structpb.NewStringValue("banned"), "time": structpb.NewStringValue(since.Add(at).Format(time.RFC3339)),
			}})}}),
		}})}}
		grant := map[string]any{"maxSurge": 1, keyMaxRecycles: 1, keyRecyclesSince: since.Format(time.RFC3339)}
		if got := replacing(compose(spec(grant), st)); (len(got) == 0) != spent {
			t.Errorf("a recycle %s after the grant began: spent %t, yet the pool replaces %v", at, spent, got)
		}
	}

	for name, c := range map[string]struct {
		s    map[string]any
		want string
	}{
		"NegativeGrant": {spec(map[string]any{keyMaxRecycles: -1}), "spec.budget.maxRecycles must not be negative"},
		"BadSince":      {spec(map[string]any{keyMaxRecycles: 1, keyRecyclesSince: "yesterday"}), "spec.budget.recyclesSince must be an RFC 3339 time"},
		"Nameless":      {spec(grant, map[string]any{"reason": "x"}), "spec.burned has an entry without a name"},
	} {
		rsp := compose(c.s, nil)
		rs := rsp.GetResults()
		if len(rs) != 1 || rs[0].GetSeverity() != fnv1.Severity_SEVERITY_FATAL || !strings.Contains(rs[0].GetMessage(), c.want) || len(rsp.GetDesired().GetResources()) != 0 {
			t.Errorf("%s: want one Fatal saying %q and nothing composed, got %v", name, c.want, rs)
		}
	}
}
