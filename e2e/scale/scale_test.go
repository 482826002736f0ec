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
// SCALE_PROFILE_DIR (egress-discovery's CPU profile of each acquisition
// goes there),
// SCALE_STEADY (the steady window, default 5m), SCALE_INTERVAL (each
// proxy's probe interval, default 60s), SCALE_SETTLE (from the leases
// taken to the window, default three intervals and 30 s),
// SCALE_READY_TIMEOUT (apply to Ready, default 10 minutes and 120 ms a
// proxy), SCALE_ROLLOUT_MAX (the largest
// size a template change is rolled over, default 1000), SCALE_OUT (where
// the table goes, default _output/scale.md).
package scale

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
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
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
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
		ProviderArgs: []string{
			"--gcp-test-endpoint=" + fake.URL,
			// Creates are API writes and Compute calls, probes run on
			// workers of their own: 50 reconciles a second make 10 000
			// proxies in minutes without queueing probes behind them.
			"--max-reconcile-rate=50",
			"--poll=" + max(interval, 5*time.Minute).String(),
		},
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

// result is what one size measured.
type result struct {
	n                         int
	pools                     int
	ready                     time.Duration // apply -> every proxy Ready and the fleet Ready
	window                    time.Duration
	requests                  map[string]float64 // verb resource -> requests in the window
	proxyStatusWrites         float64
	xrReconciles              float64
	xrReconcileP99            map[string]float64 // "fleet" or "pool" -> seconds
	runP99                    map[string]float64
	largest                   map[string]float64 // kind direction -> bytes
	cpu                       map[string]float64 // component -> cores over the window
	rss                       map[string]float64 // component -> bytes at the end
	breakerOpen               []string
	opensBringUp, opensSteady float64 // circuit_breaker_opens_total from apply to the window, and in it
	// fillP99 is the p99 of taking the held leases (n of them, all at
	// once); acquireP99 that of the same 200 acquisitions at every size,
	// made once they are held and the fleet is steady.
	fillP99, acquireP99, gatewayP99 time.Duration
	rollout                         string
	changed                         map[string]int // what the Proxies' updates in the window changed
	deleted                         time.Duration
}

func (r result) perProxyPerMinute() float64 {
	var total float64
	for _, v := range r.requests {
		total += v
	}
	return total / float64(r.n) / r.window.Minutes()
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
	e.waitReady(t, name, n, envDuration("SCALE_READY_TIMEOUT", 10*time.Minute+time.Duration(n)*120*time.Millisecond))
	r.ready = time.Since(applied)
	t.Logf("%d proxies in %d pools Ready in %.0fs", n, r.pools, r.ready.Seconds())

	held := e.acquire(t, name, n/leasesPerHot, &r)
	// The first verdicts' writes and the leases' summaries settle: a
	// proxy's latency moves by the median of its last three probes, so
	// the latencies of the busy bring-up take three intervals to go.
	time.Sleep(envDuration("SCALE_SETTLE", 3*interval+30*time.Second))

	before := e.sample(t)
	stopWatch, breaker := e.watchBreaker(name)
	changes := e.watchChanges(t, name)
	time.Sleep(steady)
	r.changed = changes()
	r.breakerOpen = breaker(stopWatch)
	after := e.sample(t)
	r.window = after.at.Sub(before.at)
	e.diff(&r, before, after)
	opens := func(a, b sampled) float64 {
		return sum(a.xp, b.xp, "circuit_breaker_opens_total", func(map[string]string) (string, bool) { return "", true })[""]
	}
	r.opensBringUp, r.opensSteady = opens(start, before), opens(before, after)
	if r.opensSteady > 0 {
		t.Errorf("Crossplane's circuit breaker opened %.0f times on a steady fleet", r.opensSteady)
	}
	t.Logf("steady %s: %.2f API requests per proxy per minute, %.2f Proxy status writes per proxy per hour, %.0f XR reconciles a minute",
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
	r.fillP99 = p99(took)
	t.Logf("%d leases on %d proxies through the API in %.0fs: p99 %s", len(ids), len(byProxy), time.Since(began).Seconds(), r.fillP99)
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
	r.acquireP99 = p99(took)
	t.Logf("200 acquisitions with the fleet's leases held: p99 %s", r.acquireP99)
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
	r.gatewayP99 = p99(took)
	t.Logf("200 gateway CONNECTs: p99 %s, from %d egress IPs", r.gatewayP99, len(ips))
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
	t.Logf("rollout: %s", r.rollout)
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

// watchChanges watches the fleet's Proxies and counts, for each update,
// what it changed: status fields, conditions (by type), labels and
// annotations, the spec. It says which transitions the steady fleet's
// writes are.
func (e *env) watchChanges(t *testing.T, fleet string) func() map[string]int {
	t.Helper()
	dc, err := dynamic.NewForConfig(e.stack.Config)
	if err != nil {
		t.Fatal(err)
	}
	gvr := v1alpha1.SchemeGroupVersion.WithResource("proxies")
	ctx, cancel := context.WithCancel(context.Background())
	l, err := dc.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: fleetv1alpha1.LabelFleet + "=" + fleet})
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]map[string]string{}
	for _, p := range l.Items {
		last[p.GetName()] = flatten(p.Object)
	}
	w, err := dc.Resource(gvr).Namespace(ns).Watch(ctx, metav1.ListOptions{LabelSelector: fleetv1alpha1.LabelFleet + "=" + fleet, ResourceVersion: l.GetResourceVersion()})
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			now := flatten(u.Object)
			prev := last[u.GetName()]
			last[u.GetName()] = now
			if ev.Type != watch.Modified || prev == nil {
				counts[string(ev.Type)]++
				continue
			}
			for k, v := range now {
				if prev[k] != v {
					counts[k]++
				}
			}
			for k := range prev {
				if _, ok := now[k]; !ok {
					counts[k]++
				}
			}
		}
	}()
	return func() map[string]int {
		cancel()
		w.Stop()
		<-done
		return counts
	}
}

