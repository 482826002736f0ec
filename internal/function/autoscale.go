package function

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"google.golang.org/protobuf/types/known/structpb"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
)

// ConditionAutoscaling says who sizes the fleet, and why it has the size it
// aims at.
const ConditionAutoscaling = "Autoscaling"

// tolerance is how far from the target utilization a fleet may be before it
// is resized, as a HorizontalPodAutoscaler's: demand jittering around a
// boundary does not flap the fleet between two sizes.
const tolerance = 0.1

// maxRecommendations bounds the sizes remembered in the XR's status.
const maxRecommendations = 64

// autoscaler is a fleet's spec.autoscaling with its defaults applied.
type autoscaler struct {
	Min, Max int
	// Target is the utilization aimed at, in thousandths, so that the
	// arithmetic is exact: 7 leases at 0.7 ask for 10 proxies, not 11.
	Target   int
	Up, Down time.Duration
}

func newAutoscaler(a *fleetv1alpha1.Autoscaling) (*autoscaler, error) {
	if a == nil {
		return nil, nil
	}
	s := &autoscaler{
		Min: int(*a.MinReplicas), Max: int(a.MaxReplicas), Target: int(math.Round(*a.TargetUtilization * 1000)),
		Up: a.ScaleUpStabilization.Duration, Down: a.ScaleDownStabilization.Duration,
	}
	switch {
	case s.Min < 0 || s.Min > fleetv1alpha1.MaxReplicas:
		return nil, fieldError("spec.autoscaling.minReplicas", "must be between 0 and %d, not %d", fleetv1alpha1.MaxReplicas, s.Min)
	case s.Max < 1 || s.Max > fleetv1alpha1.MaxReplicas:
		return nil, fieldError("spec.autoscaling.maxReplicas", "must be between 1 and %d, not %d", fleetv1alpha1.MaxReplicas, s.Max)
	case s.Min > s.Max:
		return nil, fieldError("spec.autoscaling.minReplicas", "(%d) must not exceed spec.autoscaling.maxReplicas (%d)", s.Min, s.Max)
	case math.IsNaN(*a.TargetUtilization) || s.Target < 50 || s.Target > 1000:
		return nil, fieldError("spec.autoscaling.targetUtilization", "must be between 0.05 and 1, not %g", *a.TargetUtilization)
	case s.Up < 0 || s.Up > time.Hour:
		return nil, fieldError("spec.autoscaling.scaleUpStabilization", "must be between 0s and 1h, not %s", s.Up)
	case s.Down < 0 || s.Down > time.Hour:
		return nil, fieldError("spec.autoscaling.scaleDownStabilization", "must be between 0s and 1h, not %s", s.Down)
	}
	return s, nil
}

// recommendation is a size demand asked for, from at until the next one.
type recommendation struct {
	at       time.Time
	replicas int
}

// scaling is what the autoscaler decided in one composition.
type scaling struct {
	desired  int
	reason   string
	demand   leasewire.Demand
	capacity int
	history  []recommendation
}

// wanted is how many leases are asked for: held, waiting, and refused
// lately.
func wanted(d leasewire.Demand) int { return d.Held + d.Waiting + d.Refused }

// recommend is the size that serves demand at the target utilization:
// ceil(wanted / (perProxy x target)), within the bounds. current is the
// size aimed at so far: within the tolerance of the target it stays.
func (a *autoscaler) recommend(d leasewire.Demand, perProxy, current int) int {
	w := wanted(d)
	per := perProxy * a.Target // leases per proxy at the target, in thousandths
	n := (w*1000 + per - 1) / per
	if current > 0 && w > 0 {
		// Within the tolerance of the target at the current size: no change.
		ratio := float64(w*1000) / float64(current*per)
		if math.Abs(ratio-1) <= tolerance {
			n = current
		}
	}
	return min(max(n, a.Min), a.Max)
}

