package function

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"google.golang.org/protobuf/types/known/structpb"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
)

// burnedSummary is a fresh summary of the crawlers fleet naming burned
// proxies (name, reason pairs).
func burnedSummary(pairs ...string) map[string]*fnv1.Resources {
	s := leaseSummary("crawlers", "r1", t0, nil, nil, leasewire.Demand{})
	var list []*structpb.Value
	for i := 0; i+1 < len(pairs); i += 2 {
		list = append(list, structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"name": structpb.NewStringValue(pairs[i]), "reason": structpb.NewStringValue(pairs[i+1]),
		}}))
	}
	s.GetFields()["spec"].GetStructValue().Fields["burned"] = structpb.NewListValue(&structpb.ListValue{Values: list})
	return summaries(s)
}

// withRecords is an observed fleet XR whose status lists recycles.
func withRecords(spec string, records ...map[string]any) *structpb.Struct {
	x := xr(spec)
	list := make([]any, 0, len(records))
	for _, r := range records {
		list = append(list, r)
	}
	st, err := structpb.NewStruct(map[string]any{"egress": map[string]any{"recycles": list}})
	if err != nil {
		panic(err)
	}
	x.Fields["status"] = structpb.NewStructValue(st)
	return x
}

// replacing says which observed proxy the response replaces with a new
// one, by the new one's replaces label; -1 for none.
func replacing(rsp *fnv1.RunFunctionResponse) []string {
	var out []string
	for name, r := range rsp.GetDesired().GetResources() {
		if v := field(r.GetResource(), "metadata", "labels").GetStructValue().GetFields()[fleetv1alpha1.LabelReplaces]; v != nil {
			out = append(out, name+"->"+v.GetStringValue())
		}
	}
	return out
}

