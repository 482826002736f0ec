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
	ns := bed.Namespace(t)
	fake := gcpfake.Start(t)
	target := testbed.StartEchoTarget(t)
	prov := startProvider(t, testbed.SquidStateDir(t), providerLogs(t), target, func(o *proxy.Options) {
		o.Backends.(*proxy.Backends).GCPClientOptions = fake.ClientOptions()
	})
	defer prov.stop()
	ctx := context.Background()

	p := proxyObject(ns, "vm-proxy", 32330, target.URL)
	p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "gcp-" + ns}
	p.Spec.ForProvider.Local = nil
	p.Spec.ForProvider.GCP = &v1alpha1.GCPPlacement{Zone: "europe-west1-b", GCPInstance: v1alpha1.GCPInstance{MachineType: "e2-micro", NetworkTags: []v1alpha1.NetworkTag{"crawl"}}}
	p.Spec.ForProvider.AllowedSourceRanges = []v1alpha1.CIDR{"127.0.0.0/8"}
	create(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "crawler", "password": password}},
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

	script := fake.Instance("europe-west1-b", name).GetMetadata().GetItems()[0].GetValue()
	conf := []byte(testbed.Heredoc(t, script, "/etc/squid/egress-proxy.conf"))
	// A VM's loopback is its own; on this shared host the test lets the
	// probe reach the echo target on loopback. The VM's log, pid and spool
	// paths move beside the config.
	conf = []byte(strings.NewReplacer("http_access deny egress_loopback\n", "", "/var/log/squid/", "/etc/squid/",
		"/run/squid.pid", "/etc/squid/squid.pid", "/var/spool/squid", "/etc/squid").Replace(string(conf)))
	testbed.RunSquid(t, conf, "/etc/squid", map[string][]byte{
		"egress-proxy.htpasswd": []byte(testbed.Heredoc(t, script, "/etc/squid/egress-proxy.htpasswd")),
		// What own_addresses writes on a VM whose metadata server
		// does not answer.
		"egress-proxy.self": []byte("255.255.255.255\n"),
	}, "127.0.0.1:32330")
	fake.SetStatus("europe-west1-b", name, "RUNNING", "127.0.0.1")
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
		c := &gc.Collector{
			Sources: proxy.CollectorSources{Kube: bed.Client, Backends: prov.backends}, ClusterID: "it", Grace: 15 * time.Minute,
			Now: time.Now, Log: logging.NewNopLogger(), Record: event.NewNopRecorder(), Metrics: metrics.NewProvider(),
		}
		r, err := c.Collect(ctx)
		if err != nil {
			t.Fatal(err)
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
	ns := bed.Namespace(t)
	fake := gcpfake.Start(t)
	target := testbed.StartEchoTarget(t)
	prov := startProvider(t, testbed.SquidStateDir(t), providerLogs(t), target, func(o *proxy.Options) {
		o.Backends.(*proxy.Backends).GCPClientOptions = fake.ClientOptions()
		o.Backends.(*proxy.Backends).GCPOperationTimeout = 500 * time.Millisecond
	})
	defer prov.stop()
	create(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "crawler", "password": password}},
		&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "gcp-" + ns}, Spec: v1alpha1.ProviderConfigSpec{
			Backend: v1alpha1.BackendGCP,
			GCP:     &v1alpha1.GCPBackend{Project: "crawl-proj", Credentials: v1alpha1.GCPCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}},
		}},
	)
	vmProxy := func(name, zone string) (*v1alpha1.Proxy, types.NamespacedName) {
		p := proxyObject(ns, name, 32331, target.URL)
		p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "gcp-" + ns}
		p.Spec.ForProvider.Local = nil
		p.Spec.ForProvider.GCP = &v1alpha1.GCPPlacement{Zone: zone}
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
		p, key := vmProxy("stockout", "europe-west1-d")
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
		p, key := vmProxy("slow-quota", "europe-west1-c")
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
	ns := bed.Namespace(t)
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
	p := proxyObject(ns, "keyed", 32332, target.URL)
	p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "gcp-key-" + ns}
	p.Spec.ForProvider.Local = nil
	p.Spec.ForProvider.GCP = &v1alpha1.GCPPlacement{Zone: "europe-west1-b"}
	create(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "crawler", "password": password}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gcp-sa"}, Data: map[string][]byte{"key.json": key}},
		&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "gcp-key-" + ns}, Spec: v1alpha1.ProviderConfigSpec{
			Backend: v1alpha1.BackendGCP,
			GCP: &v1alpha1.GCPBackend{Project: "crawl-proj", Credentials: v1alpha1.GCPCredentials{Source: xpv2.CredentialsSourceSecret,
				CommonCredentialSelectors: xpv2.CommonCredentialSelectors{SecretRef: &xpv2.SecretKeySelector{
					SecretReference: xpv2.SecretReference{Namespace: ns, Name: "gcp-sa"}, Key: "key.json",
				}}}},
		}},
		p,
	)
	key2 := types.NamespacedName{Namespace: ns, Name: "keyed"}
	testbed.Eventually(t, 15*time.Second, "the VM made with the key's credentials", func() (bool, string) {
		name := ownership.InstanceName(get(t, key2).UID)
		return fake.Instance("europe-west1-b", name) != nil && fake.Authenticated() > 0,
			fmt.Sprintf("%d authenticated requests; Ready: %s", fake.Authenticated(), get(t, key2).GetCondition(xpv2.TypeReady).Message)
	})
}
