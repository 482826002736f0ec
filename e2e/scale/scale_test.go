//go:build scale

// Package scale measures the product at 100, 1 000 and 10 000 proxies on
// real Crossplane: the environment `make run` starts (internal/devenv:
// etcd, kube-apiserver, Crossplane core v2.4.0 composing through
// function-proxyfleet, provider-egressproxy's controllers, egress-discovery),
// with the GCP backend of the real provider talking to the in-process fake
// of the Compute API (gcpfake). Each VM boots at once with an external IP of
// its own on loopback (127.1.0.0/16 and up), where this process serves it as
// an in-process CONNECT proxy dialing out from that address: a proxy costs a
// listener, not a Squid. Run it with `make scale`; it is not part of `make
// test`. BENCHMARKS.md holds the figures.
//
// Settings (environment): SCALE_SIZES (default 100,1000,10000),
// SCALE_PROFILE_DIR (egress-discovery's CPU profile of each acquisition,
// and its and kube-apiserver's of the steady window, go there),
// SCALE_STEADY (the steady window, default 5m), SCALE_INTERVAL (each
// proxy's probe interval, default 60s), SCALE_SETTLE (from the leases
// taken to the window, default three intervals and 30 s),
// SCALE_READY_TIMEOUT (apply to Ready, default 10 minutes and 120 ms a
// proxy), SCALE_ROLLOUT_MAX (the largest
// size a template change is rolled over, default 1000), SCALE_OUT (where
// the table goes, default _output/scale.md), SCALE_CROSSPLANE_ARGS and
// SCALE_PROVIDER_ARGS (flags added to Crossplane's and the provider's, to
// try a setting). While a fleet comes up the test logs every minute what
// it costs (bringup_test.go).
package scale

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	discoveryv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp/gcpfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/devenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

const (
	ns           = devenv.ExampleNamespace
	username     = "crawler"
	password     = "scale-test-password"
	proxyPort    = 3128
	perPool      = 105 // 10 000 proxies in 96 pools
	maxSurge     = 16  // (105 + 16) x 8600 B within a pool's 1 MiB
	leasesPerHot = 10
	config       = "scale-gcp"
)

var zones = []string{"europe-west1-b", "europe-west1-c", "europe-west1-d"}

// fleetYAML is the fleet of n proxies: GCP VMs from the fake, in pools of
// 105, probed every interval, 10 leases per proxy.
func fleetYAML(name string, n int, interval time.Duration, machine string) string {
	return fmt.Sprintf(`apiVersion: crawl.example.com/v1alpha1
kind: ProxyFleet
metadata:
  name: %s
  namespace: %s
spec:
  replicas: %d
  pools: {proxiesPerPool: %d}
  providerConfigRef: {kind: ClusterProviderConfig, name: %s}
  zones: [%s]
  placement:
    gcp: {machineType: %s}
  proxy:
    port: %d
    authSecretRef: {name: scale-auth}
    allowedSourceRanges: [127.0.0.0/8]
  healthCheck:
    url: https://%s/ip
    interval: %s
    timeout: 5s
  rotation:
    maxSurge: %d
    maxUnavailable: %d
    replaceUnhealthyAfter: 15m
  leases:
    maxLeasesPerProxy: %d
    defaultTTL: 1h
    maxTTL: 2h
`, name, ns, n, perPool, config, strings.Join(zones, ", "), machine, proxyPort, devenv.TargetAddress, interval,
		maxSurge, maxUnavailable(n), leasesPerHot)
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v >= 0 {
		return v
	}
	return def
}

func sizes(t *testing.T) []int {
	raw := os.Getenv("SCALE_SIZES")
	if raw == "" {
		return []int{100, 1000, 10000}
	}
	var out []int
	for _, f := range strings.Split(raw, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > fleetv1alpha1.MaxReplicas {
			t.Fatalf("SCALE_SIZES: %q is not a fleet size from 1 to %d", f, fleetv1alpha1.MaxReplicas)
		}
		out = append(out, n)
	}
	return out
}