// flatten names what an update may change: each status field and
// condition, each label and annotation, and the spec as one.
func flatten(o map[string]any) map[string]string {
	out := map[string]string{}
	at, _, _ := unstructured.NestedMap(o, "status", "atProvider")
	for k, v := range at {
		out["status.atProvider."+k] = fmt.Sprint(v)
	}
	conds, _, _ := unstructured.NestedSlice(o, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		out[fmt.Sprintf("condition %v", m["type"])] = fmt.Sprint(m["status"], m["reason"], m["message"])
	}
	for _, f := range []string{"labels", "annotations"} {
		m, _, _ := unstructured.NestedStringMap(o, "metadata", f)
		for k, v := range m {
			out["metadata."+f+"."+k] = v
		}
	}
	spec, _, _ := unstructured.NestedMap(o, "spec")
	out["spec"] = fmt.Sprint(spec)
	return out
}

// watchBreaker samples the fleet's and its pools' Responsive conditions
// every 15 s until stopped, and returns what it saw open.
func (e *env) watchBreaker(fleet string) (chan struct{}, func(chan struct{}) []string) {
	stop := make(chan struct{})
	done := make(chan []string)
	go func() {
		seen := map[string]bool{}
		for {
			for _, kind := range []string{"ProxyFleet", fleetv1alpha1.ProxyPoolKind} {
				l := &unstructured.UnstructuredList{}
				l.SetAPIVersion(fleetv1alpha1.SchemeGroupVersion.String())
				l.SetKind(kind + "List")
				if err := e.stack.Client.List(context.Background(), l, client.InNamespace(ns)); err != nil {
					continue
				}
				for _, x := range l.Items {
					conds, _, _ := unstructured.NestedSlice(x.Object, "status", "conditions")
					for _, c := range conds {
						m, _ := c.(map[string]any)
						if m["type"] == "Responsive" && m["status"] == "False" {
							msg, _ := m["message"].(string)
							seen[kind+" "+x.GetName()+": "+msg] = true
						}
					}
				}
			}
			select {
			case <-stop:
				out := make([]string, 0, len(seen))
				for s := range seen {
					out = append(out, s)
				}
				sort.Strings(out)
				done <- out
				return
			case <-time.After(15 * time.Second):
			}
		}
	}()
	return stop, func(stop chan struct{}) []string {
		close(stop)
		return <-done
	}
}

// sampled is one reading of every counter the window compares.
type sampled struct {
	at  time.Time
	api metrics
	xp  metrics
	fn  metrics
	cpu map[string]float64 // seconds
	rss map[string]float64
}

var components = []string{"kube-apiserver", "etcd", "crossplane", "provider-egressproxy", "function-proxyfleet", "egress-discovery"}

