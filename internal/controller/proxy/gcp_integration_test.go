package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp/gcpfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/gc"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestGCPProxy runs a Proxy on the GCP backend: the real Compute client
// talks to the in-process fake of the Compute API, the test moves the VM to
// RUNNING with a NAT IP of 127.0.0.1 and runs a real Squid from the VM's
// startup script there.
func TestGCPProxy(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := namespace(t)
	fake := gcpfake.Start(t)
	target := testbed.StartEchoTarget(t)
	prov := startProvider(t, testbed.SquidStateDir(t), providerLogs(t), target, func(o *proxy.Options) {
		o.Backends.(*proxy.Backends).GCPClientOptions = fake.ClientOptions()
		// The fake's firewall blocks nothing, so a proxy whose rule is
		// gone still passes its probes, and the drift is found at the
		// poll (on GCP the probes fail at once, which requeues it).
		o.PollInterval = 2 * time.Second
	})
	defer prov.stop()
	ctx := context.Background()

	p := vmProxy(ns, "vm-proxy", 32330, target, "gcp-"+ns, "europe-west1-b")
	p.Spec.ForProvider.GCP.GCPInstance = v1alpha1.GCPInstance{MachineType: "e2-micro", NetworkTags: []v1alpha1.NetworkTag{"crawl"}}
	p.Spec.ForProvider.AllowedSourceRanges = []v1alpha1.CIDR{"127.0.0.0/8"}
	create(t,
		authSecret(ns),
		&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "gcp-" + ns}, Spec: v1alpha1.ProviderConfigSpec{
			Backend: v1alpha1.BackendGCP,
			GCP:     &v1alpha1.GCPBackend{Project: "crawl-proj", Credentials: v1alpha1.GCPCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}},
			Policy:  &v1alpha1.Policy{GCP: &v1alpha1.GCPPolicy{AllowedNetworkTags: []v1alpha1.NetworkTag{"crawl"}}},
		}},
		p,
	)
	key := types.NamespacedName{Namespace: ns, Name: "vm-proxy"}

	var name string
	testbed.Eventually(t, 10*time.Second, "the fake receives an insert", func() (bool, string) {
		name = ownership.InstanceName(get(t, key).UID)
		return fake.Instance("europe-west1-b", name) != nil, fmt.Sprintf("%d inserts", fake.Calls("instances.insert"))
	})
	if fw := fake.Firewall(name); fw == nil || fw.GetSourceRanges()[0] != "127.0.0.0/8" {
		t.Fatalf("the firewall rule must exist, letting in only the allowed ranges: %v", fw)
	}
	testbed.Eventually(t, 5*time.Second, "provisioning while the VM boots", func() (bool, string) {
		c := get(t, key).GetCondition(xpv2.TypeReady)
		return c.Reason == proxy.ReasonProvisioning, string(c.Reason)
	})

	bootVM(t, fake, "europe-west1-b", name, "127.0.0.1:32330")
	testbed.Eventually(t, 10*time.Second, "Ready through the VM's Squid", ready(t, key, corev1.ConditionTrue))
	if ap := get(t, key).Status.AtProvider; ap.ProviderID != "projects/crawl-proj/zones/europe-west1-b/instances/"+name || ap.EgressIP != "127.0.0.1" {
		t.Errorf("atProvider: %+v", ap)
	}

	t.Run("FirewallRuleRestored", func(t *testing.T) {
		// The rule's re-insert takes a while, as on GCP: meanwhile the
		// proxy is out of service, then back.
		fake.SetOperationDuration(10 * time.Second)
		defer fake.SetOperationDuration(gcpfake.DefaultOperationDuration)
		fake.DeleteFirewall("crawl-proj", name)
		testbed.Eventually(t, 20*time.Second, "not Ready while its rule is missing", func() (bool, string) {
			c := get(t, key).GetCondition(xpv2.TypeReady)
			return c.Status == corev1.ConditionFalse && strings.Contains(c.Message, "firewall rule"), c.Message
		})
		testbed.Eventually(t, 30*time.Second, "the rule restored from the spec, and Ready again", func() (bool, string) {
			fw := fake.Firewall(name)
			c := get(t, key).GetCondition(xpv2.TypeReady)
			return fw != nil && fw.GetSourceRanges()[0] == "127.0.0.0/8" && c.Status == corev1.ConditionTrue, fmt.Sprintf("rule %v, %s", fw != nil, c.Message)
		})
	})

	t.Run("OrphanCollector", func(t *testing.T) {
		ghost := ownership.Owner{ClusterID: "it", Namespace: ns, Name: "ghost", UID: "ghost-uid"}
		foreign := ownership.Owner{ClusterID: "other-cluster", Namespace: ns, Name: "theirs", UID: "their-uid"}
		for _, o := range []ownership.Owner{ghost, foreign} {
			fake.PutInstance("europe-west1-c", &computepb.Instance{
				Name: ptr.To(ownership.InstanceName(o.UID)), Status: ptr.To("RUNNING"), Labels: o.GCPLabels(),
				CreationTimestamp: ptr.To(time.Now().Add(-2 * time.Hour).Format(time.RFC3339)),
			})
		}
		// A configuration whose backend cannot be built (its key Secret
		// is missing) does not switch collection off for the others.
		broken := gcpConfig("broken-"+ns, keyFrom(ns, "no-such-secret"))
		create(t, broken)
		defer func() { _ = bed.Client.Delete(ctx, broken) }()
		c := &gc.Collector{
			Sources: proxy.CollectorSources{Kube: bed.Client, Backends: prov.backends}, ClusterID: "it", Grace: 15 * time.Minute,
			Now: time.Now, Log: logging.NewNopLogger(), Record: event.NewNopRecorder(), Metrics: metrics.NewProvider(),
		}
		r, err := c.Collect(ctx)
		if err == nil || !strings.Contains(err.Error(), "broken-"+ns) || r.Skipped < 1 {
			t.Errorf("the broken configuration is reported and skipped: %+v, %v", r, err)
		}
		if r.Deleted != 1 {
			t.Errorf("the orphaned VM must be collected: %+v", r)
		}
		testbed.Eventually(t, 5*time.Second, "the orphan's deletion ends", func() (bool, string) {
			vm := fake.Instance("europe-west1-c", ownership.InstanceName(ghost.UID))
			return vm == nil, vm.GetStatus()
		})
		if fake.Instance("europe-west1-b", name) == nil || fake.Instance("europe-west1-c", ownership.InstanceName(foreign.UID)) == nil {
			t.Errorf("the owned VM and the other cluster's VM must stay: %+v", r)
		}
	})

	t.Run("DeleteRemovesVMAndFirewall", func(t *testing.T) {
		if err := bed.Client.Delete(ctx, get(t, key)); err != nil {
			t.Fatal(err)
		}
		testbed.Eventually(t, 10*time.Second, "Proxy, VM and firewall rule gone", func() (bool, string) {
			err := bed.Client.Get(ctx, key, &v1alpha1.Proxy{})
			return kerrors.IsNotFound(err) && fake.Instance("europe-west1-b", name) == nil && fake.Firewall(name) == nil,
				fmt.Sprintf("proxy err=%v vm=%v fw=%v", err, fake.Instance("europe-west1-b", name) != nil, fake.Firewall(name) != nil)
		})
	})
}