// vms boots every VM the fake makes at once, with an external IP of its
// own on loopback, and serves each as an in-process CONNECT proxy.
type vms struct {
	proxies *testbed.EgressProxies
	next    atomic.Uint32
	mu      sync.Mutex
	failed  error
}

func (v *vms) ip() string {
	n := v.next.Add(1)
	// 127.1.0.2 onwards (the first number taken is 1), skipping .0 and
	// .255 of every /24.
	n = n/254*256 + n%254 + 1
	return fmt.Sprintf("127.%d.%d.%d", 1+(n>>16)&0xff, (n>>8)&0xff, n&0xff)
}

func (v *vms) insert(vm *computepb.Instance) {
	ip := v.ip()
	if err := v.proxies.Add(net.JoinHostPort(ip, strconv.Itoa(proxyPort))); err != nil {
		v.mu.Lock()
		v.failed = err
		v.mu.Unlock()
		return
	}
	vm.Status = ptr.To("RUNNING")
	for _, ni := range vm.GetNetworkInterfaces() {
		for _, ac := range ni.GetAccessConfigs() {
			ac.NatIP = ptr.To(ip)
		}
	}
}

func (v *vms) remove(vm *computepb.Instance) {
	for _, ni := range vm.GetNetworkInterfaces() {
		for _, ac := range ni.GetAccessConfigs() {
			if ip := ac.GetNatIP(); ip != "" {
				v.proxies.Remove(net.JoinHostPort(ip, strconv.Itoa(proxyPort)))
			}
		}
	}
}

// env is the running environment.
type env struct {
	stack *devenv.Stack
	fake  *gcpfake.Server
	vms   *vms
	disc  *discoveryv1.Client
	// cs reads the API server's own metrics.
	cs *kubernetes.Clientset
	// pprof is egress-discovery's profiler address, with SCALE_PROFILE_DIR.
	pprof string
}