func (e *env) sample(t *testing.T) sampled {
	t.Helper()
	s := sampled{at: time.Now(), cpu: map[string]float64{}, rss: map[string]float64{}}
	body, err := e.cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.api = parseMetrics(string(body))
	for comp, dst := range map[string]*metrics{"crossplane": &s.xp, "function-proxyfleet": &s.fn} {
		url, err := e.stack.MetricsURL(comp)
		if err != nil {
			t.Fatal(err)
		}
		rsp, err := http.Get(url) //nolint:noctx // A test's scrape.
		if err != nil {
			t.Fatal(err)
		}
		b := new(strings.Builder)
		_, _ = bufio.NewReader(rsp.Body).WriteTo(b)
		_ = rsp.Body.Close()
		*dst = parseMetrics(b.String())
	}
	procs := e.stack.Processes()
	// envtest starts etcd and kube-apiserver as this process's children.
	for _, c := range []string{"kube-apiserver", "etcd"} {
		if procs[c] == 0 {
			procs[c] = childPID(c)
		}
	}
	for _, c := range components {
		cpu, rss, err := procStat(procs[c])
		if err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		s.cpu[c], s.rss[c] = cpu, rss
	}
	return s
}

// childPID is the process ID of this process's child named name, or 0.
func childPID(name string) int {
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open || s[open+1:end] != name {
			continue
		}
		f := strings.Fields(s[end+2:])
		if ppid, _ := strconv.Atoi(f[1]); ppid == os.Getpid() {
			pid, _ := strconv.Atoi(strings.TrimSpace(s[:open]))
			return pid
		}
	}
	return 0
}

// procStat is a process's CPU time (user + system, seconds) and resident
// memory (bytes).
func procStat(pid int) (float64, float64, error) {
	if pid == 0 {
		return 0, 0, fmt.Errorf("not running")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// Fields after the command name in parentheses.
	f := strings.Fields(string(b)[strings.LastIndexByte(string(b), ')')+2:])
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	rssPages, _ := strconv.ParseFloat(f[21], 64)
	return (utime + stime) / 100, rssPages * float64(os.Getpagesize()), nil
}

// metrics are samples of the Prometheus text format: name{labels} -> value.
type metrics map[string]float64

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([^ ]+)`)

func parseMetrics(text string) metrics {
	m := metrics{}
	for _, line := range strings.Split(text, "\n") {
		g := sampleLine.FindStringSubmatch(line)
		if g == nil {
			continue
		}
		v, err := strconv.ParseFloat(g[3], 64)
		if err == nil {
			m[g[1]+g[2]] = v
		}
	}
	return m
}

var labelRE = regexp.MustCompile(`([a-zA-Z_]+)="([^"]*)"`)

func labels(key string) (string, map[string]string) {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return key, nil
	}
	out := map[string]string{}
	for _, g := range labelRE.FindAllStringSubmatch(key[i:], -1) {
		out[g[1]] = g[2]
	}
	return key[:i], out
}

// sum adds the deltas of name's samples for which keep says yes, grouped
// by group.
func sum(before, after metrics, name string, keep func(map[string]string) (string, bool)) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		n, l := labels(k)
		if n != name {
			continue
		}
		if g, ok := keep(l); ok {
			out[g] += v - before[k]
		}
	}
	return out
}

