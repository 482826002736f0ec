package function

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/resource"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/utils/ptr"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
)

const validSpec = `{
  "replicas": 2, "zones": ["a", "b"],
  "providerConfigRef": {"kind": "ProviderConfig", "name": "local"},
  "placement": {"local": {"bindAddress": "127.0.0.1"}},
  "proxy": {"authSecretRef": {"name": "auth"}},
  "healthCheck": {"url": "https://example.com/ip", "interval": "10s", "timeout": "2s"}
}`

func xr(spec string) *structpb.Struct {
	return resource.MustStructJSON(`{"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyFleet",
		"metadata": {"name": "crawlers", "namespace": "team"}, "spec": ` + spec + `}`)
}

// withSpec returns validSpec with field (dotted) set to raw JSON, or
// removed when raw is "".
func withSpec(t *testing.T, field, raw string) string {
	t.Helper()
	m := map[string]any{}
	if err := json.Unmarshal([]byte(validSpec), &m); err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(field, ".")
	cur := m
	for _, p := range parts[:len(parts)-1] {
		next, ok := cur[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			cur[p] = next
		}
		cur = next
	}
	last := parts[len(parts)-1]
	if raw == "" {
		delete(cur, last)
	} else {
		var v any
		if err := json.Unmarshal([]byte(raw), &v); err != nil {
			t.Fatal(err)
		}
		cur[last] = v
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func run(t *testing.T, req *fnv1.RunFunctionRequest) *fnv1.RunFunctionResponse {
	t.Helper()
	f := New(Config{Log: logging.NewNopLogger(), Now: func() time.Time { return t0 }})
	rsp, err := f.RunFunction(context.Background(), req)
	if err != nil {
		t.Fatalf("RunFunction returned an error instead of a result: %v", err)
	}
	return rsp
}

func fatal(msg string) []*fnv1.Result {
	return []*fnv1.Result{{Severity: fnv1.Severity_SEVERITY_FATAL, Message: msg, Target: fnv1.Target_TARGET_COMPOSITE.Enum()}}
}

func TestBadInput(t *testing.T) {
	cases := map[string]struct {
		reason string
		spec   string
		want   []*fnv1.Result
	}{
		"NoZones": {
			reason: "Replicas without zones cannot be spread.",
			spec:   `{"replicas": 2, "placement": {"local": {}}, "proxy": {"authSecretRef": {"name": "a"}}, "healthCheck": {"url": "https://e/ip"}}`,
			want:   fatal("spec.zones must not be empty when spec.replicas > 0: list the zones to spread proxies over"),
		},
		"NegativeReplicas":  {reason: "Replicas cannot be negative.", spec: "replicas=-1", want: fatal("spec.replicas must be between 0 and 10000, not -1")},
		"BadZone":           {reason: "Zones are DNS labels.", spec: `zones=["a", "B_1"]`, want: fatal(`spec.zones[1] "B_1" must be a lowercase DNS label such as europe-west1-b`)},
		"DuplicateZone":     {reason: "A zone listed twice would skew the spread.", spec: `zones=["a", "a"]`, want: fatal(`spec.zones[1] "a" is listed twice`)},
		"NoPlacement":       {reason: "A fleet runs somewhere.", spec: "placement=", want: fatal("spec.placement needs exactly one of local, kubernetes, gcp or aws")},
		"TwoPlacements":     {reason: "A fleet runs on one backend.", spec: `placement={"local": {}, "kubernetes": {}}`, want: fatal("spec.placement needs exactly one of local, kubernetes, gcp or aws")},
		"AWSUserDataInline": {reason: "A fleet's own user data comes from a Secret, not through every Proxy.", spec: `placement={"aws": {"userData": {"inline": "#!/bin/sh"}}}`, want: fatal("spec.placement.aws.userData takes secretRef only in a fleet")},
		"OpenProxy":         {reason: "Open proxies are refused.", spec: "proxy={}", want: fatal("spec.proxy refuses an open proxy: set authSecretRef (credentials) and/or allowedSourceRanges")},
		"BadPort":           {reason: "Ports are 1-65535.", spec: "proxy.port=0", want: fatal("spec.proxy.port must be between 1 and 65535, not 0")},
		"NoURL":             {reason: "Health needs a probe URL.", spec: "healthCheck.url=", want: fatal("spec.healthCheck.url is required: an http(s) URL fetched through each proxy, such as https://ifconfig.me/ip")},
		"FTPURL":            {reason: "The probe goes through an HTTP proxy.", spec: `healthCheck.url="ftp://e/ip"`, want: fatal(`spec.healthCheck.url must be an absolute http:// or https:// URL, not "ftp://e/ip"`)},
		"SlowTimeout":       {reason: "A probe must end before the next starts.", spec: `healthCheck.timeout="10s"`, want: fatal("spec.healthCheck.timeout (10s) must be shorter than spec.healthCheck.interval (10s)")},
		"BadMaxAge":         {reason: "Durations are Go durations.", spec: `rotation={"maxAge": "a day"}`, want: fatal(`spec.rotation.maxAge must be a duration such as 30s, 5m or 24h, not "a day"`)},
		"StuckRotation":     {reason: "Neither surge nor unavailability: no progress.", spec: `rotation={"maxSurge": 0, "maxUnavailable": 0}`, want: fatal("spec.rotation maxSurge and maxUnavailable cannot both be 0: replacement could never make progress")},
		"ZeroLeases":        {reason: "At least one crawler per proxy.", spec: `leases={"maxLeasesPerProxy": 0}`, want: fatal("spec.leases.maxLeasesPerProxy must be at least 1, not 0")},
		"HealthyFraction":   {reason: "A share is between 0 and 1.", spec: `leases={"admission": {"minHealthyFraction": 1.5}}`, want: fatal("spec.leases.admission.minHealthyFraction must be between 0 and 1, not 1.5")},
		"LongWait":          {reason: "A wait outlasting discovery's request timeout.", spec: `leases={"admission": {"maxWait": "1m"}}`, want: fatal("spec.leases.admission.maxWait must be between 0s and 20s, not 1m0s")},
		"TwoSubjects":       {reason: "An override names one subject.", spec: `leases={"quotas": {"overrides": [{"group": "g", "staticToken": "t", "maxLeases": 1}]}}`, want: fatal("spec.leases.quotas.overrides[0] must name exactly one of serviceAccount, group or staticToken, not 2")},
		"OpenHalves":        {reason: "Two halves of the internet without credentials are an open proxy.", spec: `proxy={"allowedSourceRanges": ["0.0.0.0/1", "128.0.0.0/1"]}`, want: fatal(`spec.proxy.allowedSourceRanges "0.0.0.0/1" is not private, loopback or CGNAT space: without authSecretRef that is an open proxy; add authSecretRef or narrow the range`)},
		"PublicException":   {reason: "An exception is for private networks.", spec: `proxy={"authSecretRef": {"name": "auth"}, "allowedPrivateDestinations": ["8.8.8.0/24"]}`, want: fatal(`spec.proxy.allowedPrivateDestinations "8.8.8.0/24" is not a private network (nor may it be the proxy host itself): public destinations need no exception`)},
		"SubSecondTTL":      {reason: "A Lease object's duration is whole seconds.", spec: `leases={"defaultTTL": "500ms"}`, want: fatal("spec.leases.defaultTTL must be between 1s and 168h0m0s, not 500ms")},
		"HugeMaxTTL":        {reason: "A lease is not a way to own a proxy.", spec: `leases={"maxTTL": "1000000h"}`, want: fatal("spec.leases.maxTTL must be between 1s and 168h0m0s, not 1000000h0m0s")},
		"DefaultOverMax":    {reason: "The default must be a TTL a crawler may ask for.", spec: `leases={"defaultTTL": "2h"}`, want: fatal("spec.leases.defaultTTL (2h0m0s) must not exceed spec.leases.maxTTL (1h0m0s)")},
		"BadConfigKind":     {reason: "Only the two configuration kinds exist.", spec: `providerConfigRef={"kind": "Secret", "name": "x"}`, want: fatal(`spec.providerConfigRef.kind must be ProviderConfig or ClusterProviderConfig, not "Secret"`)},
		"NotAnObject":       {reason: "A spec of the wrong shape is refused, not a panic.", spec: `{"replicas": "three"}`, want: nil},
		"WrongShape": {reason: "A field of the wrong JSON type is named as the author wrote it (found by FuzzFunction).", spec: `healthCheck=[]`,
			want: fatal("spec.healthCheck must be an object, not an array: spec does not match the ProxyFleet schema")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			spec := tc.spec
			if field, raw, ok := strings.Cut(spec, "="); ok && !strings.HasPrefix(spec, "{") {
				spec = withSpec(t, field, raw)
			}
			rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}}})
			if tc.want == nil {
				if len(rsp.GetResults()) != 1 || rsp.GetResults()[0].GetSeverity() != fnv1.Severity_SEVERITY_FATAL ||
					!strings.Contains(rsp.GetResults()[0].GetMessage(), "spec does not match the ProxyFleet schema") {
					t.Errorf("%s\nwant one Fatal result about the schema, got %v", tc.reason, rsp.GetResults())
				}
				return
			}
			if diff := cmp.Diff(tc.want, rsp.GetResults(), protocmp.Transform()); diff != "" {
				t.Errorf("%s\nresults: -want, +got:\n%s", tc.reason, diff)
			}
			if len(rsp.GetDesired().GetResources()) != 0 {
				t.Errorf("%s\nbad input must change nothing, yet %d resources are desired", tc.reason, len(rsp.GetDesired().GetResources()))
			}
		})
	}
}

