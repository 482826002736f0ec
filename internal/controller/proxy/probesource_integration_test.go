package proxy_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp/gcpfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestGCPProbeSources is the first deployment of examples/gcp as written:
// proxies that admit their crawlers' range only (203.0.113.0/24), probed
// by a provider whose address is elsewhere (127.0.0.1 here). Without the
// ProviderConfig's spec.probe.sourceRanges the VM's real Squid, run from
// its startup script, refuses the probe, and Ready says so (ProbeRefused,
// naming the setting) instead of waiting; with it the provider's range is
// in the firewall rule beside the crawlers' and in Squid's client ACL, and
// the proxy is Ready.
func TestGCPProbeSources(t *testing.T) {
	sharedBed.Env(t)
	ns := namespace(t)
	fake := gcpfake.Start(t)
	target := testbed.StartEchoTarget(t)
	prov := startGCPProvider(t, fake, target)
	defer prov.stop()
	defer deleteProxies(t, ns)

	without, with := gcpConfig("gcp-noprobe-"+ns, nil), gcpConfig("gcp-probe-"+ns, nil)
	with.Spec.Probe = &v1alpha1.ProbeSource{SourceRanges: []v1alpha1.CIDR{"127.0.0.1/32"}}
	refused := vmProxy(ns, "refused", 32341, target, without.Name, "europe-west1-b")
	probed := vmProxy(ns, "probed", 32342, target, with.Name, "europe-west1-b")
	for _, p := range []*v1alpha1.Proxy{refused, probed} {
		p.Spec.ForProvider.AllowedSourceRanges = []v1alpha1.CIDR{"203.0.113.0/24"}
	}
	create(t, authSecret(ns), without, with, refused, probed)

	boot := func(name string, port int) string {
		key := types.NamespacedName{Namespace: ns, Name: name}
		var vm string
		testbed.Eventually(t, 10*time.Second, name+"'s VM inserted", func() (bool, string) {
			vm = ownership.InstanceName(get(t, key).UID)
			return fake.Instance("europe-west1-b", vm) != nil, ""
		})
		bootVM(t, fake, "europe-west1-b", vm, fmt.Sprintf("127.0.0.1:%d", port))
		return vm
	}
	refusedVM, probedVM := boot("refused", 32341), boot("probed", 32342)

	testbed.Eventually(t, 20*time.Second, "the refused probe named as such", func() (bool, string) {
		c := get(t, types.NamespacedName{Namespace: ns, Name: "refused"}).GetCondition(xpv2.TypeReady)
		return c.Status == corev1.ConditionFalse && c.Reason == proxy.ReasonProbeRefused && strings.Contains(c.Message, "spec.probe.sourceRanges"),
			fmt.Sprintf("%s %s %q", c.Status, c.Reason, c.Message)
	})
	testbed.Eventually(t, 20*time.Second, "the proxy that lets the probe in Ready", ready(t, types.NamespacedName{Namespace: ns, Name: "probed"}, corev1.ConditionTrue))

	if got := fake.Firewall(refusedVM).GetSourceRanges(); !slices.Equal(got, []string{"203.0.113.0/24"}) {
		t.Errorf("without probe sources the rule admits the crawlers' range only: %v", got)
	}
	if got := fake.Firewall(probedVM).GetSourceRanges(); !slices.Equal(got, []string{"127.0.0.1/32", "203.0.113.0/24"}) {
		t.Errorf("the rule must admit the probe's range beside the crawlers': %v", got)
	}
}
