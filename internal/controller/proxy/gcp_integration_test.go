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
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
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
		if r.Deleted != 1 || fake.Instance("europe-west1-c", ownership.InstanceName(ghost.UID)) != nil {
			t.Errorf("the orphaned VM must be collected: %+v", r)
		}
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
