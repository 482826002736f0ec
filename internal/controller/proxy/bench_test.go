package proxy_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// recorder wraps the real prober and notes when each probe started.
type recorder struct {
	probe.Prober
	mu    sync.Mutex
	times map[string][]time.Time
}

func (r *recorder) Probe(ctx context.Context, t probe.Target) probe.Result {
	r.mu.Lock()
	r.times[t.Proxy] = append(r.times[t.Proxy], time.Now())
	r.mu.Unlock()
	return r.Prober.Probe(ctx, t)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkProbeFleet runs the provider against the real apiserver with
// BENCH_PROXIES (default 1000) External Proxies on in-process CONNECT
// proxies, each probed every BENCH_INTERVAL seconds (default 30) with a 5 s
// timeout, and measures BENCH_CYCLES cycles twice in the same run: with
// every proxy answering, then with BENCH_HOLES percent (default 10) of them
// black-holed (they accept and never answer). Each window first creates
// and deletes local Proxies (real Squids) one after another for one
// interval and times them, then measures CPU on probes alone. It reports the provider process's CPU per probe against the same probes run
// bare in the same process (an upper bound: the in-process proxies and
// target count too), how late probes started against their interval, and
// how long creates and deletes took.
func BenchmarkProbeFleet(b *testing.B) {
	n := envInt("BENCH_PROXIES", 1000)
	every := time.Duration(envInt("BENCH_INTERVAL", 30)) * time.Second
	cycles := envInt("BENCH_CYCLES", 3)
	holes := n * envInt("BENCH_HOLES", 10) / 100
	timeout := min(5*time.Second, every/2)
	ctx := context.Background()
	target := testbed.StartEchoTarget(b)
	cp := testbed.StartConnectProxies(b, n, "crawler", password)

	// Baseline: the same probes, bare, one after another, each with the
	// closure check the provider makes with it; the second of two rounds,
	// as the first pays for warming the process up.
	pr := probe.Prober{}
	var bareCPU time.Duration
	for range 2 {
		before := testbed.ProcessCPU(b)
		for _, a := range cp.Addrs {
			t := probe.Target{Proxy: a, Username: "crawler", Password: password, URL: target.URL, RootCAs: target.RootCAs}
			if r := pr.Probe(ctx, t); !r.OK {
				b.Fatalf("baseline probe through %s: %s", a, r.Error)
			}
			if c, detail := pr.Closed(ctx, t); c != probe.ClosureClosed {
				b.Fatalf("baseline closure check through %s: %s", a, detail)
			}
		}
		bareCPU = (testbed.ProcessCPU(b) - before) / time.Duration(n)
	}

	bed := sharedBed.Env(b)
	ns := bed.Namespace(b)
	for _, o := range []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "crawler", "password": password}},
		&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "local-" + ns}, Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal,
			Policy: &v1alpha1.Policy{Local: &v1alpha1.LocalPolicy{AllowLoopbackDestinations: true}}}},
	} {
		if err := bed.Client.Create(ctx, o); err != nil {
			b.Fatal(err)
		}
	}
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i, a := range cp.Addrs {
		p := externalProxy(ns, fmt.Sprintf("p%04d", i), a, target, timeout)
		p.Spec.ForProvider.HealthCheck.Interval.Duration = every
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := bed.Client.Create(ctx, p); err != nil {
				b.Error(err)
			}
		}()
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}

	rec := &recorder{times: map[string][]time.Time{}}
	b.ResetTimer()
	prov := startProvider(b, testbed.SquidStateDir(b), providerLogs(b), target, func(o *proxy.Options) {
		o.Prober = rec
		o.MaxConcurrentReconciles = 10
		o.PollInterval = 5 * time.Minute // the provider's default --poll
	})
	defer prov.stop()

	testbed.Eventually(b, 5*time.Minute, "every proxy probed once (warm-up)", func() (bool, string) {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.times) == n, fmt.Sprintf("%d of %d proxies probed", len(rec.times), n)
	})
	// One more interval, for the first verdicts' status writes and Events
	// to settle: the window measures a steady fleet.
	time.Sleep(every)
	healthy := measureWindow(b, rec, ns, target, "healthy", time.Duration(cycles)*every, every, bareCPU, 0)
	for i := range holes {
		cp.BlackHole(i*n/holes, true)
	}
	// Until every black-holed proxy has failed its three probes (the
	// default failureThreshold) and turned unhealthy: the window then sees
	// them hang throughout, in their steady state.
	time.Sleep(3 * every)
	holed := measureWindow(b, rec, ns, target, fmt.Sprintf("%d black-holed", holes), time.Duration(cycles)*every, every, bareCPU, 100)

	b.ReportMetric(float64(healthy.perProbe)/float64(bareCPU), "x-bare")
	b.ReportMetric(float64(holed.perProbe)/float64(bareCPU), "x-bare-holed")
	b.ReportMetric(float64(holed.maxLate.Milliseconds()), "max-late-ms-holed")
	b.ReportMetric(float64((holed.maxOp - healthy.maxOp).Milliseconds()), "op-delay-ms-holed")
	if holed.maxLate > time.Second || healthy.maxLate > time.Second {
		b.Errorf("a probe started more than 1s late: %s healthy, %s black-holed", healthy.maxLate, holed.maxLate)
	}
	if d := holed.maxOp - healthy.maxOp; d > timeout {
		b.Errorf("creates and deletes took %s longer with black-holed proxies, more than one probe timeout (%s)", d, timeout)
	}
	// CPU per probe is reported, not asserted: on a machine shared with
	// the apiserver and etcd it moves by a third from run to run.
	for _, w := range []window{healthy, holed} {
		if x := float64(w.perProbe) / float64(bareCPU); x > 1.5 {
			b.Logf("note: CPU per probe %.2fx a bare probe's, above the 1.5x goal", x)
		}
	}
}

