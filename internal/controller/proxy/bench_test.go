package proxy_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// recorder wraps the real prober and notes when each proxy was probed.
type recorder struct {
	probe.Prober
	mu    sync.Mutex
	times map[string][]time.Time
}

func (r *recorder) Probe(ctx context.Context, t probe.Target) probe.Result {
	res := r.Prober.Probe(ctx, t)
	r.mu.Lock()
	r.times[t.Proxy] = append(r.times[t.Proxy], time.Now())
	r.mu.Unlock()
	return res
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkProbeFleet runs the provider against the real apiserver with
// BENCH_PROXIES (default 1000) External Proxies on in-process CONNECT
// proxies, each probed every BENCH_INTERVAL seconds (default 30), for
// BENCH_CYCLES cycles after every proxy's first probe. It reports the
// provider process's CPU in cores (an upper bound: the in-process proxies
// and target count too), CPU per probe against the same probes run bare in
// the same process, and how late probes ran against their interval.
func BenchmarkProbeFleet(b *testing.B) {
	n := envInt("BENCH_PROXIES", 1000)
	every := time.Duration(envInt("BENCH_INTERVAL", 30)) * time.Second
	cycles := envInt("BENCH_CYCLES", 2)
	ctx := context.Background()
	target := testbed.StartEchoTarget(b)
	addrs := testbed.StartConnectProxies(b, n, "crawler", password)

	// Baseline: the same probes, bare, one after another.
	pr := probe.Prober{}
	before := cpuTime()
	for _, a := range addrs {
		if r := pr.Probe(ctx, probe.Target{Proxy: a, Username: "crawler", Password: password, URL: target.URL, RootCAs: target.RootCAs}); !r.OK {
			b.Fatalf("baseline probe through %s: %s", a, r.Error)
		}
	}
	bareCPU := (cpuTime() - before) / time.Duration(n)

	bed := sharedBed.Env(b)
	ns := bed.Namespace(b)
	if err := bed.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "crawler", "password": password}}); err != nil {
		b.Fatal(err)
	}
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i, a := range addrs {
		host, portS, _ := splitHostPort(a)
		port, _ := strconv.Atoi(portS)
		p := &v1alpha1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("p%04d", i)},
			Spec: v1alpha1.ProxySpec{ForProvider: v1alpha1.ProxyParameters{
				Mode: v1alpha1.ProxyModeExternal, Endpoint: &v1alpha1.Endpoint{Host: host, Port: int32(port)},
				AuthSecretRef: &v1alpha1.AuthSecretReference{Name: "auth"},
				HealthCheck: v1alpha1.HealthCheck{URL: target.URL, Interval: &metav1.Duration{Duration: every},
					Timeout: &metav1.Duration{Duration: min(5*time.Second, every/2)}},
			}},
		}
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
	})
	defer prov.stop()

	testbed.Eventually(b, 5*time.Minute, "every proxy probed once (warm-up)", func() (bool, string) {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.times) == n, fmt.Sprintf("%d of %d proxies probed", len(rec.times), n)
	})
	start, startCPU := time.Now(), cpuTime()
	rec.mu.Lock()
	probesBefore := 0
	for _, ts := range rec.times {
		probesBefore += len(ts)
	}
	rec.mu.Unlock()
	time.Sleep(time.Duration(cycles) * every)
	wall, cpu := time.Since(start), cpuTime()-startCPU

	rec.mu.Lock()
	var lateness []time.Duration
	probes := 0
	for _, ts := range rec.times {
		probes += len(ts)
		for i := 1; i < len(ts); i++ {
			if ts[i].After(start) {
				lateness = append(lateness, max(ts[i].Sub(ts[i-1])-every, 0))
			}
		}
	}
	rec.mu.Unlock()
	probes -= probesBefore
	sort.Slice(lateness, func(i, j int) bool { return lateness[i] < lateness[j] })
	if len(lateness) == 0 || probes == 0 {
		b.Fatal("no probes in the measured window")
	}
	p99 := lateness[len(lateness)*99/100]
	maxLate := lateness[len(lateness)-1]
	cores := cpu.Seconds() / wall.Seconds()
	perProbe := cpu / time.Duration(probes)

	b.ReportMetric(cores, "cores")
	b.ReportMetric(float64(perProbe.Microseconds()), "cpu-us/probe")
	b.ReportMetric(float64(bareCPU.Microseconds()), "bare-cpu-us/probe")
	b.ReportMetric(float64(perProbe)/float64(bareCPU), "x-bare")
	b.ReportMetric(float64(p99.Milliseconds()), "p99-late-ms")
	b.ReportMetric(float64(maxLate.Milliseconds()), "max-late-ms")
	b.Logf("%d proxies every %s: %d probes in %s; %.3f cores; %s CPU/probe (bare %s, %.2fx); lateness p99 %s, max %s",
		n, every, probes, wall.Round(time.Second), cores, perProbe, bareCPU, float64(perProbe)/float64(bareCPU), p99, maxLate)
	if xpv2.TypeReady == "" {
		b.Fatal("unreachable")
	}
}

func splitHostPort(a string) (string, string, error) {
	for i := len(a) - 1; i >= 0; i-- {
		if a[i] == ':' {
			return a[:i], a[i+1:], nil
		}
	}
	return a, "", fmt.Errorf("no port in %s", a)
}
