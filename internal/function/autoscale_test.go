package function

import (
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/resource"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/structpb"
)

func scaler(minR, maxR int, up, down time.Duration) *autoscaler {
	return &autoscaler{Min: minR, Max: maxR, Target: 700, Up: up, Down: down}
}

// TestRecommend: the size that serves the leases asked for at the target
// utilization, exact in its arithmetic, steady within the tolerance, and
// within the bounds.
func TestRecommend(t *testing.T) {
	cases := map[string]struct {
		d                 leasewire.Demand
		perProxy, current int
		want              int
	}{
		// 21 / (3 x 0.7) is 10 exactly; in floating point it is
		// 10.000000000000002, whose ceiling is 11.
		"ExactArithmetic":        {leasewire.Demand{Held: 21}, 3, 0, 10},
		"WaitingAndRefusedCount": {leasewire.Demand{Held: 5, Waiting: 2, Refused: 1}, 3, 2, 4},
		"NoDemandGoesToMin":      {leasewire.Demand{}, 3, 5, 1},
		"WakesFromZero":          {leasewire.Demand{Waiting: 1}, 1, 0, 2},
		"CappedAtMax":            {leasewire.Demand{Held: 100}, 1, 5, 30},
		// 15 leases on 20 proxies at 1 each is 0.75, within 0.1 of 0.7:
		// no change, where the exact size would be 22.
		"WithinToleranceStays": {leasewire.Demand{Held: 15}, 1, 20, 20},
		// 17 on 20 is 0.85: outside the tolerance, grows to ceil(17/0.7).
		"OutsideToleranceMoves": {leasewire.Demand{Held: 17}, 1, 20, 25},
		"ShrinksOutside":        {leasewire.Demand{Held: 6}, 1, 20, 9},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			a := scaler(1, 30, 0, 0)
			if name == "WakesFromZero" {
				a.Min = 0
			}
			if got := a.recommend(tc.d, tc.perProxy, tc.current); got != tc.want {
				t.Errorf("recommend(%+v, %d per proxy, current %d) = %d, want %d", tc.d, tc.perProxy, tc.current, got, tc.want)
			}
		})
	}
}

// TestStabilize replays demand over time through the stabilization
// windows, carrying the history from call to call as the XR's status does:
// a fleet grows to the lowest size asked for over the scale-up window and
// shrinks to the highest asked for over the scale-down window.
func TestStabilize(t *testing.T) {
	type step struct {
		at   time.Duration // after t0
		rec  int
		want int
	}
	cases := map[string]struct {
		a     *autoscaler
		start int
		steps []step
	}{
		"UpAtOnceDownAfterWindow": {scaler(0, 10, 0, 5*time.Minute), 2, []step{
			{0, 4, 4},                              // grows at once
			{time.Minute, 1, 4},                    // asks for less: held
			{5*time.Minute + 59*time.Second, 1, 4}, // the 4 was asked for until 1m: seen until 6m
			{6 * time.Minute, 1, 1},                // then shrinks
			{7 * time.Minute, 0, 1},                // the 1 was asked for until 7m
			{12 * time.Minute, 0, 0},
		}},
		"DownWindowKeepsThePeak": {scaler(0, 10, 0, 5*time.Minute), 6, []step{
			{0, 6, 6},
			{time.Minute, 2, 6},
			{2 * time.Minute, 5, 6}, // a brief rise within the window
			{3 * time.Minute, 2, 6},
			{6 * time.Minute, 2, 5}, // the 6 left the window at 6m; the 5 (2m-3m) holds until 8m
			{8 * time.Minute, 2, 2},
		}},
		"UpWindowNeedsSustainedDemand": {scaler(1, 10, 2*time.Minute, 0), 2, []step{
			{0, 2, 2},
			{time.Minute, 5, 2},     // 2 still asked for within the window
			{2 * time.Minute, 5, 2}, // the 2 was asked for until 1m, within the last 2m
			{3*time.Minute + time.Second, 6, 5},
			{4 * time.Minute, 6, 5},
			{5*time.Minute + time.Second, 6, 6},
		}},
		"NewlyEnabledWaitsBeforeShrinking": {scaler(1, 10, 0, 5*time.Minute), 8, []step{
			{0, 1, 8},
			{4 * time.Minute, 1, 8},
			{5*time.Minute + time.Second, 1, 1},
		}},
		"BoundsWin": {scaler(3, 4, 0, 0), 10, []step{
			{0, 4, 4},
			{time.Minute, 3, 3},
		}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var history []recommendation
			current := tc.start
			for _, s := range tc.steps {
				var got int
				got, history = tc.a.stabilize(history, s.rec, current, t0.Add(s.at))
				if got != s.want {
					t.Fatalf("at +%s asking for %d from %d: got %d, want %d (history %v)", s.at, s.rec, current, got, s.want, history)
				}
				current = got
			}
		})
	}
}