// TestScale brings the environment up once and measures each size in turn
// on a fleet of its own, deleted before the next.
func TestScale(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"kube-apiserver", "etcd", "crossplane-core", "provider-egressproxy", "function-proxyfleet", "egress-discovery"} {
		if _, err := os.Stat(filepath.Join(root, "bin", b)); err != nil {
			t.Fatalf("bin/%s is missing: run make run-deps (make scale does)", b)
		}
	}
	interval := envDuration("SCALE_INTERVAL", time.Minute)
	steady := envDuration("SCALE_STEADY", 5*time.Minute)
	rolloutMax := envInt("SCALE_ROLLOUT_MAX", 1000)

	fake := gcpfake.Start(t)
	v := &vms{proxies: testbed.StartEgressProxies(t, username, password)}
	fake.OnInsert, fake.OnRemove = v.insert, v.remove
	state, err := os.MkdirTemp("", "egress-scale-")
	if err == nil {
		err = os.Chmod(state, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	discoveryArgs := []string{"--platform-loopback"}
	pprofAddr := ""
	if os.Getenv("SCALE_PROFILE_DIR") != "" {
		pprofAddr = freeAddress(t)
		discoveryArgs = append(discoveryArgs, "--pprof-bind-address="+pprofAddr)
	}
	stack, err := devenv.Up(context.Background(), devenv.Options{
		Root: root, StateDir: state, Progress: os.Stderr,
		ProviderArgs: append([]string{
			"--gcp-test-endpoint=" + fake.URL,
			// Creates are API writes and Compute calls, probes run on
			// workers of their own: 50 reconciles a second make 10 000
			// proxies in minutes without queueing probes behind them.
			"--max-reconcile-rate=50",
			"--poll=" + max(interval, 5*time.Minute).String(),
		}, strings.Fields(os.Getenv("SCALE_PROVIDER_ARGS"))...),
		// Ten XR reconciles at a time, not Crossplane's 100: each pool's
		// reconcile applies its 105 Proxies one after another, and with
		// all 96 pools of 10 000 applying at once each apply waited
		// about as long as the apiserver takes for 96 (1.4 s at its 70 a
		// second here), so every pool's and the fleet's reconcile ran past
		// Crossplane's 2-minute reconcile timeout and failed, over and
		// over, for the whole bring-up. docs/sizing.md says how to size it.
		CrossplaneArgs: append([]string{"--max-reconcile-rate=10"}, strings.Fields(os.Getenv("SCALE_CROSSPLANE_ARGS"))...),
		// The gateway dials the stand-in VMs on loopback (hidden flag).
		DiscoveryArgs: discoveryArgs,
	})
	if err != nil {
		t.Fatalf("bring-up: %v (logs in %s)", err, filepath.Join(state, "logs"))
	}
	t.Cleanup(func() {
		stack.Down()
		if t.Failed() || os.Getenv("SCALE_KEEP_STATE") != "" {
			t.Logf("logs kept in %s", filepath.Join(state, "logs"))
			return
		}
		_ = os.RemoveAll(state)
	})
	h, err := discoveryv1.NewHTTPClient(stack.DiscoveryCA)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{stack: stack, fake: fake, vms: v, disc: &discoveryv1.Client{BaseURL: stack.DiscoveryURL, Token: stack.Token, HTTP: h}, pprof: pprofAddr}
	e.setup(t)

	var rows []result
	for _, n := range sizes(t) {
		ok := t.Run(fmt.Sprintf("N=%d", n), func(t *testing.T) {
			rows = append(rows, e.measure(t, n, interval, steady, n <= rolloutMax))
		})
		if !ok {
			break
		}
	}
	e.report(t, rows, interval, steady)
}

func (e *env) setup(t *testing.T) {
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(e.stack.Config)
	if err != nil {
		t.Fatal(err)
	}
	e.cs = cs
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "scale-auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}},
			StringData: map[string]string{"username": username, "password": password}},
		&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: config}, Spec: v1alpha1.ProviderConfigSpec{
			Backend: v1alpha1.BackendGCP,
			GCP:     &v1alpha1.GCPBackend{Project: "scale-proj", Credentials: v1alpha1.GCPCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}},
		}},
	}
	for _, o := range objs {
		if err := e.stack.Client.Create(ctx, o); err != nil && !kerrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

func (e *env) measure(t *testing.T, n int, interval, steady time.Duration, rollout bool) result {
	ctx := context.Background()
	name := fmt.Sprintf("scale-%d", n)
	r := result{n: n, pools: (n + perPool - 1) / perPool}
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(fleetYAML(name, n, interval, "e2-micro")), &u.Object); err != nil {
		t.Fatal(err)
	}
	start := e.sample(t)
	applied := time.Now()
	if err := e.stack.Client.Create(ctx, u); err != nil {
		t.Fatalf("kubectl apply of a fleet of %d: %v", n, err)
	}
	progress := e.bringUp(t, n, start)
	e.waitReady(t, name, n, envDuration("SCALE_READY_TIMEOUT", 10*time.Minute+time.Duration(n)*120*time.Millisecond))
	r.ready = time.Since(applied)
	progress()
	progressf(t, "%d proxies in %d pools Ready in %.0fs", n, r.pools, r.ready.Seconds())

	held := e.acquire(t, name, n/leasesPerHot, &r)
	// The first verdicts' writes and the leases' summaries settle: a
	// proxy's latency moves by the median of its last three probes, so
	// the latencies of the busy bring-up take three intervals to go.
	time.Sleep(envDuration("SCALE_SETTLE", 3*interval+30*time.Second))

	before := e.sample(t)
	stopWatch, breaker := e.watchBreaker(name)
	changes := e.watchChanges(t, name)
	profiled := []func(){
		e.profile(t, fmt.Sprintf("discovery-steady-%s.pprof", name), steady-5*time.Second),
		e.profileAPIServer(t, fmt.Sprintf("apiserver-steady-%s.pprof", name), steady-5*time.Second),
	}
	time.Sleep(steady)
	for _, wait := range profiled {
		wait()
	}
	r.changed = changes()
	r.breakerOpen = breaker(stopWatch)
	after := e.sample(t)
	r.window = after.at.Sub(before.at)
	e.diff(&r, before, after)
	progressf(t, "steady window: cores %s", cores(before, after))
	opens := func(a, b sampled) float64 {
		return sum(a.xp, b.xp, "circuit_breaker_opens_total", func(map[string]string) (string, bool) { return "", true })[""]
	}
	r.opensBringUp, r.opensSteady = opens(start, before), opens(before, after)
	if r.opensSteady > 0 {
		t.Errorf("Crossplane's circuit breaker opened %.0f times on a steady fleet", r.opensSteady)
	}
	progressf(t, "steady %s: %.2f API requests per proxy per minute, %.2f Proxy status writes per proxy per hour, %.0f XR reconciles a minute",
		r.window.Round(time.Second), r.perProxyPerMinute(), r.proxyStatusWrites/float64(n)/r.window.Hours(), r.xrReconciles/r.window.Minutes())
	if len(r.breakerOpen) > 0 {
		t.Errorf("Crossplane's circuit breaker opened on a steady fleet: %v", r.breakerOpen)
	}
	e.probeAcquire(t, name, &r)
	// The probe spent the caller's request rate (100 a second, shared by
	// the API and the gateway): the gateway's 200 CONNECTs start with it
	// whole again, as they did before the probe.
	time.Sleep(2 * time.Second)
	e.throughGateway(t, name, &r)
	e.release(t, held)
	if rollout {
		e.rollOut(t, name, n, interval, &r)
	} else {
		r.rollout = "not run"
	}
	deleted := time.Now()
	if err := e.stack.Client.Delete(ctx, u); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Minute+time.Duration(n)*100*time.Millisecond, "the fleet, its pools, Proxies, Leases and VMs gone", func() (bool, string) {
		left := e.left(name)
		return left == "", left
	})
	r.deleted = time.Since(deleted)
	progressf(t, "the fleet, its %d pools, Proxies, Leases and VMs gone %.0fs after its delete", r.pools, r.deleted.Seconds())
	return r
}

