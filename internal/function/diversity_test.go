package function

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/resource"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/structpb"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/egressip"
)

// withIP sets an observed Proxy's egress IP.
func withIP(r *fnv1.Resource, ip string) *fnv1.Resource {
	r.GetResource().GetFields()["status"].GetStructValue().GetFields()["atProvider"].GetStructValue().Fields["egressIP"] = structpb.NewStringValue(ip)
	return r
}

// cond is the response's condition of type typ; nil when none.
func cond(rsp *fnv1.RunFunctionResponse, typ string) *fnv1.Condition {
	for _, c := range rsp.GetConditions() {
		if c.GetType() == typ {
			return c
		}
	}
	return nil
}

// labelsOfDesired reads a desired Proxy's labels.
func labelsOfDesired(rsp *fnv1.RunFunctionResponse, name string) map[string]any {
	return rsp.GetDesired().GetResources()[name].GetResource().GetFields()["metadata"].GetStructValue().GetFields()["labels"].GetStructValue().AsMap()
}

// TestDiversity: proxies beyond spec.diversity's caps (per IPv4 /24, per
// IPv6 /64, per ASN) are flagged on the XR, in its status and with a label
// egress-discovery hands them out last by; the oldest keep their places,
// so a new proxy (even one whose name sorts first) never displaces one;
// the fleet counts its distinct addresses and networks.
func TestDiversity(t *testing.T) {
	old := t0.Add(-time.Hour)
	observed := func() map[string]*fnv1.Resource {
		return map[string]*fnv1.Resource{
			"proxy-0":  withIP(observedProxy(0, "a", true, old, ""), "203.0.113.10"),
			"proxy-1":  withIP(observedProxy(1, "b", true, old, ""), "203.0.113.11"),
			"proxy-2":  withIP(observedProxy(2, "a", true, old, ""), "203.0.113.12"),
			"proxy-3":  withIP(observedProxy(3, "b", true, old, ""), "198.51.100.1"),
			"proxy-4":  withIP(observedProxy(4, "a", true, old, ""), "2001:db8:1::1"),
			"proxy-5":  withIP(observedProxy(5, "b", true, old, ""), "2001:db8:1::2"),
			"proxy-10": withIP(observedProxy(10, "a", true, old, ""), "::ffff:203.0.113.13"),
		}
	}
	spec := withSpecIn(t, withSpec(t, "replicas", "7"), "diversity", `{"maxPerIPv4Prefix": 2, "maxPerIPv6Prefix": 1}`)
	rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}, Resources: observed()}, RequiredResources: noLeases()})

	beyond := map[string]string{
		"proxy-2":  "203.0.113.0/24 holds its limit of 2 proxies already",
		"proxy-10": "203.0.113.0/24 holds its limit of 2 proxies already",
		"proxy-5":  "2001:db8:1::/64 holds its limit of 1 proxies already",
	}
	for name := range observed() {
		got := labelsOfDesired(rsp, name)[fleetv1alpha1.LabelBeyondDiversityLimit]
		if want := beyond[name] != ""; (got == "true") != want {
			t.Errorf("%s labelled %s=%v, want it %v", name, fleetv1alpha1.LabelBeyondDiversityLimit, got, want)
		}
	}
	status := rsp.GetDesired().GetComposite().GetResource().GetFields()["status"].GetStructValue().AsMap()
	for _, p := range status["proxies"].([]any) { //nolint:forcetypeassert // The function's own output.
		p := p.(map[string]any)                                                //nolint:forcetypeassert // The function's own output.
		name := "proxy-" + strings.TrimPrefix(p["name"].(string), "crawlers-") //nolint:forcetypeassert // The function's own output.
		if got, _ := p["beyondDiversityLimit"].(string); got != beyond[name] {
			t.Errorf("status.proxies[%s].beyondDiversityLimit %q, want %q", p["name"], got, beyond[name])
		}
	}
	want := map[string]any{"addresses": float64(7), "ipv4Prefixes": float64(2), "ipv6Prefixes": float64(1), "beyondLimit": float64(3)}
	if diff := cmp.Diff(want, status["egress"]); diff != "" {
		t.Errorf("status.egress (an IPv4-mapped address counts in its /24): -want, +got:\n%s", diff)
	}
	c := cond(rsp, ConditionEgressDiversity)
	if c.GetStatus() != fnv1.Status_STATUS_CONDITION_FALSE || c.GetReason() != "LimitExceeded" ||
		!strings.Contains(c.GetMessage(), "3 proxies") || !strings.Contains(c.GetMessage(), "crawlers-10 (203.0.113.0/24 holds its limit of 2 proxies already)") {
		t.Errorf("EgressDiversity %v, want False LimitExceeded naming the proxies and why", c)
	}

	// A proxy gone frees its place: the oldest beyond takes it.
	less := observed()
	delete(less, "proxy-1")
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}, Resources: less}, RequiredResources: noLeases()})
	if labelsOfDesired(rsp, "proxy-2")[fleetv1alpha1.LabelBeyondDiversityLimit] != nil || labelsOfDesired(rsp, "proxy-10")[fleetv1alpha1.LabelBeyondDiversityLimit] != "true" {
		t.Errorf("with proxy-1 gone, proxy-2 (older) takes its place and proxy-10 stays beyond: %v, %v", labelsOfDesired(rsp, "proxy-2"), labelsOfDesired(rsp, "proxy-10"))
	}

	// An ASN cap, with the platform's database.
	asn := egressip.Table{netip.MustParsePrefix("203.0.0.0/16"): 64500, netip.MustParsePrefix("198.51.0.0/16"): 64501, netip.MustParsePrefix("2001:db8::/32"): 64502}
	spec = withSpecIn(t, withSpec(t, "replicas", "7"), "diversity", `{"maxPerASN": 3}`)
	fn := New(Config{Log: logging.NewNopLogger(), Now: func() time.Time { return t0 }, ASN: asn})
	rsp, err := fn.RunFunction(context.Background(), &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}, Resources: observed()}, RequiredResources: noLeases()})
	if err != nil {
		t.Fatal(err)
	}
	if got := field(rsp.GetDesired().GetComposite().GetResource(), "status", "egress", "asns").GetNumberValue(); got != 3 {
		t.Errorf("status.egress.asns %v, want 3", got)
	}
	if labelsOfDesired(rsp, "proxy-10")[fleetv1alpha1.LabelBeyondDiversityLimit] != "true" || labelsOfDesired(rsp, "proxy-2")[fleetv1alpha1.LabelBeyondDiversityLimit] != nil {
		t.Error("the fourth proxy of AS64500 is beyond maxPerASN 3, the first three are not")
	}

	// Without caps nothing is flagged, and the condition says so.
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(withSpec(t, "replicas", "7"))}, Resources: observed()}, RequiredResources: noLeases()})
	if c := cond(rsp, ConditionEgressDiversity); c.GetStatus() != fnv1.Status_STATUS_CONDITION_TRUE || c.GetReason() != "NoLimits" {
		t.Errorf("without spec.diversity: EgressDiversity %v, want True NoLimits", c)
	}
	for name := range observed() {
		if v, ok := labelsOfDesired(rsp, name)[fleetv1alpha1.LabelBeyondDiversityLimit]; ok {
			t.Errorf("%s flagged without caps: %v", name, v)
		}
	}
}