// TestStabilizeBoundsItsHistory: demand changing every call never grows
// the status past its bound, and a clock that moves back restarts the
// history rather than leaving an entry in the future.
func TestStabilizeBoundsItsHistory(t *testing.T) {
	a := scaler(0, 1000, 0, time.Hour)
	var history []recommendation
	current := 0
	for i := range 500 {
		current, history = a.stabilize(history, i%7+1, current, t0.Add(time.Duration(i)*time.Second))
		if len(history) > maxRecommendations {
			t.Fatalf("call %d: %d recommendations kept, bound %d", i, len(history), maxRecommendations)
		}
	}
	if current != 7 {
		t.Errorf("the highest size within the hour holds: %d, want 7", current)
	}
	_, history = a.stabilize(history, 3, current, t0.Add(-time.Hour))
	for _, r := range history {
		if r.at.After(t0.Add(-time.Hour)) {
			t.Fatalf("after the clock moved back, an entry lies ahead of it: %v", history)
		}
	}
}

// TestPreviousScaling reads back what the last composition recorded, and
// drops what does not parse instead of failing or trusting it.
func TestPreviousScaling(t *testing.T) {
	status := resource.MustStructJSON(`{"desiredReplicas": 4, "autoscaling": {"recommendations": [
		{"time": "2026-11-29T11:59:00Z", "replicas": 4},
		{"time": "2026-11-29T11:50:00Z", "replicas": 2},
		{"time": "yesterday", "replicas": 3},
		{"time": "2026-11-29T11:55:00Z", "replicas": -1},
		{"time": "2026-11-29T11:56:00Z", "replicas": 2.5}]}}`)
	desired, history := previousScaling(status)
	want := []recommendation{{t0.Add(-10 * time.Minute), 2}, {t0.Add(-time.Minute), 4}}
	if desired != 4 || !cmp.Equal(want, history, cmp.AllowUnexported(recommendation{})) {
		t.Errorf("previousScaling = %d, %v; want 4, %v", desired, history, want)
	}
	if d, h := previousScaling(resource.MustStructJSON(`{"desiredReplicas": 1e9}`)); d != -1 || h != nil {
		t.Errorf("an out-of-bounds desiredReplicas is not trusted: %d, %v", d, h)
	}
}