// stabilize records rec in the history and returns the size the fleet aims
// at, as a HorizontalPodAutoscaler's stabilization windows have it: it
// grows to the lowest size asked for within the scale-up window, and
// shrinks to the highest asked for within the scale-down window. Each entry
// of the history holds from its time until the next entry's; an empty
// history starts from current, so that turning autoscaling on shrinks no
// fleet before the scale-down window has passed.
func (a *autoscaler) stabilize(history []recommendation, rec, current int, now time.Time) (int, []recommendation) {
	switch {
	case len(history) == 0:
		history = []recommendation{{at: now, replicas: current}}
	case history[len(history)-1].at.After(now):
		// A time ahead of this one (a clock that moved back): the history
		// restarts at now from the size last asked for.
		history = []recommendation{{at: now, replicas: history[len(history)-1].replicas}}
	}
	if history[len(history)-1].replicas != rec {
		history = append(history, recommendation{at: now, replicas: rec})
	}
	// Forget what no window reaches any more: an entry ends where the next
	// begins.
	horizon := now.Add(-max(a.Up, a.Down))
	first := 0
	for first < len(history)-1 && !history[first+1].at.After(horizon) {
		first++
	}
	history = history[first:]
	if len(history) > maxRecommendations {
		history = history[len(history)-maxRecommendations:]
	}
	up, down := a.window(history, now, a.Up, false), a.window(history, now, a.Down, true)
	desired := current
	if desired < up {
		desired = up
	}
	if desired > down {
		desired = down
	}
	return min(max(desired, a.Min), a.Max), history
}

// window is the highest (highest) or lowest size asked for within d before
// now.
func (a *autoscaler) window(history []recommendation, now time.Time, d time.Duration, highest bool) int {
	from := now.Add(-d)
	out := history[len(history)-1].replicas
	for i, r := range history[:len(history)-1] {
		if !history[i+1].at.After(from) {
			continue
		}
		if highest == (r.replicas > out) {
			out = r.replicas
		}
	}
	return out
}

// holdUntil is when the recommendation above rec that the scale-down window
// still sees leaves it: the fleet shrinks then if nothing asks for more.
func (a *autoscaler) holdUntil(history []recommendation, desired int) time.Time {
	var until time.Time
	for i, r := range history[:len(history)-1] {
		if r.replicas >= desired {
			until = history[i+1].at.Add(a.Down)
		}
	}
	return until
}

// scale sizes an autoscaled fleet: from the demand and the previous
// composition's status, the size it aims at now, and why.
func (a *autoscaler) scale(d leasewire.Demand, perProxy, healthy, current int, history []recommendation, now time.Time, outage bool) *scaling {
	rec := a.recommend(d, perProxy, current)
	if outage {
		rec = min(rec, max(current, a.Min))
	}
	desired, history := a.stabilize(history, rec, current, now)
	s := &scaling{desired: desired, demand: d, capacity: healthy * perProxy, history: history}
	target := float64(a.Target) / 1000
	w := wanted(d)
	var why []string
	switch {
	case w == 0:
		why = append(why, "no lease held or asked for")
	case s.capacity == 0:
		noun := "leases"
		if w == 1 {
			noun = "lease"
		}
		why = append(why, fmt.Sprintf("%d %s asked for and no proxy healthy", w, noun))
	default:
		u := float64(w) / float64(s.capacity)
		op := "≈"
		if u > target*(1+tolerance) {
			op = ">"
		} else if u < target*(1-tolerance) {
			op = "<"
		}
		why = append(why, fmt.Sprintf("utilization %.2f %s %.2f", u, op, target))
	}
	switch {
	case desired > rec:
		if until := a.holdUntil(history, desired); !until.IsZero() {
			why = append(why, fmt.Sprintf("scale-down stabilization keeps %d until %s", desired, until.UTC().Format(time.RFC3339)))
		}
	case desired < rec:
		why = append(why, fmt.Sprintf("scale-up stabilization holds %d for up to %s", desired, a.Up))
	}
	switch {
	case desired == a.Max && rec == a.Max && w*1000 > a.Max*perProxy*a.Target:
		why = append(why, fmt.Sprintf("limited to spec.autoscaling.maxReplicas %d", a.Max))
	case desired == a.Min && rec == a.Min && a.Min > 0 && w*1000 < a.Min*perProxy*a.Target:
		why = append(why, fmt.Sprintf("kept at spec.autoscaling.minReplicas %d", a.Min))
	}
	if outage {
		why = append(why, "no proxy healthy though some had time to boot: the fleet does not grow until one recovers (more would fail alike)")
	}
	s.reason = strings.Join(why, "; ")
	return s
}