// observedProxy is a composed Proxy as Crossplane observes it.
func observedProxy(ord int, zone string, ready bool, created time.Time, extra string) *fnv1.Resource {
	status := "False"
	if ready {
		status = "True"
	}
	return &fnv1.Resource{Resource: resource.MustStructJSON(fmt.Sprintf(`{
		"apiVersion": "egress.crawl.example.com/v1alpha1", "kind": "Proxy",
		"metadata": {"name": "crawlers-%d", "namespace": "team", "creationTimestamp": %q,
			"labels": {"crawl.example.com/zone": %q %s}},
		"status": {"conditions": [{"type": "Ready", "status": %q, "reason": "x", "lastTransitionTime": %q}],
			"atProvider": {"healthy": %t, "host": "127.0.0.1", "port": 3128, "egressIP": "203.0.113.%d"}}}`,
		ord, created.Format(time.RFC3339), zone, extra, status, created.Format(time.RFC3339), ready, ord))}
}

func TestRunFunction(t *testing.T) {
	t.Run("RequiresTheFleetsLeaseSummaries", func(t *testing.T) {
		rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(validSpec)}}})
		want := &fnv1.Requirements{Resources: map[string]*fnv1.ResourceSelector{requiredSummaries: {
			ApiVersion: "egress.crawl.example.com/v1alpha1", Kind: "LeaseSummary", Namespace: ptr.To("team"),
			Match: &fnv1.ResourceSelector_MatchLabels{MatchLabels: &fnv1.MatchLabels{Labels: map[string]string{"crawl.example.com/fleet": "crawlers"}}},
		}}}
		if diff := cmp.Diff(want, rsp.GetRequirements(), protocmp.Transform()); diff != "" {
			t.Errorf("the function asks Crossplane for the fleet's LeaseSummaries, not its Leases: -want, +got:\n%s", diff)
		}
	})

	t.Run("StatusReadinessAndPassThrough", func(t *testing.T) {
		other := &fnv1.Resource{Resource: resource.MustStructJSON(`{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "extra"}}`)}
		req := &fnv1.RunFunctionRequest{
			Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(validSpec)}, Resources: map[string]*fnv1.Resource{
				"proxy-0": observedProxy(0, "a", true, t0.Add(-3*time.Hour), ""),
				"proxy-1": observedProxy(1, "b", false, t0.Add(-2*time.Minute), ""),
			}},
			Desired:           &fnv1.State{Resources: map[string]*fnv1.Resource{"extra": other}},
			RequiredResources: noLeases(),
		}
		rsp := run(t, req)
		d := rsp.GetDesired().GetResources()
		if diff := cmp.Diff(other, d["extra"], protocmp.Transform()); diff != "" {
			t.Errorf("resources of other steps pass through untouched: -want, +got:\n%s", diff)
		}
		if d["proxy-0"].GetReady() != fnv1.Ready_READY_TRUE || d["proxy-1"].GetReady() == fnv1.Ready_READY_TRUE {
			t.Errorf("only the Ready proxy is marked ready: %v, %v", d["proxy-0"].GetReady(), d["proxy-1"].GetReady())
		}
		status := rsp.GetDesired().GetComposite().GetResource().GetFields()["status"].GetStructValue().AsMap()
		if rev, _ := status["observedRevision"].(string); len(rev) != 10 {
			t.Errorf("the status names the template revision: %q", rev)
		}
		delete(status, "observedRevision")
		want := map[string]any{
			"replicas": float64(2), "readyReplicas": float64(1), "healthyReplicas": float64(1), "updatedReplicas": float64(2),
			"desiredReplicas": float64(2),
			"egress":          map[string]any{"addresses": float64(1), "ipv4Prefixes": float64(1), "ipv6Prefixes": float64(0), "beyondLimit": float64(0)},
			"proxies": []any{
				map[string]any{"name": "crawlers-0", "endpoint": "127.0.0.1:3128", "zone": "a", "egressIP": "203.0.113.0", "healthy": true, "createdAt": "2026-11-29T09:00:00Z"},
				map[string]any{"name": "crawlers-1", "endpoint": "127.0.0.1:3128", "zone": "b", "egressIP": "203.0.113.1", "healthy": false, "createdAt": "2026-11-29T11:58:00Z"},
			},
		}
		if diff := cmp.Diff(want, status); diff != "" {
			t.Errorf("XR status: -want, +got:\n%s", diff)
		}
		wantCond := []*fnv1.Condition{{
			Type: "FleetHealthy", Status: fnv1.Status_STATUS_CONDITION_FALSE, Reason: "Degraded",
			Message: ptr.To("1/2 proxies healthy; proxy crawlers-1 unhealthy since 2026-11-29T11:58:00Z"), Target: fnv1.Target_TARGET_COMPOSITE_AND_CLAIM.Enum(),
		}}
		if diff := cmp.Diff(wantCond, conditions(rsp, ConditionFleetHealthy), protocmp.Transform()); diff != "" {
			t.Errorf("FleetHealthy: -want, +got:\n%s", diff)
		}
		if len(rsp.GetResults()) != 0 {
			t.Errorf("a proxy unhealthy for 2 minutes is not yet real trouble: no Warning, got %v", rsp.GetResults())
		}
	})

	t.Run("DuplicateEgressIP", func(t *testing.T) {
		// crawlers-2 leaves from crawlers-0's IP (one node, one NAT): the
		// fleet says so on the XR, marks both in its status, and labels
		// both Proxies; crawlers-1, of the same zone, has an IP of its
		// own, and crawlers-3 none known yet.
		shared := observedProxy(2, "a", true, t0.Add(-time.Hour), "")
		shared.GetResource().GetFields()["status"].GetStructValue().GetFields()["atProvider"].GetStructValue().Fields["egressIP"] = structpb.NewStringValue("203.0.113.0")
		unknown := observedProxy(3, "a", false, t0.Add(-time.Minute), "")
		delete(unknown.GetResource().GetFields()["status"].GetStructValue().GetFields()["atProvider"].GetStructValue().Fields, "egressIP")
		spec := strings.Replace(validSpec, `"replicas": 2`, `"replicas": 4`, 1)
		req := &fnv1.RunFunctionRequest{
			Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}, Resources: map[string]*fnv1.Resource{
				"proxy-0": observedProxy(0, "a", true, t0.Add(-3*time.Hour), ""),
				"proxy-1": observedProxy(1, "a", true, t0.Add(-2*time.Hour), ""),
				"proxy-2": shared,
				"proxy-3": unknown,
			}},
			RequiredResources: noLeases(),
		}
		rsp := run(t, req)
		wantCond := []*fnv1.Condition{{
			Type: ConditionDuplicateEgressIP, Status: fnv1.Status_STATUS_CONDITION_TRUE, Reason: "SharedEgressIP",
			Message: ptr.To("crawlers-0, crawlers-2 share egress IP 203.0.113.0: to a target they are one client"), Target: fnv1.Target_TARGET_COMPOSITE_AND_CLAIM.Enum(),
		}}
		if diff := cmp.Diff(wantCond, conditions(rsp, ConditionDuplicateEgressIP), protocmp.Transform()); diff != "" {
			t.Errorf("DuplicateEgressIP: -want, +got:\n%s", diff)
		}
		for name, want := range map[string]bool{"proxy-0": true, "proxy-1": false, "proxy-2": true, "proxy-3": false} {
			labels := rsp.GetDesired().GetResources()[name].GetResource().GetFields()["metadata"].GetStructValue().GetFields()["labels"].GetStructValue().AsMap()
			if got := labels[fleetv1alpha1.LabelDuplicateEgressIP] == "true"; got != want {
				t.Errorf("%s labelled %s: %v, want %v (labels %v)", name, fleetv1alpha1.LabelDuplicateEgressIP, got, want, labels)
			}
		}
		status := rsp.GetDesired().GetComposite().GetResource().GetFields()["status"].GetStructValue().AsMap()
		for _, p := range status["proxies"].([]any) {
			p := p.(map[string]any)
			if want := p["name"] == "crawlers-0" || p["name"] == "crawlers-2"; (p["duplicateEgressIP"] == true) != want {
				t.Errorf("status.proxies[%s].duplicateEgressIP: %v, want %v", p["name"], p["duplicateEgressIP"], want)
			}
		}

		// Once it leaves from an IP of its own, the flag goes.
		shared.GetResource().GetFields()["status"].GetStructValue().GetFields()["atProvider"].GetStructValue().Fields["egressIP"] = structpb.NewStringValue("203.0.113.2")
		rsp = run(t, req)
		if c := conditions(rsp, ConditionDuplicateEgressIP); len(c) != 1 || c[0].GetStatus() != fnv1.Status_STATUS_CONDITION_FALSE || c[0].GetReason() != "DistinctEgressIPs" {
			t.Errorf("distinct IPs: DuplicateEgressIP %v, want False DistinctEgressIPs", c)
		}
		labels := rsp.GetDesired().GetResources()["proxy-2"].GetResource().GetFields()["metadata"].GetStructValue().GetFields()["labels"].GetStructValue().AsMap()
		if _, ok := labels[fleetv1alpha1.LabelDuplicateEgressIP]; ok {
			t.Errorf("a proxy with an IP of its own keeps the duplicate label: %v", labels)
		}

		// Nothing known (no proxy probed, or a health check that echoes
		// no IP) is no all-clear.
		rsp = run(t, &fnv1.RunFunctionRequest{
			Observed:          &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}, Resources: map[string]*fnv1.Resource{"proxy-3": unknown}},
			RequiredResources: noLeases(),
		})
		if c := conditions(rsp, ConditionDuplicateEgressIP); len(c) != 1 || c[0].GetStatus() != fnv1.Status_STATUS_CONDITION_UNKNOWN || c[0].GetReason() != "NoEgressIPsKnown" {
			t.Errorf("no egress IP known: DuplicateEgressIP %v, want Unknown NoEgressIPsKnown", c)
		}
	})

	t.Run("WarningOnRealTrouble", func(t *testing.T) {
		req := &fnv1.RunFunctionRequest{
			Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(validSpec)}, Resources: map[string]*fnv1.Resource{
				"proxy-0": observedProxy(0, "a", true, t0.Add(-3*time.Hour), ""),
				"proxy-1": observedProxy(1, "b", false, t0.Add(-20*time.Minute), ""),
			}},
			RequiredResources: noLeases(),
		}
		rsp := run(t, req)
		if r := rsp.GetResults(); len(r) != 1 || r[0].GetSeverity() != fnv1.Severity_SEVERITY_WARNING || !strings.Contains(r[0].GetMessage(), "crawlers-1 unhealthy since 2026-11-29T11:40:00Z") {
			t.Errorf("a proxy down longer than replaceUnhealthyAfter is a Warning: %v", r)
		}
		if _, ok := rsp.GetDesired().GetResources()["proxy-2"]; !ok {
			t.Error("and it gets a replacement")
		}
	})

	t.Run("RefusedByPolicy", func(t *testing.T) {
		// The provider refused proxy-1 by its ProviderConfig's policy an
		// hour ago. The fleet says why, and does not replace it: the
		// replacement would be refused alike, and again, forever.
		refused := observedProxy(1, "b", false, t0.Add(-time.Hour), "")
		cond := refused.GetResource().GetFields()["status"].GetStructValue().GetFields()["conditions"].GetListValue().GetValues()[0].GetStructValue()
		cond.Fields["reason"] = structpb.NewStringValue("NotPermitted")
		cond.Fields["message"] = structpb.NewStringValue(`spec.forProvider.kubernetes.namespace "kube-system" is not permitted by ClusterProviderConfig pods`)
		rsp := run(t, &fnv1.RunFunctionRequest{
			Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(validSpec)}, Resources: map[string]*fnv1.Resource{
				"proxy-0": observedProxy(0, "a", true, t0.Add(-3*time.Hour), ""),
				"proxy-1": refused,
			}},
			RequiredResources: noLeases(),
		})
		if _, ok := rsp.GetDesired().GetResources()["proxy-2"]; ok {
			t.Error("a refused proxy must not be replaced")
		}
		if c := conditions(rsp, ConditionFleetHealthy); len(c) != 1 || !strings.Contains(c[0].GetMessage(), `crawlers-1 unhealthy since 2026-11-29T11:00:00Z: spec.forProvider.kubernetes.namespace "kube-system" is not permitted`) {
			t.Errorf("FleetHealthy must repeat the refusal: %v", c)
		}
	})

	t.Run("LegacyClusterXR", func(t *testing.T) {
		legacy := resource.MustStructJSON(`{"apiVersion": "crawl.example.com/v1alpha1", "kind": "XProxyFleet",
			"metadata": {"name": "legacy-crawlers-x7k2p", "labels": {"crossplane.io/claim-name": "legacy-crawlers", "crossplane.io/claim-namespace": "team"}},
			"spec": ` + validSpec + `}`)
		rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: legacy}}})
		meta := rsp.GetDesired().GetResources()["proxy-0"].GetResource().GetFields()["metadata"].GetStructValue().AsMap()
		if meta["namespace"] != "team" || meta["name"] != "legacy-crawlers-0" {
			t.Errorf("a claimed XProxyFleet composes Proxies in the claim's namespace, named after the claim: %v", meta)
		}
		unclaimed := resource.MustStructJSON(`{"apiVersion": "crawl.example.com/v1alpha1", "kind": "XProxyFleet", "metadata": {"name": "x"}, "spec": ` + validSpec + `}`)
		rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: unclaimed}}})
		want := fatal("metadata.labels[crossplane.io/claim-namespace] is missing: create a XProxyFleet through a ProxyFleetClaim, whose namespace its Proxies live in")
		if diff := cmp.Diff(want, rsp.GetResults(), protocmp.Transform()); diff != "" {
			t.Errorf("an unclaimed XProxyFleet: -want, +got:\n%s", diff)
		}
		// Discovery publishes demand for namespaced fleets only.
		autoscaled := resource.MustStructJSON(`{"apiVersion": "crawl.example.com/v1alpha1", "kind": "XProxyFleet",
			"metadata": {"name": "legacy-crawlers-x7k2p", "labels": {"crossplane.io/claim-name": "legacy-crawlers", "crossplane.io/claim-namespace": "team"}},
			"spec": ` + withSpec(t, "autoscaling", `{"maxReplicas": 3}`) + `}`)
		rsp = run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: autoscaled}}})
		if r := rsp.GetResults(); len(r) != 1 || r[0].GetSeverity() != fnv1.Severity_SEVERITY_FATAL || !strings.HasPrefix(r[0].GetMessage(), "spec.autoscaling is for namespaced ProxyFleets") || len(rsp.GetDesired().GetResources()) != 0 {
			t.Errorf("an autoscaled legacy XProxyFleet: want a Fatal naming spec.autoscaling and nothing composed, got %v", r)
		}
	})

	t.Run("ActiveLeaseHoldsRotation", func(t *testing.T) {
		spec := withSpec(t, "rotation", `{"maxAge": "1h"}`)
		drained := `, "crawl.example.com/draining-since": "` + strconv.FormatInt(t0.Add(-time.Minute).Unix(), 10) + `"`
		observed := map[string]*fnv1.Resource{
			"proxy-0": observedProxy(0, "a", true, t0.Add(-3*time.Hour), drained),
			"proxy-1": observedProxy(1, "b", true, t0.Add(-10*time.Minute), ""),
			"proxy-2": observedProxy(2, "a", true, t0.Add(-5*time.Minute), `, "crawl.example.com/replaces": "0"`),
		}
		seen := []string{"crawlers-0"}
		for name, tc := range map[string]struct {
			summaries []*structpb.Struct
			oldKept   bool
		}{
			"Listed": {[]*structpb.Struct{leaseSummary("crawlers", "r1", t0, []held{{"crawlers-0", 1, t0.Add(time.Minute)}}, seen, leasewire.Demand{})}, true},
			"ListedByAnotherReplica": {[]*structpb.Struct{
				leaseSummary("crawlers", "r1", t0, nil, seen, leasewire.Demand{}),
				leaseSummary("crawlers", "r2", t0.Add(-5*time.Second), []held{{"crawlers-0", 1, t0.Add(time.Minute)}}, seen, leasewire.Demand{}),
			}, true},
			// Its replica died; what it said still holds until then.
			"ListedByAStaleSummaryStillHeld": {[]*structpb.Struct{
				leaseSummary("crawlers", "r1", t0, nil, seen, leasewire.Demand{}),
				leaseSummary("crawlers", "r2", staleAt, []held{{"crawlers-0", 1, t0.Add(time.Minute)}}, nil, leasewire.Demand{}),
			}, true},
			"ListedByAStaleSummaryEnded": {[]*structpb.Struct{
				leaseSummary("crawlers", "r1", t0, nil, seen, leasewire.Demand{}),
				leaseSummary("crawlers", "r2", staleAt, []held{{"crawlers-0", 1, t0.Add(-time.Second)}}, nil, leasewire.Demand{}),
			}, false},
			"NotSeenDrainingByALiveReplica": {[]*structpb.Struct{
				leaseSummary("crawlers", "r1", t0, nil, seen, leasewire.Demand{}),
				leaseSummary("crawlers", "r2", t0, nil, nil, leasewire.Demand{}),
			}, true},
			"OnlyStaleSummaries": {[]*structpb.Struct{leaseSummary("crawlers", "r1", staleAt, nil, seen, leasewire.Demand{})}, true},
			"NoneListed":         {[]*structpb.Struct{leaseSummary("crawlers", "r1", t0, nil, seen, leasewire.Demand{})}, false},
		} {
			rsp := run(t, &fnv1.RunFunctionRequest{
				Observed:          &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}, Resources: observed},
				RequiredResources: summaries(tc.summaries...),
			})
			_, kept := rsp.GetDesired().GetResources()["proxy-0"]
			if kept != tc.oldKept {
				t.Errorf("%s: old proxy kept %v, want %v", name, kept, tc.oldKept)
			}
		}
	})

	t.Run("Deterministic", func(t *testing.T) {
		req := &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(validSpec)}, Resources: map[string]*fnv1.Resource{
			"proxy-0": observedProxy(0, "a", true, t0.Add(-3*time.Hour), ""),
		}}}
		if diff := cmp.Diff(run(t, req), run(t, req), protocmp.Transform()); diff != "" {
			t.Errorf("the same request at the same time gives the same response: %s", diff)
		}
	})
}