// TestGCPCreateFailures runs the provider against Compute Engine's
// after-the-fact failures: a stockout reported in the insert's operation
// is shown on the Proxy, naming the zone, and held off rather than retried
// in a loop; an insert that outlasts Create's wait and then fails is
// reported on the next Create instead of re-created blindly; and a firewall
// rule that disappears from under a Ready proxy takes it out of service
// until the rule is restored.
func TestGCPCreateFailures(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := namespace(t)
	fake := gcpfake.Start(t)
	target := testbed.StartEchoTarget(t)
	prov := startProvider(t, testbed.SquidStateDir(t), providerLogs(t), target, func(o *proxy.Options) {
		o.Backends.(*proxy.Backends).GCPClientOptions = fake.ClientOptions()
		o.Backends.(*proxy.Backends).GCPOperationTimeout = 500 * time.Millisecond
	})
	defer prov.stop()
	defer deleteProxies(t, ns)
	create(t,
		authSecret(ns),
		gcpConfig("gcp-"+ns, nil),
	)
	limited := func(name, zone string) (*v1alpha1.Proxy, types.NamespacedName) {
		p := vmProxy(ns, name, 32331, target, "gcp-"+ns, zone)
		p.Spec.ForProvider.AllowedSourceRanges = []v1alpha1.CIDR{"127.0.0.0/8"}
		return p, types.NamespacedName{Namespace: ns, Name: name}
	}
	reason := func(key types.NamespacedName, want xpv2.ConditionReason, says ...string) func() (bool, string) {
		return func() (bool, string) {
			c := get(t, key).GetCondition(xpv2.TypeReady)
			ok := c.Reason == want
			for _, s := range says {
				ok = ok && strings.Contains(c.Message, s)
			}
			return ok, string(c.Reason) + ": " + c.Message
		}
	}

	t.Run("StockoutInOperation", func(t *testing.T) {
		fake.FailOperation("instances.insert", gcpfake.Stockout("crawl-proj", "europe-west1-d"))
		defer fake.FailOperation("instances.insert", gcpfake.Failure{})
		p, key := limited("stockout", "europe-west1-d")
		create(t, p)
		testbed.Eventually(t, 15*time.Second, "Ready=False ZoneExhausted, naming the zone", reason(key, xpv2.ConditionReason(backend.ClassStockout), "europe-west1-d", "no capacity"))
		inserts := fake.Calls("instances.insert")
		time.Sleep(3 * time.Second)
		if n := fake.Calls("instances.insert"); n != inserts {
			t.Errorf("a stockout is backed off, not retried in a loop: %d inserts became %d within 3s", inserts, n)
		}
		name := ownership.InstanceName(get(t, key).UID)
		if fake.Firewall(name) == nil {
			t.Fatal("the rule waits for the retried VM")
		}
		if err := bed.Client.Delete(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		testbed.Eventually(t, 15*time.Second, "the Proxy gone, and the rule of its VM that never came with it", func() (bool, string) {
			err := bed.Client.Get(context.Background(), key, &v1alpha1.Proxy{})
			return kerrors.IsNotFound(err) && fake.Firewall(name) == nil, fmt.Sprintf("proxy: %v, rule: %v", err, fake.Firewall(name) != nil)
		})
	})

	t.Run("FailsAfterTheWait", func(t *testing.T) {
		clock := &struct {
			sync.Mutex
			t time.Time
		}{t: time.Now()}
		now := func() time.Time { clock.Lock(); defer clock.Unlock(); return clock.t }
		fake.SetClock(now)
		defer fake.SetClock(time.Now)
		fake.SetOperationDuration(time.Hour)
		defer fake.SetOperationDuration(gcpfake.DefaultOperationDuration)
		fake.FailOperation("instances.insert", gcpfake.QuotaInOperation("IN_USE_ADDRESSES", "europe-west1"))
		defer fake.FailOperation("instances.insert", gcpfake.Failure{})
		p, key := limited("slow-quota", "europe-west1-c")
		create(t, p)
		testbed.Eventually(t, 15*time.Second, "Create leaves the insert running and says so", func() (bool, string) {
			a := get(t, key).GetAnnotations()["egress.crawl.example.com/create-operation"]
			return a != "", fmt.Sprint(get(t, key).GetAnnotations())
		})
		inserts := fake.Calls("instances.insert")
		clock.Lock()
		clock.t = clock.t.Add(2 * time.Hour)
		clock.Unlock()
		testbed.Eventually(t, 20*time.Second, "the failed insert is reported as quota", reason(key, xpv2.ConditionReason(backend.ClassQuota), "IN_USE_ADDRESSES"))
		if n := fake.Calls("instances.insert"); n != inserts {
			t.Errorf("a VM whose insert failed is not re-created blindly: %d inserts became %d", inserts, n)
		}
		if err := bed.Client.Delete(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	})
}

// TestGCPServiceAccountKey runs the credentials path end to end: the fake
// Compute API demands a bearer token signed by a service-account key, the
// key sits in a Secret that the ClusterProviderConfig names, and the
// provider reads it, builds its client from it and creates the VM.
func TestGCPServiceAccountKey(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := namespace(t)
	fake := gcpfake.Start(t)
	key, err := fake.RequireAuth()
	if err != nil {
		t.Fatal(err)
	}
	target := testbed.StartEchoTarget(t)
	prov := startProvider(t, testbed.SquidStateDir(t), providerLogs(t), target, func(o *proxy.Options) {
		o.Backends.(*proxy.Backends).GCPClientOptions = fake.EndpointOptions()
	})
	defer prov.stop()
	defer deleteProxies(t, ns)
	p := vmProxy(ns, "keyed", 32332, target, "gcp-key-"+ns, "europe-west1-b")
	create(t,
		authSecret(ns),
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gcp-sa"}, Data: map[string][]byte{"key.json": key}},
		gcpConfig("gcp-key-"+ns, keyFrom(ns, "gcp-sa")),
		p,
	)
	key2 := types.NamespacedName{Namespace: ns, Name: "keyed"}
	testbed.Eventually(t, 15*time.Second, "the VM made with the key's credentials", func() (bool, string) {
		name := ownership.InstanceName(get(t, key2).UID)
		return fake.Instance("europe-west1-b", name) != nil && fake.Authenticated() > 0,
			fmt.Sprintf("%d authenticated requests; Ready: %s", fake.Authenticated(), get(t, key2).GetCondition(xpv2.TypeReady).Message)
	})

	// A permanent failure (the project's organisation policy) holds until
	// something it depends on changes: here the credentials Secret, as
	// when the platform team moves the proxies to another service account.
	fake.Fail("instances.insert", gcpfake.OrgPolicyExternalIP("crawl-proj", "europe-west1-b", "x"))
	held := vmProxy(ns, "held", 32337, target, "gcp-key-"+ns, "europe-west1-b")
	create(t, held)
	heldKey := types.NamespacedName{Namespace: ns, Name: "held"}
	testbed.Eventually(t, 15*time.Second, "held as a permanent error", func() (bool, string) {
		c := get(t, heldKey).GetCondition(xpv2.TypeReady)
		return c.Reason == xpv2.ConditionReason(backend.ClassPermanent), string(c.Reason) + ": " + c.Message
	})
	fake.Fail("instances.insert", gcpfake.Failure{})
	sa := &corev1.Secret{}
	if err := bed.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "gcp-sa"}, sa); err != nil {
		t.Fatal(err)
	}
	sa.Data["note"] = []byte("moved to another service account")
	if err := bed.Client.Update(context.Background(), sa); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 15*time.Second, "retried once its credentials changed", func() (bool, string) {
		name := ownership.InstanceName(get(t, heldKey).UID)
		return fake.Instance("europe-west1-b", name) != nil, get(t, heldKey).GetCondition(xpv2.TypeReady).Message
	})
}

