package proxy

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/google/go-cmp/cmp"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/fake"
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
func startPool(t *testing.T, pr Prober, workers int) (*probePool, chan types.NamespacedName) {
	t.Helper()
	requeued := make(chan types.NamespacedName, 100)
	pp := newProbePool(pr, workers, time.Minute, time.Now, metrics.NewProvider())
	pp.requeue = func(ctx context.Context, key types.NamespacedName) {
		select {
		case requeued <- key:
		case <-ctx.Done():
		}
	}
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
		pp.watch("hole", probing{key: hole, instance: "a", target: holeT, every: 20 * time.Millisecond}, time.Now())
		pp.watch("live", probing{key: live, instance: "a", target: liveT, every: 20 * time.Millisecond}, time.Now())
		waitFor(t, "five probes of the live proxy while the other hangs", func() bool { return pr.count("live:1") >= 5 })
		if n := pr.count("hole:1"); n != 1 {
			t.Errorf("the hanging probe is not repeated while it hangs: %d probes", n)
		}
		// Each outcome requeues its Proxy (no steady test given), and
		// only its own.
		for range 5 {
			if k := requeuedWithin(t, requeued); k != live {
				t.Fatalf("requeued %v, which has no outcome", k)
			}
		}
		outs := pp.take("live", "a", liveT)
		if len(outs) < 5 || len(outs) > maxOutcomes {
			t.Errorf("want between 5 and %d outcomes kept, got %d", maxOutcomes, len(outs))
		}
		if outs := pp.take("hole", "a", holeT); len(outs) != 0 {
			t.Errorf("the hanging probe has no outcome yet, got %d", len(outs))
		}
		close(pr.hold["hole:1"])
		if k := requeuedWithin(t, requeued); k != hole && k != live {
			t.Fatalf("requeued %v", k)
		}
		waitFor(t, "the released probe's outcome", func() bool { return len(pp.take("hole", "a", holeT)) == 1 })
	})

	t.Run("OutcomesBelongToTheirInstanceAndTarget", func(t *testing.T) {
		pr := &gatedProber{hold: map[string]chan struct{}{"old:1": make(chan struct{})}, started: map[string]int{}}
		pp, requeued := startPool(t, pr, 2)
		key := types.NamespacedName{Name: "p"}
		oldT, newT := probe.Target{Proxy: "old:1"}, probe.Target{Proxy: "new:1", Password: "one"}
		pp.watch("p", probing{key: key, instance: "old", target: oldT, every: time.Hour}, time.Now())
		waitFor(t, "the old instance's probe in flight", func() bool { return pr.count("old:1") == 1 })
		// The instance is replaced while its probe hangs: the new one is
		// probed at once, though due an hour from now.
		pp.watch("p", probing{key: key, instance: "new", target: newT, every: time.Hour}, time.Now().Add(time.Hour))
		if k := requeuedWithin(t, requeued); k != key {
			t.Fatalf("requeued %v", k)
		}
		// The old probe then ends with a pass, which is the old
		// instance's: no requeue, no outcome.
		close(pr.hold["old:1"])
		select {
		case k := <-requeued:
			t.Fatalf("a replaced instance's probe requeued %v", k)
		case <-time.After(100 * time.Millisecond):
		}
		outs := pp.take("p", "new", newT)
		if len(outs) != 1 || outs[0].res.EgressIP != "new:1" {
			t.Errorf("want the new instance's one outcome, got %+v", outs)
		}
		// An outcome of credentials since rotated is not folded.
		pp.mu.Lock()
		pp.entries["p"].outcomes = []outcome{{target: newT, res: probe.Result{OK: true}}}
		pp.mu.Unlock()
		rotated := newT
		rotated.Password = "two"
		if outs := pp.take("p", "new", rotated); len(outs) != 0 {
			t.Errorf("an outcome of the old credentials is folded: %+v", outs)
		}
	})

	t.Run("StopDropsAProbeWaitingOrInFlight", func(t *testing.T) {
		pr := &gatedProber{hold: map[string]chan struct{}{"p:1": make(chan struct{})}, started: map[string]int{}}
		pp, requeued := startPool(t, pr, 1)
		pp.watch("p", probing{key: types.NamespacedName{Name: "p"}, instance: "a", target: probe.Target{Proxy: "p:1"}, every: time.Millisecond}, time.Now())
		waitFor(t, "the probe in flight", func() bool { return pr.count("p:1") == 1 })
		pp.stop("p")
		close(pr.hold["p:1"])
		select {
		case k := <-requeued:
			t.Fatalf("a stopped probing requeued %v", k)
		case <-time.After(100 * time.Millisecond):
		}
		if n := pr.count("p:1"); n != 1 {
			t.Errorf("a stopped probing was probed again: %d probes", n)
		}
		if _, ok := pp.polled("p", time.Minute); ok {
			t.Error("a stopped probing is still watched")
		}

		// Handed to a worker, then stopped before the worker took it:
		// its credentials are not sent.
		now := time.Now()
		pq := newProbePool(pr, 1, time.Minute, func() time.Time { return now }, metrics.NewProvider())
		pq.requeue = func(context.Context, types.NamespacedName) {}
		pq.watch("q", probing{instance: "a", target: probe.Target{Proxy: "q:1"}, every: time.Minute}, now)
		e, _ := pq.next()
		pq.stop("q")
		pq.run(context.Background(), e)
		if n := pr.count("q:1"); n != 0 {
			t.Errorf("a probing stopped while it waited for a worker was probed %d times", n)
		}
	})

	t.Run("UnattendedProbingIsDropped", func(t *testing.T) {
		start := time.Now()
		now := start
		var forgotten []types.UID
		pp := newProbePool(&gatedProber{started: map[string]int{}}, 1, time.Minute, func() time.Time { return now }, metrics.NewProvider())
		pp.requeue = func(context.Context, types.NamespacedName) {}
		pp.forget = func(uid types.UID) { forgotten = append(forgotten, uid) }
		pp.watch("p", probing{key: types.NamespacedName{Name: "p"}, instance: "a", target: probe.Target{Timeout: 5 * time.Second}, every: 30 * time.Second}, now)
		// This Proxy's own poll is 30 min (its poll-interval annotation):
		// its Observe may stay away that long, and its probes go on.
		pp.polled("p", 30*time.Minute)
		for range 2 * 30 * 2 {
			e, _ := pp.next()
			if e == nil {
				t.Fatalf("a steady probing stopped %s after Observe last asked for it, within two of its polls", now.Sub(start))
			}
			pp.run(context.Background(), e)
			now = now.Add(30 * time.Second)
		}
		// Nobody folds its outcomes or asks for it again: its Proxy is
		// gone without a word, or paused.
		now = now.Add(2 * time.Minute)
		if e, _ := pp.next(); e != nil {
			t.Error("a probing nobody asked for in two polls is still run")
		}
		if _, ok := pp.polled("p", time.Minute); ok {
			t.Error("a probing nobody asked for in two polls is kept")
		}
		if len(forgotten) != 1 || forgotten[0] != "p" {
			t.Errorf("the scheduler is not told to forget a dropped probing: %v", forgotten)
		}
	})

	t.Run("ClockSteppedBack", func(t *testing.T) {
		now := time.Now()
		pp := newProbePool(&gatedProber{started: map[string]int{}}, 1, time.Minute, func() time.Time { return now }, metrics.NewProvider())
		// A due time an hour ahead, as after a wall-clock step back of
		// an hour, or a status written by a replica an hour ahead.
		pp.watch("p", probing{instance: "a", target: probe.Target{}, every: 30 * time.Second}, now.Add(time.Hour))
		if _, wait := pp.next(); wait > 30*time.Second {
			t.Errorf("a probe is put off by %s, more than its interval", wait)
		}
	})

	t.Run("OpenOutcomeOutlivesSteadyOnes", func(t *testing.T) {
		now := time.Now()
		pp := newProbePool(&gatedProber{started: map[string]int{}}, 1, time.Minute, func() time.Time { return now }, metrics.NewProvider())
		pp.requeue = func(context.Context, types.NamespacedName) {}
		steadyPass := func(o outcome) bool { return o.res.OK }
		tg := probe.Target{Proxy: "p:1"}
		pp.watch("p", probing{instance: "a", target: tg, every: time.Second, steady: steadyPass}, now)
		pp.mu.Lock()
		pp.entries["p"].outcomes = []outcome{{target: tg, res: probe.Result{Error: "open"}}}
		pp.mu.Unlock()
		for range 2 * maxOutcomes {
			e, _ := pp.next()
			if e == nil {
				now = now.Add(time.Second)
				continue
			}
			pp.run(context.Background(), e)
		}
		outs := pp.take("p", "a", tg)
		if len(outs) != maxOutcomes || outs[0].res.Error != "open" {
			t.Errorf("an outcome that is not steady was dropped for steady ones: %d kept, first %+v", len(outs), outs[0])
		}
	})
}

