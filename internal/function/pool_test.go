package function

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/resource"
	"google.golang.org/protobuf/types/known/structpb"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
)

func TestSizePools(t *testing.T) {
	zones := []string{"a", "b", "c"}
	got := sizePools(250, 100, zones, nil)
	var sizes []int
	var first []string
	for _, p := range got {
		sizes = append(sizes, p.replicas)
		first = append(first, p.zones[0])
	}
	if fmt.Sprint(sizes) != "[100 100 50]" {
		t.Errorf("250 proxies in pools of 100 fill them in order: got %v", sizes)
	}
	// Pool 2 starts where pool 1's 100 left off (100 mod 3 = 1), pool 3
	// where 200 did.
	if fmt.Sprint(first) != "[a b c]" {
		t.Errorf("each pool's zones start where the pools before it left off: got %v", first)
	}
	// The fleet as a whole is spread as one level would be.
	perZone := map[string]int{}
	for _, p := range got {
		for i := range p.replicas {
			perZone[p.zones[i%len(zones)]]++
		}
	}
	if perZone["a"] != 84 || perZone["b"] != 83 || perZone["c"] != 83 {
		t.Errorf("zones of 250 proxies: got %v, want 84/83/83", perZone)
	}

	// Shrinking to 150: pool 3 keeps a plan of 0 replicas until it is
	// empty, and is left out (deleted) only once it reported so.
	observed := map[int]*observedPool{
		1: {index: 1, replicas: 100, reported: true, desired: 100, counts: poolCounts{replicas: 100}},
		2: {index: 2, replicas: 100, reported: true, desired: 100, counts: poolCounts{replicas: 100}},
		3: {index: 3, replicas: 50, reported: true, desired: 50, counts: poolCounts{replicas: 50}},
	}
	if got := sizePools(150, 100, zones, observed); len(got) != 3 || got[1].replicas != 50 || got[2].replicas != 0 {
		t.Errorf("shrinking to 150 keeps pool 3 at 0 replicas until it is empty: %+v", got)
	}
	observed[3] = &observedPool{index: 3, replicas: 0, reported: true, desired: 0, counts: poolCounts{replicas: 1}}
	if got := sizePools(150, 100, zones, observed); len(got) != 3 {
		t.Errorf("a pool that still has a Proxy stays: %d pools", len(got))
	}
	observed[3] = &observedPool{index: 3, replicas: 0, reported: true, desired: 50, counts: poolCounts{replicas: 0}}
	if got := sizePools(150, 100, zones, observed); len(got) != 3 {
		t.Errorf("a pool that reported no Proxies while composed with 50 replicas may still be making them: it stays")
	}
	observed[3] = &observedPool{index: 3, replicas: 0, reported: true, desired: 0, counts: poolCounts{replicas: 0}}
	if got := sizePools(150, 100, zones, observed); len(got) != 2 {
		t.Errorf("an empty pool composed with 0 replicas goes: %d pools", len(got))
	}
}