// TestPooledDiversity: a pool flags its own Proxies beyond the fleet's
// caps and reports them in status.egress; the pooled fleet sums its
// pools and names those with proxies beyond.
func TestPooledDiversity(t *testing.T) {
	old := t0.Add(-time.Hour)
	template := mustMap(t, withSpecIn(t, withSpec(t, "replicas", "3"), "diversity", `{"maxPerIPv4Prefix": 1}`))
	pool := map[string]any{"fleet": "crawlers", "index": 1, "template": template}
	base := fleetv1alpha1.PoolOrdinalSpan
	observed := map[string]*fnv1.Resource{}
	for i, ip := range []string{"203.0.113.1", "203.0.113.2", "198.51.100.1"} {
		observed[resourceName(base+i)] = withIP(observedProxy(base+i, "a", true, old, `, "crawl.example.com/pool": "crawlers-pool-1"`), ip)
	}
	rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: poolXR(t, pool)}, Resources: observed}, RequiredResources: noLeases()})
	if got := field(rsp.GetDesired().GetComposite().GetResource(), "status", "egress", "beyondLimit").GetNumberValue(); got != 1 {
		t.Errorf("pool status.egress.beyondLimit %v, want 1", got)
	}
	if labelsOfDesired(rsp, resourceName(base+1))[fleetv1alpha1.LabelBeyondDiversityLimit] != "true" {
		t.Error("the pool labels its second proxy in 203.0.113.0/24")
	}

	fleetSpec := withSpecIn(t, withSpecIn(t, validSpec, "pools", `{"proxiesPerPool": 3}`), "diversity", `{"maxPerIPv4Prefix": 1}`)
	pooled := resource.MustStructJSON(`{"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
		"metadata": {"name": "crawlers-pool-1", "namespace": "team"},
		"spec": {"fleet": "crawlers", "index": 1, "template": {"replicas": 2}},
		"status": {"replicas": 3, "desiredReplicas": 3, "egress": {"beyondLimit": 1}}}`)
	rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(fleetSpec)},
		Resources: map[string]*fnv1.Resource{"pool-1": {Resource: pooled}}}})
	if got := field(rsp.GetDesired().GetComposite().GetResource(), "status", "egress", "beyondLimit").GetNumberValue(); got != 1 {
		t.Errorf("fleet status.egress.beyondLimit %v, want the pools' 1", got)
	}
	if c := cond(rsp, ConditionEgressDiversity); c.GetStatus() != fnv1.Status_STATUS_CONDITION_FALSE || !strings.Contains(c.GetMessage(), "crawlers-pool-1 (1 of its proxies") {
		t.Errorf("pooled EgressDiversity %v, want False naming the pool", c)
	}
}
