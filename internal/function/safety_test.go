package function

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// safetyCase is a fleet, the proxies crawlers really hold leases on, and
// what egress-discovery's replicas wrote of them.
type safetyCase struct {
	name     string
	spec     string
	observed map[string]*fnv1.Resource
	// holds are the proxies crawlers hold leases on, whatever the
	// summaries say.
	holds     []string
	summaries []*structpb.Struct
	// removes says that, the summaries being right, the function removes
	// a proxy here: the checker is not vacuous.
	removes bool
}

// removedHeld composes c, its summaries first passed through mutate, and
// returns the held proxies the function removed, and whether it removed
// any proxy at all.
func removedHeld(t *testing.T, c safetyCase, mutate func([]*structpb.Struct) []*structpb.Struct) ([]string, bool) {
	t.Helper()
	sums := make([]*structpb.Struct, 0, len(c.summaries))
	for _, s := range c.summaries {
		sums = append(sums, proto.Clone(s).(*structpb.Struct)) //nolint:forcetypeassert // A clone of a Struct.
	}
	rsp := run(t, &fnv1.RunFunctionRequest{
		Observed:          &fnv1.State{Composite: &fnv1.Resource{Resource: xr(c.spec)}, Resources: c.observed},
		RequiredResources: summaries(mutate(sums)...),
	})
	kept := map[string]bool{}
	for _, r := range rsp.GetDesired().GetResources() {
		kept[str(r.GetResource(), "metadata", "name")] = true
	}
	var removed []string
	for _, h := range c.holds {
		if !kept[h] {
			removed = append(removed, h)
		}
	}
	any := false
	for _, o := range c.observed {
		any = any || !kept[str(o.GetResource(), "metadata", "name")]
	}
	return removed, any
}