func TestAllocate(t *testing.T) {
	pool := func(k int, o observedPool) *poolPlan {
		o.index = k
		return &poolPlan{index: k, observed: &o}
	}
	grants := func(plans []*poolPlan) string {
		var out []string
		for _, p := range plans {
			out = append(out, fmt.Sprintf("%d/%d", p.grant.surge, p.grant.unavailable))
		}
		return strings.Join(out, " ")
	}
	cases := []struct {
		name  string
		total budget
		pools []*poolPlan
		want  string
	}{
		{"NobodyWants", budget{2, 1, 0}, []*poolPlan{pool(1, observedPool{}), pool(2, observedPool{})}, "0/0 0/0"},
		{"OneEachInTurn", budget{3, 1, 0}, []*poolPlan{pool(1, observedPool{wanted: 5}), pool(2, observedPool{wanted: 5})}, "2/1 1/0"},
		{"NoMoreThanWanted", budget{3, 0, 0}, []*poolPlan{pool(1, observedPool{wanted: 1}), pool(2, observedPool{wanted: 5})}, "1/0 2/0"},
		// Pool 1 gave its unit up in its spec, but was last composed
		// with it: pool 2 waits until pool 1 acknowledges.
		{"WaitsForTheAck", budget{1, 1, 0}, []*poolPlan{
			pool(1, observedPool{reported: true, acked: budget{1, 1, 0}}),
			pool(2, observedPool{wanted: 3}),
		}, "0/0 0/0"},
		{"AfterTheAck", budget{1, 1, 0}, []*poolPlan{
			pool(1, observedPool{reported: true}),
			pool(2, observedPool{wanted: 3}),
		}, "0/0 1/1"},
		// A pool keeps its units while it uses them, wanted or not.
		{"KeepsWhatItUses", budget{1, 1, 0}, []*poolPlan{
			pool(1, observedPool{reported: true, granted: budget{1, 1, 0}, acked: budget{1, 1, 0}, inUse: budget{1, 1, 0}}),
			pool(2, observedPool{wanted: 3}),
		}, "1/1 0/0"},
		// Proxies a pool took out of service hold their units, granted
		// or not, until they serve again.
		{"TakenOutHolds", budget{0, 1, 0}, []*poolPlan{
			pool(1, observedPool{reported: true, inUse: budget{0, 1, 0}}),
			pool(2, observedPool{wanted: 3}),
		}, "0/0 0/0"},
		// The fleet's own record of a grant holds it, though the pool's
		// spec, read from a stale cache, does not show it yet.
		{"LedgerHolds", budget{1, 0, 0}, []*poolPlan{
			pool(1, observedPool{ledger: budget{1, 0, 0}}),
			pool(2, observedPool{wanted: 3}),
		}, "0/0 0/0"},
		// Pools whose due proxies no lease holds come first.
		{"UnleasedFirst", budget{1, 0, 0}, []*poolPlan{
			pool(1, observedPool{wanted: 2}),
			pool(2, observedPool{wanted: 3, wantedFree: 1}),
		}, "0/0 1/0"},
		// A pool keeps no more than it wants or uses.
		{"TrimmedToUse", budget{3, 0, 0}, []*poolPlan{
			pool(1, observedPool{reported: true, wanted: 1, granted: budget{3, 0, 0}, acked: budget{3, 0, 0}, inUse: budget{1, 0, 0}}),
		}, "1/0"},
		{"BudgetLowered", budget{1, 0, 0}, []*poolPlan{
			pool(1, observedPool{wanted: 2, granted: budget{2, 0, 0}, acked: budget{2, 0, 0}}),
			pool(2, observedPool{wanted: 2, granted: budget{1, 0, 0}, acked: budget{1, 0, 0}}),
		}, "1/0 0/0"},
	}
	for _, c := range cases {
		allocate(c.total, c.pools)
		if got := grants(c.pools); got != c.want {
			t.Errorf("%s: grants %s, want %s", c.name, got, c.want)
		}
	}
}

func (x *simProxy) ready(now time.Time, boot time.Duration) bool { return now.Sub(x.created) >= boot }

