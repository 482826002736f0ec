package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestSteadyProxyWritesNoStatus: a Ready proxy polled and probed every
// second, whose verdict does not change, costs the API server no status
// write: crossplane-runtime's write at the end of every reconcile is left
// out when it would change nothing (before, one PUT a poll). Counted by the
// API server itself (apiserver_request_total).
func TestSteadyProxyWritesNoStatus(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := namespace(t)
	target := testbed.StartEchoTarget(t)
	pm := metrics.NewProvider()
	prov := startProvider(t, testbed.SquidStateDir(t), providerLogs(t), target, func(o *proxy.Options) {
		o.Metrics, o.PollInterval = pm, time.Second
	})
	defer prov.stop()
	defer deleteProxies(t, ns)
	create(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "crawler", "password": password}},
		&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "local-" + ns}, Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal,
			Policy: &v1alpha1.Policy{Local: &v1alpha1.LocalPolicy{AllowLoopbackDestinations: true}}}},
		proxyObject(ns, "steady", 32380, target.URL),
	)
	key := types.NamespacedName{Namespace: ns, Name: "steady"}
	testbed.Eventually(t, 15*time.Second, "Proxy Ready=True", ready(t, key, corev1.ConditionTrue))
	// Past the first probes' threshold and latency settling.
	time.Sleep(3 * time.Second)
	puts := statusPutCounter(t)
	// Every change the Proxy goes through in the window (a latency step,
	// under load), which a write that changed something made.
	wc, err := client.NewWithWatch(bed.Config, client.Options{Scheme: bed.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	before, rv, skipped := puts(), get(t, key).ResourceVersion, testutil.ToFloat64(pm.StatusWritesSkipped)
	// Every namespace's: the API server counts every Proxy status PUT,
	// including those of an earlier test's proxies still going.
	w, err := wc.Watch(context.Background(), &v1alpha1.ProxyList{}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	const window = 8 * time.Second
	changes := 0
	for end := time.After(window); end != nil; {
		select {
		case <-end:
			end = nil
		case <-w.ResultChan():
			changes++
		}
	}
	after := puts()
	p := get(t, key)
	t.Logf("%s of a steady proxy polled every second: %d Proxy status PUTs answered 200, %d changes, %g left out, resourceVersion %s -> %s",
		window, after-before, changes, testutil.ToFloat64(pm.StatusWritesSkipped)-skipped, rv, p.ResourceVersion)
	if after-before > changes {
		t.Errorf("a steady proxy cost %d status writes in %s, for %d changes: writes that changed nothing were sent", after-before, window, changes)
	}
	if testutil.ToFloat64(pm.StatusWritesSkipped)-skipped < 2 {
		t.Errorf("only %g unchanged writes left out in %s of polls every second", testutil.ToFloat64(pm.StatusWritesSkipped)-skipped, window)
	}
	if c := p.GetCondition("Ready"); c.Status != corev1.ConditionTrue {
		t.Errorf("the proxy is no longer Ready: %+v", c)
	}
}

// statusPutCounter reads, at each call, how many PUTs of proxies/status
// the test bed's API server has answered (apiserver_request_total).
func statusPutCounter(t testing.TB) func() int {
	t.Helper()
	cs, err := kubernetes.NewForConfig(sharedBed.Env(t).Config)
	if err != nil {
		t.Fatal(err)
	}
	return func() int {
		raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return statusPuts(raw)
	}
}

// statusPuts sums apiserver_request_total's PUTs of proxies/status that
// succeeded (a conflict, which crossplane-runtime retries, is no write).
func statusPuts(raw []byte) int {
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `resource="proxies"`) ||
			!strings.Contains(line, `subresource="status"`) || !strings.Contains(line, `verb="PUT"`) || !strings.Contains(line, `code="200"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			n += int(v)
		}
	}
	return n
}

// BenchmarkSteadyStatusWrites measures what a steady fleet costs the API
// server in Proxy status writes, at BENCH_SIZES proxies (default 100 and
// 1000): External Proxies on in-process CONNECT proxies, probed every 30 s
// and polled every BENCH_POLL seconds (default 30, as make run polls), all
// Ready, over a window of BENCH_WINDOW seconds (default 90). It counts the
// PUTs of proxies/status the API server saw (apiserver_request_total) and
// the unchanged writes the provider left out: their sum is what the
// reconciler wrote before, measured in the same run.
func BenchmarkSteadyStatusWrites(b *testing.B) {
	poll := time.Duration(envInt("BENCH_POLL", 30)) * time.Second
	window := time.Duration(envInt("BENCH_WINDOW", 90)) * time.Second
	sizes := []int{100, 1000}
	if v := os.Getenv("BENCH_SIZES"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			if n, err := strconv.Atoi(f); err == nil && n > 0 {
				sizes = append(sizes, n)
			}
		}
	}
	bed := sharedBed.Env(b)
	puts := statusPutCounter(b)
	target := testbed.StartEchoTarget(b)
	b.ResetTimer()
	for _, n := range sizes {
		ns := namespace(b)
		ctx := context.Background()
		cp := testbed.StartConnectProxies(b, n, "crawler", password)
		if err := bed.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "crawler", "password": password}}); err != nil {
			b.Fatal(err)
		}
		for i, a := range cp.Addrs {
			p := externalProxy(ns, fmt.Sprintf("s%04d", i), a, target, 5*time.Second)
			if err := bed.Client.Create(ctx, p); err != nil {
				b.Fatal(err)
			}
		}
		pm := metrics.NewProvider()
		prov := startProvider(b, testbed.SquidStateDir(b), providerLogs(b), target, func(o *proxy.Options) {
			o.Metrics, o.PollInterval, o.MaxConcurrentReconciles = pm, poll, 10
		})
		testbed.Eventually(b, 10*time.Minute, fmt.Sprintf("all %d proxies Ready", n), func() (bool, string) {
			l := &v1alpha1.ProxyList{}
			if err := bed.Client.List(ctx, l, client.InNamespace(ns)); err != nil {
				return false, err.Error()
			}
			ready := 0
			for i := range l.Items {
				if l.Items[i].GetCondition("Ready").Status == corev1.ConditionTrue {
					ready++
				}
			}
			return ready == n, fmt.Sprintf("%d of %d Ready", ready, n)
		})
		// One poll and one probe interval for the first verdicts to settle.
		time.Sleep(max(poll, 30*time.Second))
		before, skipped := puts(), testutil.ToFloat64(pm.StatusWritesSkipped)
		time.Sleep(window)
		written := float64(puts() - before)
		left := testutil.ToFloat64(pm.StatusWritesSkipped) - skipped
		perHour := func(x float64) float64 { return x / float64(n) * float64(time.Hour) / float64(window) }
		b.Logf("%d steady proxies, poll %s, probes every 30s, %s: %.0f status PUTs (%.1f per proxy per hour); %.0f unchanged left out, so %.1f per proxy per hour before (%.2fx)",
			n, poll, window, written, perHour(written), left, perHour(written+left), written/max(written+left, 1))
		b.ReportMetric(perHour(written), fmt.Sprintf("writes/proxy/h@%d", n))
		b.ReportMetric(perHour(written+left), fmt.Sprintf("before/proxy/h@%d", n))
		deleteProxies(b, ns)
		prov.stop()
	}
}
