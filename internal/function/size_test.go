package function

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

var sharedBed testbed.Lazy

// longFleet is a fleet name of the longest length allowed.
var longFleet = strings.Repeat("f", fleetv1alpha1.MaxNameLength)

func TestMain(m *testing.M) { sharedBed.Main(m) }

// realObjects writes a fleet's Proxy and a crawler's slot Lease to the test
// apiserver the way Crossplane, the provider and egress-discovery do
// (server-side apply of the composed Proxy, the provider's finalizer,
// annotations and status, discovery's create and renewal of the Lease),
// and reads them back as Crossplane sends them to the function: whole
// objects, managedFields included.
func realObjects(tb testing.TB) (proxy, slot map[string]any) {
	tb.Helper()
	bed := sharedBed.Env(tb)
	ctx := context.Background()
	ns := bed.Namespace(tb)
	// The longest names allowed: a fleet of MaxNameLength characters, a
	// ten-digit ordinal, a holder identity of 253.
	name := longFleet + "-1234567890"
	composed := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": v1alpha1.ProxyKind,
		"metadata": map[string]any{
			"name": name, "namespace": ns,
			"labels": map[string]any{
				fleetv1alpha1.LabelFleet: ownership.LabelValue(longFleet), fleetv1alpha1.LabelZone: "europe-west1-b", fleetv1alpha1.LabelRotationGeneration: "3",
				fleetv1alpha1.LabelTemplateRevision: "2c14442eb0", fleetv1alpha1.LabelReplaces: "1234567889",
				fleetv1alpha1.LabelUnhealthyStreak: "3", fleetv1alpha1.LabelDrainingSince: "1764500000",
				"crossplane.io/composite": ownership.LabelValue(longFleet),
			},
			"annotations": map[string]any{
				fleetv1alpha1.AnnotationFleet: longFleet, "crossplane.io/composition-resource-name": "proxy-1234567890",
			},
			"ownerReferences": []any{map[string]any{
				"apiVersion": fleetv1alpha1.SchemeGroupVersion.String(), "kind": fleetv1alpha1.ProxyFleetKind, "name": longFleet,
				"uid": "0b7c6a2e-1111-4222-8333-944455556666", "controller": true, "blockOwnerDeletion": true,
			}},
		},
		"spec": map[string]any{
			"providerConfigRef": map[string]any{"kind": "ClusterProviderConfig", "name": "gcp"},
			"forProvider": map[string]any{
				"mode": "Managed", "port": int64(3128), "maxLeases": int64(10),
				"authSecretRef":         map[string]any{"name": "crawlers-proxy-auth"},
				"credentialGracePeriod": "167h59m59s",
				"allowedSourceRanges":   []any{"203.0.113.0/24", "198.51.100.0/24"},
				"healthCheck":           map[string]any{"url": "https://ifconfig.me/ip", "interval": "30s", "timeout": "5s"},
				"gcp": map[string]any{"zone": "europe-west1-b", "machineType": "e2-small", "networkTags": []any{"crawl"},
					"network": "projects/crawl-proj/global/networks/crawl", "subnetwork": "projects/crawl-proj/regions/europe-west1/subnetworks/crawl"},
			},
		},
	}}
	if err := bed.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(composed), client.FieldOwner("apiextensions.crossplane.io/composed/9f2c1e7a0b"), client.ForceOwnership); err != nil {
		tb.Fatal(err)
	}
	p := &v1alpha1.Proxy{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, p); err != nil {
		tb.Fatal(err)
	}
	p.Finalizers = append(p.Finalizers, "finalizer.managedresource.crossplane.io")
	p.Annotations["crossplane.io/external-name"] = "projects/crawl-proj/zones/europe-west1-b/instances/egress-jje2z6fgxvzhokcj"
	p.Annotations["crossplane.io/external-create-pending"] = time.Now().UTC().Format(time.RFC3339)
	p.Annotations["crossplane.io/external-create-succeeded"] = time.Now().UTC().Format(time.RFC3339)
	if err := bed.Client.Update(ctx, p, client.FieldOwner("provider-egressproxy")); err != nil {
		tb.Fatal(err)
	}
	now := metav1.Now()
	p.Status.AtProvider = v1alpha1.ProxyObservation{
		ProviderID: "projects/crawl-proj/zones/europe-west1-b/instances/egress-jje2z6fgxvzhokcj", Host: "34.140.211.97", Port: 3128,
		EgressIP: "34.140.211.97", Phase: v1alpha1.InstancePhaseRunning, Healthy: true, LatencyMilliseconds: 142,
		LastProbeTime: &now, ConsecutiveSuccesses: 12, InstanceCreatedAt: &now,
		PreviousCredentialsUntil: &now, CredentialsOutdated: true,
	}
	p.SetConditions(xpv2.Available(), xpv2.ReconcileSuccess(),
		xpv2.Condition{Type: "OpenProxy", Status: "False", Reason: "RefusesUnauthenticated", Message: "a request without credentials gets 407", LastTransitionTime: now})
	if err := bed.Client.Status().Update(ctx, p, client.FieldOwner("provider-egressproxy")); err != nil {
		tb.Fatal(err)
	}

	l := &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name + "-slot-99",
			Labels:          map[string]string{fleetv1alpha1.LabelFleet: ownership.LabelValue(longFleet), fleetv1alpha1.LabelProxy: ownership.LabelValue(name), fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindSlot},
			Annotations:     map[string]string{fleetv1alpha1.AnnotationFleet: longFleet, fleetv1alpha1.AnnotationProxy: name},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.ProxyKind, Name: name, UID: p.UID}},
		},
		Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To(strings.Repeat("h", 253)), LeaseDurationSeconds: ptr.To[int32](600),
			AcquireTime: &metav1.MicroTime{Time: time.Now()}, RenewTime: &metav1.MicroTime{Time: time.Now()}},
	}
	if err := bed.Client.Create(ctx, l, client.FieldOwner("egress-discovery")); err != nil {
		tb.Fatal(err)
	}
	renew, _ := json.Marshal([]map[string]any{{"op": "replace", "path": "/spec/renewTime", "value": metav1.MicroTime{Time: time.Now()}}})
	if err := bed.Client.Patch(ctx, l, client.RawPatch(types.JSONPatchType, renew), client.FieldOwner("egress-discovery")); err != nil {
		tb.Fatal(err)
	}
	read := func(obj client.Object) map[string]any {
		out := map[string]any{}
		raw, err := json.Marshal(obj)
		if err != nil {
			tb.Fatal(err)
		}
		if err := json.Unmarshal(raw, &out); err != nil {
			tb.Fatal(err)
		}
		return out
	}
	if err := bed.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
		tb.Fatal(err)
	}
	if err := bed.Client.Get(ctx, client.ObjectKeyFromObject(l), l); err != nil {
		tb.Fatal(err)
	}
	proxy, slot = read(p), read(l)
	proxy["apiVersion"], proxy["kind"] = v1alpha1.SchemeGroupVersion.String(), v1alpha1.ProxyKind
	slot["apiVersion"], slot["kind"] = "coordination.k8s.io/v1", "Lease"
	return proxy, slot
}