// TestBackendClients: a configuration's API client is built once and
// reused while only its status changes (every Proxy that starts or stops
// using it writes status.users), and rebuilt, the old one closed, when its
// credentials Secret changes.
func TestBackendClients(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := namespace(t)
	ctx := context.Background()
	fake := gcpfake.Start(t)
	key, err := fake.RequireAuth()
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gcp-sa"}, Data: map[string][]byte{"key.json": key}}
	pc := gcpConfig("clients-"+ns, keyFrom(ns, "gcp-sa"))
	create(t, secret, pc)
	defer func() { _ = bed.Client.Delete(ctx, pc) }()
	backends := proxy.NewBackends(proxy.BackendsConfig{Kube: bed.Client, Config: bed.Config, ClusterID: "it", GCPClientOptions: fake.EndpointOptions(), RetireAfter: 200 * time.Millisecond})
	sources := proxy.CollectorSources{Kube: bed.Client, Backends: backends}
	mine := func() backend.Backend {
		t.Helper()
		targets, err := sources.Targets(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, tg := range targets {
			if o, ok := tg.Object.(*v1alpha1.ClusterProviderConfig); ok && o.Name == pc.Name {
				if tg.Err != nil {
					t.Fatal(tg.Err)
				}
				return tg.Backend
			}
		}
		t.Fatal("the configuration is not listed")
		return nil
	}
	first := mine()
	clients := backends.Clients()
	for i := 0; i < 100; i++ {
		if err := bed.Client.Get(ctx, types.NamespacedName{Name: pc.Name}, pc); err != nil {
			t.Fatal(err)
		}
		pc.Status.Users = int64(i + 1)
		if err := bed.Client.Status().Update(ctx, pc); err != nil {
			t.Fatal(err)
		}
		if b := mine(); b != first {
			t.Fatalf("status write %d built a new client", i+1)
		}
	}
	if n := backends.Clients(); n != clients {
		t.Errorf("100 status writes keep one client: %d clients, then %d", clients, n)
	}

	secret.Data["key.json"] = append([]byte(nil), key...)
	secret.Data["rotated"] = []byte("yes")
	if err := bed.Client.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if b := mine(); b == first {
		t.Error("a changed credentials Secret builds a new client")
	}
	if n := backends.Clients(); n != clients {
		t.Errorf("and the old one is let go: %d clients, then %d", clients, n)
	}
	if backends.Retired() != 0 {
		t.Error("a replaced client is not closed at once: reconciles may still be using it")
	}
	testbed.Eventually(t, 5*time.Second, "the replaced client closed after its grace", func() (bool, string) {
		return backends.Retired() == 1, fmt.Sprint(backends.Retired())
	})

	// A configuration that is gone takes its client with it.
	if err := bed.Client.Delete(ctx, pc); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, "the deleted configuration's client closed", func() (bool, string) {
		if _, err := sources.Targets(ctx); err != nil {
			return false, err.Error()
		}
		return backends.Clients() == clients-1 && backends.Retired() == 2, fmt.Sprintf("%d clients, %d closed", backends.Clients(), backends.Retired())
	})
}

