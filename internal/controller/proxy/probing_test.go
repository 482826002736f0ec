package proxy

import (
	"context"
	"slices"
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
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe/pool"
)

func TestPollAfter(t *testing.T) {
	now := time.Now()
	pp := pool.New(pool.Config{Prober: &fakeProber{}, Workers: 1, Poll: 5 * time.Minute, Now: func() time.Time { return now }, Metrics: metrics.NewProvider()})
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
	pp.Watch(p.GetUID(), pool.Probing{Instance: "a", Target: probe.Target{Timeout: 5 * time.Second}, Every: 30 * time.Second}, now)
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
	var outcomes []pool.Outcome
	for _, ok := range []bool{true, false} {
		for _, latency := range []time.Duration{0, 30 * time.Millisecond, 45 * time.Millisecond, 200 * time.Millisecond} {
			for _, egress := range []string{"", "192.0.2.1", "192.0.2.2"} {
				res := probe.Result{OK: ok, Latency: latency, EgressIP: egress}
				if !ok {
					res = probe.Result{Error: "timeout", Latency: latency}
				}
				outcomes = append(outcomes, pool.Outcome{Res: res})
			}
		}
	}
	closures := []pool.Outcome{
		{Checked: true, Closure: probe.ClosureClosed, Detail: "the proxy demanded credentials"},
		{Checked: true, Closure: probe.ClosureClosed, Detail: "another detail"},
		{Checked: true, Closure: probe.ClosureOpen, Detail: "opened a tunnel"},
		{Checked: true, Closure: probe.ClosureUnknown, Detail: "no answer"},
	}
	// with gives o the closure check a Proxy with or without credentials
	// gets, starting at start.
	with := func(o pool.Outcome, creds bool, c pool.Outcome, start time.Time) pool.Outcome {
		o.Started = start
		if creds {
			o.Checked, o.Closure, o.Detail = c.Checked, c.Closure, c.Detail
		}
		return o
	}
	pass, fail := outcomes[1], outcomes[len(outcomes)-1]
	// Every state a new instance reaches by up to four passes or failures
	// and then any one outcome, and by any two outcomes, with the closure
	// check passing.
	var runs [][]pool.Outcome
	prefixes := [][]pool.Outcome{nil}
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
			runs = append(runs, []pool.Outcome{a, b})
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
					e := newExternal(fake.New(), &fakeProber{}, &clock{t: o.Started})
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
	requeued := 0
	pp := pool.New(pool.Config{Prober: pr, Workers: 1, Poll: time.Minute, Now: c.now, Metrics: metrics.NewProvider(), Requeue: func(context.Context, types.NamespacedName) { requeued++ }})
	e.sched.pool = pp
	p := unitProxy(func(p *v1alpha1.Proxy) {
		p.Spec.ForProvider.Mode = v1alpha1.ProxyModeExternal
		p.Spec.ForProvider.Local = nil
		p.Spec.ForProvider.Endpoint = &v1alpha1.Endpoint{Host: "proxy.example.net", Port: 8080}
	})
	probeNow := func() {
		t.Helper()
		if _, ok := pp.Step(context.Background()); !ok {
			t.Fatal("no probe due")
		}
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
	if tg, ok := pp.Step(context.Background()); !ok || tg.Proxy != "proxy.example.net:8081" {
		t.Errorf("the new endpoint is not due a probe at once: %v %+v", ok, tg)
	}

	// A deleted Proxy's probing stops.
	p.SetDeletionTimestamp(&metav1.Time{Time: c.t})
	if _, err := e.Observe(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if _, ok := pp.Polled(p.GetUID(), time.Minute); ok {
		t.Error("a deleted Proxy is still probed")
	}
}
