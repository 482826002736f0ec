package proxy_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// inflight wraps the real prober and counts the probes running at once.
type inflight struct {
	probe.Prober
	mu        sync.Mutex
	now, peak int
}

func (f *inflight) Probe(ctx context.Context, t probe.Target) probe.Result {
	f.mu.Lock()
	f.now++
	f.peak = max(f.peak, f.now)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.now--
		f.mu.Unlock()
	}()
	return f.Prober.Probe(ctx, t)
}

func (f *inflight) counts() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now, f.peak
}

// externalProxy is an External Proxy at addr, probed every 30 s with
// timeout.
func externalProxy(ns, name, addr string, target testbed.Target, timeout time.Duration) *v1alpha1.Proxy {
	host, portS, _ := splitHostPort(addr)
	port, _ := strconv.Atoi(portS)
	return &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ProxySpec{ForProvider: v1alpha1.ProxyParameters{
			Mode: v1alpha1.ProxyModeExternal, Endpoint: &v1alpha1.Endpoint{Host: host, Port: int32(port)},
			AuthSecretRef: &v1alpha1.AuthSecretReference{Name: "auth"},
			HealthCheck: v1alpha1.HealthCheck{URL: target.URL, Interval: &metav1.Duration{Duration: 30 * time.Second},
				Timeout: &metav1.Duration{Duration: timeout}},
		}},
	}
}

// TestBlackHolesDoNotStarveReconciles: proxies that accept connections and
// never answer hold probe workers for their whole timeout, never reconcile
// workers. With two reconcile workers and twenty black-holed proxies probed
// with a 10 s timeout, a new Proxy is still created and Ready, and deleted,
// in less than one probe timeout. Probing inside Observe took minutes.
func TestBlackHolesDoNotStarveReconciles(t *testing.T) {
	const holes, timeout = 20, 10 * time.Second
	bed := sharedBed.Env(t)
	ns := namespace(t)
	target := testbed.StartEchoTarget(t)
	pr := &inflight{}
	prov := startProvider(t, testbed.SquidStateDir(t), providerLogs(t), target, func(o *proxy.Options) {
		o.Prober = pr
		o.MaxConcurrentReconciles = 2
	})
	defer prov.stop()
	defer deleteProxies(t, ns)
	ctx := context.Background()

	cp := testbed.StartConnectProxies(t, holes, "crawler", password)
	create(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "crawler", "password": password}},
		&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "local-" + ns}, Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal,
			Policy: &v1alpha1.Policy{Local: &v1alpha1.LocalPolicy{AllowLoopbackDestinations: true}}}},
	)
	for i, addr := range cp.Addrs {
		cp.BlackHole(i, true)
		create(t, externalProxy(ns, fmt.Sprintf("hole%02d", i), addr, target, timeout))
	}
	testbed.Eventually(t, 10*time.Second, "every black-holed proxy's probe hanging at once", func() (bool, string) {
		now, _ := pr.counts()
		return now == holes, fmt.Sprintf("%d of %d probes in flight", now, holes)
	})

	start := time.Now()
	create(t, proxyObject(ns, "p1", 32330, target.URL))
	key := types.NamespacedName{Namespace: ns, Name: "p1"}
	testbed.Eventually(t, timeout-time.Second, "p1 Ready while the black holes hang", ready(t, key, corev1.ConditionTrue))
	t.Logf("p1 Ready %s after apply, with %d probes hanging", time.Since(start).Round(time.Millisecond), holes)

	start = time.Now()
	if err := bed.Client.Delete(ctx, get(t, key)); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, timeout-time.Second, "p1 gone while the black holes hang", func() (bool, string) {
		err := bed.Client.Get(ctx, key, &v1alpha1.Proxy{})
		return kerrors.IsNotFound(err), fmt.Sprintf("get: %v", err)
	})
	t.Logf("p1 deleted %s after the request", time.Since(start).Round(time.Millisecond))

	// The black-holed proxies' verdicts arrive all the same.
	testbed.Eventually(t, 2*timeout+5*time.Second, "the black-holed proxies found failing", func() (bool, string) {
		for i := range holes {
			p := get(t, types.NamespacedName{Namespace: ns, Name: fmt.Sprintf("hole%02d", i)})
			if p.Status.AtProvider.ConsecutiveFailures == 0 {
				return false, fmt.Sprintf("%s: %+v %v", p.Name, p.Status.AtProvider, p.GetCondition(xpv2.TypeReady))
			}
		}
		return true, ""
	})
}

// TestExternalEndpointReach: an External Proxy's endpoint is whatever its
// author wrote. Pointed at loopback, by address or by a name resolving
// there, it is never dialed unless the platform permits the network
// (TenantPrivateNetworks): its Ready condition says why, and the
// listener there sees no connection. Permitted, the same endpoint is
// probed and Ready.
func TestExternalEndpointReach(t *testing.T) {
	sharedBed.Env(t)
	ns := namespace(t)
	target := testbed.StartEchoTarget(t)
	cp := testbed.StartConnectProxies(t, 1, "crawler", password)
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "crawler", "password": password}})
	_, port, _ := splitHostPort(cp.Addrs[0])

	prov := startProvider(t, testbed.SquidStateDir(t), providerLogs(t), target, func(o *proxy.Options) { o.TenantPrivateNetworks = nil })
	for name, addr := range map[string]string{"by-address": cp.Addrs[0], "by-name": "localhost:" + port} {
		p := externalProxy(ns, name, addr, target, 500*time.Millisecond)
		p.Spec.ForProvider.HealthCheck.Interval = &metav1.Duration{Duration: time.Second}
		create(t, p)
	}
	for _, name := range []string{"by-address", "by-name"} {
		key := types.NamespacedName{Namespace: ns, Name: name}
		testbed.Eventually(t, 15*time.Second, name+" refused at the dial, and saying so", func() (bool, string) {
			p := get(t, key)
			c := p.GetCondition(xpv2.TypeReady)
			return c.Status == corev1.ConditionFalse && strings.Contains(p.Status.AtProvider.LastProbeError, "loopback"),
				fmt.Sprintf("Ready=%s %s: %s; last probe error %q", c.Status, c.Reason, c.Message, p.Status.AtProvider.LastProbeError)
		})
	}
	if n := cp.Connections(0); n != 0 {
		t.Fatalf("the refused endpoint was dialed %d times", n)
	}
	prov.stop()

	prov = startProvider(t, testbed.SquidStateDir(t), providerLogs(t), target)
	defer prov.stop()
	defer deleteProxies(t, ns)
	testbed.Eventually(t, 15*time.Second, "by-address Ready once loopback is permitted", ready(t, types.NamespacedName{Namespace: ns, Name: "by-address"}, corev1.ConditionTrue))
}
