package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

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
	cs, err := kubernetes.NewForConfig(bed.Config)
	if err != nil {
		t.Fatal(err)
	}
	puts := func() int {
		raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return statusPuts(raw)
	}
	before, rv, skipped := puts(), get(t, key).ResourceVersion, testutil.ToFloat64(pm.StatusWritesSkipped)
	const window = 8 * time.Second
	time.Sleep(window)
	after := puts()
	p := get(t, key)
	t.Logf("%s of a steady proxy polled every second: %d Proxy status PUTs, %g left out, resourceVersion %s -> %s",
		window, after-before, testutil.ToFloat64(pm.StatusWritesSkipped)-skipped, rv, p.ResourceVersion)
	if after-before > 1 {
		t.Errorf("a steady proxy cost %d status writes in %s, want at most 1 (a latency step)", after-before, window)
	}
	if testutil.ToFloat64(pm.StatusWritesSkipped)-skipped < 4 {
		t.Errorf("only %g unchanged writes left out in %s of polls every second", testutil.ToFloat64(pm.StatusWritesSkipped)-skipped, window)
	}
	if c := p.GetCondition("Ready"); c.Status != corev1.ConditionTrue {
		t.Errorf("the proxy is no longer Ready: %+v", c)
	}
}

// statusPuts sums apiserver_request_total's PUTs of proxies/status.
func statusPuts(raw []byte) int {
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `resource="proxies"`) ||
			!strings.Contains(line, `subresource="status"`) || !strings.Contains(line, `verb="PUT"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			n += int(v)
		}
	}
	return n
}