// TestPoolsKeepTheFleetsBudget: a template change rolled over a pooled
// fleet, its pools reconciled in any order, from observations a few
// reconciles old, never takes more than the fleet's maxUnavailable Proxies
// out of service nor makes more than its maxSurge above replicas, however
// many pools roll at once; and it completes. The checker is proven by a
// fleet that does not read what its pools acknowledged, which hands one
// unit to two pools at once, and must be caught.
func TestPoolsKeepTheFleetsBudget(t *testing.T) {
	const replicas, perPool = 6, 2
	cases := map[string]struct {
		rotation           string
		unavailable, surge int
	}{
		"Unavailable": {`{"maxSurge": 0, "maxUnavailable": 1}`, 1, 0},
		"Surge":       {`{"maxSurge": 1, "maxUnavailable": 0}`, 0, 1},
		"Both":        {`{"maxSurge": 2, "maxUnavailable": 2}`, 2, 2},
	}
	for name, tc := range cases {
		for _, lag := range []bool{false, true} {
			for seed := range int64(3) {
				fewest, most, done := rollOut(t, seed, replicas, perPool, tc.rotation, variant{lag: lag})
				if !done {
					t.Errorf("%s, lagging %t, seed %d: the rollout did not complete", name, lag, seed)
				}
				if fewest < replicas-tc.unavailable {
					t.Errorf("%s, lagging %t, seed %d: %d proxies available at one moment, below the fleet's floor of %d", name, lag, seed, fewest, replicas-tc.unavailable)
				}
				if most > replicas+tc.surge {
					t.Errorf("%s, lagging %t, seed %d: %d proxies at one moment, above replicas + maxSurge %d", name, lag, seed, most, replicas+tc.surge)
				}
			}
		}
	}

	// The broken variants: a fleet that sees no acknowledgement and no
	// use, and one that keeps no record of its grants while its view of
	// the pools lags.
	ignoresAcks := func(o *structpb.Struct) {
		if b := field(o, "status", "budget").GetStructValue(); b != nil {
			for _, k := range []string{keyMaxSurge, keyMaxUnavailable, "surgeInUse", "unavailableInUse"} {
				delete(b.GetFields(), k)
			}
		}
	}
	noLedger := func(x *structpb.Struct) { delete(field(x, "status").GetStructValue().GetFields(), "pools") }
	for name, v := range map[string]variant{"IgnoresAcks": {pools: ignoresAcks}, "KeepsNoLedger": {lag: true, xr: noLedger}} {
		caught := 0
		for _, tc := range []string{"Unavailable", "Surge"} {
			for seed := range int64(4) {
				fewest, most, _ := rollOut(t, seed, replicas, perPool, cases[tc].rotation, v)
				if fewest < replicas-cases[tc].unavailable || most > replicas+cases[tc].surge {
					caught++
				}
			}
		}
		t.Logf("%s broke a bound in %d of 8 runs", name, caught)
		if caught == 0 {
			t.Errorf("the broken variant %s never broke a bound: the checker cannot tell it from the function", name)
		}
	}
}

// poolXR is a ProxyPool of the crawlers fleet, as its fleet composes it.
func poolXR(t *testing.T, spec map[string]any) *structpb.Struct {
	t.Helper()
	b, err := json.Marshal(map[string]any{"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
		"metadata": map[string]any{"name": "crawlers-pool-1", "namespace": "team"}, "spec": spec})
	if err != nil {
		t.Fatal(err)
	}
	return resource.MustStructJSON(string(b))
}