func TestFleetNameTooLong(t *testing.T) {
	name := strings.Repeat("x", fleetv1alpha1.MaxNameLength+1)
	oxr := resource.MustStructJSON(`{"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyFleet",
		"metadata": {"name": "` + name + `", "namespace": "team"}, "spec": ` + validSpec + `}`)
	rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: oxr}}})
	want := fatal(fmt.Sprintf("metadata.name is %d characters long; a fleet's name may have at most %d, so that the names of its Proxies and Leases fit Kubernetes' 253", len(name), fleetv1alpha1.MaxNameLength))
	if diff := cmp.Diff(want, rsp.GetResults(), protocmp.Transform()); diff != "" {
		t.Errorf("a fleet name too long for its Leases' names: -want, +got:\n%s", diff)
	}
	if len(rsp.GetDesired().GetResources()) != 0 {
		t.Error("a refused fleet composes nothing")
	}
}

func TestPrivateDestinationsComposed(t *testing.T) {
	spec := withSpec(t, "proxy", `{"authSecretRef": {"name": "auth"}, "allowedPrivateDestinations": ["10.1.0.0/16"]}`)
	rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}}})
	fp := rsp.GetDesired().GetResources()["proxy-0"].GetResource().AsMap()["spec"].(map[string]any)["forProvider"].(map[string]any)
	if diff := cmp.Diff([]any{"10.1.0.0/16"}, fp["allowedPrivateDestinations"]); diff != "" {
		t.Errorf("a fleet's private destinations reach its Proxies (the provider checks them against the policy): -want +got:\n%s", diff)
	}
}