func TestPollAfter(t *testing.T) {
	now := time.Now()
	pp := newProbePool(&gatedProber{started: map[string]int{}}, 1, 5*time.Minute, func() time.Time { return now }, metrics.NewProvider())
	s := &scheduler{now: func() time.Time { return now }, seen: map[types.UID]time.Time{}, pool: pp}
	p := unitProxy()
	created := func(ago time.Duration) {
		p.Status.AtProvider.InstanceCreatedAt = &metav1.Time{Time: now.Add(-ago)}
	}
	// Not probed (provisioning): soon while young, then less often.
	for ago, want := range map[time.Duration]time.Duration{
		0: time.Second, 8 * time.Second: 2 * time.Second, time.Minute: 15 * time.Second, time.Hour: maxProvisioningPoll,
	} {
		created(ago)
		if got := s.pollAfter(p, time.Minute); got != want {
			t.Errorf("instance %s old, not probed: poll after %s, want %s", ago, got, want)
		}
	}
	// Probed: every outcome that changes its verdict requeues it; the
	// poll folds steady passes and looks for drift every --poll, or at
	// each probe when they are further apart.
	pp.watch(p.GetUID(), probing{instance: "a", target: probe.Target{Timeout: 5 * time.Second}, every: 30 * time.Second}, now)
	for poll, want := range map[time.Duration]time.Duration{time.Minute: time.Minute, 10 * time.Second: 30 * time.Second} {
		if got := s.pollAfter(p, poll); got != want {
			t.Errorf("probed every 30s, --poll %s: poll after %s, want %s", poll, got, want)
		}
	}
	// Previous credentials whose grace ends before the next poll: polled
	// a second after it ends, to retire them and say so.
	p.Status.AtProvider.PreviousCredentialsUntil = &metav1.Time{Time: now.Add(20 * time.Second)}
	if got := s.pollAfter(p, time.Minute); got != 21*time.Second {
		t.Errorf("previous credentials until 20s from now: poll after %s, want 21s", got)
	}
	// A deadline left in the status past (a Proxy not observed since):
	// polled as usual, not in a loop.
	p.Status.AtProvider.PreviousCredentialsUntil = &metav1.Time{Time: now.Add(-time.Minute)}
	if got := s.pollAfter(p, time.Minute); got != time.Minute {
		t.Errorf("previous credentials past their grace: poll after %s, want the usual minute", got)
	}
}