// quantile estimates q of a histogram's deltas between two samples as
// Prometheus' histogram_quantile does: linearly within the bucket it falls
// in (the bucket's lower bound when that is +Inf).
func quantile(before, after metrics, name string, match func(map[string]string) bool, q float64) float64 {
	type bucket struct{ le, count float64 }
	var bs []bucket
	for k, v := range after {
		n, l := labels(k)
		if n != name+"_bucket" || !match(l) {
			continue
		}
		le, err := strconv.ParseFloat(l["le"], 64)
		if l["le"] == "+Inf" {
			le, err = math.Inf(1), nil
		}
		if err != nil {
			continue
		}
		bs = append(bs, bucket{le, v - before[k]})
	}
	merged := map[float64]float64{}
	for _, b := range bs {
		merged[b.le] += b.count
	}
	bs = bs[:0]
	for le, c := range merged {
		bs = append(bs, bucket{le, c})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	if len(bs) == 0 || bs[len(bs)-1].count == 0 {
		return 0
	}
	want := q * bs[len(bs)-1].count
	lower, below := 0.0, 0.0
	for _, b := range bs {
		if b.count >= want {
			if math.IsInf(b.le, 1) || b.count == below {
				return lower
			}
			return lower + (b.le-lower)*(want-below)/(b.count-below)
		}
		lower, below = b.le, b.count
	}
	return lower
}

func (e *env) diff(r *result, before, after sampled) {
	r.requests = sum(before.api, after.api, "apiserver_request_total", func(l map[string]string) (string, bool) {
		res := l["resource"]
		if l["subresource"] != "" {
			res += "/" + l["subresource"]
		}
		return l["verb"] + " " + res, true
	})
	r.proxyStatusWrites = 0
	for k, v := range r.requests {
		if k == "PUT proxies/status" || k == "PATCH proxies/status" || k == "APPLY proxies/status" {
			r.proxyStatusWrites += v
		}
	}
	composite := func(l map[string]string) bool { return strings.HasPrefix(l["controller"], "composite/") }
	xr := sum(before.xp, after.xp, "controller_runtime_reconcile_total", func(l map[string]string) (string, bool) { return "", composite(l) })
	r.xrReconciles = xr[""]
	r.xrReconcileP99 = map[string]float64{}
	for level, plural := range map[string]string{"fleet": "proxyfleets.", "pool": "proxypools."} {
		r.xrReconcileP99[level] = quantile(before.xp, after.xp, "controller_runtime_reconcile_time_seconds", func(l map[string]string) bool {
			return composite(l) && strings.Contains(l["controller"], plural)
		}, 0.99)
	}
	r.runP99 = map[string]float64{}
	for _, kind := range []string{"ProxyFleet", fleetv1alpha1.ProxyPoolKind} {
		r.runP99[kind] = quantile(before.fn, after.fn, "function_proxyfleet_run_seconds", func(l map[string]string) bool { return l["kind"] == kind }, 0.99)
	}
	r.largest = map[string]float64{}
	for k, v := range after.fn {
		if n, l := labels(k); n == "function_proxyfleet_largest_message_bytes" {
			r.largest[l["kind"]+" "+l["direction"]] = v
		}
	}
	r.cpu, r.rss = map[string]float64{}, after.rss
	for _, c := range components {
		r.cpu[c] = (after.cpu[c] - before.cpu[c]) / after.at.Sub(before.at).Seconds()
	}
}

func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(math.Ceil(0.99*float64(len(s))))-1)]
}