// TestDiscoveryAccess: each fleet grants egress-discovery get on exactly
// its auth Secret and Lease writes in its namespace; a fleet without
// credentials grants no Secret, and a function told of no discovery
// grants nothing.
func TestDiscoveryAccess(t *testing.T) {
	grants := func(f *Function, spec string) map[string]*fnv1.Resource {
		rsp, err := f.RunFunction(context.Background(), &fnv1.RunFunctionRequest{
			Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}}, RequiredResources: noLeases(),
		})
		if err != nil || len(rsp.GetResults()) != 0 {
			t.Fatalf("%v %v", err, rsp.GetResults())
		}
		out := map[string]*fnv1.Resource{}
		for name, r := range rsp.GetDesired().GetResources() {
			if _, ok := ordinalOf(name); !ok {
				out[name] = r
			}
		}
		return out
	}
	fn := New(Config{Log: logging.NewNopLogger(), Now: func() time.Time { return t0 }})
	got := grants(fn, validSpec)
	role, binding := got[resourceAccessRole].GetResource().AsMap(), got[resourceAccessBinding].GetResource().AsMap()
	wantRules := []any{
		map[string]any{"apiGroups": []any{"coordination.k8s.io"}, "resources": []any{"leases"}, "verbs": []any{"get", "create", "update", "patch", "delete"}},
		map[string]any{"apiGroups": []any{""}, "resources": []any{"secrets"}, "resourceNames": []any{"auth"}, "verbs": []any{"get"}},
	}
	if diff := cmp.Diff(wantRules, role["rules"]); diff != "" {
		t.Errorf("the Role: -want, +got:\n%s", diff)
	}
	wantSubjects := []any{map[string]any{"kind": "ServiceAccount", "name": "egress-discovery", "namespace": "egress-system"}}
	if diff := cmp.Diff(wantSubjects, binding["subjects"]); diff != "" {
		t.Errorf("the RoleBinding: -want, +got:\n%s", diff)
	}
	if ns := role["metadata"].(map[string]any)["namespace"]; ns != "team" {
		t.Errorf("the grant lives in the fleet's namespace, got %v", ns)
	}

	noAuth := withSpec(t, "proxy", `{"allowedSourceRanges": ["10.0.0.0/8"]}`)
	if rules := grants(fn, noAuth)[resourceAccessRole].GetResource().AsMap()["rules"].([]any); len(rules) != 1 {
		t.Errorf("a fleet without credentials grants no Secret: %v", rules)
	}
	if g := grants(New(Config{Log: logging.NewNopLogger(), Now: func() time.Time { return t0 }, Discovery: &types.NamespacedName{}}), validSpec); len(g) != 0 {
		t.Errorf("without egress-discovery nothing is granted: %v", g)
	}
	// An empty setting is none too, as --discovery-service-account= says;
	// a Config without one gets the default.
	none, err := ParseServiceAccount("")
	if err != nil {
		t.Fatal(err)
	}
	if g := grants(New(Config{Log: logging.NewNopLogger(), Now: func() time.Time { return t0 }, Discovery: none}), validSpec); len(g) != 0 {
		t.Errorf("an empty service account grants nothing: %v", g)
	}
	if g := grants(New(Config{Log: logging.NewNopLogger(), Now: func() time.Time { return t0 }}), validSpec); len(g) == 0 {
		t.Error("a Config without Discovery grants the default service account")
	}
}