// fleetStatus reads what waiting needs from the fleet.
func (e *env) fleetStatus(name string) (ready bool, readyN int64, msg string, err error) {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(fleetv1alpha1.SchemeGroupVersion.String())
	u.SetKind("ProxyFleet")
	if err := e.stack.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, u); err != nil {
		return false, 0, "", err
	}
	readyN, _, _ = unstructured.NestedInt64(u.Object, "status", "readyReplicas")
	h, _, _ := unstructured.NestedInt64(u.Object, "status", "healthyReplicas")
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Ready" {
			ready = m["status"] == "True"
			msg, _ = m["message"].(string)
		}
	}
	return ready, min(readyN, h), msg, nil
}

func (e *env) waitReady(t *testing.T, name string, n int, timeout time.Duration) {
	t.Helper()
	testbed.Eventually(t, timeout, fmt.Sprintf("fleet %s Ready with %d healthy proxies", name, n), func() (bool, string) {
		ready, readyN, msg, err := e.fleetStatus(name)
		if err != nil {
			return false, err.Error()
		}
		e.vms.mu.Lock()
		failed := e.vms.failed
		e.vms.mu.Unlock()
		if failed != nil {
			t.Fatalf("a stand-in VM could not listen: %v", failed)
		}
		return ready && readyN == int64(n), fmt.Sprintf("Ready %t (%s), %d of %d ready and healthy, %d VMs", ready, msg, readyN, n, e.vms.proxies.Len())
	})
}

