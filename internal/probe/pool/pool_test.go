package pool

import (
	"context"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
)

// gatedProber answers a probe with the proxy's address as the egress IP,
// and holds probes of the addresses in hold until they are released.
type gatedProber struct {
	mu      sync.Mutex
	hold    map[string]chan struct{}
	started map[string]int
}

func (g *gatedProber) Probe(ctx context.Context, t probe.Target) probe.Result {
	g.mu.Lock()
	g.started[t.Proxy]++
	gate := g.hold[t.Proxy]
	g.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	return probe.Result{OK: true, EgressIP: t.Proxy}
}

func (g *gatedProber) Closed(context.Context, probe.Target) (probe.Closure, string) {
	return probe.ClosureClosed, "407"
}

func (g *gatedProber) count(addr string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.started[addr]
}

// startPool runs a pool of workers on pr until the test ends, and returns
// it with the channel its requeues arrive on.
func startPool(t *testing.T, pr Prober, workers int) (*Pool, chan types.NamespacedName) {
	t.Helper()
	requeued := make(chan types.NamespacedName, 100)
	pp := New(Config{Prober: pr, Workers: workers, Poll: time.Minute, Now: time.Now, Metrics: metrics.NewProvider(),
		Requeue: func(ctx context.Context, key types.NamespacedName) {
			select {
			case requeued <- key:
			case <-ctx.Done():
			}
		}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = pp.Start(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return pp, requeued
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5s for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// requeuedWithin returns the next requeued key, or fails the test.
func requeuedWithin(t *testing.T, requeued chan types.NamespacedName) types.NamespacedName {
	t.Helper()
	select {
	case k := <-requeued:
		return k
	case <-time.After(5 * time.Second):
		t.Fatal("no requeue within 5s")
		return types.NamespacedName{}
	}
}

func TestProbePool(t *testing.T) {
	t.Run("HangingProbeHoldsOnlyItsWorker", func(t *testing.T) {
		pr := &gatedProber{hold: map[string]chan struct{}{"hole:1": make(chan struct{})}, started: map[string]int{}}
		pp, requeued := startPool(t, pr, 2)
		hole, live := types.NamespacedName{Name: "hole"}, types.NamespacedName{Name: "live"}
		holeT, liveT := probe.Target{Proxy: "hole:1"}, probe.Target{Proxy: "live:1"}
		pp.Watch("hole", Probing{Key: hole, Instance: "a", Target: holeT, Every: 20 * time.Millisecond}, time.Now())
		pp.Watch("live", Probing{Key: live, Instance: "a", Target: liveT, Every: 20 * time.Millisecond}, time.Now())
		waitFor(t, "five probes of the live proxy while the other hangs", func() bool { return pr.count("live:1") >= 5 })
		if n := pr.count("hole:1"); n != 1 {
			t.Errorf("the hanging probe is not repeated while it hangs: %d probes", n)
		}
		// Each Outcome requeues its Proxy (no steady test given), and
		// only its own.
		for range 5 {
			if k := requeuedWithin(t, requeued); k != live {
				t.Fatalf("requeued %v, which has no Outcome", k)
			}
		}
		outs := pp.Take("live", "a", liveT)
		if len(outs) < 5 || len(outs) > maxOutcomes {
			t.Errorf("want between 5 and %d outcomes kept, got %d", maxOutcomes, len(outs))
		}
		if outs := pp.Take("hole", "a", holeT); len(outs) != 0 {
			t.Errorf("the hanging probe has no Outcome yet, got %d", len(outs))
		}
		close(pr.hold["hole:1"])
		if k := requeuedWithin(t, requeued); k != hole && k != live {
			t.Fatalf("requeued %v", k)
		}
		waitFor(t, "the released probe's Outcome", func() bool { return len(pp.Take("hole", "a", holeT)) == 1 })
	})

	t.Run("OutcomesBelongToTheirInstanceAndTarget", func(t *testing.T) {
		pr := &gatedProber{hold: map[string]chan struct{}{"old:1": make(chan struct{})}, started: map[string]int{}}
		pp, requeued := startPool(t, pr, 2)
		key := types.NamespacedName{Name: "p"}
		oldT, newT := probe.Target{Proxy: "old:1"}, probe.Target{Proxy: "new:1", Password: "one"}
		pp.Watch("p", Probing{Key: key, Instance: "old", Target: oldT, Every: time.Hour}, time.Now())
		waitFor(t, "the old instance's probe in flight", func() bool { return pr.count("old:1") == 1 })
		// The instance is replaced while its probe hangs: the new one is
		// probed at once, though due an hour from now.
		pp.Watch("p", Probing{Key: key, Instance: "new", Target: newT, Every: time.Hour}, time.Now().Add(time.Hour))
		if k := requeuedWithin(t, requeued); k != key {
			t.Fatalf("requeued %v", k)
		}
		// The old probe then ends with a pass, which is the old
		// instance's: no requeue, no Outcome.
		close(pr.hold["old:1"])
		select {
		case k := <-requeued:
			t.Fatalf("a replaced instance's probe requeued %v", k)
		case <-time.After(100 * time.Millisecond):
		}
		outs := pp.Take("p", "new", newT)
		if len(outs) != 1 || outs[0].Res.EgressIP != "new:1" {
			t.Errorf("want the new instance's one Outcome, got %+v", outs)
		}
		// An Outcome of credentials since rotated is not folded.
		pp.mu.Lock()
		pp.entries["p"].outcomes = []Outcome{{Target: newT, Res: probe.Result{OK: true}}}
		pp.mu.Unlock()
		rotated := newT
		rotated.Password = "two"
		if outs := pp.Take("p", "new", rotated); len(outs) != 0 {
			t.Errorf("an Outcome of the old credentials is folded: %+v", outs)
		}
	})

	t.Run("StopDropsAProbeWaitingOrInFlight", func(t *testing.T) {
		pr := &gatedProber{hold: map[string]chan struct{}{"p:1": make(chan struct{})}, started: map[string]int{}}
		pp, requeued := startPool(t, pr, 1)
		pp.Watch("p", Probing{Key: types.NamespacedName{Name: "p"}, Instance: "a", Target: probe.Target{Proxy: "p:1"}, Every: time.Millisecond}, time.Now())
		waitFor(t, "the probe in flight", func() bool { return pr.count("p:1") == 1 })
		pp.Stop("p")
		close(pr.hold["p:1"])
		select {
		case k := <-requeued:
			t.Fatalf("a stopped Probing requeued %v", k)
		case <-time.After(100 * time.Millisecond):
		}
		if n := pr.count("p:1"); n != 1 {
			t.Errorf("a stopped Probing was probed again: %d probes", n)
		}
		if _, ok := pp.Polled("p", time.Minute); ok {
			t.Error("a stopped Probing is still watched")
		}

		// Handed to a worker, then stopped before the worker took it:
		// its credentials are not sent.
		now := time.Now()
		pq := New(Config{Prober: pr, Workers: 1, Poll: time.Minute, Now: func() time.Time { return now }, Metrics: metrics.NewProvider()})
		pq.Watch("q", Probing{Instance: "a", Target: probe.Target{Proxy: "q:1"}, Every: time.Minute}, now)
		e, _ := pq.next()
		pq.Stop("q")
		pq.run(context.Background(), e)
		if n := pr.count("q:1"); n != 0 {
			t.Errorf("a Probing stopped while it waited for a worker was probed %d times", n)
		}
	})

	t.Run("UnattendedProbingIsDropped", func(t *testing.T) {
		start := time.Now()
		now := start
		var forgotten []types.UID
		pp := New(Config{Prober: &gatedProber{started: map[string]int{}}, Workers: 1, Poll: time.Minute, Now: func() time.Time { return now }, Metrics: metrics.NewProvider(),
			Forget: func(uid types.UID) { forgotten = append(forgotten, uid) }})
		pp.Watch("p", Probing{Key: types.NamespacedName{Name: "p"}, Instance: "a", Target: probe.Target{Timeout: 5 * time.Second}, Every: 30 * time.Second}, now)
		// This Proxy's own poll is 30 min (its poll-interval annotation):
		// its Observe may stay away that long, and its probes go on.
		pp.Polled("p", 30*time.Minute)
		for range 2 * 30 * 2 {
			e, _ := pp.next()
			if e == nil {
				t.Fatalf("a steady Probing stopped %s after Observe last asked for it, within two of its polls", now.Sub(start))
			}
			pp.run(context.Background(), e)
			now = now.Add(30 * time.Second)
		}
		// Nobody folds its outcomes or asks for it again: its Proxy is
		// gone without a word, or paused.
		now = now.Add(2 * time.Minute)
		if e, _ := pp.next(); e != nil {
			t.Error("a Probing nobody asked for in two polls is still run")
		}
		if _, ok := pp.Polled("p", time.Minute); ok {
			t.Error("a Probing nobody asked for in two polls is kept")
		}
		if len(forgotten) != 1 || forgotten[0] != "p" {
			t.Errorf("the scheduler is not told to forget a dropped Probing: %v", forgotten)
		}
	})

	t.Run("ClockSteppedBack", func(t *testing.T) {
		now := time.Now()
		pp := New(Config{Prober: &gatedProber{started: map[string]int{}}, Workers: 1, Poll: time.Minute, Now: func() time.Time { return now }, Metrics: metrics.NewProvider()})
		// A due time an hour ahead, as after a wall-clock step back of
		// an hour, or a status written by a replica an hour ahead.
		pp.Watch("p", Probing{Instance: "a", Target: probe.Target{}, Every: 30 * time.Second}, now.Add(time.Hour))
		if _, wait := pp.next(); wait > 30*time.Second {
			t.Errorf("a probe is put off by %s, more than its interval", wait)
		}
	})

	t.Run("OpenOutcomeOutlivesSteadyOnes", func(t *testing.T) {
		now := time.Now()
		pp := New(Config{Prober: &gatedProber{started: map[string]int{}}, Workers: 1, Poll: time.Minute, Now: func() time.Time { return now }, Metrics: metrics.NewProvider()})
		steadyPass := func(o Outcome) bool { return o.Res.OK }
		tg := probe.Target{Proxy: "p:1"}
		pp.Watch("p", Probing{Instance: "a", Target: tg, Every: time.Second, Steady: steadyPass}, now)
		pp.mu.Lock()
		pp.entries["p"].outcomes = []Outcome{{Target: tg, Res: probe.Result{Error: "open"}}}
		pp.mu.Unlock()
		for range 2 * maxOutcomes {
			e, _ := pp.next()
			if e == nil {
				now = now.Add(time.Second)
				continue
			}
			pp.run(context.Background(), e)
		}
		outs := pp.Take("p", "a", tg)
		if len(outs) != maxOutcomes || outs[0].Res.Error != "open" {
			t.Errorf("an Outcome that is not steady was dropped for steady ones: %d kept, first %+v", len(outs), outs[0])
		}
	})
}