// TestTemplateChangeKeepsOldSpecs: after a template change, a Proxy of the
// old revision keeps the spec it was made with (with the fleet's current
// leases per proxy) until it is replaced, and its surge replacement gets
// the new template, in its zone.
func TestTemplateChangeKeepsOldSpecs(t *testing.T) {
	spec := withSpec(t, "leases", `{"maxLeasesPerProxy": 3}`)
	current := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}}}).
		GetDesired().GetComposite().GetResource().GetFields()["status"].GetStructValue().GetFields()["observedRevision"].GetStringValue()
	old := observedProxy(0, "a", true, t0.Add(-3*time.Hour), `, "crawl.example.com/template-revision": "0ld0ld0ld0"`)
	old.Resource.Fields["spec"] = structpb.NewStructValue(resource.MustStructJSON(`{
		"providerConfigRef": {"kind": "ProviderConfig", "name": "local"}, "managementPolicies": ["*"],
		"forProvider": {"mode": "Managed", "port": 9999, "local": {"bindAddress": "127.0.0.1"}, "maxLeases": 1, "authSecretRef": {"name": "auth"}}}`))
	req := &fnv1.RunFunctionRequest{
		Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}, Resources: map[string]*fnv1.Resource{
			"proxy-0": old,
			"proxy-1": observedProxy(1, "b", true, t0.Add(-2*time.Hour), `, "crawl.example.com/template-revision": "`+current+`"`),
		}},
		RequiredResources: noLeases(),
	}
	d := run(t, req).GetDesired().GetResources()
	fp := func(name string) map[string]any {
		return d[name].GetResource().AsMap()["spec"].(map[string]any)["forProvider"].(map[string]any)
	}
	labels := func(name string) map[string]any {
		return d[name].GetResource().AsMap()["metadata"].(map[string]any)["labels"].(map[string]any)
	}
	if got := fp("proxy-0"); got["port"] != float64(9999) || got["maxLeases"] != float64(3) {
		t.Errorf("the old Proxy keeps its spec, with the current leases per proxy: %v", got)
	}
	if _, ok := d["proxy-0"].GetResource().AsMap()["spec"].(map[string]any)["managementPolicies"]; ok {
		t.Error("only providerConfigRef and forProvider are the function's to keep")
	}
	if l := labels("proxy-0"); l[fleetv1alpha1.LabelTemplateRevision] != "0ld0ld0ld0" {
		t.Errorf("the old Proxy keeps its revision: %v", l)
	}
	if l := labels("proxy-0"); l[fleetv1alpha1.LabelDrainingSince] != nil {
		t.Errorf("the old Proxy serves as before while its replacement boots: %v", l)
	}

	// Its replacement Ready, and a crawler's lease on it, the old Proxy
	// drains from now; composed again, it keeps the time its drain began.
	req.Observed.Resources["proxy-2"] = observedProxy(2, "a", true, t0.Add(-time.Minute), `, "crawl.example.com/replaces": "0", "crawl.example.com/template-revision": "`+current+`"`)
	req.RequiredResources = summaries(leaseSummary("crawlers", "r1", t0, []held{{"crawlers-0", 1, t0.Add(10 * time.Minute)}}, nil, leasewire.Demand{}))
	drained := func() any {
		return run(t, req).GetDesired().GetResources()["proxy-0"].GetResource().AsMap()["metadata"].(map[string]any)["labels"].(map[string]any)[fleetv1alpha1.LabelDrainingSince]
	}
	if got := drained(); got != strconv.FormatInt(t0.Unix(), 10) {
		t.Errorf("the old Proxy, its replacement Ready, drains from now: %v", got)
	}
	began := strconv.FormatInt(t0.Add(-5*time.Minute).Unix(), 10)
	old.Resource.Fields["metadata"].GetStructValue().Fields["labels"].GetStructValue().Fields[fleetv1alpha1.LabelDrainingSince] = structpb.NewStringValue(began)
	if got := drained(); got != began {
		t.Errorf("the drain start stays as observed: %v", got)
	}
	if got := fp("proxy-1"); got["port"] != float64(3128) {
		t.Errorf("a Proxy of the current revision gets the template: %v", got)
	}
	r, ok := d["proxy-2"]
	if !ok {
		t.Fatalf("the old Proxy gets a surge replacement: %v", d)
	}
	l := labels("proxy-2")
	if l[fleetv1alpha1.LabelTemplateRevision] != current || l[fleetv1alpha1.LabelReplaces] != "0" || l[fleetv1alpha1.LabelZone] != "a" || fp("proxy-2")["port"] != float64(3128) {
		t.Errorf("the replacement is of the current template, in the old one's zone: %v %v", l, r.GetResource().AsMap()["spec"])
	}

	// It waits on that lease, and the replica that granted it is gone:
	// its summary is stale and counts the lease 25 s more. Nothing is
	// written when it ends, so the fleet asks to be composed again then,
	// not a minute later.
	req.RequiredResources = summaries(
		leaseSummary("crawlers", "r1", staleAt, []held{{"crawlers-0", 1, t0.Add(25 * time.Second)}}, nil, leasewire.Demand{}),
		leaseSummary("crawlers", "r2", t0, nil, []string{"crawlers-0"}, leasewire.Demand{}))
	rsp := run(t, req)
	if _, kept := rsp.GetDesired().GetResources()["proxy-0"]; !kept {
		t.Fatal("the old Proxy, leased by the stale summary, goes")
	}
	if ttl := rsp.GetMeta().GetTtl().AsDuration(); ttl != 25*time.Second {
		t.Errorf("waiting on a lease that ends in 25 s: composed again after %s, want 25s", ttl)
	}
}

