package function

import (
	"fmt"
	"math/rand"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/resource"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
)

// quietCases are pools of 6 with a budget to act on: one steady, the
// others each with one thing to do.
func quietCases(t *testing.T) map[string]*fnv1.RunFunctionRequest {
	t.Helper()
	base := fleetv1alpha1.PoolOrdinalSpan
	label := func(k, v string) string { return fmt.Sprintf(`, %q: %q`, k, v) }
	mkBudget := func(surge float64, change func(map[string]*fnv1.Resource)) *fnv1.RunFunctionRequest {
		req := poolRequest(t, 6)
		spec := req.Observed.Composite.Resource.Fields["spec"].GetStructValue()
		spec.Fields["budget"] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			keyMaxSurge: structpb.NewNumberValue(surge), keyMaxUnavailable: structpb.NewNumberValue(1), keyMaxRepairs: structpb.NewNumberValue(1),
		}})
		if change != nil {
			change(req.Observed.Resources)
		}
		req.RequiredResources = nil
		return req
	}
	mk := func(change func(map[string]*fnv1.Resource)) *fnv1.RunFunctionRequest { return mkBudget(1, change) }
	down := func(o map[string]*fnv1.Resource) {
		o[resourceName(base+2)] = observedProxy(base+2, "c", false, t0.Add(-time.Hour), "")
	}
	old := func(o map[string]*fnv1.Resource) {
		o[resourceName(base+4)] = observedProxy(base+4, "b", true, t0.Add(-time.Hour), label("crawl.example.com/template-revision", "0ld0ld0ld0"))
	}
	return map[string]*fnv1.RunFunctionRequest{
		"Steady":          mk(nil),
		"OneDown":         mk(down),
		"OneDownNoSurge":  mkBudget(0, down),
		"OutdatedNoSurge": mkBudget(0, old),
		// Out of date and drained a minute: with no surge it is replaced
		// in place once no lease is on it and every replica saw it drain.
		"OutdatedDrainedNoSurge": mkBudget(0, func(o map[string]*fnv1.Resource) {
			o[resourceName(base+4)] = observedProxy(base+4, "b", true, t0.Add(-time.Hour),
				label("crawl.example.com/template-revision", "0ld0ld0ld0")+label(fleetv1alpha1.LabelDrainingSince, strconv.FormatInt(drainedAt.Unix(), 10)))
		}),
		"Short": mk(func(o map[string]*fnv1.Resource) { delete(o, resourceName(base+5)) }),
		"Surplus": mk(func(o map[string]*fnv1.Resource) {
			o[resourceName(base+6)] = observedProxy(base+6, "a", true, t0.Add(-time.Hour), "")
		}),
		"DueByMaxAge": mk(func(o map[string]*fnv1.Resource) {
			o[resourceName(base+1)] = observedProxy(base+1, "b", true, t0.Add(-25*time.Hour), "")
		}),
		"Draining": mk(func(o map[string]*fnv1.Resource) {
			o[resourceName(base+3)] = observedProxy(base+3, "a", true, t0.Add(-time.Hour), label(fleetv1alpha1.LabelDrainingSince, strconv.FormatInt(drainedAt.Unix(), 10)))
		}),
		"Outdated": mk(old),
		// A rollout paused with a proxy out of date: nothing moves.
		"PausedOutdated": func() *fnv1.RunFunctionRequest {
			req := mk(old)
			tmpl := req.Observed.Composite.Resource.Fields["spec"].GetStructValue().Fields["template"].GetStructValue()
			tmpl.Fields["rollout"] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"paused": structpb.NewBoolValue(true)}})
			return req
		}(),
		"ReplacementUp": mk(func(o map[string]*fnv1.Resource) {
			o[resourceName(base+6)] = observedProxy(base+6, "b", true, t0.Add(-time.Minute), label(fleetv1alpha1.LabelReplaces, strconv.Itoa(base+1)))
		}),
	}
}