// window is what one measured window found.
type window struct {
	perProbe, maxLate, maxOp time.Duration
}

// measureWindow measures probes for d while it creates and deletes local
// Proxies one after another, and logs what it found.
func measureWindow(b *testing.B, rec *recorder, ns string, target testbed.Target, name string, d, every, bareCPU time.Duration, portOffset int32) window {
	b.Helper()
	bed := sharedBed.Env(b)
	ctx := context.Background()
	start := time.Now()
	// Creates and deletes of other Proxies, timed: created is the instance
	// made (status.atProvider.providerID), ready the first passing probe
	// folded in, deleted the Proxy gone.
	var creates, readies, deletes []time.Duration
	for i := int32(0); time.Since(start) < every; i++ {
		key := types.NamespacedName{Namespace: ns, Name: fmt.Sprintf("op-%d-%d", portOffset, i)}
		t0 := time.Now()
		if err := bed.Client.Create(ctx, proxyObject(ns, key.Name, 32400+portOffset+i, target.URL)); err != nil {
			b.Fatal(err)
		}
		var created time.Duration
		testbed.Eventually(b, time.Minute, key.Name+" Ready", func() (bool, string) {
			p := &v1alpha1.Proxy{}
			if err := bed.Client.Get(ctx, key, p); err != nil {
				return false, err.Error()
			}
			if created == 0 && p.Status.AtProvider.ProviderID != "" {
				created = time.Since(t0)
			}
			return p.GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue, fmt.Sprintf("%+v", p.GetCondition(xpv2.TypeReady))
		})
		creates, readies = append(creates, created), append(readies, time.Since(t0))
		t0 = time.Now()
		if err := bed.Client.Delete(ctx, &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name}}); err != nil {
			b.Fatal(err)
		}
		testbed.Eventually(b, time.Minute, key.Name+" gone", func() (bool, string) {
			err := bed.Client.Get(ctx, key, &v1alpha1.Proxy{})
			return kerrors.IsNotFound(err), fmt.Sprintf("get: %v", err)
		})
		deletes = append(deletes, time.Since(t0))
	}
	// CPU per probe is measured after that, on probes alone.
	rec.mu.Lock()
	probesBefore := 0
	for _, ts := range rec.times {
		probesBefore += len(ts)
	}
	rec.mu.Unlock()
	cpuStart, startCPU := time.Now(), testbed.ProcessCPU(b)
	time.Sleep(d)
	cpuWall, cpu := time.Since(cpuStart), testbed.ProcessCPU(b)-startCPU
	wall := time.Since(start)

	rec.mu.Lock()
	var lateness []time.Duration
	probes := 0
	for _, ts := range rec.times {
		probes += len(ts)
		for i := 1; i < len(ts); i++ {
			if ts[i].After(start) && ts[i].Before(start.Add(wall)) {
				lateness = append(lateness, max(ts[i].Sub(ts[i-1])-every, 0))
			}
		}
	}
	rec.mu.Unlock()
	probes -= probesBefore
	if len(lateness) == 0 || probes == 0 || len(creates) == 0 {
		b.Fatalf("%s: nothing measured: %d probes, %d creates", name, probes, len(creates))
	}
	if want := len(rec.times) * int(d/every); probes < want*95/100 {
		b.Errorf("%s: %d probes in %s, want about %d: proxies went unprobed", name, probes, cpuWall.Round(time.Second), want)
	}
	slices.Sort(lateness)
	w := window{perProbe: cpu / time.Duration(probes), maxLate: lateness[len(lateness)-1], maxOp: max(slices.Max(creates), slices.Max(deletes))}
	b.Logf("%s: %d probes in %s, %.3f cores, %s CPU/probe (bare %s, %.2fx); lateness over %s p99 %s, max %s; %d creates: instance max %s, Ready max %s; deletes max %s",
		name, probes, cpuWall.Round(time.Second), cpu.Seconds()/cpuWall.Seconds(), w.perProbe, bareCPU, float64(w.perProbe)/float64(bareCPU),
		wall.Round(time.Second), lateness[len(lateness)*99/100], w.maxLate, len(creates), slices.Max(creates), slices.Max(readies), slices.Max(deletes))
	return w
}

func splitHostPort(a string) (string, string, error) {
	for i := len(a) - 1; i >= 0; i-- {
		if a[i] == ':' {
			return a[:i], a[i+1:], nil
		}
	}
	return a, "", fmt.Errorf("no port in %s", a)
}
