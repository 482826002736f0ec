package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp/gcpfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// importing returns p asking to import the instance x.
func importing(p *v1alpha1.Proxy, x string) *v1alpha1.Proxy {
	meta.SetExternalName(p, x)
	return p
}

// refusedImport waits until the Proxy key reports its import refused, with
// a message containing why.
func refusedImport(t *testing.T, key types.NamespacedName, why string) {
	t.Helper()
	testbed.Eventually(t, 15*time.Second, "import refused: "+why, func() (bool, string) {
		p := get(t, key)
		c := p.GetCondition(xpv2.TypeReady)
		return c.Reason == proxy.ReasonImportRefused && strings.Contains(c.Message, why) && p.Status.AtProvider.ProviderID == "", string(c.Reason) + ": " + c.Message
	})
}

// deleteAndWait deletes the Proxy key and waits until it is gone.
func deleteAndWait(t *testing.T, key types.NamespacedName) {
	t.Helper()
	bed := sharedBed.Env(t)
	if err := bed.Client.Delete(context.Background(), &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, key.Name+" gone", func() (bool, string) {
		err := bed.Client.Get(context.Background(), key, &v1alpha1.Proxy{})
		return kerrors.IsNotFound(err), fmt.Sprint(err)
	})
}

// TestGCPImport imports a VM through the external-name annotation: a VM
// this provider made for a Proxy of the same namespace that is gone is
// adopted, relabelled for its new Proxy, kept from the orphan collector and
// deleted with its new Proxy. A VM in another namespace's keeping, one
// whose Proxy still exists, one elsewhere than the spec places it and one
// the provider did not make are refused, and nothing is made or changed for
// them.
func TestGCPImport(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := namespace(t)
	otherNS := namespace(t)
	ctx := context.Background()
	fake := gcpfake.Start(t)
	target := testbed.StartEchoTarget(t)
	prov := startGCPProvider(t, fake, target)
	defer prov.stop()
	defer deleteProxies(t, otherNS)
	defer deleteProxies(t, ns)
	pc := "gcp-import-" + ns
	create(t, authSecret(ns), authSecret(otherNS), gcpConfig(pc, nil))

	// A VM made to outlive its Proxy, which is gone.
	maker := vmProxy(ns, "maker", 32337, target, pc, "europe-west1-b")
	maker.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate})
	create(t, maker)
	makerKey := types.NamespacedName{Namespace: ns, Name: "maker"}
	var name string
	testbed.Eventually(t, 15*time.Second, "the maker's VM, retained", func() (bool, string) {
		name = ownership.InstanceName(get(t, makerKey).UID)
		vm := fake.Instance("europe-west1-b", name)
		return vm != nil && vm.GetLabels()["egress-retain"] == "true", fmt.Sprint(vm.GetLabels())
	})
	makerUID := string(get(t, makerKey).UID)
	deleteAndWait(t, makerKey)
	x := "projects/crawl-proj/zones/europe-west1-b/instances/" + name

	// A VM whose Proxy lives.
	create(t, vmProxy(ns, "alive", 32338, target, pc, "europe-west1-b"))
	aliveKey := types.NamespacedName{Namespace: ns, Name: "alive"}
	var aliveName string
	testbed.Eventually(t, 15*time.Second, "the live Proxy's VM", func() (bool, string) {
		aliveName = ownership.InstanceName(get(t, aliveKey).UID)
		return fake.Instance("europe-west1-b", aliveName) != nil, ""
	})
	// A VM the provider did not make.
	fake.PutInstance("europe-west1-b", &computepb.Instance{Name: ptr.To("hand-made"), Status: ptr.To("RUNNING"), Labels: map[string]string{"team": "web"},
		CreationTimestamp: ptr.To(time.Now().Add(-time.Hour).Format(time.RFC3339))})

	inserts := fake.Calls("instances.insert")
	refused := []struct {
		name, ns, zone, x, why string
	}{
		{name: "other-tenant", ns: otherNS, zone: "europe-west1-b", x: x, why: fmt.Sprintf("belongs to a Proxy of namespace %q", ns)},
		{name: "elsewhere", ns: ns, zone: "europe-west1-c", x: x, why: `is in zone "europe-west1-b"`},
		{name: "still-owned", ns: ns, zone: "europe-west1-b", x: "projects/crawl-proj/zones/europe-west1-b/instances/" + aliveName, why: "belongs to Proxy " + ns + "/alive, which still exists"},
		{name: "not-ours", ns: ns, zone: "europe-west1-b", x: "projects/crawl-proj/zones/europe-west1-b/instances/hand-made", why: "no such instance made by this provider"},
	}
	for _, r := range refused {
		t.Run("Refused/"+r.name, func(t *testing.T) {
			create(t, importing(vmProxy(r.ns, r.name, 32337, target, pc, r.zone), r.x))
			key := types.NamespacedName{Namespace: r.ns, Name: r.name}
			refusedImport(t, key, r.why)
			// Deleting the refused Proxy deletes nothing it asked for.
			deleteAndWait(t, key)
		})
	}
	if n := fake.Calls("instances.insert"); n != inserts {
		t.Errorf("a refused import makes no instance: %d inserts", n-inserts)
	}
	for _, n := range []string{name, aliveName, "hand-made"} {
		if fake.Instance("europe-west1-b", n) == nil {
			t.Fatalf("VM %s must outlive the refused imports", n)
		}
	}
	if l := fake.Instance("europe-west1-b", name).GetLabels(); l["egress-adopted-by"] != "" || l["egress-proxy-uid"] != makerUID {
		t.Errorf("a refused import relabels nothing: %v", l)
	}

	t.Run("Imported", func(t *testing.T) {
		create(t, importing(vmProxy(ns, "importer", 32337, target, pc, "europe-west1-b"), x))
		key := types.NamespacedName{Namespace: ns, Name: "importer"}
		testbed.Eventually(t, 15*time.Second, "imported, the VM relabelled", func() (bool, string) {
			p := get(t, key)
			l := fake.Instance("europe-west1-b", name).GetLabels()
			return p.Status.AtProvider.ProviderID == x && p.Status.AtProvider.ImportedFrom == x && l["egress-adopted-by"] == string(p.UID) &&
					l["egress-proxy-name"] == "importer" && l["egress-retain"] == "" && l["egress-proxy-uid"] == makerUID,
				fmt.Sprintf("%+v %v %s", p.Status.AtProvider, l, p.GetCondition(xpv2.TypeReady).Message)
		})
		if n := fake.Calls("instances.insert"); n != inserts {
			t.Errorf("an imported VM is used, not replaced: %d inserts", n-inserts)
		}
		// The orphan collector keeps it: its maker is gone, its adopter not.
		c := collectorAnHourAhead(bed, prov)
		if _, err := c.Collect(ctx); err != nil {
			t.Logf("collect: %v", err)
		}
		if fake.Instance("europe-west1-b", name) == nil || fake.Firewall(name) == nil {
			t.Fatal("the orphan collector must keep an imported VM and its rule")
		}
		// Its new Proxy deletes it, rule and all.
		deleteAndWait(t, key)
		if vm := fake.Instance("europe-west1-b", name); vm != nil && vm.GetStatus() != "STOPPING" {
			t.Errorf("the imported VM goes with its new Proxy: %s", vm.GetStatus())
		}
		if fake.Firewall(name) != nil {
			t.Error("the imported VM's firewall rule goes with it")
		}
	})
}

