package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/function"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestSharedOutgoingAddressFlagged forces two real local proxies of one
// fleet onto one outgoing address: the echo target sees both leave from
// it, each Proxy reports it as its egress IP, and the function, given
// those Proxies as Crossplane observes them, flags the fleet
// (DuplicateEgressIP) and labels both Proxies.
func TestSharedOutgoingAddressFlagged(t *testing.T) {
	const shared = "127.1.250.9"
	rsp := composeOverRealProxies(t, []string{shared, shared}, []int32{32330, 32331}, nil)
	flagged := false
	for _, c := range rsp.GetConditions() {
		if c.GetType() == function.ConditionDuplicateEgressIP {
			flagged = c.GetStatus() == fnv1.Status_STATUS_CONDITION_TRUE
			t.Logf("%s %s: %s", c.GetType(), c.GetReason(), c.GetMessage())
		}
	}
	if !flagged {
		t.Errorf("two proxies leaving from %s: the fleet is not flagged: %v", shared, rsp.GetConditions())
	}
	for name, labels := range desiredProxyLabels(rsp) {
		if labels[fleetv1alpha1.LabelDuplicateEgressIP] != "true" {
			t.Errorf("%s is not labelled %s", name, fleetv1alpha1.LabelDuplicateEgressIP)
		}
	}
}

// TestSharedPrefixBeyondDiversity forces three real local proxies of one
// fleet onto outgoing addresses, two of them in one IPv4 /24: the echo
// target sees each leave from its own, each Proxy reports it, and the
// function, given those Proxies as Crossplane observes them and a cap
// of one proxy per /24, labels the newer of the two beyond the cap and
// no other, and counts 3 addresses in 2 /24s.
func TestSharedPrefixBeyondDiversity(t *testing.T) {
	rsp := composeOverRealProxies(t, []string{"127.1.251.1", "127.1.251.2", "127.1.252.1"}, []int32{32350, 32351, 32352},
		map[string]any{"diversity": map[string]any{"maxPerIPv4Prefix": 1}})
	for name, labels := range desiredProxyLabels(rsp) {
		if beyond, want := labels[fleetv1alpha1.LabelBeyondDiversityLimit] == "true", name == "proxy-1"; beyond != want {
			t.Errorf("%s labelled beyond the /24 cap: %v, want %v", name, beyond, want)
		}
	}
	egress := rsp.GetDesired().GetComposite().GetResource().GetFields()["status"].GetStructValue().GetFields()["egress"].GetStructValue().GetFields()
	if a, p := egress["addresses"].GetNumberValue(), egress["ipv4Prefixes"].GetNumberValue(); a != 3 || p != 2 {
		t.Errorf("status.egress: %v addresses in %v /24s, want 3 in 2", a, p)
	}
}

// composeOverRealProxies starts real local proxies crawlers-0, -1, ... of
// one fleet through the provider, each on its port and leaving from its
// address, waits until each is Ready reporting that address as its
// egress IP, and runs the function over them as Crossplane observes them
// (proxy-0, proxy-1, ...), in a local fleet whose spec has spec's fields
// besides. The proxies are deleted through the provider when the test
// ends, so that no Squid outlives it.
func composeOverRealProxies(t *testing.T, addresses []string, ports []int32, spec map[string]any) *fnv1.RunFunctionResponse {
	t.Helper()
	ns := namespace(t)
	target := testbed.StartEchoTarget(t)
	prov := startProvider(t, testbed.SquidStateDir(t), providerLogs(t), target)
	t.Cleanup(prov.stop)
	t.Cleanup(func() { deleteProxies(t, ns) })
	create(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "crawler", "password": password}},
		&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "local-" + ns}, Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal,
			Policy: &v1alpha1.Policy{Local: &v1alpha1.LocalPolicy{AllowLoopbackDestinations: true}}}},
	)
	for i, port := range ports {
		p := proxyObject(ns, fmt.Sprintf("crawlers-%d", i), port, target.URL)
		p.Spec.ForProvider.Local.OutgoingAddress = v1alpha1.IPAddress(addresses[i])
		p.Labels = map[string]string{fleetv1alpha1.LabelFleet: "crawlers", fleetv1alpha1.LabelZone: "a"}
		create(t, p)
	}
	observed := map[string]*fnv1.Resource{}
	for i, address := range addresses {
		key := types.NamespacedName{Namespace: ns, Name: fmt.Sprintf("crawlers-%d", i)}
		testbed.Eventually(t, 15*time.Second, key.Name+" Ready, leaving from "+address, func() (bool, string) {
			p := get(t, key)
			return p.GetCondition("Ready").Status == corev1.ConditionTrue && p.Status.AtProvider.EgressIP == address, fmt.Sprintf("%+v", p.Status.AtProvider)
		})
		p := get(t, key)
		// As Crossplane sends it: typed objects read back carry no kind.
		p.APIVersion, p.Kind = v1alpha1.SchemeGroupVersion.String(), v1alpha1.ProxyKind
		raw, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		s := &structpb.Struct{}
		if err := s.UnmarshalJSON(raw); err != nil {
			t.Fatal(err)
		}
		observed[fmt.Sprintf("proxy-%d", i)] = &fnv1.Resource{Resource: s}
	}
	fleetSpec := map[string]any{"replicas": len(addresses), "zones": []any{"a"}, "placement": map[string]any{"local": map[string]any{"bindAddress": "127.0.0.1"}},
		"proxy": map[string]any{"authSecretRef": map[string]any{"name": "auth"}}, "healthCheck": map[string]any{"url": target.URL}}
	for k, v := range spec {
		fleetSpec[k] = v
	}
	xr, err := structpb.NewStruct(map[string]any{"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyFleet",
		"metadata": map[string]any{"name": "crawlers", "namespace": ns}, "spec": fleetSpec})
	if err != nil {
		t.Fatal(err)
	}
	rsp, err := function.New(function.Config{Log: logging.NewNopLogger()}).RunFunction(context.Background(), &fnv1.RunFunctionRequest{
		Observed:          &fnv1.State{Composite: &fnv1.Resource{Resource: xr}, Resources: observed},
		RequiredResources: map[string]*fnv1.Resources{"leases": {}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return rsp
}

// desiredProxyLabels is the labels of each Proxy the function composed,
// by its resource name.
func desiredProxyLabels(rsp *fnv1.RunFunctionResponse) map[string]map[string]string {
	out := map[string]map[string]string{}
	for name, r := range rsp.GetDesired().GetResources() {
		if r.GetResource().GetFields()["kind"].GetStringValue() != v1alpha1.ProxyKind {
			continue
		}
		out[name] = map[string]string{}
		for k, v := range r.GetResource().GetFields()["metadata"].GetStructValue().GetFields()["labels"].GetStructValue().GetFields() {
			out[name][k] = v.GetStringValue()
		}
	}
	return out
}