// TestGCPZoneChange: moving a Proxy to another zone replaces its VM there
// and deletes the one in the old zone, which the provider finds where it
// recorded it (the external-name), not where the spec now points.
func TestGCPZoneChange(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := namespace(t)
	ctx := context.Background()
	fake := gcpfake.Start(t)
	target := testbed.StartEchoTarget(t)
	prov := startGCPProvider(t, fake, target)
	defer prov.stop()
	defer deleteProxies(t, ns)
	p := vmProxy(ns, "mover", 32333, target, "gcp-move-"+ns, "europe-west1-b")
	create(t,
		authSecret(ns),
		gcpConfig("gcp-move-"+ns, nil),
		p,
	)
	key := types.NamespacedName{Namespace: ns, Name: "mover"}
	var name string
	testbed.Eventually(t, 15*time.Second, "the VM in europe-west1-b, recorded", func() (bool, string) {
		p := get(t, key)
		name = ownership.InstanceName(p.UID)
		return fake.Instance("europe-west1-b", name) != nil && strings.Contains(p.Status.AtProvider.ProviderID, "/zones/europe-west1-b/"), p.Status.AtProvider.ProviderID
	})
	testbed.Eventually(t, 10*time.Second, "the Proxy moved to europe-west1-c", func() (bool, string) {
		p := get(t, key)
		p.Spec.ForProvider.GCP.Zone = "europe-west1-c"
		err := bed.Client.Update(ctx, p)
		return err == nil, fmt.Sprint(err)
	})
	testbed.Eventually(t, 30*time.Second, "the VM replaced in europe-west1-c, none left in europe-west1-b", func() (bool, string) {
		old, moved := fake.Instance("europe-west1-b", name), fake.Instance("europe-west1-c", name)
		recorded := get(t, key).Status.AtProvider.ProviderID
		return old == nil && moved != nil && fake.Firewall(name) != nil && strings.Contains(recorded, "/zones/europe-west1-c/"),
			fmt.Sprintf("old %v, new %v, rule %v, recorded %s", old.GetStatus(), moved.GetStatus(), fake.Firewall(name) != nil, recorded)
	})
	if err := bed.Client.Delete(ctx, get(t, key)); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 15*time.Second, "nothing left after the Proxy is deleted", func() (bool, string) {
		return fake.Instances() == 0 && fake.Firewall(name) == nil, fmt.Sprintf("%d VMs", fake.Instances())
	})
}