// TestRecycling: a proxy egress-discovery names burned is replaced by a
// surge proxy, recorded in status.egress.recycles with why and said in
// a Normal result; at most maxPerHour an hour (the status' records are
// what is counted, so the function keeps no state), none while the fleet
// is below its floor, none without spec.recycling; a new proxy on an
// address a recycle gave back is counted as seen again.
func TestRecycling(t *testing.T) {
	old := t0.Add(-2 * time.Hour)
	spec := withSpecIn(t, withSpec(t, "replicas", "3"), "recycling", `{"bannedByDomains": 2, "maxPerHour": 1, "backoff": "10m"}`)
	observed := func() map[string]*fnv1.Resource {
		return map[string]*fnv1.Resource{
			"proxy-0": observedProxy(0, "a", true, old, ""),
			"proxy-1": observedProxy(1, "b", true, old, ""),
			"proxy-2": observedProxy(2, "a", true, old, ""),
		}
	}
	burned := burnedSummary("crawlers-1", "203.0.113.1 banned by 2 domains within 1h0m0s", "crawlers-2", "203.0.113.2 banned by 3 domains within 1h0m0s")
	rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}, Resources: observed()}, RequiredResources: burned})
	if got := replacing(rsp); len(got) != 1 || !strings.HasSuffix(got[0], "->1") {
		t.Fatalf("one surge proxy replaces crawlers-1, the first burned (maxPerHour 1): %v", got)
	}
	recs := field(rsp.GetDesired().GetComposite().GetResource(), "status", "egress", "recycles").GetListValue().GetValues()
	if len(recs) != 1 || str(recs[0].GetStructValue(), "proxy") != "crawlers-1" || str(recs[0].GetStructValue(), "egressIP") != "203.0.113.1" ||
		!strings.Contains(str(recs[0].GetStructValue(), "reason"), "banned by 2 domains") || str(recs[0].GetStructValue(), "time") != t0.Format(time.RFC3339) {
		t.Errorf("status.egress.recycles: %v", recs)
	}
	said := false
	for _, r := range rsp.GetResults() {
		said = said || r.GetSeverity() == fnv1.Severity_SEVERITY_NORMAL && strings.Contains(r.GetMessage(), "Recycling proxy crawlers-1")
	}
	if !said {
		t.Errorf("no Normal result says the recycle: %v", rsp.GetResults())
	}

	if ann := field(rsp.GetDesired().GetResources()["proxy-3"].GetResource(), "metadata", "annotations").GetStructValue().AsMap(); ann[fleetv1alpha1.AnnotationRecycleOf] != "crawlers-1" ||
		ann[fleetv1alpha1.AnnotationRecycleIP] != "203.0.113.1" || ann[fleetv1alpha1.AnnotationRecycleAt] != t0.Format(time.RFC3339) {
		t.Errorf("the replacement carries the recycle it makes: %v", ann)
	}

	// Composed again with the status never written: the replacement's
	// annotations keep crawlers-1 due and count against the hour's
	// bound, so crawlers-2 waits.
	inFlight := func(created time.Time) map[string]*fnv1.Resource {
		o := observed()
		r := observedProxy(3, "b", false, created, `, "crawl.example.com/replaces": "1"`)
		meta := r.GetResource().GetFields()["metadata"].GetStructValue()
		ann, _ := structpb.NewStruct(map[string]any{
			fleetv1alpha1.AnnotationFleet: "crawlers", fleetv1alpha1.AnnotationRecycleOf: "crawlers-1", fleetv1alpha1.AnnotationRecycleIP: "203.0.113.1",
			fleetv1alpha1.AnnotationRecycleReason: "banned", fleetv1alpha1.AnnotationRecycleAt: created.Format(time.RFC3339),
		})
		meta.Fields["annotations"] = structpb.NewStructValue(ann)
		o["proxy-3"] = r
		return o
	}
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}, Resources: inFlight(t0.Add(-time.Minute))}, RequiredResources: burned})
	if got := replacing(rsp); len(got) != 1 || got[0] != "proxy-3->1" {
		t.Errorf("with crawlers-1's replacement booting and no status, still that one only: %v", got)
	}
	if n := len(field(rsp.GetDesired().GetComposite().GetResource(), "status", "egress", "recycles").GetListValue().GetValues()); n != 1 {
		t.Errorf("the status lists the recycle its replacement carries: %d", n)
	}
	// A recycle whose replacement is not up within the progress deadline
	// is given up: the replacement goes, and the hour's bound still holds.
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}, Resources: inFlight(t0.Add(-11 * time.Minute))}, RequiredResources: burned})
	if _, kept := rsp.GetDesired().GetResources()["proxy-3"]; kept || len(replacing(rsp)) != 0 {
		t.Errorf("a recycle replacement down past the progress deadline is dropped, and none made in its place this hour: %v", replacing(rsp))
	}
	// The status' record alone counts too: an hour's bound holds.
	record := map[string]any{"proxy": "crawlers-1", "egressIP": "203.0.113.1", "reason": "banned", "time": t0.Add(-30 * time.Minute).Format(time.RFC3339)}
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: withRecords(spec, record)}, Resources: observed()}, RequiredResources: burned})
	if got := replacing(rsp); len(got) != 0 {
		t.Errorf("a recycle 30 minutes ago: the next waits for the hour: %v", got)
	}
	// No surge slot (another replacement in flight, maxSurge 1): the
	// pick is no recycle, recorded nor said.
	busy := observed()
	busy["proxy-4"] = observedProxy(4, "a", false, t0.Add(-time.Minute), `, "crawl.example.com/replaces": "0"`)
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: withRecords(withSpecIn(t, spec, "rotation", `{"maxAge": "1h"}`))}, Resources: busy}, RequiredResources: burned})
	for _, r := range rsp.GetResults() {
		if strings.Contains(r.GetMessage(), "Recycling") {
			t.Errorf("a recycle without a surge slot is said: %v", r.GetMessage())
		}
	}
	if n := len(field(rsp.GetDesired().GetComposite().GetResource(), "status", "egress", "recycles").GetListValue().GetValues()); n != 0 {
		t.Errorf("a recycle without a surge slot is recorded: %d", n)
	}
	record["time"] = t0.Add(-61 * time.Minute).Format(time.RFC3339)
	gone := observed()
	delete(gone, "proxy-1")
	gone["proxy-3"] = observedProxy(3, "b", true, t0.Add(-time.Hour), "")
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: withRecords(withSpec(t, "replicas", "3"), record)}, Resources: gone}, RequiredResources: burned})
	if got := replacing(rsp); len(got) != 0 {
		t.Errorf("without spec.recycling nothing is recycled: %v", got)
	}
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: withRecords(spec, record)}, Resources: gone}, RequiredResources: burned})
	if got := replacing(rsp); len(got) != 1 || !strings.HasSuffix(got[0], "->2") {
		t.Errorf("an hour on, crawlers-2 is recycled: %v", got)
	}
	if n := len(field(rsp.GetDesired().GetComposite().GetResource(), "status", "egress", "recycles").GetListValue().GetValues()); n != 2 {
		t.Errorf("the status lists the day's two recycles: %d", n)
	}
	// Paused, nothing is picked.
	paused := withSpecIn(t, spec, "rollout", `{"paused": true}`)
	if got := replacing(run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: withRecords(paused, record)}, Resources: gone}, RequiredResources: burned})); len(got) != 0 {
		t.Errorf("a paused rollout recycles nothing: %v", got)
	}

	// Below the floor (3 replicas, maxUnavailable 0: 3 healthy) none.
	sick := observed()
	sick["proxy-0"] = observedProxy(0, "a", false, old, "")
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}, Resources: sick}, RequiredResources: burned})
	for _, got := range replacing(rsp) {
		if !strings.HasSuffix(got, "->0") {
			t.Errorf("below the floor only the sick proxy is replaced, no recycle: %v", replacing(rsp))
		}
	}

	// A new proxy on an address a recycle gave back.
	again := observed()
	again["proxy-2"] = withIP(observedProxy(2, "a", true, old, ""), "203.0.113.1")
	record["time"] = t0.Add(-2 * time.Hour).Format(time.RFC3339)
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: withRecords(spec, record)}, Resources: again}, RequiredResources: burnedSummary()})
	if n := field(rsp.GetDesired().GetComposite().GetResource(), "status", "egress", "seenAgain").GetNumberValue(); n != 1 {
		t.Errorf("status.egress.seenAgain %v, want 1: crawlers-2 leaves from the address crawlers-1's recycle gave back", n)
	}
}