// TestNoLeasedProxyRemoved: whatever the replicas' summaries say, fresh,
// stale or from several replicas, the function never removes a proxy a
// crawler holds a lease on. The checker is proven by three broken
// variants, each of which it must catch: a summary that drops a held
// proxy, a stale summary trusted as fresh, and a merge that reads only one
// replica's summary.
func TestNoLeasedProxyRemoved(t *testing.T) {
	rotated := withSpec(t, "rotation", `{"maxAge": "1h"}`)
	draining := func(ago time.Duration) string {
		return `, "crawl.example.com/draining-since": "` + strconv.FormatInt(t0.Add(-ago).Unix(), 10) + `"`
	}
	// An old proxy, drained a minute, whose replacement is Ready.
	rotation := map[string]*fnv1.Resource{
		"proxy-0": observedProxy(0, "a", true, t0.Add(-3*time.Hour), draining(time.Minute)),
		"proxy-1": observedProxy(1, "b", true, t0.Add(-10*time.Minute), ""),
		"proxy-2": observedProxy(2, "a", true, t0.Add(-5*time.Minute), `, "crawl.example.com/replaces": "0"`),
	}
	autoscaled := withSpec(t, "autoscaling", `{"minReplicas": 1, "maxReplicas": 3, "scaleDownStabilization": "0s"}`)
	// Three proxies, all drained, of a fleet that wants fewer.
	shrinking := map[string]*fnv1.Resource{
		"proxy-0": observedProxy(0, "a", true, t0.Add(-time.Hour), draining(time.Minute)),
		"proxy-1": observedProxy(1, "b", true, t0.Add(-time.Hour), draining(time.Minute)),
		"proxy-2": observedProxy(2, "a", true, t0.Add(-time.Hour), draining(time.Minute)),
	}
	// An old proxy that failed its probe 30 s ago, which a crawler took
	// just before: the only summary was written 9 minutes ago, still
	// fresh, and lists neither the lease nor a drain.
	failed := observedProxy(0, "a", false, t0.Add(-3*time.Hour), "")
	cond := failed.GetResource().GetFields()["status"].GetStructValue().GetFields()["conditions"].GetListValue().GetValues()[0].GetStructValue()
	cond.GetFields()["lastTransitionTime"] = structpb.NewStringValue(t0.Add(-30 * time.Second).Format(time.RFC3339))
	justFailed := map[string]*fnv1.Resource{
		"proxy-0": failed,
		"proxy-1": observedProxy(1, "b", true, t0.Add(-10*time.Minute), ""),
		"proxy-2": observedProxy(2, "a", true, t0.Add(-5*time.Minute), `, "crawl.example.com/replaces": "0"`),
	}
	all := []string{"crawlers-0", "crawlers-1", "crawlers-2"}
	holding := func(p string) []held { return []held{{p, 1, t0.Add(5 * time.Minute)}} }
	cases := []safetyCase{
		{name: "NoneHeld", spec: rotated, observed: rotation, removes: true, summaries: []*structpb.Struct{
			leaseSummary("crawlers", "r1", t0, nil, []string{"crawlers-0"}, leasewire.Demand{}),
			leaseSummary("crawlers", "r2", t0.Add(-3*time.Second), nil, []string{"crawlers-0"}, leasewire.Demand{}),
		}},
		{name: "HeldThroughTheSecondReplica", spec: rotated, observed: rotation, holds: []string{"crawlers-0"}, summaries: []*structpb.Struct{
			leaseSummary("crawlers", "r1", t0, nil, []string{"crawlers-0"}, leasewire.Demand{}),
			leaseSummary("crawlers", "r2", t0.Add(-3*time.Second), holding("crawlers-0"), []string{"crawlers-0"}, leasewire.Demand{}),
		}},
		// The only summary is stale: its replica died, and the lease
		// granted since by a replica that has not written yet is on none.
		{name: "OnlyAStaleSummary", spec: rotated, observed: rotation, holds: []string{"crawlers-0"}, summaries: []*structpb.Struct{
			leaseSummary("crawlers", "r1", staleAt, nil, []string{"crawlers-0"}, leasewire.Demand{}),
		}},
		{name: "JustFailedSinceTheLastWrite", spec: validSpec, observed: justFailed, holds: []string{"crawlers-0"}, summaries: []*structpb.Struct{
			leaseSummary("crawlers", "r1", t0.Add(-9*time.Minute), nil, nil, leasewire.Demand{}),
		}},
		{name: "ShrinkingWithOneHeld", spec: autoscaled, observed: shrinking, holds: []string{"crawlers-1"}, removes: true, summaries: []*structpb.Struct{
			leaseSummary("crawlers", "r1", t0, holding("crawlers-1"), all, leasewire.Demand{}),
			leaseSummary("crawlers", "r2", t0, nil, all, leasewire.Demand{}),
		}},
	}
	correct := func(s []*structpb.Struct) []*structpb.Struct { return s }
	for _, c := range cases {
		removed, any := removedHeld(t, c, correct)
		if len(removed) > 0 {
			t.Errorf("%s: the function removed %v, which crawlers hold leases on", c.name, removed)
		}
		if c.removes && !any {
			t.Errorf("%s: the function removed nothing where it should: the checker would prove nothing", c.name)
		}
	}

	mutants := map[string]func([]*structpb.Struct) []*structpb.Struct{
		"DropsAHeldProxy": func(s []*structpb.Struct) []*structpb.Struct {
			for _, x := range s {
				delete(x.GetFields()["spec"].GetStructValue().GetFields(), "leased")
			}
			return s
		},
		"TrustsAStaleSummary": func(s []*structpb.Struct) []*structpb.Struct {
			for _, x := range s {
				spec := x.GetFields()["spec"].GetStructValue().GetFields()
				spec["observedAt"] = structpb.NewStringValue(t0.Format(time.RFC3339Nano))
				spec["validUntil"] = structpb.NewStringValue(t0.Add(time.Minute).Format(time.RFC3339Nano))
			}
			return s
		},
		"IgnoresAnotherReplica": func(s []*structpb.Struct) []*structpb.Struct { return s[:min(1, len(s))] },
	}
	for name, mutate := range mutants {
		var caught []string
		for _, c := range cases {
			if removed, _ := removedHeld(t, c, mutate); len(removed) > 0 {
				caught = append(caught, c.name)
			}
		}
		if len(caught) == 0 {
			t.Errorf("the broken variant %s removes no held proxy in any case: the checker cannot tell it from the function", name)
		}
		t.Logf("%s caught by %v", name, slices.Sorted(slices.Values(caught)))
	}
}