// TestKubernetesImport imports a pod: it and its config Secret and
// NetworkPolicy are relabelled for the new Proxy, and the policy still
// selects the pod. A pod in kube-system, which the provider did not make,
// is never imported, nor one another namespace's Proxy made.
func TestKubernetesImport(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := namespace(t)
	otherNS := namespace(t)
	podNS := namespace(t)
	ctx := context.Background()
	target := testbed.StartEchoTarget(t)
	prov := startProvider(t, testbed.SquidStateDir(t), providerLogs(t), target)
	defer prov.stop()
	defer deleteProxies(t, otherNS)
	defer deleteProxies(t, ns)
	pc := "pods-import-" + ns
	podProxy := func(ns, name string) *v1alpha1.Proxy {
		p := proxyObject(ns, name, 32339, target.URL)
		p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: pc}
		p.Spec.ForProvider.Local = nil
		p.Spec.ForProvider.Kubernetes = &v1alpha1.KubernetesPlacement{}
		return p
	}
	create(t, authSecret(ns), authSecret(otherNS),
		&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: pc}, Spec: v1alpha1.ProviderConfigSpec{
			Backend:    v1alpha1.BackendKubernetes,
			Kubernetes: &v1alpha1.KubernetesBackend{Namespace: podNS, Credentials: &v1alpha1.KubernetesCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}},
		}})
	// A bystander in kube-system.
	sys := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "import-bystander-" + ns[len(ns)-6:]},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "c"}}}}
	create(t, sys)
	defer bed.Client.Delete(ctx, sys) //nolint:errcheck // Best effort.

	maker := podProxy(ns, "maker")
	maker.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate})
	create(t, maker)
	makerKey := types.NamespacedName{Namespace: ns, Name: "maker"}
	var name string
	testbed.Eventually(t, 15*time.Second, "the maker's pod, retained", func() (bool, string) {
		name = ownership.InstanceName(get(t, makerKey).UID)
		pod := &corev1.Pod{}
		err := bed.Client.Get(ctx, types.NamespacedName{Namespace: podNS, Name: name}, pod)
		return err == nil && pod.Labels[ownership.LabelRetain] == "true", fmt.Sprint(err, pod.Labels)
	})
	makerUID := string(get(t, makerKey).UID)
	deleteAndWait(t, makerKey)
	x := podNS + "/" + name

	for _, r := range []struct{ name, ns, x, why string }{
		{name: "system", ns: ns, x: "kube-system/" + sys.Name, why: "no such instance made by this provider"},
		{name: "other-tenant", ns: otherNS, x: x, why: fmt.Sprintf("belongs to a Proxy of namespace %q", ns)},
	} {
		t.Run("Refused/"+r.name, func(t *testing.T) {
			create(t, importing(podProxy(r.ns, r.name), r.x))
			key := types.NamespacedName{Namespace: r.ns, Name: r.name}
			refusedImport(t, key, r.why)
			deleteAndWait(t, key)
		})
	}
	if err := bed.Client.Get(ctx, client.ObjectKeyFromObject(sys), &corev1.Pod{}); err != nil {
		t.Errorf("the kube-system pod is left alone: %v", err)
	}

	t.Run("Imported", func(t *testing.T) {
		create(t, importing(podProxy(ns, "importer"), x))
		key := types.NamespacedName{Namespace: ns, Name: "importer"}
		var uid types.UID
		testbed.Eventually(t, 15*time.Second, "imported", func() (bool, string) {
			p := get(t, key)
			uid = p.UID
			return p.Status.AtProvider.ProviderID == x, fmt.Sprintf("%+v %s", p.Status.AtProvider, p.GetCondition(xpv2.TypeReady).Message)
		})
		objKey := types.NamespacedName{Namespace: podNS, Name: name}
		np := &networkingv1.NetworkPolicy{}
		for _, o := range []client.Object{&corev1.Pod{}, &corev1.Secret{}, np} {
			if err := bed.Client.Get(ctx, objKey, o); err != nil {
				t.Fatal(err)
			}
			if l := o.GetLabels(); l[ownership.LabelAdopter] != string(uid) || l[ownership.LabelName] != "importer" || l[ownership.LabelUID] != makerUID || l[ownership.LabelRetain] != "" {
				t.Errorf("%T relabelled for its new Proxy, its maker's UID kept: %v", o, l)
			}
		}
		if np.Spec.PodSelector.MatchLabels[ownership.LabelUID] != makerUID {
			t.Errorf("the NetworkPolicy still selects the pod: %v", np.Spec.PodSelector)
		}
		deleteAndWait(t, key)
		for _, o := range []client.Object{&corev1.Pod{}, &corev1.Secret{}, &networkingv1.NetworkPolicy{}} {
			if err := bed.Client.Get(ctx, objKey, o); !kerrors.IsNotFound(err) {
				t.Errorf("%T goes with the Proxy that imported it: %v", o, err)
			}
		}
	})
}