// TestAutoscalerRemovesOnlyUnleased: shrinking, the autoscaler removes
// only proxies no crawler holds a lease on, and none while the leases are
// unknown; spec.replicas removes whatever its order says.
func TestAutoscalerRemovesOnlyUnleased(t *testing.T) {
	observed := func() []*member {
		return []*member{m(0, "a", leased), m(1, "b"), m(2, "a", leased), m(3, "b")}
	}
	auto := func(f *Fleet) { f.autoscale = scaler(0, 10, 0, 0) }
	// First the unleased drain, so that no crawler is handed them while
	// their removal is decided; once they drained drainSettle, they go.
	p := decide(fleetFor(1, []string{"a", "b"}, auto), observed(), true, t0)
	var draining []string
	for _, k := range p.keep {
		if k.Draining {
			draining = append(draining, k.Name)
		}
	}
	if got := summary(p); got != "0:a 1:b 2:a 3:b" || strings.Join(draining, " ") != "f-1 f-3" || !p.leaseWait {
		t.Errorf("autoscaled to 1 with two proxies leased: kept %q draining %v (recheck %v), want all kept, the unleased f-1 f-3 draining", got, draining, p.leaseWait)
	}
	drained := func() []*member {
		ms := observed()
		ms[1].DrainSince, ms[3].DrainSince = t0.Add(-drainSettle), t0.Add(-drainSettle)
		ms[1].DrainSeen, ms[3].DrainSeen = true, true
		return ms
	}
	if got := summary(decide(fleetFor(1, []string{"a", "b"}, auto), drained(), true, t0)); got != "0:a 2:a" {
		t.Errorf("autoscaled to 1 with two proxies leased, the others drained: kept %q, want the leased 0:a 2:a", got)
	}
	leasedWhileDraining := drained()
	leasedWhileDraining[3].Leased = true
	if got := summary(decide(fleetFor(1, []string{"a", "b"}, auto), leasedWhileDraining, true, t0)); got != "0:a 2:a 3:b" {
		t.Errorf("a draining proxy leased after all stays: kept %q, want 0:a 2:a 3:b", got)
	}
	p = decide(fleetFor(3, []string{"a", "b"}, auto), drained(), true, t0)
	if got := summary(p); got != "0:a 1:b 2:a" {
		t.Errorf("autoscaled to 3: kept %q, want the leased ones and one more", got)
	}
	// A holder long drained for a rollout whose Ready replacement serves:
	// the holder, drained, goes; the replacement, which may have been
	// leased a moment ago, drains before it goes too.
	rolled := []*member{m(0, "a", leased), m(1, "b", drainedFor(time.Hour)), m(2, "b", replaces(1))}
	p = decide(fleetFor(1, []string{"a", "b"}, auto), rolled, true, t0)
	if got := summary(p); got != "0:a 2:b>1" || len(p.keep) != 2 || !p.keep[1].Draining {
		t.Errorf("a drained holder with a fresh replacement: kept %q; want 0:a and the replacement 2:b>1, draining", got)
	}
	p = decide(fleetFor(1, []string{"a", "b"}, auto), observed(), false, t0)
	if got := summary(p); got != "0:a 1:b 2:a 3:b" {
		t.Errorf("autoscaled with leases unknown: kept %q, want every proxy", got)
	}
	if !p.leaseWait || !strings.Contains(strings.Join(p.blocked, ";"), "stay until their leases end") {
		t.Errorf("a held-back scale-down says so and is looked at again soon: %v, leaseWait %v", p.blocked, p.leaseWait)
	}
	if got := summary(decide(fleetFor(1, []string{"a", "b"}), observed(), true, t0)); got != "0:a" {
		t.Errorf("spec.replicas 1: kept %q, want 0:a (the operator's count rules)", got)
	}
}