// TestGCPManagementPolicies: Observe-only never creates; without Delete, the
// VM outlives its Proxy, labelled so, and the orphan collector leaves it.
func TestGCPManagementPolicies(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := namespace(t)
	ctx := context.Background()
	fake := gcpfake.Start(t)
	target := testbed.StartEchoTarget(t)
	prov := startGCPProvider(t, fake, target)
	defer prov.stop()
	defer deleteProxies(t, ns)
	create(t,
		authSecret(ns),
		gcpConfig("gcp-mp-"+ns, nil),
	)
	managedAs := func(name string, port int32, policies ...xpv2.ManagementAction) *v1alpha1.Proxy {
		p := vmProxy(ns, name, port, target, "gcp-mp-"+ns, "europe-west1-b")
		p.SetManagementPolicies(policies)
		return p
	}

	t.Run("ObserveOnly", func(t *testing.T) {
		p := managedAs("watched", 32334, xpv2.ManagementActionObserve)
		create(t, p)
		key := types.NamespacedName{Namespace: ns, Name: "watched"}
		testbed.Eventually(t, 10*time.Second, "observed: no instance, which Observe-only does not create", func() (bool, string) {
			c := get(t, key).GetCondition(xpv2.TypeSynced)
			// Not "management policies are not enabled": they are obeyed.
			return c.Status == corev1.ConditionFalse && strings.Contains(c.Message, "does not exist") && !strings.Contains(c.Message, "not enabled"),
				string(c.Reason) + ": " + c.Message
		})
		time.Sleep(2 * time.Second)
		if n := fake.Calls("instances.insert") + fake.Calls("firewalls.insert"); n != 0 {
			t.Errorf("Observe-only creates nothing: %d inserts", n)
		}
		if err := bed.Client.Delete(ctx, get(t, key)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("PoliciesChangedLater", func(t *testing.T) {
		p := managedAs("later", 32336)
		create(t, p)
		key := types.NamespacedName{Namespace: ns, Name: "later"}
		var name string
		testbed.Eventually(t, 15*time.Second, "the VM, not marked", func() (bool, string) {
			name = ownership.InstanceName(get(t, key).UID)
			vm := fake.Instance("europe-west1-b", name)
			return vm != nil && vm.GetLabels()["egress-retain"] == "", fmt.Sprint(vm.GetLabels())
		})
		testbed.Eventually(t, 10*time.Second, "Delete left out of the policies", func() (bool, string) {
			p := get(t, key)
			p.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate})
			err := bed.Client.Update(ctx, p)
			return err == nil, fmt.Sprint(err)
		})
		testbed.Eventually(t, 15*time.Second, "the VM marked to outlive its Proxy", func() (bool, string) {
			vm := fake.Instance("europe-west1-b", name)
			return vm.GetLabels()["egress-retain"] == "true", fmt.Sprint(vm.GetLabels())
		})
		if err := bed.Client.Delete(ctx, get(t, key)); err != nil {
			t.Fatal(err)
		}
		testbed.Eventually(t, 15*time.Second, "the Proxy gone, its VM kept", func() (bool, string) {
			err := bed.Client.Get(ctx, key, &v1alpha1.Proxy{})
			return kerrors.IsNotFound(err) && fake.Instance("europe-west1-b", name) != nil, fmt.Sprint(err)
		})
	})

	t.Run("KeptWithoutDelete", func(t *testing.T) {
		p := managedAs("kept", 32335, xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate, xpv2.ManagementActionLateInitialize)
		create(t, p)
		key := types.NamespacedName{Namespace: ns, Name: "kept"}
		var name string
		testbed.Eventually(t, 15*time.Second, "the VM, labelled to be retained", func() (bool, string) {
			name = ownership.InstanceName(get(t, key).UID)
			vm := fake.Instance("europe-west1-b", name)
			return vm != nil && vm.GetLabels()["egress-retain"] == "true", fmt.Sprint(vm.GetLabels())
		})
		if err := bed.Client.Delete(ctx, get(t, key)); err != nil {
			t.Fatal(err)
		}
		testbed.Eventually(t, 15*time.Second, "the Proxy gone", func() (bool, string) {
			err := bed.Client.Get(ctx, key, &v1alpha1.Proxy{})
			return kerrors.IsNotFound(err), fmt.Sprint(err)
		})
		if fake.Instance("europe-west1-b", name) == nil || fake.Firewall(name) == nil {
			t.Fatal("the VM and its rule outlive the Proxy")
		}
		// Beside it, an orphan that was not made to be kept.
		ghost := ownership.Owner{ClusterID: "it", Namespace: ns, Name: "ghost", UID: "ghost-uid-mp"}
		fake.PutInstance("europe-west1-b", &computepb.Instance{
			Name: ptr.To(ownership.InstanceName(ghost.UID)), Status: ptr.To("RUNNING"), Labels: ghost.GCPLabels(),
			CreationTimestamp: ptr.To(time.Now().Add(-2 * time.Hour).Format(time.RFC3339)),
		})
		c := collectorAnHourAhead(bed, prov)
		r, err := c.Collect(ctx)
		if err != nil {
			t.Logf("collect: %v", err)
		}
		if r.Deleted < 1 {
			t.Errorf("the collector ran over this backend and took the plain orphan: %+v", r)
		}
		if fake.Instance("europe-west1-b", name) == nil {
			t.Error("the orphan collector never takes a retained VM")
		}
	})
}

// startGCPProvider starts the provider with its GCP clients aimed at fake.
func startGCPProvider(t *testing.T, fake *gcpfake.Server, target testbed.Target) *provider {
	t.Helper()
	return startProvider(t, testbed.SquidStateDir(t), providerLogs(t), target, func(o *proxy.Options) {
		o.Backends.(*proxy.Backends).GCPClientOptions = fake.ClientOptions()
	})
}

// bootVM plays the VM zone/name booting: it runs a real Squid from the VM's
// startup script, listening on addr, and moves the VM to RUNNING with a NAT
// IP of 127.0.0.1.
func bootVM(t testing.TB, fake *gcpfake.Server, zone, name, addr string) {
	t.Helper()
	runVMSquid(t, fake, zone, name, addr)
	fake.SetStatus(zone, name, "RUNNING", "127.0.0.1")
}

// runVMSquid runs the Squid of VM zone/name, from its startup script.
func runVMSquid(t testing.TB, fake *gcpfake.Server, zone, name, addr string) {
	t.Helper()
	testbed.StartScriptSquid(t, fake.Instance(zone, name).GetMetadata().GetItems()[0].GetValue(), addr, nil)
}

// collectorAnHourAhead is an orphan collector over prov's backends whose
// clock runs an hour ahead, so that no orphan is too young to collect.
func collectorAnHourAhead(bed *testbed.Env, prov *provider) *gc.Collector {
	return &gc.Collector{
		Sources: proxy.CollectorSources{Kube: bed.Client, Backends: prov.backends}, ClusterID: "it", Grace: 0,
		Now: func() time.Time { return time.Now().Add(time.Hour) }, Log: logging.NewNopLogger(), Record: event.NewNopRecorder(), Metrics: metrics.NewProvider(),
	}
}

// authSecret is the proxies' credentials, usable by them.
func authSecret(ns string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}},
		StringData: map[string]string{"username": "crawler", "password": password},
	}
}