// TestRecycleWaitingSaid: a burned proxy that no recycle replaces is
// counted in status.egress.burned, and status.egress.recycleWaiting
// says why it waits: the hourly bound (with when the next may start),
// the floor, a paused rollout, a full surge.
func TestRecycleWaitingSaid(t *testing.T) {
	old := t0.Add(-2 * time.Hour)
	spec := withSpecIn(t, withSpec(t, "replicas", "3"), "recycling", `{"bannedByDomains": 2, "maxPerHour": 1, "backoff": "10m"}`)
	observed := func() map[string]*fnv1.Resource {
		return map[string]*fnv1.Resource{
			"proxy-0": observedProxy(0, "a", true, old, ""),
			"proxy-1": observedProxy(1, "b", true, old, ""),
			"proxy-2": observedProxy(2, "a", true, old, ""),
		}
	}
	burned := burnedSummary("crawlers-1", "203.0.113.1 banned by 2 domains within 1h0m0s", "crawlers-2", "203.0.113.2 banned by 3 domains within 1h0m0s")
	record := map[string]any{"proxy": "crawlers-0", "egressIP": "203.0.113.9", "reason": "banned", "time": t0.Add(-30 * time.Minute).Format(time.RFC3339)}
	busy := observed()
	busy["proxy-4"] = observedProxy(4, "a", false, t0.Add(-time.Minute), `, "crawl.example.com/replaces": "0"`)
	sick := observed()
	sick["proxy-0"] = observedProxy(0, "a", false, old, "")
	cases := map[string]struct {
		xr        *structpb.Struct
		resources map[string]*fnv1.Resource
		burned    int
		atBound   bool
		want      []string
	}{
		"HourlyBound": {xr: withRecords(spec, record), resources: observed(), burned: 2, atBound: true,
			want: []string{"crawlers-1, crawlers-2: spec.recycling's bounds: at most 1 recycles an hour", "the next may start at " + t0.Add(30*time.Minute).Format(time.RFC3339)}},
		"OneStartedOneWaits": {xr: xr(spec), resources: observed(), burned: 1, atBound: true, want: []string{"crawlers-2: spec.recycling's bounds: at most 1 recycles an hour"}},
		"BelowTheFloor":      {xr: xr(spec), resources: sick, burned: 2, want: []string{"2 healthy proxies, below its floor of 3"}},
		"Paused":             {xr: xr(withSpecIn(t, spec, "rollout", `{"paused": true}`)), resources: observed(), burned: 2, want: []string{"paused"}},
		"NoSurgeSlot":        {xr: xr(withSpecIn(t, spec, "rotation", `{"maxAge": "1h"}`)), resources: busy, burned: 2, want: []string{"crawlers-1: no surge slot is free"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: tc.xr}, Resources: tc.resources}, RequiredResources: burned})
			egress := field(rsp.GetDesired().GetComposite().GetResource(), "status", "egress").GetStructValue()
			if n := int(egress.GetFields()["burned"].GetNumberValue()); n != tc.burned {
				t.Errorf("status.egress.burned %d, want %d", n, tc.burned)
			}
			if got := egress.GetFields()["recyclesAtBound"].GetBoolValue(); got != tc.atBound {
				t.Errorf("status.egress.recyclesAtBound %v, want %v", got, tc.atBound)
			}
			why := str(egress, "recycleWaiting")
			for _, w := range tc.want {
				if !strings.Contains(why, w) {
					t.Errorf("status.egress.recycleWaiting %q does not say %q", why, w)
				}
			}
		})
	}
	// Nothing burned, nothing said.
	rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}, Resources: observed()}, RequiredResources: burnedSummary()})
	if egress := field(rsp.GetDesired().GetComposite().GetResource(), "status", "egress").GetStructValue(); egress.GetFields()["burned"] != nil || egress.GetFields()["recycleWaiting"] != nil {
		t.Errorf("a fleet with nothing burned says some wait: %v", egress)
	}
}