// sizedRequest is the request Crossplane sends for a fleet of n proxies,
// each with k leases held (listed, as egress-discovery's LeaseSummaries
// list them: a proxy and its count of holders), built from real objects.
func sizedRequest(tb testing.TB, proxy, _ map[string]any, n, k int) *fnv1.RunFunctionRequest {
	tb.Helper()
	spec := fmt.Sprintf(`{"replicas": %d, "zones": ["europe-west1-b", "europe-west1-c", "europe-west1-d"],
		"providerConfigRef": {"kind": "ClusterProviderConfig", "name": "gcp"},
		"placement": {"gcp": {"machineType": "e2-small", "networkTags": ["crawl"]}},
		"proxy": {"authSecretRef": {"name": "crawlers-proxy-auth"}, "allowedSourceRanges": ["203.0.113.0/24", "198.51.100.0/24"]},
		"healthCheck": {"url": "https://ifconfig.me/ip"}, "leases": {"maxLeasesPerProxy": %d}}`, n, k)
	observed := make(map[string]*fnv1.Resource, n)
	var leased []held
	composite := xr(spec)
	// The XR as Crossplane sends it: a status entry and a resource
	// reference per proxy.
	var entries, refs []any
	for i := range n {
		pname := fmt.Sprintf("%s-%010d", longFleet, i)
		meta := proxy["metadata"].(map[string]any)
		meta["name"] = pname
		s, err := structpb.NewStruct(proxy)
		if err != nil {
			tb.Fatal(err)
		}
		observed[resourceName(i)] = &fnv1.Resource{Resource: s}
		entries = append(entries, map[string]any{"name": pname, "endpoint": "34.140.211.97:3128", "zone": "europe-west1-b",
			"egressIP": "34.140.211.97", "healthy": true, "createdAt": "2026-11-30T12:00:00Z"})
		refs = append(refs, map[string]any{"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": v1alpha1.ProxyKind, "name": pname, "namespace": "crawl-team"})
		if k > 0 {
			leased = append(leased, held{pname, int32(k), t0.Add(time.Hour)}) //nolint:gosec // Test figures.
		}
	}
	status, err := structpb.NewValue(map[string]any{"proxies": entries})
	if err != nil {
		tb.Fatal(err)
	}
	composite.Fields["status"] = status
	crossplane, err := structpb.NewValue(map[string]any{"resourceRefs": refs})
	if err != nil {
		tb.Fatal(err)
	}
	composite.Fields["spec"].GetStructValue().Fields["crossplane"] = crossplane
	return &fnv1.RunFunctionRequest{
		Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: composite}, Resources: observed},
		// Three discovery replicas' summaries (two, and one rolling
		// over), each listing every leased proxy.
		RequiredResources: summaries(
			leaseSummary("crawlers", strings.Repeat("r", 250)+"1", t0, leased, nil, leasewire.Demand{}),
			leaseSummary("crawlers", strings.Repeat("r", 250)+"2", t0, leased, nil, leasewire.Demand{}),
			leaseSummary("crawlers", strings.Repeat("r", 250)+"3", t0, leased, nil, leasewire.Demand{})),
	}
}