// acquire takes 10 leases on each of hot proxies through the API (one
// sticky key per proxy), eight callers at once, and records p99.
func (e *env) acquire(t *testing.T, fleet string, hot int, r *result) []string {
	t.Helper()
	var mu sync.Mutex
	var took []time.Duration
	var ids []string
	byProxy := map[string]int{}
	began := time.Now()
	profiled := e.profile(t, fmt.Sprintf("discovery-acquire-%s.pprof", fleet), 20*time.Second)
	defer profiled()
	fanOut(hot, func(g int) {
		for j := range leasesPerHot {
			var l *discoveryv1.Lease
			d, err := paced(func() (err error) {
				l, err = e.disc.Acquire(context.Background(), discoveryv1.AcquireRequest{Fleet: ns + "/" + fleet,
					Holder: fmt.Sprintf("crawler-%d-%d", g, j), StickyKey: fmt.Sprintf("hot-%d", g), MaxWait: "0"})
				return err
			})
			mu.Lock()
			if err != nil {
				t.Errorf("acquire %d/%d: %v", g, j, err)
			} else {
				took = append(took, d)
				ids = append(ids, l.LeaseID)
				byProxy[l.Proxy]++
			}
			mu.Unlock()
		}
	})
	r.fillP99 = testbed.P99(took)
	progressf(t, "%d leases on %d proxies through the API in %.0fs: p99 %s", len(ids), len(byProxy), time.Since(began).Seconds(), r.fillP99)
	return ids
}

// probeAcquire makes the same work at every size, with the fleet's
// leases held and the fleet steady: 200 acquisitions through the API,
// eight callers at once, each released before that caller's next; and
// records their p99. Filling the fleet with its leases takes n
// acquisitions as fast as they go, whose p99 grows with the load they
// make themselves (n leases in a few seconds, each a Lease written, each
// summary rewritten) and with how many there are to take the tail of:
// not what a crawler of a large fleet waits.
func (e *env) probeAcquire(t *testing.T, fleet string, r *result) {
	t.Helper()
	var mu sync.Mutex
	var took []time.Duration
	fanOut(200, func(i int) {
		var l *discoveryv1.Lease
		d, err := paced(func() (err error) {
			l, err = e.disc.Acquire(context.Background(), discoveryv1.AcquireRequest{Fleet: ns + "/" + fleet, Holder: fmt.Sprintf("probe-%d", i), MaxWait: "0"})
			return err
		})
		if err != nil {
			t.Errorf("probe acquire %d: %v", i, err)
			return
		}
		mu.Lock()
		took = append(took, d)
		mu.Unlock()
		if _, err := paced(func() error { return e.disc.Release(context.Background(), l.LeaseID) }); err != nil {
			t.Errorf("probe release %s: %v", l.LeaseID, err)
		}
	})
	r.acquireP99 = testbed.P99(took)
	progressf(t, "200 acquisitions with the fleet's leases held: p99 %s", r.acquireP99)
}

// fanOut calls do for 0 to n-1, eight callers at once (as many crawlers).
func fanOut(n int, do func(i int)) {
	work := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				do(i)
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
}

// paced calls fn until discovery's per-caller request rate (100 a second
// by default) lets it through, and returns how long the call that went
// through took: the rate limit is the caller's policy, not latency.
func paced(fn func() error) (time.Duration, error) {
	for attempt := 0; ; attempt++ {
		t0 := time.Now()
		err := fn()
		took := time.Since(t0)
		var ae *discoveryv1.APIError
		if attempt < 50 && errors.As(err, &ae) && ae.Status == http.StatusTooManyRequests && strings.Contains(ae.Detail.Message, "requests a second") {
			time.Sleep(time.Second)
			continue
		}
		return took, err
	}
}

func (e *env) release(t *testing.T, ids []string) {
	t.Helper()
	fanOut(len(ids), func(i int) {
		if _, err := paced(func() error { return e.disc.Release(context.Background(), ids[i]) }); err != nil {
			t.Errorf("release %s: %v", ids[i], err)
		}
	})
}