// TestRunAutoscaled: an autoscaled fleet asks Crossplane for its demand
// Leases, ignores spec.replicas and says so, and keeps its size until the
// leases and demand have been sent.
func TestRunAutoscaled(t *testing.T) {
	spec := withSpec(t, "autoscaling", `{"minReplicas": 0, "maxReplicas": 5}`)
	req := &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}}}
	rsp := run(t, req)
	if sel := rsp.GetRequirements().GetResources()[requiredSummaries]; sel.GetKind() != "LeaseSummary" || sel.GetMatchLabels().GetLabels()["crawl.example.com/fleet"] != "crawlers" {
		t.Fatalf("an autoscaled fleet requires its LeaseSummaries: %v", rsp.GetRequirements())
	}
	if n := len(rsp.GetDesired().GetResources()); n != 2 {
		// validSpec's two zones... its access Role and RoleBinding only.
		t.Errorf("with nothing known and no proxy, the fleet starts from none: %d desired resources", n)
	}
	req.RequiredResources = summaries(leaseSummary("crawlers", "r1", t0, nil, nil, leasewire.Demand{Waiting: 1}))
	rsp = run(t, req)
	status := rsp.GetDesired().GetComposite().GetResource().GetFields()["status"].GetStructValue()
	if got := field(status, "desiredReplicas").GetNumberValue(); got != 2 {
		t.Errorf("one acquisition waiting at a fleet of none: desiredReplicas %v, want 2 (1 / 0.7)", got)
	}
	c := conditions(rsp, ConditionAutoscaling)
	if len(c) != 1 || !strings.Contains(c[0].GetMessage(), "spec.replicas (2) is ignored while spec.autoscaling is set") {
		t.Errorf("the Autoscaling condition says spec.replicas is ignored: %v", c)
	}
	if ttl := rsp.GetMeta().GetTtl().AsDuration(); ttl > leasewire.DemandInterval {
		t.Errorf("an autoscaled fleet is composed again within %s, not %s", leasewire.DemandInterval, ttl)
	}
	plain := run(t, &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(validSpec)}}})
	if c := conditions(plain, ConditionAutoscaling); len(c) != 1 || c[0].GetReason() != "Disabled" {
		t.Errorf("without spec.autoscaling the condition says spec.replicas rules: %v", c)
	}
	if r := plain.GetRequirements().GetResources(); len(r) != 1 || r[requiredSummaries] == nil {
		t.Errorf("a fleet without autoscaling requires its LeaseSummaries and nothing else (no Leases): %v", r)
	}
}

// TestAutoscalerHoldsThroughAnOutage: while no proxy is healthy though
// some had time to boot (the health target down, say), crawlers refused or
// waiting are no reason to grow: more proxies would fail alike. A proxy
// still booting, one failing beside healthy ones, or one the provider
// refuses by policy does not hold growth back.
func TestAutoscalerHoldsThroughAnOutage(t *testing.T) {
	spec := withSpec(t, "autoscaling", `{"minReplicas": 1, "maxReplicas": 10}`)
	refused := observedProxy(1, "b", false, t0.Add(-time.Hour), "")
	cond := refused.GetResource().GetFields()["status"].GetStructValue().GetFields()["conditions"].GetListValue().GetValues()[0].GetStructValue()
	cond.Fields["reason"] = structpb.NewStringValue("NotPermitted")
	cases := map[string]struct {
		proxies map[string]*fnv1.Resource
		want    float64
		outage  bool
	}{
		"AllFailing": {map[string]*fnv1.Resource{
			"proxy-0": observedProxy(0, "a", false, t0.Add(-time.Hour), ""),
			"proxy-1": observedProxy(1, "b", false, t0.Add(-5*time.Minute), ""),
		}, 2, true},
		"OneFailingBesideAHealthyOne": {map[string]*fnv1.Resource{
			"proxy-0": observedProxy(0, "a", true, t0.Add(-time.Hour), ""),
			"proxy-1": observedProxy(1, "b", false, t0.Add(-5*time.Minute), ""),
		}, 10, false},
		"WakingFromZero": {map[string]*fnv1.Resource{
			"proxy-0": observedProxy(0, "a", false, t0.Add(-30*time.Second), ""),
		}, 10, false},
		"RefusedByPolicy": {map[string]*fnv1.Resource{"proxy-1": refused}, 10, false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			rsp := run(t, &fnv1.RunFunctionRequest{
				Observed:          &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}, Resources: tc.proxies},
				RequiredResources: summaries(leaseSummary("crawlers", "r1", t0, nil, nil, leasewire.Demand{Waiting: 4, Refused: 3})),
			})
			st := rsp.GetDesired().GetComposite().GetResource().GetFields()["status"].GetStructValue()
			n, why := field(st, "desiredReplicas").GetNumberValue(), str(st, "autoscaling", "reason")
			if n != tc.want || strings.Contains(why, "no proxy healthy though") != tc.outage {
				t.Errorf("desired %v (%s), want %v, outage %v", n, why, tc.want, tc.outage)
			}
		})
	}
}