func TestPoolBadInput(t *testing.T) {
	good := func() map[string]any {
		return map[string]any{"fleet": "crawlers", "index": 1, "template": mustMap(t, validSpec)}
	}
	cases := map[string]struct {
		edit func(map[string]any)
		want string
	}{
		"NoFleet":      {func(s map[string]any) { delete(s, "fleet") }, "spec.fleet must name the ProxyFleet"},
		"IndexZero":    {func(s map[string]any) { s["index"] = 0 }, "spec.index must be a whole number between 1 and 96"},
		"IndexTooHigh": {func(s map[string]any) { s["index"] = 97 }, "spec.index must be a whole number between 1 and 96"},
		"IndexHalf":    {func(s map[string]any) { s["index"] = 1.5 }, "spec.index must be a whole number"},
		"NoTemplate":   {func(s map[string]any) { delete(s, "template") }, "spec.template is required"},
		"NotItsName":   {func(s map[string]any) { s["index"] = 2 }, `metadata.name "crawlers-pool-1" must be "crawlers-pool-2"`},
		"OtherFleet":   {func(s map[string]any) { s["fleet"] = "theirs" }, `metadata.name "crawlers-pool-1" must be "theirs-pool-1"`},
		"BadTemplate": {func(s map[string]any) { s["template"].(map[string]any)["replicas"] = -1 }, //nolint:forcetypeassert // Test data.
			"spec.template: spec.replicas must be between 0"},
		"TemplateAutoscaled": {func(s map[string]any) {
			s["template"].(map[string]any)["autoscaling"] = map[string]any{"maxReplicas": 3} //nolint:forcetypeassert // Test data.
		}, "spec.template must have neither autoscaling nor pools"},
		"NegativeBudget": {func(s map[string]any) { s["budget"] = map[string]any{"maxSurge": -1} }, "spec.budget maxSurge, maxUnavailable and maxRepairs must not be negative"},
		"BadScaleDown":   {func(s map[string]any) { s["scaleDown"] = "Later" }, `spec.scaleDown must be Immediate or Drain, not "Later"`},
	}
	for name, c := range cases {
		s := good()
		c.edit(s)
		rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: poolXR(t, s)}}})
		rs := rsp.GetResults()
		if len(rs) != 1 || rs[0].GetSeverity() != fnv1.Severity_SEVERITY_FATAL || !strings.Contains(rs[0].GetMessage(), c.want) {
			t.Errorf("%s: want one Fatal saying %q, got %v", name, c.want, rs)
		}
		if len(rsp.GetDesired().GetResources()) != 0 {
			t.Errorf("%s: bad input composed %d resources", name, len(rsp.GetDesired().GetResources()))
		}
	}

	// A legacy claim's XR, and a fleet of Proxies that got pools anyway.
	legacy := xr(withSpecIn(t, validSpec, "pools", `{"proxiesPerPool": 2}`))
	legacy.Fields["kind"] = structpb.NewStringValue("XProxyFleet")
	meta := field(legacy, "metadata").GetStructValue()
	delete(meta.GetFields(), "namespace")
	meta.Fields["labels"] = structpb.NewStructValue(resource.MustStructJSON(`{"crossplane.io/claim-namespace": "team", "crossplane.io/claim-name": "crawlers"}`))
	rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: legacy}}})
	if rs := rsp.GetResults(); len(rs) != 1 || !strings.Contains(rs[0].GetMessage(), "spec.pools is for namespaced ProxyFleets") {
		t.Errorf("a legacy XR with spec.pools: want a Fatal naming spec.pools, got %v", rs)
	}
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{
		Composite: &fnv1.Resource{Resource: xr(withSpecIn(t, validSpec, "pools", `{"proxiesPerPool": 2}`))},
		Resources: map[string]*fnv1.Resource{"proxy-0": observedProxy(0, "a", true, t0.Add(-time.Hour), "")},
	}})
	if rs := rsp.GetResults(); len(rs) != 1 || rs[0].GetSeverity() != fnv1.Severity_SEVERITY_FATAL || !strings.Contains(rs[0].GetMessage(), "cannot move into pools") {
		t.Errorf("a fleet of Proxies with spec.pools: want a Fatal (nothing deleted), got %v", rs)
	}
	for name, want := range map[string]string{
		`{"proxiesPerPool": 0}`:   "spec.pools.proxiesPerPool must be between 1 and 120",
		`{"proxiesPerPool": 121}`: "spec.pools.proxiesPerPool must be between 1 and 120",
		`{"proxiesPerPool": 1}`:   "spec.pools.proxiesPerPool (1) x 96 pools holds 96 proxies, fewer than the fleet's 100",
	} {
		spec := withSpecIn(t, withSpec(t, "replicas", "100"), "pools", name)
		rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}}})
		if rs := rsp.GetResults(); len(rs) != 1 || !strings.Contains(rs[0].GetMessage(), want) {
			t.Errorf("pools %s: want a Fatal saying %q, got %v", name, want, rs)
		}
	}
}

// poolSummaries is what Crossplane sends a pool: its own summaries, and
// its fleet's fleet-wide one of each replica that wrote one of the pool
// (r1 unless named otherwise).
func poolSummaries(items ...*structpb.Struct) map[string]*fnv1.Resources {
	out := summaries(items...)
	seen := map[string]bool{}
	whole := &fnv1.Resources{}
	for _, i := range items {
		r := str(i, "spec", "replica")
		if !seen[r] {
			seen[r] = true
			whole.Items = append(whole.Items, &fnv1.Resource{Resource: leaseSummary("crawlers", r, t0, nil, nil, leasewire.Demand{})})
		}
	}
	out[requiredFleetSummaries] = whole
	return out
}

// inPool makes a summary one of a pool's.
func inPool(pool string, s *structpb.Struct) *structpb.Struct {
	field(s, "spec").GetStructValue().Fields["pool"] = structpb.NewStringValue(pool)
	return s
}