// TestReplaceBeyondLimit: a VM fleet with spec.diversity.replaceBeyondLimit
// replaces a proxy beyond a cap through the recycling machinery (a surge
// replacement, recorded with which cap, said in a Normal result), within
// the recycling bounds (their defaults without spec.recycling: one at a
// time with a back-off); without the setting, or on a backend whose
// replacement would leave from the same address, it is only flagged; a
// local fleet asking for it gets a Fatal result naming the field.
func TestReplaceBeyondLimit(t *testing.T) {
	old := t0.Add(-2 * time.Hour)
	observed := func() map[string]*fnv1.Resource {
		return map[string]*fnv1.Resource{
			"proxy-0": withIP(observedProxy(0, "a", true, old, ""), "203.0.113.10"),
			"proxy-1": withIP(observedProxy(1, "b", true, old, ""), "198.51.100.1"),
			"proxy-2": withIP(observedProxy(2, "a", true, old, ""), "203.0.113.11"),
			"proxy-3": withIP(observedProxy(3, "b", true, old, ""), "203.0.113.12"),
		}
	}
	vm := withSpecIn(t, withSpec(t, "replicas", "4"), "placement", `{"gcp": {"machineType": "e2-small", "networkTags": ["crawl"]}}`)
	capped := withSpecIn(t, vm, "diversity", `{"maxPerIPv4Prefix": 1, "replaceBeyondLimit": true}`)
	rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(capped)}, Resources: observed()}, RequiredResources: noLeases()})
	if got := replacing(rsp); len(got) != 1 || got[0] != "proxy-4->2" {
		t.Fatalf("one surge proxy replaces crawlers-2, the first beyond the /24's cap (the default bounds: one at a time): %v", got)
	}
	egress := field(rsp.GetDesired().GetComposite().GetResource(), "status", "egress").GetStructValue()
	recs := egress.GetFields()["recycles"].GetListValue().GetValues()
	if len(recs) != 1 || str(recs[0].GetStructValue(), "proxy") != "crawlers-2" ||
		str(recs[0].GetStructValue(), "reason") != "203.0.113.11 beyond spec.diversity: 203.0.113.0/24 holds its limit of 1 proxies already" {
		t.Errorf("status.egress.recycles: %v", recs)
	}
	if n, why := int(egress.GetFields()["burned"].GetNumberValue()), str(egress, "recycleWaiting"); n != 1 || !strings.Contains(why, "crawlers-3: spec.recycling's bounds: at most 2 recycles an hour") {
		t.Errorf("crawlers-3 waits for the bounds: burned %d, %q", n, why)
	}
	said := false
	for _, r := range rsp.GetResults() {
		said = said || r.GetSeverity() == fnv1.Severity_SEVERITY_NORMAL && strings.Contains(r.GetMessage(), "Recycling proxy crawlers-2: its egress IP 203.0.113.11 beyond spec.diversity")
	}
	if !said {
		t.Errorf("no Normal result says the replacement: %v", rsp.GetResults())
	}
	// A record of the last minutes holds the next back.
	record := map[string]any{"proxy": "crawlers-2", "egressIP": "203.0.113.11", "reason": "203.0.113.11 beyond spec.diversity: 203.0.113.0/24 holds its limit of 1 proxies already", "time": t0.Add(-5 * time.Minute).Format(time.RFC3339)}
	if got := replacing(run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: withRecords(capped, record)}, Resources: observed()}, RequiredResources: noLeases()})); len(got) != 0 {
		t.Errorf("within the back-off after a replacement, none: %v", got)
	}
	// Only flagged without the setting.
	flagged := withSpecIn(t, vm, "diversity", `{"maxPerIPv4Prefix": 1}`)
	if got := replacing(run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(flagged)}, Resources: observed()}, RequiredResources: noLeases()})); len(got) != 0 {
		t.Errorf("without replaceBeyondLimit a proxy beyond a cap is only flagged: %v", got)
	}
	// A local fleet cannot draw another address.
	local := withSpecIn(t, withSpec(t, "replicas", "4"), "diversity", `{"maxPerIPv4Prefix": 1, "replaceBeyondLimit": true}`)
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(local)}, Resources: observed()}, RequiredResources: noLeases()})
	fatal := false
	for _, r := range rsp.GetResults() {
		fatal = fatal || r.GetSeverity() == fnv1.Severity_SEVERITY_FATAL && strings.Contains(r.GetMessage(), "spec.diversity.replaceBeyondLimit")
	}
	if !fatal || len(rsp.GetDesired().GetResources()) != 0 {
		t.Errorf("a local fleet asking to replace proxies beyond its caps: want a Fatal result naming the field and nothing composed: %v", rsp.GetResults())
	}
	// Without surge (stored before the schema refused it) nothing is
	// recycled, and the fleet says so.
	noSurge := withSpecIn(t, capped, "rotation", `{"maxSurge": 0, "maxUnavailable": 1}`)
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(noSurge)}, Resources: observed()}, RequiredResources: noLeases()})
	warned := false
	for _, r := range rsp.GetResults() {
		warned = warned || r.GetSeverity() == fnv1.Severity_SEVERITY_WARNING && strings.Contains(r.GetMessage(), "spec.rotation.maxSurge is 0") && strings.Contains(r.GetMessage(), "recycles no proxy")
	}
	if got := replacing(rsp); len(got) != 0 || !warned {
		t.Errorf("without surge: replacements %v, a Warning saying nothing is recycled %v: %v", got, warned, rsp.GetResults())
	}
}