// TestFleetReadiness: the XR is Ready while at least replicas -
// maxUnavailable proxies are, so a surge proxy booting during a rollout
// does not make it unready, and one proxy down beyond that does.
func TestFleetReadiness(t *testing.T) {
	cases := map[string]struct {
		reason    string
		spec      string
		resources map[string]*fnv1.Resource
		want      fnv1.Ready
	}{
		"SurgeBooting": {
			reason: "Two Ready proxies and a surge one booting: Ready.",
			spec:   validSpec,
			resources: map[string]*fnv1.Resource{
				"proxy-0": observedProxy(0, "a", true, t0.Add(-3*time.Hour), ""),
				"proxy-1": observedProxy(1, "b", true, t0.Add(-3*time.Hour), ""),
				"proxy-2": observedProxy(2, "a", false, t0.Add(-time.Minute), `, "crawl.example.com/replaces": "0"`),
			},
			want: fnv1.Ready_READY_TRUE,
		},
		"OneDown": {
			reason: "One of two proxies down, maxUnavailable 0: not Ready.",
			spec:   validSpec,
			resources: map[string]*fnv1.Resource{
				"proxy-0": observedProxy(0, "a", true, t0.Add(-3*time.Hour), ""),
				"proxy-1": observedProxy(1, "b", false, t0.Add(-3*time.Hour), ""),
			},
			want: fnv1.Ready_READY_FALSE,
		},
		"OneDownAllowed": {
			reason: "One of two proxies down, maxUnavailable 1: Ready.",
			spec:   withSpec(t, "rotation", `{"maxUnavailable": 1}`),
			resources: map[string]*fnv1.Resource{
				"proxy-0": observedProxy(0, "a", true, t0.Add(-3*time.Hour), ""),
				"proxy-1": observedProxy(1, "b", false, t0.Add(-3*time.Hour), ""),
			},
			want: fnv1.Ready_READY_TRUE,
		},
		"New": {
			reason: "A fleet whose proxies are all still booting is not Ready.",
			spec:   validSpec,
			want:   fnv1.Ready_READY_FALSE,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			rsp := run(t, &fnv1.RunFunctionRequest{
				Observed:          &fnv1.State{Composite: &fnv1.Resource{Resource: xr(tc.spec)}, Resources: tc.resources},
				RequiredResources: noLeases(),
			})
			if got := rsp.GetDesired().GetComposite().GetReady(); got != tc.want {
				t.Errorf("%s\nXR ready: %v, want %v", tc.reason, got, tc.want)
			}
		})
	}
}