// TestPoolScaleDownDrains: a pool of an autoscaled fleet (scaleDown:
// Drain) above its replicas removes no proxy a lease is on, drains the
// others, and removes them once every discovery replica saw them
// draining; a pool of a fleet sized by spec.replicas removes at once.
func TestPoolScaleDownDrains(t *testing.T) {
	spec := func(mode string) map[string]any {
		tmpl := mustMap(t, withSpec(t, "replicas", "1"))
		return map[string]any{"fleet": "crawlers", "index": 1, "scaleDown": mode, "template": tmpl}
	}
	base := fleetv1alpha1.PoolOrdinalSpan
	drained := `, "crawl.example.com/draining-since": "` + strconv.FormatInt(drainedAt.Unix(), 10) + `"`
	observed := func(extra string) map[string]*fnv1.Resource {
		return map[string]*fnv1.Resource{
			resourceName(base):     observedProxy(base, "a", true, t0.Add(-time.Hour), extra),
			resourceName(base + 1): observedProxy(base+1, "b", true, t0.Add(-time.Hour), extra),
			resourceName(base + 2): observedProxy(base+2, "a", true, t0.Add(-time.Hour), extra),
		}
	}
	names := func(rsp *fnv1.RunFunctionResponse) []string {
		var out []string
		for _, r := range rsp.GetDesired().GetResources() {
			out = append(out, str(r.GetResource(), "metadata", "name"))
		}
		sort.Strings(out)
		return out
	}
	kept := fmt.Sprintf("crawlers-%d", base+1)
	all := []string{fmt.Sprintf("crawlers-%d", base), kept, fmt.Sprintf("crawlers-%d", base+2)}
	leased := poolSummaries(inPool("crawlers-pool-1", leaseSummary("crawlers", "r1", t0, []held{{kept, 1, t0.Add(time.Hour)}}, nil, leasewire.Demand{})))
	rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: poolXR(t, spec("Drain"))}, Resources: observed("")}, RequiredResources: leased})
	if got := names(rsp); len(got) != 3 {
		t.Errorf("Drain: the pool removed proxies before they drained: kept %v", got)
	}
	seen := poolSummaries(inPool("crawlers-pool-1", leaseSummary("crawlers", "r1", t0, []held{{kept, 1, t0.Add(time.Hour)}}, all, leasewire.Demand{})))
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: poolXR(t, spec("Drain"))}, Resources: observed(drained)}, RequiredResources: seen})
	if got := names(rsp); len(got) != 1 || got[0] != kept {
		t.Errorf("Drain: once drained and seen, the pool keeps only the leased proxy %s: kept %v", kept, got)
	}
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: poolXR(t, spec("Immediate"))}, Resources: observed("")}, RequiredResources: leased})
	if got := names(rsp); len(got) != 1 {
		t.Errorf("Immediate: spec.replicas falling removes at once, as a one-level fleet does: kept %v", got)
	}
}

// TestPoolRolloutClock: a pool with proxies to replace but no budget waits
// for its turn without a rollout clock (it cannot stall while it waits);
// a fleet says RolloutStalled when one of its pools does, naming it.
func TestPoolRolloutClock(t *testing.T) {
	base := fleetv1alpha1.PoolOrdinalSpan
	old := `, "crawl.example.com/template-revision": "0ld0ld0ld0"`
	observed := map[string]*fnv1.Resource{
		resourceName(base):     observedProxy(base, "a", true, t0.Add(-time.Hour), old),
		resourceName(base + 1): observedProxy(base+1, "b", true, t0.Add(-time.Hour), old),
	}
	spec := map[string]any{"fleet": "crawlers", "index": 1, "template": mustMap(t, validSpec)}
	rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: poolXR(t, spec)}, Resources: observed}, RequiredResources: noLeases()})
	if c := cond(rsp, ConditionRolloutStalled); c.GetReason() != "WaitingForBudget" {
		t.Errorf("a pool without budget: RolloutStalled %v, want WaitingForBudget", c)
	}
	if field(rsp.GetDesired().GetComposite().GetResource(), "status", "rollout") != nil {
		t.Error("a pool without budget runs no rollout clock")
	}
	if u := field(rsp.GetDesired().GetComposite().GetResource(), "status", "budget", "wanted").GetNumberValue(); u != 2 {
		t.Errorf("the pool wants budget for its 2 outdated proxies, says %v", u)
	}
	spec["budget"] = map[string]any{"maxSurge": 1}
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: poolXR(t, spec)}, Resources: observed}, RequiredResources: noLeases()})
	if c := cond(rsp, ConditionRolloutStalled); c.GetReason() != "Progressing" {
		t.Errorf("a pool with budget: RolloutStalled %v, want Progressing", c)
	}
	if field(rsp.GetDesired().GetComposite().GetResource(), "status", "rollout") == nil {
		t.Error("a pool with budget runs its rollout clock")
	}

	fleetSpec := withSpecIn(t, validSpec, "pools", `{"proxiesPerPool": 2}`)
	stuck := resource.MustStructJSON(`{"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
		"metadata": {"name": "crawlers-pool-1", "namespace": "team"},
		"spec": {"fleet": "crawlers", "index": 1, "budget": {"maxSurge": 1}, "template": {"replicas": 2}},
		"status": {"replicas": 2, "desiredReplicas": 2, "budget": {"maxSurge": 1, "wanted": 1, "surgeInUse": 1},
			"conditions": [{"type": "RolloutStalled", "status": "True", "message": "no progress since 2026-11-29T11:00:00Z"}]}}`)
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(fleetSpec)},
		Resources: map[string]*fnv1.Resource{"pool-1": {Resource: stuck}}}})
	if c := cond(rsp, ConditionRolloutStalled); c.GetStatus() != fnv1.Status_STATUS_CONDITION_TRUE || !strings.Contains(c.GetMessage(), "crawlers-pool-1: no progress since") {
		t.Errorf("a fleet with a stalled pool: RolloutStalled %v, want True naming the pool", c)
	}
}