// recycledFrom marks an observed proxy as made by a recycle of of (which
// left from ip) at at, as its annotations do.
func recycledFrom(r *fnv1.Resource, of, ip string, at time.Time) *fnv1.Resource {
	meta := r.GetResource().GetFields()["metadata"].GetStructValue()
	ann, _ := structpb.NewStruct(map[string]any{
		fleetv1alpha1.AnnotationFleet: "crawlers", fleetv1alpha1.AnnotationRecycleOf: of, fleetv1alpha1.AnnotationRecycleIP: ip,
		fleetv1alpha1.AnnotationRecycleReason: "banned", fleetv1alpha1.AnnotationRecycleAt: at.Format(time.RFC3339),
	})
	meta.Fields["annotations"] = structpb.NewStructValue(ann)
	return r
}

// TestRecyclePicks: which due proxy a recycle takes, and which it leaves
// alone: those burned by bans before those only beyond a diversity cap,
// by ordinal; never a replacement whose holder is still there (the plan
// could not start it, and it would spend the budget); never a
// replacement beyond a cap that a recycle made in the very network its
// holder was recycled out of (the backend hands that network out again:
// replacing it would loop); a record is kept once per proxy and address,
// whatever time a replica with a skewed clock gave it; a reason is cut
// on a character boundary.
func TestRecyclePicks(t *testing.T) {
	old := t0.Add(-2 * time.Hour)
	vm := withSpecIn(t, withSpec(t, "replicas", "4"), "placement", `{"gcp": {"machineType": "e2-small", "networkTags": ["crawl"]}}`)
	capped := withSpecIn(t, withSpecIn(t, vm, "diversity", `{"maxPerIPv4Prefix": 1, "replaceBeyondLimit": true}`), "recycling", `{"bannedByDomains": 2, "maxPerHour": 1}`)
	waiting := func(rsp *fnv1.RunFunctionResponse) string {
		return str(field(rsp.GetDesired().GetComposite().GetResource(), "status", "egress").GetStructValue(), "recycleWaiting")
	}

	// crawlers-12 is beyond the /24's cap, crawlers-5 burned by bans: the
	// bans go first, though "crawlers-12" sorts before "crawlers-5".
	banned := map[string]*fnv1.Resource{
		"proxy-0":  withIP(observedProxy(0, "a", true, old, ""), "203.0.113.10"),
		"proxy-5":  withIP(observedProxy(5, "b", true, old, ""), "198.51.100.1"),
		"proxy-12": withIP(observedProxy(12, "a", true, old, ""), "203.0.113.12"),
		"proxy-13": withIP(observedProxy(13, "b", true, old, ""), "192.0.2.1"),
	}
	rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(capped)}, Resources: banned}, RequiredResources: burnedSummary("crawlers-5", "198.51.100.1 banned by 2 or more domains within 1h0m0s")})
	if got := replacing(rsp); len(got) != 1 || !strings.HasSuffix(got[0], "->5") {
		t.Errorf("the proxy burned by bans is recycled first: %v", got)
	}
	if why := waiting(rsp); !strings.Contains(why, "crawlers-12: spec.recycling's bounds") {
		t.Errorf("crawlers-12, beyond the cap, waits for the bound: %q", why)
	}

	// crawlers-4 replaces crawlers-2 (recycled a minute ago), is Ready and
	// beyond the cap of 198.51.100.0/24 with crawlers-1: not picked while
	// crawlers-2 is there.
	replacing2 := map[string]*fnv1.Resource{
		"proxy-0": withIP(observedProxy(0, "a", true, old, ""), "203.0.113.10"),
		"proxy-1": withIP(observedProxy(1, "b", true, old, ""), "198.51.100.1"),
		"proxy-2": withIP(observedProxy(2, "a", true, old, ""), "203.0.113.11"),
		"proxy-3": withIP(observedProxy(3, "b", true, old, ""), "192.0.2.1"),
		"proxy-4": recycledFrom(withIP(observedProxy(4, "a", true, t0.Add(-time.Minute), `, "crawl.example.com/replaces": "2"`), "198.51.100.2"), "crawlers-2", "203.0.113.11", t0.Add(-time.Minute)),
	}
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(capped)}, Resources: replacing2}, RequiredResources: noLeases()})
	if why := waiting(rsp); !strings.Contains(why, "crawlers-4: it does not serve, is being replaced already, or is a replacement whose holder is still there") {
		t.Errorf("a replacement whose holder is there is not picked: %q", why)
	}

	// crawlers-2 gone, crawlers-4 landed in 203.0.113.0/24 again, beyond
	// its cap beside crawlers-0: not replaced again for that.
	again := map[string]*fnv1.Resource{
		"proxy-0": withIP(observedProxy(0, "a", true, old, ""), "203.0.113.10"),
		"proxy-1": withIP(observedProxy(1, "b", true, old, ""), "198.51.100.1"),
		"proxy-3": withIP(observedProxy(3, "b", true, old, ""), "192.0.2.1"),
		"proxy-4": recycledFrom(withIP(observedProxy(4, "a", true, old, `, "crawl.example.com/replaces": "2"`), "203.0.113.13"), "crawlers-2", "203.0.113.11", old),
	}
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(capped)}, Resources: again}, RequiredResources: noLeases()})
	if got := replacing(rsp); len(got) != 0 {
		t.Errorf("a replacement given the same network again is replaced again: %v", got)
	}
	if why := waiting(rsp); !strings.Contains(why, "crawlers-4: a recycle beyond spec.diversity made it, and the backend gave it an address in the same network again") {
		t.Errorf("status.egress.recycleWaiting says why crawlers-4 stays: %q", why)
	}

	// The status lists crawlers-1's recycle at t0-5m; a replica ahead by
	// ten minutes annotated it at t0+5m: one record, not two.
	record := map[string]any{"proxy": "crawlers-1", "egressIP": "198.51.100.1", "reason": "banned", "time": t0.Add(-5 * time.Minute).Format(time.RFC3339)}
	skewed := map[string]*fnv1.Resource{
		"proxy-0": withIP(observedProxy(0, "a", true, old, ""), "203.0.113.10"),
		"proxy-1": withIP(observedProxy(1, "b", true, old, ""), "198.51.100.1"),
		"proxy-2": withIP(observedProxy(2, "a", true, old, ""), "192.0.2.2"),
		"proxy-3": withIP(observedProxy(3, "b", true, old, ""), "192.0.2.1"),
		"proxy-4": recycledFrom(observedProxy(4, "b", false, t0.Add(-5*time.Minute), `, "crawl.example.com/replaces": "1"`), "crawlers-1", "198.51.100.1", t0.Add(5*time.Minute)),
	}
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: withRecords(capped, record)}, Resources: skewed}, RequiredResources: noLeases()})
	if recs := field(rsp.GetDesired().GetComposite().GetResource(), "status", "egress", "recycles").GetListValue().GetValues(); len(recs) != 1 {
		t.Errorf("one recycle recorded once whatever the clocks: %v", recs)
	}

	if got := truncateTo(strings.Repeat("é", 200), maxReason); len(got) > maxReason || !utf8.ValidString(got) {
		t.Errorf("a reason of 400 bytes cut to %d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
	}
}