// BenchmarkMessageSizes measures the RunFunctionRequest Crossplane sends
// (the observed Proxies as the apiserver returns them, and the required
// LeaseSummary) and the function's response, for a fleet of the XRD's
// maximum replicas with 1, 10 and 100 leases per proxy, against the
// function's 4 MiB receive limit. It also reports the bytes one Proxy and
// one leased proxy add, from which the XRD's bound on replicas is derived.
func BenchmarkMessageSizes(b *testing.B) {
	proxy, slot := realObjects(b)
	f := New(Config{Log: logging.NewNopLogger(), Now: func() time.Time { return t0 }})
	size := func(n, k int) (int, int) {
		req := sizedRequest(b, proxy, slot, n, k)
		rsp, err := f.RunFunction(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		return proto.Size(req), proto.Size(rsp)
	}
	base, _ := size(0, 0)
	one, _ := size(1, 0)
	withLease, _ := size(1, 1)
	type measured struct{ n, k, req, rsp int }
	var at []measured
	for _, k := range []int{1, 10, 100} {
		req, rsp := size(fleetv1alpha1.MaxUnpooledReplicas, k)
		at = append(at, measured{fleetv1alpha1.MaxUnpooledReplicas, k, req, rsp})
	}
	for b.Loop() {
	}
	// Reported after the loop, which resets what was reported before it.
	b.ReportMetric(float64(one-base), "B/proxy")
	b.ReportMetric(float64(withLease-one), "B/leased-proxy")
	for _, m := range at {
		b.ReportMetric(float64(m.req)/(1<<20), fmt.Sprintf("req-MiB/n=%d,k=%d", m.n, m.k))
		b.ReportMetric(float64(m.rsp)/(1<<20), fmt.Sprintf("rsp-MiB/n=%d,k=%d", m.n, m.k))
	}
}

// TestMessageSizesBounded holds one real Proxy and one leased proxy of a
// LeaseSummary to the sizes the XRD's message bound assumes, and checks
// that a fleet right at the bound fits half of the function's 4 MiB limit
// however many leases each proxy holds: if the objects grow (more labels,
// conditions or managedFields), this fails and the bound must move.
func TestMessageSizesBounded(t *testing.T) {
	proxy, slot := realObjects(t)
	req := func(n, k int) int { return proto.Size(sizedRequest(t, proxy, slot, n, k)) }
	base := req(0, 0)
	perProxy, perLeased := req(1, 0)-base, req(1, 1)-req(1, 0)
	t.Logf("one Proxy adds %d bytes, its being leased %d", perProxy, perLeased)
	if perProxy > fleetv1alpha1.ProxyMessageBytes || perLeased > fleetv1alpha1.LeasedProxyMessageBytes {
		t.Fatalf("a Proxy adds %d bytes (bound %d), a leased proxy %d (bound %d): raise ProxyMessageBytes/LeasedProxyMessageBytes and the XRD rule",
			perProxy, fleetv1alpha1.ProxyMessageBytes, perLeased, fleetv1alpha1.LeasedProxyMessageBytes)
	}
	if more := req(1, 100) - req(1, 1); more > 8 {
		t.Errorf("100 leases on a proxy cost %d bytes more than 1: the summary counts holders, it lists no lease", more)
	}
	n := fleetv1alpha1.MessageBudget / (fleetv1alpha1.ProxyMessageBytes + fleetv1alpha1.LeasedProxyMessageBytes)
	for _, k := range []int{1, 10, 100} {
		if size := req(n, k); size > fleetv1alpha1.MessageBudget+base {
			t.Errorf("%d replicas with %d leases each: %d bytes, above the budget of %d", n, k, size, fleetv1alpha1.MessageBudget)
		}
	}
	// A pool's request: its largest, every proxy leased, within a
	// quarter of the 4 MiB limit.
	if most := fleetv1alpha1.PoolMessageBudget / (fleetv1alpha1.ProxyMessageBytes + fleetv1alpha1.LeasedProxyMessageBytes); most < fleetv1alpha1.MaxProxiesPerPool+1 {
		t.Errorf("the pool budget holds %d proxies, fewer than MaxProxiesPerPool %d and a surge one", most, fleetv1alpha1.MaxProxiesPerPool)
	}
	if size := req(fleetv1alpha1.MaxProxiesPerPool+1, 10); size > fleetv1alpha1.PoolMessageBudget+base {
		t.Errorf("a pool of %d proxies and a surge one, all leased: %d bytes, above a quarter of 4 MiB", fleetv1alpha1.MaxProxiesPerPool, size)
	}
	// Past the budget (a fleet stored before the bound), the function says
	// so before Crossplane can no longer send it.
	rsp, err := New(Config{Log: logging.NewNopLogger(), Now: func() time.Time { return t0 }}).RunFunction(context.Background(), sizedRequest(t, proxy, slot, 420, 1))
	if err != nil {
		t.Fatal(err)
	}
	warned := false
	for _, r := range rsp.GetResults() {
		warned = warned || r.GetSeverity() == fnv1.Severity_SEVERITY_WARNING && strings.Contains(r.GetMessage(), "more than the 2 MiB the XRD allows a fleet of one level")
	}
	if !warned {
		t.Errorf("a request past the budget must bring a Warning: %v", rsp.GetResults())
	}
}

// TestMessageBudgetRule keeps the XRDs' rule in step with the constants.
func TestMessageBudgetRule(t *testing.T) {
	want := fmt.Sprintf("((has(self.pools) ? self.pools.proxiesPerPool : self.replicas) + self.rotation.maxSurge) * (%d + %d + ",
		fleetv1alpha1.ProxyMessageBytes, fleetv1alpha1.LeasedProxyMessageBytes)
	budget := fmt.Sprintf(")) <= (has(self.pools) ? %d : %d) || (oldSelf.hasValue()", fleetv1alpha1.PoolMessageBudget, fleetv1alpha1.MessageBudget)
	for _, f := range []string{"../../apis/fleet/definition.yaml", "../../apis/fleet/legacy/definition.yaml"} {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		flat := strings.Join(strings.Fields(string(raw)), " ")
		if !strings.Contains(flat, want) || !strings.Contains(flat, budget) {
			t.Errorf("%s must carry the rule %q ... %q", f, want, budget)
		}
	}
}

// realPool writes pool 400 of a fleet of the longest name allowed to the
// test apiserver the way Crossplane does (server-side apply of the
// composed pool, its status as the pool's composition writes it, with
// three faults of long probe errors and Crossplane's conditions), and
// reads it back as Crossplane sends it to the fleet: managedFields
// included.
func realPool(tb testing.TB) map[string]any {
	tb.Helper()
	bed := sharedBed.Env(tb)
	ctx := context.Background()
	ns := bed.Namespace(tb)
	spec := map[string]any{}
	if err := json.Unmarshal([]byte(`{"replicas": 10000, "zones": ["europe-west1-b", "europe-west1-c", "europe-west1-d"],
		"providerConfigRef": {"kind": "ClusterProviderConfig", "name": "gcp"},
		"placement": {"gcp": {"machineType": "e2-small", "networkTags": ["crawl"],
			"network": "projects/crawl-proj/global/networks/crawl", "subnetwork": "projects/crawl-proj/regions/europe-west1/subnetworks/crawl"}},
		"proxy": {"authSecretRef": {"name": "crawlers-proxy-auth"}, "allowedSourceRanges": ["203.0.113.0/24", "198.51.100.0/24"]},
		"healthCheck": {"url": "https://ifconfig.me/ip"}, "leases": {"maxLeasesPerProxy": 10},
		"rotation": {"maxAge": "24h", "maxSurge": 5, "maxUnavailable": 5}, "pools": {"proxiesPerPool": 105}}`), &spec); err != nil {
		tb.Fatal(err)
	}
	// A namespaced fleet's name, as any XR's, has at most 63 characters.
	fleet := strings.Repeat("f", maxXRName)
	f, err := parseFleet(fleet, ns, spec)
	if err != nil {
		tb.Fatal(err)
	}
	// The most a fleet names of a pool's burned proxies, and a recycle
	// grant.
	longestProxy := fleet + "-" + strconv.Itoa(fleetv1alpha1.MaxPools*fleetv1alpha1.PoolOrdinalSpan+fleetv1alpha1.PoolOrdinalSpan-1)
	burned := make([]fleetv1alpha1.PoolBurned, fleetv1alpha1.MaxPoolBurned)
	for i := range burned {
		burned[i] = fleetv1alpha1.PoolBurned{Name: longestProxy, Reason: strings.Repeat("r", fleetv1alpha1.MaxPoolBurnedReason)}
	}
	r, err := f.pool(&poolPlan{index: fleetv1alpha1.MaxPools, replicas: 105, zones: f.Zones, grant: budget{5, 5, 1},
		recycles: recycleGrant{k: 1, since: time.Now().UTC().Format(time.RFC3339)}}, burned)
	if err != nil {
		tb.Fatal(err)
	}
	composed := &unstructured.Unstructured{Object: r.GetResource().AsMap()}
	composed.SetLabels(map[string]string{fleetv1alpha1.LabelFleet: fleet, "crossplane.io/composite": fleet})
	composed.SetAnnotations(map[string]string{fleetv1alpha1.AnnotationFleet: fleet, "crossplane.io/composition-resource-name": "pool-400"})
	composed.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: fleetv1alpha1.SchemeGroupVersion.String(), Kind: fleetv1alpha1.ProxyFleetKind, Name: fleet,
		UID: "0b7c6a2e-1111-4222-8333-944455556666", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}})
	if err := bed.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(composed), client.FieldOwner("apiextensions.crossplane.io/composed/9f2c1e7a0b"), client.ForceOwnership); err != nil {
		tb.Fatal(err)
	}
	// Crossplane's reference to each Proxy the pool composes, the most a
	// pool holds (MaxProxiesPerPool and a surge one) with the longest
	// names, written by its composite controller: the fleet is sent them
	// all (an atomic list: its managedFields name the list alone).
	var refs []any
	for i := range fleetv1alpha1.MaxProxiesPerPool + 1 {
		refs = append(refs, map[string]any{"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": v1alpha1.ProxyKind,
			"name": fleet + "-" + strconv.Itoa(fleetv1alpha1.MaxPools*fleetv1alpha1.PoolOrdinalSpan+fleetv1alpha1.PoolOrdinalSpan-1-i)})
	}
	xpRefs := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": composed.GetAPIVersion(), "kind": composed.GetKind(),
		"metadata": map[string]any{"name": composed.GetName(), "namespace": ns},
		"spec":     map[string]any{"crossplane": map[string]any{"resourceRefs": refs}},
	}}
	if err := bed.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(xpRefs), client.FieldOwner("apiextensions.crossplane.io/composite"), client.ForceOwnership); err != nil {
		tb.Fatalf("the pool's resourceRefs, as Crossplane writes them, do not apply: %v", err)
	}
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(fleetv1alpha1.SchemeGroupVersion.WithKind(fleetv1alpha1.ProxyPoolKind))
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: composed.GetName()}, got); err != nil {
		tb.Fatal(err)
	}
	if n := len(field(mustStruct(tb, got.Object), "spec", "crossplane", "resourceRefs").GetListValue().GetValues()); n != fleetv1alpha1.MaxProxiesPerPool+1 {
		tb.Fatalf("the pool kept %d resourceRefs, want %d", n, fleetv1alpha1.MaxProxiesPerPool+1)
	}
	// What the pool's composition writes: the function's own status of
	// the pool, from three faulty proxies with the longest probe errors
	// (the provider caps them at 512 characters), and conditions as long
	// as its messages get; applied server-side as Crossplane applies it,
	// so that a field the schema lacks fails here as it fails there.
	observed := map[string]*fnv1.Resource{}
	base := fleetv1alpha1.MaxPools * fleetv1alpha1.PoolOrdinalSpan
	for i := range 3 {
		o := observedProxy(base+i, "europe-west1-b", false, time.Now().Add(-time.Hour), "")
		field(o.GetResource(), "status", "atProvider").GetStructValue().Fields["lastProbeError"] = structpb.NewStringValue(strings.Repeat("e", 512))
		observed[resourceName(base+i)] = o
	}
	// Its recycles of the day, more than it lists, with the longest
	// names, addresses and reasons.
	var records []any
	for i := range fleetv1alpha1.MaxPoolRecycleRecords + 2 {
		records = append(records, map[string]any{"proxy": longestProxy, "egressIP": fmt.Sprintf("2001:db8:ffff:ffff:ffff:ffff:ffff:%04x", 0xff00+i),
			"reason": strings.Repeat("r", maxReason), "time": time.Now().UTC().Format(time.RFC3339)})
	}
	got.Object["status"] = map[string]any{"egress": map[string]any{"recycles": records}}
	poolSpec, err := structpb.NewStruct(got.Object)
	if err != nil {
		tb.Fatal(err)
	}
	rsp, err := New(Config{Log: logging.NewNopLogger()}).RunFunction(ctx, &fnv1.RunFunctionRequest{
		Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: poolSpec}, Resources: observed}, RequiredResources: noLeases()})
	if err != nil {
		tb.Fatal(err)
	}
	status := field(rsp.GetDesired().GetComposite().GetResource(), "status").GetStructValue().AsMap()
	if n := len(field(rsp.GetDesired().GetComposite().GetResource(), "status", "egress", "recycles").GetListValue().GetValues()); n != fleetv1alpha1.MaxPoolRecycleRecords {
		tb.Fatalf("the pool lists %d recycles, want its newest %d", n, fleetv1alpha1.MaxPoolRecycleRecords)
	}
	// The longest it says of those that wait, and the most of its
	// counts and grant.
	egress, _ := status["egress"].(map[string]any)
	egress["recycleWaiting"] = strings.Repeat("w", fleetv1alpha1.MaxPoolWaiting)
	egress["burned"], egress["seenAgain"], egress["recyclesAtBound"] = int64(fleetv1alpha1.MaxProxiesPerPool), int64(fleetv1alpha1.MaxProxiesPerPool), true
	b, _ := status["budget"].(map[string]any)
	b[keyMaxRecycles], b[keyRecyclesSince], b[keyRecyclesUsed], b[keyRecyclesWanted] = int64(10), time.Now().UTC().Format(time.RFC3339), int64(10), int64(fleetv1alpha1.MaxProxiesPerPool)
	b[keyRecyclesLastHour] = int64(10)
	now := time.Now().UTC().Format(time.RFC3339)
	conds := []any{
		map[string]any{"type": "Ready", "status": "False", "reason": "Creating", "lastTransitionTime": now},
		map[string]any{"type": "Synced", "status": "True", "reason": "ReconcileSuccess", "lastTransitionTime": now},
	}
	// The longest each of the pool's conditions says: FleetHealthy counts
	// (status.faults names the proxies), DuplicateEgressIP names three IPs
	// of five proxies each, RolloutStalled five reasons.
	longest := map[string]int{ConditionFleetHealthy: 300, ConditionDuplicateEgressIP: 3 * 5 * (maxXRName + 12), ConditionRolloutStalled: 5*(maxXRName+60) + 150}
	for _, c := range rsp.GetConditions() {
		conds = append(conds, map[string]any{"type": c.GetType(), "status": "False", "reason": c.GetReason(),
			"message": strings.Repeat("m", max(len(c.GetMessage()), longest[c.GetType()])), "lastTransitionTime": now})
	}
	status["conditions"] = conds
	applied := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": got.GetAPIVersion(), "kind": got.GetKind(),
		"metadata": map[string]any{"name": got.GetName(), "namespace": got.GetNamespace()},
		"status":   status,
	}}
	if err := bed.Client.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(applied), client.FieldOwner("apiextensions.crossplane.io/composite"), client.ForceOwnership); err != nil {
		tb.Fatalf("the pool's status, as the function writes it, does not apply: %v", err)
	}
	if err := bed.Client.Get(ctx, client.ObjectKeyFromObject(got), got); err != nil {
		tb.Fatal(err)
	}
	// The schema keeps what recycling writes: a field it lacked would be
	// pruned, silently, and a pool would lose its grant or the fleet its
	// acknowledgement.
	for _, path := range [][]string{
		{"spec", "burned"}, {"spec", "budget", keyMaxRecycles}, {"spec", "budget", keyRecyclesSince},
		{"status", "budget", keyRecyclesUsed}, {"status", "budget", keyRecyclesWanted}, {"status", "budget", keyRecyclesLastHour},
		{"status", "egress", "recycles"}, {"status", "egress", "recycleWaiting"},
	} {
		if _, ok, _ := unstructured.NestedFieldNoCopy(got.Object, path...); !ok {
			tb.Errorf("the ProxyPool's schema dropped %s", strings.Join(path, "."))
		}
	}
	return got.Object
}