// TestPoolOrdinalsStayInTheirSpan: a pool whose ordinals reached the end
// of its span names new Proxies from the lowest ordinal of its span no
// Proxy holds, never one of the next pool's, nor one just removed.
func TestPoolOrdinalsStayInTheirSpan(t *testing.T) {
	f, err := parsePool("crawlers-pool-1", "team", map[string]any{"spec": map[string]any{
		"fleet": "crawlers", "index": float64(1), "budget": map[string]any{keyMaxSurge: float64(1)},
		"template": mustMap(t, withSpecIn(t, withSpec(t, "replicas", "3"), "rotation", `{"maxAge": "1h"}`)),
	}})
	if err != nil {
		t.Fatal(err)
	}
	base, end := fleetv1alpha1.PoolOrdinalSpan, 2*fleetv1alpha1.PoolOrdinalSpan
	observed := []*member{
		{Ordinal: base, Name: "crawlers-10000000", Zone: "a", Ready: true, Created: t0.Add(-2 * time.Hour), Since: t0.Add(-2 * time.Hour), Replaces: -1, Revision: f.Revision},
		{Ordinal: base + 1, Name: "crawlers-10000001", Zone: "b", Ready: true, Created: t0.Add(-time.Minute), Since: t0.Add(-time.Minute), Replaces: -1, Revision: f.Revision},
		{Ordinal: end - 1, Name: "crawlers-19999999", Zone: "a", Ready: true, Created: t0.Add(-time.Minute), Since: t0.Add(-time.Minute), Replaces: -1, Revision: f.Revision},
	}
	p := decide(f, observed, true, t0)
	var made []int
	for _, m := range p.keep {
		if m.Created.Equal(t0) {
			made = append(made, m.Ordinal)
		}
	}
	if len(made) != 1 || made[0] != base+2 {
		t.Errorf("the pool past its span made %v, want [%d]: the lowest free ordinal of its own span", made, base+2)
	}
}