// TestSteadyChangesNothing holds steady to fold: an outcome it calls steady,
// which the pool therefore does not requeue the Proxy for, must leave the
// Proxy's status exactly as it is, whatever state the Proxy is in.
func TestSteadyChangesNothing(t *testing.T) {
	var outcomes []outcome
	for _, ok := range []bool{true, false} {
		for _, latency := range []time.Duration{0, 30 * time.Millisecond, 45 * time.Millisecond, 200 * time.Millisecond} {
			for _, egress := range []string{"", "192.0.2.1", "192.0.2.2"} {
				res := probe.Result{OK: ok, Latency: latency, EgressIP: egress}
				if !ok {
					res = probe.Result{Error: "timeout", Latency: latency}
				}
				outcomes = append(outcomes, outcome{res: res})
			}
		}
	}
	closures := []outcome{
		{checked: true, closure: probe.ClosureClosed, detail: "the proxy demanded credentials"},
		{checked: true, closure: probe.ClosureClosed, detail: "another detail"},
		{checked: true, closure: probe.ClosureOpen, detail: "opened a tunnel"},
		{checked: true, closure: probe.ClosureUnknown, detail: "no answer"},
	}
	// with gives o the closure check a Proxy with or without credentials
	// gets, starting at start.
	with := func(o outcome, creds bool, c outcome, start time.Time) outcome {
		o.started = start
		if creds {
			o.checked, o.closure, o.detail = c.checked, c.closure, c.detail
		}
		return o
	}
	pass, fail := outcomes[1], outcomes[len(outcomes)-1]
	// Every state a new instance reaches by up to four passes or failures
	// and then any one outcome, and by any two outcomes, with the closure
	// check passing.
	var runs [][]outcome
	prefixes := [][]outcome{nil}
	for range 4 {
		for _, pre := range prefixes {
			if len(pre) == len(prefixes[len(prefixes)-1]) {
				prefixes = append(prefixes, append(slices.Clone(pre), pass), append(slices.Clone(pre), fail))
			}
		}
	}
	for _, pre := range prefixes {
		for _, o := range outcomes {
			runs = append(runs, append(slices.Clone(pre), o))
		}
	}
	for _, a := range outcomes {
		for _, b := range outcomes {
			runs = append(runs, []outcome{a, b})
		}
	}
	var states []*v1alpha1.Proxy
	for _, creds := range []bool{false, true} {
		for _, threshold := range []int32{1, 2} {
			// A VM published at its external IP (192.0.2.1), which the
			// egress IP is compared with.
			for _, vm := range []bool{false, true} {
				for _, run := range runs {
					p := unitProxy(func(p *v1alpha1.Proxy) {
						p.Spec.ForProvider.HealthCheck.SuccessThreshold = threshold
						if creds {
							p.Spec.ForProvider.AuthSecretRef = &v1alpha1.AuthSecretReference{Name: "auth"}
						}
						if vm {
							p.Spec.ForProvider.Local = nil
							p.Spec.ForProvider.GCP = &v1alpha1.GCPPlacement{Zone: "europe-west1-b"}
						}
					})
					e := newExternal(fake.New(), &fakeProber{}, &clock{t: epoch})
					resetInstanceStatus(p)
					if vm {
						p.Status.AtProvider.Host = "192.0.2.1"
					}
					for i, o := range run {
						e.fold(p, "127.0.0.1:3128", with(o, creds, closures[0], epoch.Add(time.Duration(i-len(run)+2)*10*time.Second)))
						e.setReadiness(p)
					}
					states = append(states, p)
				}
			}
		}
	}
	// A settled proxy whose status still carries an old error, as one
	// written by an earlier provider might.
	old := states[0].DeepCopy()
	e := newExternal(fake.New(), &fakeProber{}, &clock{t: epoch})
	e.fold(old, "127.0.0.1:3128", with(pass, false, closures[0], epoch))
	e.setReadiness(old)
	old.Status.AtProvider.LastProbeError = "an old error"
	states = append(states, old)
	// And one whose Ready was last set by something else.
	other := old.DeepCopy()
	other.Status.AtProvider.LastProbeError = ""
	other.SetConditions(unavailable(ReasonProvisioning, "repairing"))
	states = append(states, other)
	// And a settled VM whose status an earlier provider wrote, before
	// the egress IP was compared with the VM's external IP.
	for _, p := range states {
		if p.Spec.ForProvider.GCP != nil && p.GetCondition(TypeEgressIPMismatch).Status == corev1.ConditionFalse && steady(p)(with(pass, p.Spec.ForProvider.AuthSecretRef != nil, closures[0], epoch.Add(time.Minute))) {
			upgraded := p.DeepCopy()
			var kept []xpv2.Condition
			for _, c := range upgraded.Status.Conditions {
				if c.Type != TypeEgressIPMismatch {
					kept = append(kept, c)
				}
			}
			upgraded.Status.Conditions = kept
			states = append(states, upgraded)
			break
		}
	}

	steadyOnes := 0
	for _, p := range states {
		isSteady := steady(p)
		creds := p.Spec.ForProvider.AuthSecretRef != nil
		for _, o := range outcomes {
			for _, c := range closures {
				for _, after := range []time.Duration{30 * time.Second, 25 * time.Hour} {
					o := with(o, creds, c, epoch.Add(10*time.Second+after))
					if !isSteady(o) {
						continue
					}
					steadyOnes++
					got := p.DeepCopy()
					e := newExternal(fake.New(), &fakeProber{}, &clock{t: o.started})
					e.fold(got, "127.0.0.1:3128", o)
					e.setReadiness(got)
					if diff := cmp.Diff(p.Status, got.Status); diff != "" {
						t.Fatalf("an outcome called steady changes the status (-before +after):\n%s\noutcome %+v", diff, o)
					}
				}
			}
		}
	}
	// Not vacuous: a settled proxy's plain passes are steady.
	if steadyOnes == 0 {
		t.Fatal("no outcome was steady: the pool would requeue every Proxy for every probe")
	}
	t.Logf("%d states, %d steady outcomes checked", len(states), steadyOnes)
}

