package proxy

import (
	"context"
	"sync"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe/pool"
)

func TestLatencyStep(t *testing.T) {
	cases := []struct {
		recorded, measured, want int64
		reason                   string
	}{
		{0, 0, 1, "nothing recorded: a loopback probe under a millisecond records the first step"},
		{0, 37, 50, "nothing recorded: the nearest step on a log scale (37 is nearer 50 than 20)"},
		{0, 140, 100, "nothing recorded: 140 is nearer 100 than 200"},
		{0, 150, 200, "nothing recorded: 150 is nearer 200 than 100 (log scale)"},
		{100, 240, 100, "within 2.5 times: kept"},
		{100, 41, 100, "within 2.5 times below: kept"},
		{100, 260, 200, "beyond 2.5 times: the nearest step"},
		{100, 39, 50, "beyond 2.5 times below: the nearest step"},
		{1, 0, 1, "a fast proxy stays at the first step"},
		{1, 3, 1, "a few milliseconds either way is noise: kept however many times over"},
		{2, 21, 2, "within 20 ms: kept"},
		{2, 23, 20, "beyond 20 ms and 2.5 times: the nearest step"},
		{50, 110, 50, "within 2.5 times: kept, though beyond 20 ms"},
		{40, 58, 40, "a value recorded by an older provider is kept while within the band"},
		{200, 900000, 50000, "beyond the last step: the last step"},
	}
	for _, tc := range cases {
		if got := latencyStep(tc.recorded, tc.measured); got != tc.want {
			t.Errorf("latencyStep(%d, %d) = %d, want %d: %s", tc.recorded, tc.measured, got, tc.want, tc.reason)
		}
	}
	// Noise that never leaves the band never writes: 1 000 probes jittering
	// 40% either side of 100 ms keep one value.
	recorded, changes := int64(100), 0
	for i := range 1000 {
		measured := int64(60 + (i*7919)%81) // 60..140 ms
		if next := latencyStep(recorded, measured); next != recorded {
			recorded = next
			changes++
		}
	}
	if changes != 0 {
		t.Errorf("jitter between 60 and 140 ms moved the recorded 100 ms %d times, want never", changes)
	}
}

// spikyProber passes every probe, every third one ten times slower.
type spikyProber struct {
	mu    sync.Mutex
	calls int
}

func (s *spikyProber) Probe(context.Context, probe.Target) probe.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	latency := 100 * time.Millisecond
	if s.calls%3 == 0 {
		latency = time.Second
	}
	return probe.Result{OK: true, Latency: latency, EgressIP: "203.0.113.9"}
}

func (s *spikyProber) Closed(context.Context, probe.Target) (probe.Closure, string) {
	return probe.ClosureClosed, "the proxy demanded credentials"
}

func (s *spikyProber) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// TestASlowProbeMovesNoLatency: a steady proxy probed every few
// milliseconds, one probe in three ten times slower, is never requeued for
// a status change: the status goes by the median of the last three passes.
func TestASlowProbeMovesNoLatency(t *testing.T) {
	p := unitProxy(func(p *v1alpha1.Proxy) {
		p.Status.AtProvider = v1alpha1.ProxyObservation{ProviderID: localID, Healthy: true, ConsecutiveSuccesses: 1,
			LastProbeTime: &metav1.Time{Time: time.Now()}, EgressIP: "203.0.113.9", LatencyMilliseconds: 100}
		p.SetConditions(xpv2.Available())
	})
	if !steady(p)(pool.Outcome{Started: time.Now(), Res: probe.Result{OK: true, Latency: 100 * time.Millisecond, EgressIP: "203.0.113.9"}}) {
		t.Fatal("the test's proxy is not steady: it would prove nothing")
	}
	pr := &spikyProber{}
	requeued := 0
	pp := pool.New(pool.Config{Prober: pr, Workers: 1, Poll: time.Minute, Now: time.Now, Metrics: metrics.NewProvider(), Requeue: func(context.Context, types.NamespacedName) { requeued++ }})
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	target := probe.Target{Proxy: "127.0.0.1:3128"}
	pp.Watch(p.GetUID(), pool.Probing{Key: key, Instance: "a", Target: target, Every: 5 * time.Millisecond, Steady: steady(p)}, time.Now())
	// Driven by hand, one probe at a time as each falls due.
	deadline := time.Now().Add(5 * time.Second)
	var outs []pool.Outcome
	for pr.count() < 20 {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5s for twenty probes: %d", pr.count())
		}
		if _, ok := pp.Step(context.Background()); !ok {
			time.Sleep(time.Millisecond)
		}
		outs = append(outs, pp.Take(p.GetUID(), "a", target)...)
	}
	if len(outs) < 20 {
		t.Fatalf("%d outcomes taken of 20 probes", len(outs))
	}
	if requeued != 0 {
		t.Fatalf("a slow probe among fast ones requeued the Proxy %d times for a status change", requeued)
	}
	for _, o := range outs {
		if o.Latency() != 100*time.Millisecond {
			t.Errorf("an outcome goes by a latency of %s, want the median 100ms (measured %s)", o.Latency(), o.Res.Latency)
		}
	}
}