// TestPoolLeasesCoveredByEveryReplica: a pool trusts its summaries only
// when every egress-discovery replica with a fresh summary of the fleet
// has summarised the pool too: one that has not may hold a lease on one of
// the pool's proxies. The check is proven by a pool summary missing for a
// live replica, which leaves the leases unknown (nothing removed).
func TestPoolLeasesCoveredByEveryReplica(t *testing.T) {
	spec := map[string]any{"fleet": "crawlers", "index": 1, "scaleDown": "Drain", "template": mustMap(t, withSpec(t, "replicas", "1"))}
	base := fleetv1alpha1.PoolOrdinalSpan
	drained := `, "crawl.example.com/draining-since": "` + strconv.FormatInt(drainedAt.Unix(), 10) + `"`
	observed := map[string]*fnv1.Resource{
		resourceName(base):     observedProxy(base, "a", true, t0.Add(-time.Hour), ""),
		resourceName(base + 1): observedProxy(base+1, "b", true, t0.Add(-time.Hour), drained),
	}
	extra := fmt.Sprintf("crawlers-%d", base+1)
	kept := func(required map[string]*fnv1.Resources) int {
		rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: poolXR(t, spec)}, Resources: observed}, RequiredResources: required})
		return len(rsp.GetDesired().GetResources())
	}
	both := poolSummaries(
		inPool("crawlers-pool-1", leaseSummary("crawlers", "r1", t0, nil, []string{extra}, leasewire.Demand{})),
		inPool("crawlers-pool-1", leaseSummary("crawlers", "r2", t0, nil, []string{extra}, leasewire.Demand{})))
	if n := kept(both); n != 1 {
		t.Fatalf("drained and seen by both replicas: the proxy above replicas goes (kept %d): the check is not vacuous", n)
	}
	// r2 is live (its fleet-wide summary is fresh) but wrote no summary
	// of this pool.
	missing := poolSummaries(inPool("crawlers-pool-1", leaseSummary("crawlers", "r1", t0, nil, []string{extra}, leasewire.Demand{})))
	missing[requiredFleetSummaries].Items = append(missing[requiredFleetSummaries].Items, &fnv1.Resource{Resource: leaseSummary("crawlers", "r2", t0, nil, nil, leasewire.Demand{})})
	if n := kept(missing); n != 2 {
		t.Errorf("a live replica without a summary of the pool: nothing may go, kept %d", n)
	}
	noFleet := summaries(inPool("crawlers-pool-1", leaseSummary("crawlers", "r1", t0, nil, []string{extra}, leasewire.Demand{})))
	if n := kept(noFleet); n != 2 {
		t.Errorf("without the fleet's own summaries: nothing may go, kept %d", n)
	}
}

// TestPooledFleetCountsHeldLeases: an autoscaled pooled fleet's own
// summaries list no proxy; the leases held are what their demand counts.
func TestPooledFleetCountsHeldLeases(t *testing.T) {
	spec := withSpecIn(t, withSpecIn(t, validSpec, "pools", `{"proxiesPerPool": 2}`), "autoscaling", `{"minReplicas": 1, "maxReplicas": 20, "scaleDownStabilization": "0s"}`)
	rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}},
		RequiredResources: summaries(leaseSummary("crawlers", "r1", t0, nil, nil, leasewire.Demand{Held: 9}), leaseSummary("crawlers", "r2", t0, nil, nil, leasewire.Demand{Held: 9}))})
	// 9 leases at one per proxy, 0.7 utilization: 13 proxies.
	if got := field(rsp.GetDesired().GetComposite().GetResource(), "status", "desiredReplicas").GetNumberValue(); got != 13 {
		t.Errorf("9 leases held (each replica counting all): want 13 proxies, got %v (%v)", got, rsp.GetConditions())
	}
}

// TestRepairsShareTheFleetsLimit: replacements of proxies that are down
// are the fleet's max(maxSurge, 1) in all, however many pools: a pool
// without a share replaces none and asks; with one it replaces.
func TestRepairsShareTheFleetsLimit(t *testing.T) {
	plans := []*poolPlan{
		{index: 1, observed: &observedPool{index: 1, repairsWanted: 2}},
		{index: 2, observed: &observedPool{index: 2, repairsWanted: 1}},
	}
	allocate(budget{0, 1, 1}, plans)
	if plans[0].grant.repairs+plans[1].grant.repairs != 1 {
		t.Errorf("one repair for the fleet: granted %d and %d", plans[0].grant.repairs, plans[1].grant.repairs)
	}

	base := fleetv1alpha1.PoolOrdinalSpan
	observed := map[string]*fnv1.Resource{
		resourceName(base):     observedProxy(base, "a", true, t0.Add(-time.Hour), ""),
		resourceName(base + 1): observedProxy(base+1, "b", false, t0.Add(-time.Hour), ""),
	}
	compose := func(repairs int) *fnv1.RunFunctionResponse {
		spec := map[string]any{"fleet": "crawlers", "index": 1, "budget": map[string]any{"maxRepairs": repairs}, "template": mustMap(t, validSpec)}
		return run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: poolXR(t, spec)}, Resources: observed},
			RequiredResources: poolSummaries(inPool("crawlers-pool-1", leaseSummary("crawlers", "r1", t0, nil, nil, leasewire.Demand{})))})
	}
	down := resourceName(base + 1)
	rsp := compose(0)
	if _, kept := rsp.GetDesired().GetResources()[down]; !kept || len(rsp.GetDesired().GetResources()) != 2 {
		t.Errorf("without a repair the pool replaces no proxy that is down: %d desired", len(rsp.GetDesired().GetResources()))
	}
	if w := field(rsp.GetDesired().GetComposite().GetResource(), "status", "budget", "repairsWanted").GetNumberValue(); w != 1 {
		t.Errorf("the pool asks for a repair: repairsWanted %v", w)
	}
	rsp = compose(1)
	if _, kept := rsp.GetDesired().GetResources()[down]; kept {
		t.Errorf("with a repair the pool replaces the proxy that is down (in place: it has no surge)")
	}
	if u := field(rsp.GetDesired().GetComposite().GetResource(), "status", "budget", "repairsInUse").GetNumberValue(); u != 1 {
		t.Errorf("the replacement in flight holds the repair: repairsInUse %v", u)
	}
}