// TestSteadyPoolReadsNoLeases: a pool requires its LeaseSummaries and its
// fleet's only when it has something to replace, remove or wait for, so
// that lease churn composes no steady pool; the requirements it returns
// are the same with the summaries sent as without (Crossplane calls until
// they settle), and a pool that did not read its leases reports no
// leased count rather than a wrong one.
func TestSteadyPoolReadsNoLeases(t *testing.T) {
	base := fleetv1alpha1.PoolOrdinalSpan
	leasedOne := poolSummaries(inPool("crawlers-pool-1", leaseSummary("crawlers", "r1", t0, []held{{fmt.Sprintf("crawlers-%d", base), 1, t0.Add(time.Hour)}}, nil, leasewire.Demand{})))
	for name, req := range quietCases(t) {
		rsp := run(t, req)
		got := rsp.GetRequirements().GetResources()
		_, own := got[requiredSummaries]
		_, whole := got[requiredFleetSummaries]
		status := field(rsp.GetDesired().GetComposite().GetResource(), "status").GetStructValue()
		if name == "Steady" {
			if len(got) != 0 {
				t.Errorf("%s: a steady pool requires %v: every summary written would compose it", name, got)
			}
			if _, ok := status.GetFields()["leasedReplicas"]; ok {
				t.Errorf("%s: a pool that read no leases reports leasedReplicas", name)
			}
		} else if !own || !whole {
			t.Errorf("%s: the pool must read its own and its fleet's summaries before it acts, requires %v", name, got)
		}
		req.RequiredResources = leasedOne
		again := run(t, req)
		if diff := cmp.Diff(rsp.GetRequirements(), again.GetRequirements(), protocmp.Transform()); diff != "" {
			t.Errorf("%s: the requirements change once Crossplane sends them, so they never settle: -first, +second:\n%s", name, diff)
		}
		if name == "OneDown" {
			if n := field(again.GetDesired().GetComposite().GetResource(), "status", "leasedReplicas"); n == nil || n.GetNumberValue() != 1 {
				t.Errorf("%s: a pool that read its leases counts its one leased proxy, says %v", name, n)
			}
		}
	}
}