// TestRolloutStalled: a rollout that made no progress for its deadline is
// reported, naming what blocks it; progress (an old proxy gone, a new one
// Ready) moves the time on, and a paused rollout never stalls.
func TestRolloutStalled(t *testing.T) {
	old := `, "crawl.example.com/template-revision": "0ld0ld0ld0"`
	stuck := map[string]*fnv1.Resource{
		"proxy-0": observedProxy(0, "a", true, t0.Add(-3*time.Hour), old),
		"proxy-1": observedProxy(1, "b", true, t0.Add(-3*time.Hour), old),
		"proxy-2": observedProxy(2, "a", false, t0.Add(-20*time.Minute), `, "crawl.example.com/replaces": "0"`),
	}
	withRollout := func(spec string, remaining, updatedReady int, since time.Time) *structpb.Struct {
		x := xr(spec)
		x.Fields["status"] = structpb.NewStructValue(resource.MustStructJSON(fmt.Sprintf(
			`{"rollout": {"remaining": %d, "updatedReady": %d, "lastProgressTime": %q}}`, remaining, updatedReady, since.Format(time.RFC3339))))
		return x
	}
	cases := map[string]struct {
		reason     string
		xr         *structpb.Struct
		wantStatus fnv1.Status
		wantReason string
		wantSince  time.Time
		says       string
	}{
		"Stalled": {
			reason: "Two old proxies left for 11 minutes, the new one never Ready: stalled.",
			xr:     withRollout(validSpec, 2, 0, t0.Add(-11*time.Minute)), wantStatus: fnv1.Status_STATUS_CONDITION_TRUE, wantReason: "ProgressDeadlineExceeded",
			wantSince: t0.Add(-11 * time.Minute), says: "crawlers-2 of the new template is not Ready",
		},
		"NotYet": {
			reason: "Nine minutes without progress: still progressing.",
			xr:     withRollout(validSpec, 2, 0, t0.Add(-9*time.Minute)), wantStatus: fnv1.Status_STATUS_CONDITION_FALSE, wantReason: "Progressing",
			wantSince: t0.Add(-9 * time.Minute),
		},
		"Progressed": {
			reason: "Three old proxies left before, two now: progress, from now.",
			xr:     withRollout(validSpec, 3, 0, t0.Add(-30*time.Minute)), wantStatus: fnv1.Status_STATUS_CONDITION_FALSE, wantReason: "Progressing",
			wantSince: t0,
		},
		"Paused": {
			reason: "A paused rollout does not stall.",
			xr:     withRollout(withSpec(t, "rollout", `{"paused": true}`), 2, 0, t0.Add(-time.Hour)), wantStatus: fnv1.Status_STATUS_CONDITION_FALSE, wantReason: "Paused",
			wantSince: t0.Add(-time.Hour),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			rsp := run(t, &fnv1.RunFunctionRequest{
				Observed:          &fnv1.State{Composite: &fnv1.Resource{Resource: tc.xr}, Resources: stuck},
				RequiredResources: noLeases(),
			})
			var c *fnv1.Condition
			for _, x := range rsp.GetConditions() {
				if x.GetType() == ConditionRolloutStalled {
					c = x
				}
			}
			if c == nil || c.GetStatus() != tc.wantStatus || c.GetReason() != tc.wantReason || !strings.Contains(c.GetMessage(), tc.says) {
				t.Fatalf("%s\nRolloutStalled: %v", tc.reason, c)
			}
			st := rsp.GetDesired().GetComposite().GetResource().GetFields()["status"].GetStructValue()
			if got := str(st, "rollout", "lastProgressTime"); got != tc.wantSince.Format(time.RFC3339) {
				t.Errorf("%s\nstatus.rollout.lastProgressTime %s, want %s", tc.reason, got, tc.wantSince.Format(time.RFC3339))
			}
		})
	}
}