// TestSteadyPoolRechecksRarely: a pool where nothing is to change is
// composed again after poolSteadyRecheck unless a proxy's maxAge comes
// first; one with anything in progress keeps the minute.
func TestSteadyPoolRechecksRarely(t *testing.T) {
	ttl := func(req *fnv1.RunFunctionRequest) time.Duration {
		t.Helper()
		rsp := run(t, req)
		if len(rsp.GetResults()) > 0 && rsp.GetResults()[0].GetSeverity() == fnv1.Severity_SEVERITY_FATAL {
			t.Fatal(rsp.GetResults()[0].GetMessage())
		}
		return rsp.GetMeta().GetTtl().AsDuration()
	}
	if got := ttl(poolRequest(t, 6)); got != poolSteadyRecheck {
		t.Errorf("a steady pool: TTL %s, want %s", got, poolSteadyRecheck)
	}
	base := fleetv1alpha1.PoolOrdinalSpan
	down := poolRequest(t, 6)
	down.Observed.Resources[resourceName(base+2)] = observedProxy(base+2, "c", false, t0.Add(-time.Hour), "")
	if got := ttl(down); got > time.Minute {
		t.Errorf("a pool with a proxy down: TTL %s, want at most a minute", got)
	}
	short := poolRequest(t, 6)
	delete(short.Observed.Resources, resourceName(base+5))
	if got := ttl(short); got > time.Minute {
		t.Errorf("a pool short of a proxy: TTL %s, want at most a minute", got)
	}
	aging := poolRequest(t, 6)
	tmpl := aging.Observed.Composite.Resource.Fields["spec"].GetStructValue().Fields["template"].GetStructValue()
	tmpl.Fields["rotation"] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"maxAge": structpb.NewStringValue("63m")}})
	if got := ttl(aging); got != 3*time.Minute {
		t.Errorf("a steady pool whose proxies reach maxAge in 3m: TTL %s, want 3m", got)
	}
}

// TestPoolsCarryNoGatewaySettings: a pool's template leaves the fleet's
// spec.gateway out (egress-discovery reads it from the fleet), so a
// change of the gateway's rotation composes the pools exactly as before.
func TestPoolsCarryNoGatewaySettings(t *testing.T) {
	pools := func(gateway string) map[string]string {
		spec := withSpecIn(t, withSpecIn(t, validSpec, "pools", `{"proxiesPerPool": 2}`), "gateway", gateway)
		rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}}})
		out := map[string]string{}
		for name, r := range rsp.GetDesired().GetResources() {
			b, err := r.GetResource().MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			out[name] = string(b)
		}
		return out
	}
	lru, rr := pools(`{"rotation": "leastRecentlyUsed"}`), pools(`{"rotation": "roundRobin"}`)
	if len(lru) == 0 {
		t.Fatal("no pools composed")
	}
	for name, p := range lru {
		if strings.Contains(p, "rotation\":\"leastRecentlyUsed") || strings.Contains(p, `"gateway"`) {
			t.Errorf("%s carries the gateway's settings: %s", name, p)
		}
		if rr[name] != p {
			t.Errorf("%s changed with the gateway's rotation:\n%s\n%s", name, p, rr[name])
		}
	}
}