// report writes the table BENCHMARKS.md quotes and checks the goals that
// compare sizes.
func (e *env) report(t *testing.T, rows []result, interval, steady time.Duration) {
	if len(rows) == 0 {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "make scale, %s: probe interval %s, steady window %s; Crossplane's circuit breaker at devenv's burst 1000, refill 10/s; p99s interpolated within histogram buckets; the largest messages are the largest since the function started (sizes run in ascending order)\n\n",
		time.Now().UTC().Format("2006-01-02"), interval, steady)
	fmt.Fprintln(&b, "| proxies | pools | apply -> Ready | API requests / proxy / min | Proxy status writes / proxy / h | XR reconciles / min | XR reconcile p99 fleet / pool | RunFunction p99 fleet / pool | largest request / response | circuit breaker | acquire p99 API steady (filling) / gateway | rollout | delete |")
	fmt.Fprintln(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		breaker := fmt.Sprintf("opened %.0f times steady, %.0f bringing up", r.opensSteady, r.opensBringUp)
		if len(r.breakerOpen) > 0 {
			breaker += fmt.Sprintf("; %d XRs seen not Responsive", len(r.breakerOpen))
		}
		req := max(r.largest["ProxyFleet request"], r.largest[fleetv1alpha1.ProxyPoolKind+" request"])
		rsp := max(r.largest["ProxyFleet response"], r.largest[fleetv1alpha1.ProxyPoolKind+" response"])
		fmt.Fprintf(&b, "| %d | %d | %.0f s | %.2f | %.2f | %.0f | %.2g / %.2g s | %.2g / %.2g s | %.0f / %.0f KB | %s | %s (%s) / %s | %s | %.0f s |\n",
			r.n, r.pools, r.ready.Seconds(), r.perProxyPerMinute(), r.proxyStatusWrites/float64(r.n)/r.window.Hours(),
			r.xrReconciles/r.window.Minutes(), r.xrReconcileP99["fleet"], r.xrReconcileP99["pool"], r.runP99["ProxyFleet"], r.runP99[fleetv1alpha1.ProxyPoolKind],
			req/1024, rsp/1024, breaker, r.acquireP99.Round(time.Millisecond), r.fillP99.Round(time.Millisecond), r.gatewayP99.Round(time.Millisecond), r.rollout, r.deleted.Seconds())
	}
	fmt.Fprint(&b, "\nCPU (cores) and resident memory (MiB) over the steady window:\n\n")
	fmt.Fprintf(&b, "| proxies | %s |\n|---|%s\n", strings.Join(components, " | "), strings.Repeat("---|", len(components)))
	for _, r := range rows {
		var cells []string
		for _, c := range components {
			cells = append(cells, fmt.Sprintf("%.2f / %.0f", r.cpu[c], r.rss[c]/(1<<20)))
		}
		fmt.Fprintf(&b, "| %d | %s |\n", r.n, strings.Join(cells, " | "))
	}
	fmt.Fprint(&b, "\nWhat the Proxies' updates in the window changed (updates per proxy per hour):\n\n")
	for _, r := range rows {
		keys := make([]string, 0, len(r.changed))
		for k := range r.changed {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return r.changed[keys[i]] > r.changed[keys[j]] })
		var cells []string
		for _, k := range keys {
			cells = append(cells, fmt.Sprintf("%s %.2f", k, float64(r.changed[k])/float64(r.n)/r.window.Hours()))
		}
		fmt.Fprintf(&b, "- %d: %s\n", r.n, strings.Join(cells, ", "))
	}
	fmt.Fprint(&b, "\nAPI requests in the window by verb and resource, per proxy per minute (those above 0.01):\n\n")
	for _, r := range rows {
		keys := make([]string, 0, len(r.requests))
		for k, v := range r.requests {
			if v/float64(r.n)/r.window.Minutes() > 0.01 {
				keys = append(keys, k)
			}
		}
		sort.Slice(keys, func(i, j int) bool { return r.requests[keys[i]] > r.requests[keys[j]] })
		var cells []string
		for _, k := range keys {
			cells = append(cells, fmt.Sprintf("%s %.2f", k, r.requests[k]/float64(r.n)/r.window.Minutes()))
		}
		fmt.Fprintf(&b, "- %d: %s\n", r.n, strings.Join(cells, ", "))
	}
	out := os.Getenv("SCALE_OUT")
	if out == "" {
		out = filepath.Join("..", "..", "_output", "scale.md")
	}
	_ = os.MkdirAll(filepath.Dir(out), 0o755)
	if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil { //nolint:gosec // A report.
		t.Error(err)
	}
	t.Logf("\n%s\n(written to %s)", b.String(), out)

	first, last := rows[0], rows[len(rows)-1]
	if last.n >= 10*first.n {
		if x := last.perProxyPerMinute() / first.perProxyPerMinute(); x > 1.2 {
			t.Errorf("API requests per proxy per minute at %d are %.2fx those at %d: the goal is linear, within 1.2x", last.n, x, first.n)
		}
		for _, c := range []string{"crossplane", "provider-egressproxy", "egress-discovery"} {
			if x := (last.rss[c] / float64(last.n)) / (first.rss[c] / float64(first.n)); x > 1.5 {
				t.Logf("note: %s's memory per proxy at %d is %.2fx that at %d (goal 1.5x; a process's base memory dominates at small sizes)", c, last.n, x, first.n)
			}
		}
		if x := float64(last.acquireP99) / float64(first.acquireP99); x > 1.5 {
			t.Errorf("acquisition p99 (200 acquisitions, the fleet's leases held) at %d is %.2fx that at %d: the goal is 1.5x", last.n, x, first.n)
		}
		t.Logf("filling the fleet with its leases: p99 at %d is %.2fx that at %d (%d against %d acquisitions, each size's own load)",
			last.n, float64(last.fillP99)/float64(first.fillP99), first.n, last.n, first.n)
	}
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
	dir := os.Getenv("SCALE_PROFILE_DIR")
	if dir == "" || e.pprof == "" {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		rsp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", e.pprof, int(d.Seconds()))) //nolint:gosec,noctx // The test's own loopback address.
		if err != nil {
			t.Logf("profile %s: %v", name, err)
			return
		}
		defer rsp.Body.Close() //nolint:errcheck // Read to the end.
		b, err := io.ReadAll(rsp.Body)
		if err == nil && rsp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s: %s", rsp.Status, b)
		}
		if err == nil {
			_ = os.MkdirAll(dir, 0o755)
			err = os.WriteFile(filepath.Join(dir, name), b, 0o644) //nolint:gosec // A profile.
		}
		if err != nil {
			t.Logf("profile %s: %v", name, err)
			return
		}
		t.Logf("egress-discovery's CPU profile of %s: %s", strings.TrimSuffix(name, ".pprof"), filepath.Join(dir, name))
	}()
	return func() { <-done }
}