// TestObserveThroughThePool: Observe registers the probing, folds what the
// pool found, judges a changed endpoint afresh, and stops the probing of a
// deleted Proxy.
func TestObserveThroughThePool(t *testing.T) {
	c := &clock{t: epoch}
	pr := &fakeProber{res: probe.Result{OK: true, EgressIP: "192.0.2.1"}}
	e := newExternal(fake.New(), pr, c)
	e.backend, e.pc = nil, nil
	pp := newProbePool(pr, 1, time.Minute, c.now, metrics.NewProvider())
	requeued := 0
	pp.requeue = func(context.Context, types.NamespacedName) { requeued++ }
	e.sched.pool = pp
	p := unitProxy(func(p *v1alpha1.Proxy) {
		p.Spec.ForProvider.Mode = v1alpha1.ProxyModeExternal
		p.Spec.ForProvider.Local = nil
		p.Spec.ForProvider.Endpoint = &v1alpha1.Endpoint{Host: "proxy.example.net", Port: 8080}
	})
	probeNow := func() {
		t.Helper()
		en, _ := pp.next()
		if en == nil {
			t.Fatal("no probe due")
		}
		pp.run(context.Background(), en)
	}

	if _, err := e.Observe(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if pr.calls != 0 || p.Status.AtProvider.Healthy {
		t.Fatalf("Observe probes nothing itself: %d probes, %+v", pr.calls, p.Status.AtProvider)
	}
	probeNow()
	if requeued != 1 {
		t.Errorf("the first verdict requeues the Proxy: %d requeues", requeued)
	}
	if _, err := e.Observe(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if ap := p.Status.AtProvider; !ap.Healthy || ap.EgressIP != "192.0.2.1" || p.GetCondition(xpv2.TypeReady).Status != corev1.ConditionTrue {
		t.Fatalf("the pool's outcome is folded in: %+v %+v", ap, p.GetCondition(xpv2.TypeReady))
	}

	// A steady pass is not worth a reconcile.
	c.t = c.t.Add(10 * time.Second)
	probeNow()
	if requeued != 1 {
		t.Errorf("a steady pass requeued the Proxy: %d requeues", requeued)
	}

	// Another endpoint is judged afresh, and probed at once.
	p.Spec.ForProvider.Endpoint.Port = 8081
	if _, err := e.Observe(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if p.Status.AtProvider.Healthy || p.GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue {
		t.Errorf("a changed endpoint inherits the old one's verdict: %+v", p.Status.AtProvider)
	}
	if en, _ := pp.next(); en == nil || en.target.Proxy != "proxy.example.net:8081" {
		t.Errorf("the new endpoint is not due a probe at once: %+v", en)
	}

	// A deleted Proxy's probing stops.
	p.SetDeletionTimestamp(&metav1.Time{Time: c.t})
	if _, err := e.Observe(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if _, ok := pp.polled(p.GetUID(), time.Minute); ok {
		t.Error("a deleted Proxy is still probed")
	}
}