// gcpConfig is a ClusterProviderConfig of the GCP backend in project
// crawl-proj: with the provider's own identity when creds is nil.
func gcpConfig(name string, creds *v1alpha1.GCPCredentials) *v1alpha1.ClusterProviderConfig {
	c := v1alpha1.GCPCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}
	if creds != nil {
		c = *creds
	}
	return &v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.ProviderConfigSpec{
		Backend: v1alpha1.BackendGCP, GCP: &v1alpha1.GCPBackend{Project: "crawl-proj", Credentials: c},
	}}
}

// keyFrom names a service-account key in the Secret name of ns.
func keyFrom(ns, name string) *v1alpha1.GCPCredentials {
	return &v1alpha1.GCPCredentials{Source: xpv2.CredentialsSourceSecret, CommonCredentialSelectors: xpv2.CommonCredentialSelectors{
		SecretRef: &xpv2.SecretKeySelector{SecretReference: xpv2.SecretReference{Namespace: ns, Name: name}, Key: "key.json"},
	}}
}

// vmProxy is a Proxy on a VM in zone, through the ClusterProviderConfig pc.
func vmProxy(ns, name string, port int32, target testbed.Target, pc, zone string) *v1alpha1.Proxy {
	p := proxyObject(ns, name, port, target.URL)
	p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: pc}
	p.Spec.ForProvider.Local = nil
	p.Spec.ForProvider.GCP = &v1alpha1.GCPPlacement{Zone: zone}
	return p
}