func mustStruct(tb testing.TB, m map[string]any) *structpb.Struct {
	tb.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// TestPoolMessageSizesBounded holds one real pool, as the fleet observes
// it (its Proxies' references included), to PoolMessageBytes, and checks
// that a fleet of MaxPools of them stays within a quarter of the
// function's default receive limit, and its response within a quarter of
// Crossplane's 4 MiB.
func TestPoolMessageSizesBounded(t *testing.T) {
	obj := realPool(t)
	s, err := structpb.NewStruct(obj)
	if err != nil {
		t.Fatal(err)
	}
	one := proto.Size(&fnv1.Resource{Resource: s}) + len("pool-400") + 8
	t.Logf("one observed pool adds about %d bytes", one)
	if one > fleetv1alpha1.PoolMessageBytes {
		t.Fatalf("an observed pool adds %d bytes, above PoolMessageBytes %d: raise it and lower MaxPools", one, fleetv1alpha1.PoolMessageBytes)
	}
	if one < fleetv1alpha1.PoolMessageBytes*95/100 {
		t.Errorf("an observed pool adds %d bytes, far below PoolMessageBytes %d: lower it, so that the bound says what a pool costs", one, fleetv1alpha1.PoolMessageBytes)
	}
	quarter := DefaultMaxRecvMessageMiB << 20 / 4
	if total := fleetv1alpha1.MaxPools * fleetv1alpha1.PoolMessageBytes; total > quarter {
		t.Errorf("%d pools of %d bytes make %d bytes, above a quarter of the function's %d MiB", fleetv1alpha1.MaxPools, fleetv1alpha1.PoolMessageBytes, total, DefaultMaxRecvMessageMiB)
	}
	// The fleet's request and response at MaxPools pools.
	observed := map[string]*fnv1.Resource{}
	for k := 1; k <= fleetv1alpha1.MaxPools; k++ {
		observed[poolResourceName(k)] = &fnv1.Resource{Resource: s}
	}
	spec := withSpec(t, "replicas", "10000")
	spec = withSpecIn(t, spec, "pools", `{"proxiesPerPool": 105}`)
	req := &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}, Resources: observed}}
	// The fleet as Crossplane sends it: its status as the function wrote
	// it (an entry per pool) and a resource reference per pool.
	first := run(t, req)
	composite := xr(spec)
	composite.Fields["status"] = field(first.GetDesired().GetComposite().GetResource(), "status")
	refs := make([]any, 0, fleetv1alpha1.MaxPools)
	for k := 1; k <= fleetv1alpha1.MaxPools; k++ {
		refs = append(refs, map[string]any{"apiVersion": fleetv1alpha1.SchemeGroupVersion.String(), "kind": fleetv1alpha1.ProxyPoolKind, "name": poolName(strings.Repeat("f", maxXRName), k)})
	}
	crossplane, err := structpb.NewValue(map[string]any{"resourceRefs": refs})
	if err != nil {
		t.Fatal(err)
	}
	composite.Fields["spec"].GetStructValue().Fields["crossplane"] = crossplane
	req.Observed.Composite.Resource = composite
	rsp := run(t, req)
	if len(rsp.GetDesired().GetResources()) < fleetv1alpha1.MaxPools {
		t.Fatalf("the fleet composed %d resources, want its %d pools", len(rsp.GetDesired().GetResources()), fleetv1alpha1.MaxPools)
	}
	t.Logf("a fleet of %d pools: request %d bytes, response %d bytes", fleetv1alpha1.MaxPools, proto.Size(req), proto.Size(rsp))
	// The request goes to the function, the response to Crossplane, which
	// takes 4 MiB.
	if n := proto.Size(req); n > quarter {
		t.Errorf("the request of a fleet of %d pools is %d bytes, above a quarter of the function's %d MiB", fleetv1alpha1.MaxPools, n, DefaultMaxRecvMessageMiB)
	}
	if n := proto.Size(rsp); n > 1<<20 {
		t.Errorf("the response of a fleet of %d pools is %d bytes, above a quarter of Crossplane's 4 MiB", fleetv1alpha1.MaxPools, n)
	}
}