// previousScaling reads back what the last composition recorded in the
// XR's status: the size it aimed at (-1 when none) and the recent
// recommendations, oldest first. Entries that do not parse are dropped.
func previousScaling(status *structpb.Struct) (int, []recommendation) {
	desired := -1
	if v := field(status, "desiredReplicas"); v != nil {
		if n := v.GetNumberValue(); n >= 0 && n <= fleetv1alpha1.MaxReplicas && n == math.Trunc(n) {
			desired = int(n)
		}
	}
	var out []recommendation
	for _, v := range field(status, "autoscaling", "recommendations").GetListValue().GetValues() {
		e := v.GetStructValue()
		at, err := time.Parse(time.RFC3339, str(e, "time"))
		n := field(e, "replicas").GetNumberValue()
		if err != nil || n < 0 || n > fleetv1alpha1.MaxReplicas || n != math.Trunc(n) {
			continue
		}
		out = append(out, recommendation{at: at.UTC(), replicas: int(n)})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	if len(out) > maxRecommendations {
		out = out[len(out)-maxRecommendations:]
	}
	return desired, out
}

// statusOf is the XR's status.autoscaling.
func (s *scaling) statusOf() *structpb.Value {
	recs := make([]*structpb.Value, 0, len(s.history))
	for _, r := range s.history {
		recs = append(recs, structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"time":     structpb.NewStringValue(r.at.UTC().Format(time.RFC3339)),
			"replicas": structpb.NewNumberValue(float64(r.replicas)),
		}}))
	}
	return structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
		keyReason:         structpb.NewStringValue(s.reason),
		"held":            structpb.NewNumberValue(float64(s.demand.Held)),
		"waiting":         structpb.NewNumberValue(float64(s.demand.Waiting)),
		"refused":         structpb.NewNumberValue(float64(s.demand.Refused)),
		"capacity":        structpb.NewNumberValue(float64(s.capacity)),
		"recommendations": structpb.NewListValue(&structpb.ListValue{Values: recs}),
	}})
}

// health counts what the autoscaler reads of a fleet: its healthy proxies,
// those unready past failingAfter, and those not replacing another (the
// size autoscaling starts from when turned on).
type health struct{ healthy, failing, holders int }

func countsOf(members []*member, now time.Time) health {
	var h health
	for _, m := range members {
		if m.Healthy {
			h.healthy++
		}
		if !m.Ready && !m.Refused && now.Sub(m.Created) >= failingAfter {
			h.failing++
		}
		if m.Replaces < 0 {
			h.holders++
		}
	}
	return h
}

// failingAfter is how old an unready proxy must be before an autoscaled
// fleet with no healthy proxy counts as in an outage rather than booting.
const failingAfter = 2 * time.Minute

// autoscale sizes an autoscaled fleet, setting its Replicas to the size it
// aims at; nil for a fleet spec.replicas sizes. Until Crossplane has sent
// the fleet's leases and demand, the size aimed at so far stays.
func autoscale(req *fnv1.RunFunctionRequest, f *Fleet, h health, view *leaseView, now time.Time) *scaling {
	if f.autoscale == nil {
		return nil
	}
	current, history := previousScaling(field(req.GetObserved().GetComposite().GetResource(), "status").GetStructValue())
	if current < 0 {
		// Autoscaling was just turned on: it starts from the proxies
		// there are.
		current = h.holders
	}
	var sc *scaling
	if view.known {
		// An outage (the health target down, a backend failing): no
		// proxy healthy though some had time to boot. Every crawler is
		// refused and more proxies would fail alike, so the fleet does
		// not grow until one recovers; nor does it shrink for it.
		outage := h.healthy == 0 && h.failing > 0
		sc = f.autoscale.scale(view.demand, int(*f.spec.Leases.MaxLeasesPerProxy), h.healthy, current, history, now, outage)
	} else {
		sc = &scaling{desired: min(max(current, f.autoscale.Min), f.autoscale.Max), history: history, reason: view.why}
	}
	f.Replicas = sc.desired
	return sc
}