// throughGateway opens 200 connections through the gateway one after
// another, each a CONNECT without a session to the probe target, and
// records the p99 of the time to its 200.
func (e *env) throughGateway(t *testing.T, fleet string, r *result) {
	t.Helper()
	pem, err := os.ReadFile(e.stack.DiscoveryCA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(ns+"_"+fleet+":"+e.stack.Token))
	targetPEM, err := os.ReadFile(e.stack.TargetCA)
	if err != nil {
		t.Fatal(err)
	}
	targetCAs := x509.NewCertPool()
	targetCAs.AppendCertsFromPEM(targetPEM)
	ips := map[string]int{}
	var took []time.Duration
	for i := range 200 {
		t0 := time.Now()
		c, err := tls.Dial("tcp", e.stack.GatewayAddress, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
		if err != nil {
			t.Fatalf("gateway connection %d: %v", i, err)
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\n\r\n", devenv.TargetAddress, devenv.TargetAddress, auth)
		rsp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || rsp.StatusCode != http.StatusOK {
			_ = c.Close()
			t.Fatalf("gateway CONNECT %d: %v %v", i, rsp, err)
		}
		took = append(took, time.Since(t0))
		// A fetch through the tunnel: the answer is the proxy's egress IP.
		tc := tls.Client(c, &tls.Config{RootCAs: targetCAs, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
		fmt.Fprintf(tc, "GET /ip HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", devenv.TargetAddress)
		got, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			_ = c.Close()
			t.Fatalf("fetch %d through the gateway: %v", i, err)
		}
		b, _ := io.ReadAll(got.Body)
		_ = c.Close()
		ips[strings.TrimSpace(string(b))]++
	}
	r.gatewayP99 = testbed.P99(took)
	progressf(t, "200 gateway CONNECTs: p99 %s, from %d egress IPs", r.gatewayP99, len(ips))
}

// rollOut changes the template (the machine type) and waits until every
// proxy runs on it, sampling the Proxies' Ready count against the floor.
func (e *env) rollOut(t *testing.T, name string, n int, interval time.Duration, r *result) {
	t.Helper()
	ctx := context.Background()
	floor := n - maxUnavailable(n)
	patch := []byte(`{"spec":{"placement":{"gcp":{"machineType":"e2-small"}}}}`)
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(fleetv1alpha1.SchemeGroupVersion.String())
	u.SetKind("ProxyFleet")
	u.SetNamespace(ns)
	u.SetName(name)
	began := time.Now()
	if err := e.stack.Client.Patch(ctx, u, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	lowest, samples, most := n, 0, 0
	// Every few seconds, not testbed's 100 ms: listing a thousand Proxies
	// ten times a second would be most of the load being measured.
	testbed.EventuallyEvery(t, 20*time.Minute+time.Duration(n)*time.Second, 3*time.Second, "every proxy on the new machine type", func() (bool, string) {
		l := &v1alpha1.ProxyList{}
		if err := e.stack.Client.List(ctx, l, client.InNamespace(ns), client.MatchingLabels{fleetv1alpha1.LabelFleet: name}); err != nil {
			return false, err.Error()
		}
		ready, updated, live := 0, 0, 0
		for _, p := range l.Items {
			if p.DeletionTimestamp == nil {
				live++
			}
			c := p.GetCondition(xpv2.TypeReady)
			// A Proxy being deleted serves no one, Ready or not.
			if c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
				ready++
			}
			if p.Spec.ForProvider.GCP != nil && p.Spec.ForProvider.GCP.MachineType == "e2-small" && c.Status == corev1.ConditionTrue {
				updated++
			}
		}
		samples++
		lowest, most = min(lowest, ready), max(most, live)
		ok, _, _, _ := e.fleetStatus(name)
		return updated == n && live == n && ok, fmt.Sprintf("%d of %d updated and Ready, %d Ready, %d live", updated, n, ready, live)
	})
	r.rollout = fmt.Sprintf("%.0f s, lowest Ready %d (floor %d) over %d samples, at most %d proxies (%d + maxSurge %d)",
		time.Since(began).Seconds(), lowest, floor, samples, most, n, maxSurge)
	progressf(t, "rollout: %s", r.rollout)
	if lowest < floor {
		t.Errorf("the rollout dropped to %d Ready proxies, below the floor of %d", lowest, floor)
	}
	if most > n+maxSurge {
		t.Errorf("the rollout made %d proxies at once, above %d + maxSurge %d", most, n, maxSurge)
	}
}

// left names what is left of a deleted fleet, or "".
func (e *env) left(fleet string) string {
	ctx := context.Background()
	var left []string
	sel := client.MatchingLabels{fleetv1alpha1.LabelFleet: fleet}
	l := &v1alpha1.ProxyList{}
	if err := e.stack.Client.List(ctx, l, client.InNamespace(ns), sel); err != nil || len(l.Items) > 0 {
		left = append(left, fmt.Sprintf("%d Proxies (%v)", len(l.Items), err))
	}
	pl := &unstructured.UnstructuredList{}
	pl.SetAPIVersion(fleetv1alpha1.SchemeGroupVersion.String())
	pl.SetKind(fleetv1alpha1.ProxyPoolKind + "List")
	if err := e.stack.Client.List(ctx, pl, client.InNamespace(ns), sel); err != nil || len(pl.Items) > 0 {
		left = append(left, fmt.Sprintf("%d pools (%v)", len(pl.Items), err))
	}
	if ls, err := e.stack.Leases(ctx, ns, fleet); err != nil || len(ls) > 0 {
		left = append(left, fmt.Sprintf("%d Leases (%v)", len(ls), err))
	}
	if n := e.fake.Instances(); n > 0 {
		left = append(left, fmt.Sprintf("%d VMs", n))
	}
	if n := e.vms.proxies.Len(); n > 0 {
		left = append(left, fmt.Sprintf("%d stand-in proxies", n))
	}
	return strings.Join(left, ", ")
}

// maxUnavailable is the fleets' rollout budget: 5%, within the XRD's
// bound of 100 (a fleet of 10 000 may take out 100 at a time).
func maxUnavailable(n int) int { return min(max(1, n/20), 100) }

// freeAddress is a loopback address no one listens on now.
func freeAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close() //nolint:errcheck // Only its port was wanted.
	return l.Addr().String()
}

// profile records egress-discovery's CPU for d into SCALE_PROFILE_DIR/name
// (go tool pprof reads it), when that is set; the returned func waits for
// the profile to be written.
func (e *env) profile(t *testing.T, name string, d time.Duration) func() {
	t.Helper()
	if e.pprof == "" {
		return func() {}
	}
	return e.record(t, "egress-discovery", name, func() ([]byte, error) {
		rsp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", e.pprof, int(d.Seconds()))) //nolint:gosec,noctx // The test's own loopback address.
		if err != nil {
			return nil, err
		}
		defer rsp.Body.Close() //nolint:errcheck // Read to the end.
		b, err := io.ReadAll(rsp.Body)
		if err == nil && rsp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s: %s", rsp.Status, b)
		}
		return b, err
	})
}

// profileAPIServer records kube-apiserver's CPU for d (its own
// /debug/pprof, which the admin's client may read) into
// SCALE_PROFILE_DIR/name, when that is set.
func (e *env) profileAPIServer(t *testing.T, name string, d time.Duration) func() {
	t.Helper()
	return e.record(t, "kube-apiserver", name, func() ([]byte, error) {
		return e.cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
			Param("seconds", strconv.Itoa(int(d.Seconds()))).Timeout(d + time.Minute).DoRaw(context.Background())
	})
}

// record writes what get returns into SCALE_PROFILE_DIR/name in the
// background, when that is set; the returned func waits for it.
func (e *env) record(t *testing.T, who, name string, get func() ([]byte, error)) func() {
	t.Helper()
	dir := os.Getenv("SCALE_PROFILE_DIR")
	if dir == "" {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		b, err := get()
		if err == nil {
			err = os.MkdirAll(dir, 0o755)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, name), b, 0o644) //nolint:gosec // A profile.
		}
		if err != nil {
			t.Logf("profile %s: %v", name, err)
			return
		}
		t.Logf("%s's CPU profile of %s: %s", who, strings.TrimSuffix(name, ".pprof"), filepath.Join(dir, name))
	}()
	return func() { <-done }
}