// TestQuickUnhealthyReplaceClamped: a fleet stored before the schema
// refused a replaceUnhealthyAfter under 1m is still composed, with 1m and a
// Warning that says so.
func TestQuickUnhealthyReplaceClamped(t *testing.T) {
	rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(withSpec(t, "rotation", `{"replaceUnhealthyAfter": "30s"}`))}}})
	if len(rsp.GetDesired().GetResources()) == 0 {
		t.Fatal("the fleet must still be composed")
	}
	var warned bool
	for _, r := range rsp.GetResults() {
		if r.GetSeverity() == fnv1.Severity_SEVERITY_FATAL {
			t.Errorf("no Fatal result: %v", r)
		}
		warned = warned || r.GetSeverity() == fnv1.Severity_SEVERITY_WARNING && strings.Contains(r.GetMessage(), "replaceUnhealthyAfter 30s is shorter than 1m: 1m is used")
	}
	if !warned {
		t.Errorf("a Warning says the hold was raised to 1m: %v", rsp.GetResults())
	}
}

// conditions are the response's conditions of type t.
func conditions(rsp *fnv1.RunFunctionResponse, t string) []*fnv1.Condition {
	var out []*fnv1.Condition
	for _, c := range rsp.GetConditions() {
		if c.GetType() == t {
			out = append(out, c)
		}
	}
	return out
}

// heldLease is a crawler's unexpired lease on the Proxy proxy at t0.
// noLeases is what Crossplane sends of a fleet no crawler holds a lease
// on: one fresh LeaseSummary listing none.
func noLeases() map[string]*fnv1.Resources {
	return summaries(leaseSummary("crawlers", "r1", t0, nil, nil, leasewire.Demand{}))
}

// TestCredentials: each Proxy is told how long to accept its previous
// credentials (spec.proxy.credentialGracePeriod, else the longest lease),
// which changes no template revision; a Proxy whose instance reports
// outdated credentials (a VM that cannot change them in place) gets a surge
// replacement of the same template, as a Proxy of an old revision would;
// and a grace period outside its bounds is a Fatal naming the field.
func TestCredentials(t *testing.T) {
	revisionOf := func(spec string) string {
		return run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}}}).
			GetDesired().GetComposite().GetResource().GetFields()["status"].GetStructValue().GetFields()["observedRevision"].GetStringValue()
	}
	current := revisionOf(validSpec)
	withGrace := withSpec(t, "proxy.credentialGracePeriod", `"15m"`)
	if got := revisionOf(withGrace); got != current {
		t.Errorf("the grace period must not change the template revision: %s, then %s", current, got)
	}
	outdated := observedProxy(0, "a", true, t0.Add(-3*time.Hour), `, "crawl.example.com/template-revision": "`+current+`"`)
	outdated.Resource.Fields["status"].GetStructValue().Fields["atProvider"].GetStructValue().Fields["credentialsOutdated"] = structpb.NewBoolValue(true)
	for spec, grace := range map[string]string{validSpec: "1h0m0s", withGrace: "15m0s"} {
		req := &fnv1.RunFunctionRequest{
			Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}, Resources: map[string]*fnv1.Resource{
				"proxy-0": outdated,
				"proxy-1": observedProxy(1, "b", true, t0.Add(-2*time.Hour), `, "crawl.example.com/template-revision": "`+current+`"`),
			}},
			RequiredResources: noLeases(),
		}
		d := run(t, req).GetDesired().GetResources()
		for _, name := range []string{"proxy-0", "proxy-1", "proxy-2"} {
			r, ok := d[name]
			if !ok {
				t.Fatalf("want %s (proxy-2 replacing the outdated proxy-0): %v", name, d)
			}
			fp := r.GetResource().AsMap()["spec"].(map[string]any)["forProvider"].(map[string]any)
			if fp["credentialGracePeriod"] != grace {
				t.Errorf("%s: credentialGracePeriod %v, want %s", name, fp["credentialGracePeriod"], grace)
			}
		}
		l := d["proxy-2"].GetResource().AsMap()["metadata"].(map[string]any)["labels"].(map[string]any)
		if l[fleetv1alpha1.LabelReplaces] != "0" || l[fleetv1alpha1.LabelZone] != "a" || l[fleetv1alpha1.LabelTemplateRevision] != current {
			t.Errorf("the replacement is of the current template, in the outdated proxy's zone: %v", l)
		}
	}
	// A fleet that drops its credentials keeps its old Proxies' specs,
	// credentials and all, until they are replaced.
	open := withSpec(t, "proxy", `{"allowedSourceRanges": ["10.0.0.0/8"]}`)
	old := observedProxy(0, "a", true, t0.Add(-3*time.Hour), `, "crawl.example.com/template-revision": "`+current+`"`)
	old.Resource.Fields["spec"] = structpb.NewStructValue(resource.MustStructJSON(`{
		"providerConfigRef": {"kind": "ProviderConfig", "name": "local"},
		"forProvider": {"mode": "Managed", "port": 3128, "local": {"bindAddress": "127.0.0.1"}, "maxLeases": 1, "authSecretRef": {"name": "auth"}, "credentialGracePeriod": "1h0m0s"}}`))
	rsp := run(t, &fnv1.RunFunctionRequest{
		Observed:          &fnv1.State{Composite: &fnv1.Resource{Resource: xr(open)}, Resources: map[string]*fnv1.Resource{"proxy-0": old}},
		RequiredResources: noLeases(),
	})
	for _, r := range rsp.GetResults() {
		if r.GetSeverity() == fnv1.Severity_SEVERITY_FATAL {
			t.Fatalf("dropping the credentials: %s", r.GetMessage())
		}
	}
	if fp := rsp.GetDesired().GetResources()["proxy-0"].GetResource().AsMap()["spec"].(map[string]any)["forProvider"].(map[string]any); fp["credentialGracePeriod"] != "1h0m0s" {
		t.Errorf("the old Proxy keeps its grace period: %v", fp)
	}
	for _, bad := range []string{`"-1s"`, `"169h"`} {
		rsp := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(withSpec(t, "proxy.credentialGracePeriod", bad))}}})
		if r := rsp.GetResults(); len(r) == 0 || r[0].GetSeverity() != fnv1.Severity_SEVERITY_FATAL || !strings.Contains(r[0].GetMessage(), "spec.proxy.credentialGracePeriod") {
			t.Errorf("grace %s: want a Fatal naming spec.proxy.credentialGracePeriod, got %v", bad, r)
		}
	}
}