// quietViolations returns the pools that quiet (the test for reading no
// leases) lets go without them although what they would do with leases
// known differs from what they do without: every proxy leased, or none
// leased and every drain seen.
func quietViolations(t *testing.T, quiet func(*Fleet, []*member, *plan) bool) []string {
	t.Helper()
	var out []string
	for name, req := range quietCases(t) {
		r := req.GetObserved().GetComposite().GetResource().AsMap()
		f, err := parsePool("crawlers-pool-1", "team", r)
		if err != nil {
			t.Fatal(err)
		}
		// assign says, per member, whether a lease is on it and whether
		// every replica saw its drain.
		members := func(assign func(i int) (leased, seen bool)) []*member {
			ms := observedMembers(req.GetObserved().GetResources(), nil, f.Revision)
			assessEgress(f, ms, nil)
			for i, m := range ms {
				leased, seen := assign(i)
				m.Leased, m.DrainSeen = leased, seen && !m.DrainSince.IsZero()
			}
			return ms
		}
		unknown := members(func(int) (bool, bool) { return false, false })
		p := decide(f, unknown, false, t0)
		if !quiet(f, unknown, p) {
			continue
		}
		// Every proxy leased; none leased and every drain seen; then
		// random mixes.
		assignments := []func(int) (bool, bool){
			func(int) (bool, bool) { return true, false },
			func(int) (bool, bool) { return false, true },
		}
		rng := rand.New(rand.NewSource(int64(len(name)))) //nolint:gosec // Test data.
		for range 30 {
			bits := rng.Int63()
			assignments = append(assignments, func(i int) (bool, bool) { return bits>>(2*i)&1 == 1, bits>>(2*i+1)&1 == 1 })
		}
		for _, assign := range assignments {
			if a, b := planSignature(p), planSignature(decide(f, members(assign), true, t0)); a != b {
				out = append(out, name)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

// planSignature is what a plan does: the proxies it keeps, each draining
// or not, and how many it creates and removes.
func planSignature(p *plan) string {
	var keep []string
	for _, m := range p.keep {
		keep = append(keep, fmt.Sprintf("%d/%t", m.Ordinal, m.Draining))
	}
	slices.Sort(keep)
	return fmt.Sprintf("%s created=%d removed=%d wait=%t inFlight=%d due=%d repairs=%d/%d", strings.Join(keep, ","),
		p.created, p.removed, p.leaseWait, p.inFlight, p.due, p.repairsWanted, p.repairsInFlight)
}

// TestQuietPoolNeedsNoLeases: wherever a pool reads no leases, knowing
// them would change nothing it does. The check is proven by a weaker test
// of quiet (the pool holds as many proxies as it wants), which lets a pool
// with a proxy down or out of date go without its leases, where known
// leases would have it replace the proxy at once.
func TestQuietPoolNeedsNoLeases(t *testing.T) {
	if v := quietViolations(t, steadyPlan); len(v) > 0 {
		t.Errorf("pools that read no leases although leases known would change what they do: %v", v)
	}
	weak := func(f *Fleet, ms []*member, p *plan) bool { return len(p.keep) == f.Replicas && len(ms) == len(p.keep) }
	v := quietViolations(t, weak)
	if len(v) == 0 {
		t.Error("the weaker test of quiet lets no pool act differently: the check proves nothing")
	}
	t.Logf("the weaker test is caught by %v", v)
}

// TestPooledFleetCountsLeasedProxies: a pooled fleet, autoscaled or not,
// reads its fleet-wide summaries and shows the leased proxies they count
// (the most any fresh one does: each replica sees every lease), at most
// its proxies; while none counts them (no discovery, or one of a release
// before the count) it shows none rather than its pools' partial sum.
func TestPooledFleetCountsLeasedProxies(t *testing.T) {
	spec := withSpecIn(t, validSpec, "pools", `{"proxiesPerPool": 2}`)
	pool := func(i, leased int) *fnv1.Resource {
		return &fnv1.Resource{Resource: resource.MustStructJSON(fmt.Sprintf(`{"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
			"metadata": {"name": "crawlers-pool-%d", "namespace": "team"},
			"spec": {"fleet": "crawlers", "index": %d, "template": {"replicas": 2}},
			"status": {"replicas": 2, "leasedReplicas": %d}}`, i, i, leased))}
	}
	counting := func(replica string, n int32) *structpb.Struct {
		s := leaseSummary("crawlers", replica, t0, nil, nil, leasewire.Demand{Held: 9})
		field(s, "spec", "demand").GetStructValue().Fields["leasedProxies"] = structpb.NewNumberValue(float64(n))
		return s
	}
	leased := func(required map[string]*fnv1.Resources) (*fnv1.RunFunctionResponse, *structpb.Value) {
		rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)},
			Resources: map[string]*fnv1.Resource{"pool-1": pool(1, 1), "pool-2": pool(2, 2)}}, RequiredResources: required})
		return rsp, field(rsp.GetDesired().GetComposite().GetResource(), "status", "leasedReplicas")
	}
	rsp, n := leased(nil)
	if _, ok := rsp.GetRequirements().GetResources()[requiredSummaries]; !ok {
		t.Errorf("a pooled fleet without autoscaling reads its fleet-wide summaries too: requires %v", rsp.GetRequirements())
	}
	if n != nil {
		t.Errorf("without summaries: leasedReplicas unknown, not %v (its steady pools count none)", n)
	}
	if _, n := leased(summaries(leaseSummary("crawlers", "r1", t0, nil, nil, leasewire.Demand{Held: 9}))); n != nil {
		t.Errorf("a summary of a release that does not count them: leasedReplicas unknown, not %v", n)
	}
	if _, n := leased(summaries(counting("r1", 3), counting("r2", 2))); n.GetNumberValue() != 3 {
		t.Errorf("summaries counting 3 and 2 leased proxies: want the most, 3, got %v", n)
	}
	stale := counting("r1", 4)
	field(stale, "spec").GetStructValue().Fields["observedAt"] = structpb.NewStringValue(staleAt.Format(time.RFC3339Nano))
	field(stale, "spec").GetStructValue().Fields["validUntil"] = structpb.NewStringValue(staleAt.Add(leasewire.SummaryFreshness).Format(time.RFC3339Nano))
	if _, n := leased(summaries(stale, counting("r2", 2))); n.GetNumberValue() != 2 {
		t.Errorf("a stale summary's count does not count: want 2, got %v", n)
	}
	if _, n := leased(summaries(counting("r1", 1<<30))); n.GetNumberValue() != 4 {
		t.Errorf("a count above the fleet's 4 proxies: want 4, got %v", n)
	}
}
