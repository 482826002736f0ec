package function

import (
	"fmt"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/response"
	"google.golang.org/protobuf/types/known/structpb"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
)

// The fleet's status and what the function reports: the XR's status,
// its conditions and results, and when Crossplane calls again.

// ConditionFleetHealthy is the XR condition that says how healthy the fleet is.
const ConditionFleetHealthy = "FleetHealthy"

// finish reports the fleet: its status, readiness and conditions, and when
// to compose it again.
func finish(rsp *fnv1.RunFunctionResponse, req *fnv1.RunFunctionRequest, fleet *Fleet, members []*member, p *plan, sc *scaling, now time.Time) {
	setStatus(rsp.Desired, fleet, members, now)
	reportScaling(rsp, fleet, sc)
	ro := progress(fleet, members, field(req.GetObserved().GetComposite().GetResource(), "status").GetStructValue(), now)
	setRollout(field(rsp.Desired.Composite.Resource, "status").GetStructValue(), ro)
	setReady(rsp.Desired, fleet, members)
	report(rsp, fleet, members, p, ro, now)
	reportDuplicates(rsp, members)
	for _, w := range fleet.Warnings {
		response.Warning(rsp, errors.New(w)).TargetCompositeAndClaim()
	}
	if n := proto.Size(req); n > fleetv1alpha1.MessageBudget {
		// What the XRD's bound cannot see (a stored fleet above it, long
		// error messages, many bans): said before it breaks.
		response.Warning(rsp, errors.Errorf("Crossplane sent this fleet's Proxies and leases in %.1f MiB, more than the 2 MiB the XRD allows a fleet of one level: past the function's --max-recv-message-size (%d MiB unless set) it can no longer be composed; lower spec.replicas, spec.rotation.maxSurge or spec.placement.gcp.cloudInit.inline, or replace it with a fleet created with spec.pools", float64(n)/(1<<20), DefaultMaxRecvMessageMiB)).TargetCompositeAndClaim()
	}
	reportRollout(rsp, fleet, members, p, ro, now)
	ttl := requeueAfter(fleet, members, p, now)
	if sc != nil {
		// Demand is no object Crossplane watches: an autoscaled fleet is
		// composed again as often as discovery may publish it, and a
		// fleet at zero twice as often, for its first crawler waits.
		ttl = min(ttl, leasewire.DemandInterval)
		if fleet.Replicas == 0 {
			ttl = min(ttl, leasewire.DemandInterval/2)
		}
	}
	if ro != nil && !fleet.Paused {
		// RolloutStalled turns True when the deadline passes, not a
		// poll later.
		if left := ro.since.Add(fleet.ProgressDeadline).Sub(now); left > 0 && left < ttl {
			ttl = max(left, time.Second)
		}
	}
	rsp.Meta.Ttl = durationpb.New(ttl)
}

// requeueAfter is how long Crossplane may wait before composing the fleet
// again. Changes to its Proxies and its LeaseSummaries requeue it at once
// anyway (realtime compositions watch what a function composes and
// requires); what nothing announces is time passing, so this is the time
// until the next proxy reaches maxAge or has been unready for
// replaceUnhealthyAfter, so that rotation and replacement happen when due
// rather than up to a poll interval later, and, while one waits on a
// lease, until the summaries say otherwise by time alone or a drain
// settles.
func requeueAfter(f *Fleet, members []*member, p *plan, now time.Time) time.Duration {
	return requeueFrom(response.DefaultTTL, f, members, p, now)
}

// requeueFrom is requeueAfter from base rather than the default.
func requeueFrom(base time.Duration, f *Fleet, members []*member, p *plan, now time.Time) time.Duration {
	d := base
	due := func(at time.Time) {
		if left := at.Sub(now); left > 0 && left < d {
			d = left
		}
	}
	for _, m := range members {
		if f.MaxAge > 0 {
			due(m.Created.Add(f.MaxAge))
		}
		if !m.Ready && !m.Since.IsZero() {
			due(later(m.Since, m.Created).Add(f.unhealthyHold(m)))
		}
		if p.leaseWait && !m.DrainSince.IsZero() {
			// Drained once every replica saw it (a summary written)
			// and drainSettle passed (nothing written).
			due(m.DrainSince.Add(drainSettle))
		}
	}
	if p.leaseWait && !p.leasesChange.IsZero() {
		// A fresh summary of a crashed replica turns stale, a stale
		// one's lease ends: unannounced. (Without realtime
		// compositions a drain waits for the poll too.)
		due(p.leasesChange)
	}
	// Times are whole seconds; never ask for a busy loop.
	return max(d, time.Second)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// setStatus writes the fleet's observed state to the desired XR, keeping
// whatever earlier pipeline steps set.
func setStatus(desired *fnv1.State, f *Fleet, members []*member, now time.Time) {
	status := compositeStatus(desired)
	var ready, healthy, updated int
	proxies := make([]*structpb.Value, 0, len(members))
	shared := map[string]*structpb.Value{} // zones repeat
	intern := func(s string) *structpb.Value {
		v, ok := shared[s]
		if !ok {
			v = structpb.NewStringValue(s)
			shared[s] = v
		}
		return v
	}
	healthyValue := map[bool]*structpb.Value{true: structpb.NewBoolValue(true), false: structpb.NewBoolValue(false)}
	for _, m := range members {
		if m.Ready {
			ready++
		}
		if m.Healthy {
			healthy++
		}
		if f.current(m) {
			updated++
		}
		ps := &structpb.Struct{Fields: map[string]*structpb.Value{
			"name":     structpb.NewStringValue(m.Name),
			"endpoint": structpb.NewStringValue(m.Endpoint),
			"zone":     intern(m.Zone),
			"egressIP": structpb.NewStringValue(m.EgressIP),
			"healthy":  healthyValue[m.Healthy],
			// A timestamp, not an age: an age would change the XR on
			// every reconcile, each change would trigger the next, and
			// Crossplane's circuit breaker would throttle the fleet.
			"createdAt": structpb.NewStringValue(m.Created.UTC().Format(time.RFC3339)),
		}}
		if m.Duplicate {
			ps.Fields["duplicateEgressIP"] = healthyValue[true]
		}
		if m.Beyond != "" {
			ps.Fields["beyondDiversityLimit"] = structpb.NewStringValue(m.Beyond)
		}
		proxies = append(proxies, structpb.NewStructValue(ps))
	}
	status.Fields["replicas"] = structpb.NewNumberValue(float64(len(members)))
	status.Fields["readyReplicas"] = structpb.NewNumberValue(float64(ready))
	status.Fields["healthyReplicas"] = structpb.NewNumberValue(float64(healthy))
	status.Fields["updatedReplicas"] = structpb.NewNumberValue(float64(updated))
	status.Fields["observedRevision"] = structpb.NewStringValue(f.Revision)
	status.Fields["desiredReplicas"] = structpb.NewNumberValue(float64(f.Replicas))
	status.Fields["proxies"] = structpb.NewListValue(&structpb.ListValue{Values: proxies})
}

// report sets the FleetHealthy condition, and a Warning result only on real
// trouble: a proxy unavailable for longer than replaceUnhealthyAfter.
func report(rsp *fnv1.RunFunctionResponse, f *Fleet, members []*member, p *plan, ro *rollout, now time.Time) {
	healthy := 0
	var sick []string
	trouble := false
	for _, m := range members {
		if m.Healthy {
			healthy++
			continue
		}
		down := now.Sub(m.Since)
		// "since", not "for": the message must not change while nothing does.
		msg := fmt.Sprintf("proxy %s unhealthy since %s", m.Name, m.Since.UTC().Format(time.RFC3339))
		if m.Error != "" {
			msg += ": " + m.Error
		}
		sick = append(sick, msg)
		if !m.Ready && down >= f.ReplaceUnhealthyAfter {
			trouble = true
		}
	}
	parts := []string{fmt.Sprintf("%d/%d proxies healthy", healthy, max(len(members), f.Replicas))}
	if len(members) != f.Replicas {
		parts[0] += fmt.Sprintf(" (replicas %d)", f.Replicas)
	}
	switch {
	case f.Pool != "" && len(sick) > 0:
		// A pool's status.faults names them: its fleet reads every
		// pool's status in one message, which this would double.
		parts = append(parts, fmt.Sprintf("%d unhealthy; status.faults names the worst", len(sick)))
	case len(sick) > 3:
		parts = append(parts, append(sick[:3], fmt.Sprintf("and %d more", len(sick)-3))...)
	default:
		parts = append(parts, sick...)
	}
	if n := p.inFlight + p.created; n == 1 {
		parts = append(parts, "1 proxy being added or replaced")
	} else if n > 1 {
		parts = append(parts, fmt.Sprintf("%d proxies being added or replaced", n))
	}
	if ro != nil {
		r := fmt.Sprintf("rolling out template revision %s: %d of %d proxies to replace", f.Revision, ro.remaining, len(members))
		if f.Paused {
			r += " (paused: spec.rollout.paused)"
		}
		parts = append(parts, r)
	}
	parts = append(parts, p.blocked...)
	msg := strings.Join(parts, "; ")

	setFleetHealthy(rsp, f.Replicas, healthy, msg)
	if trouble {
		response.Warning(rsp, errors.New(msg)).TargetCompositeAndClaim()
	}
}

// setFleetHealthy sets the FleetHealthy condition of a fleet of replicas
// proxies with healthy of them healthy, saying msg.
func setFleetHealthy(rsp *fnv1.RunFunctionResponse, replicas, healthy int, msg string) {
	var c *response.ConditionOption
	switch {
	case replicas == 0:
		c = response.ConditionTrue(rsp, ConditionFleetHealthy, "ScaledToZero")
	case healthy >= replicas:
		c = response.ConditionTrue(rsp, ConditionFleetHealthy, "AllHealthy")
	case healthy == 0:
		c = response.ConditionFalse(rsp, ConditionFleetHealthy, "NoHealthyProxies")
	default:
		c = response.ConditionFalse(rsp, ConditionFleetHealthy, "Degraded")
	}
	c.WithMessage(msg).TargetCompositeAndClaim()
}

// reportScaling says who sizes the fleet: the Autoscaling condition, and
// for an autoscaled fleet its status.autoscaling.
func reportScaling(rsp *fnv1.RunFunctionResponse, f *Fleet, sc *scaling) {
	if sc == nil {
		response.ConditionFalse(rsp, ConditionAutoscaling, "Disabled").
			WithMessage("spec.replicas sizes the fleet; kubectl scale or a HorizontalPodAutoscaler may set it").TargetCompositeAndClaim()
		return
	}
	field(rsp.Desired.Composite.Resource, "status").GetStructValue().Fields["autoscaling"] = sc.statusOf()
	msg := fmt.Sprintf("aiming at %d proxies: %s; spec.replicas (%d) is ignored while spec.autoscaling is set", sc.desired, sc.reason, *f.spec.Replicas)
	response.ConditionTrue(rsp, ConditionAutoscaling, "DemandDriven").WithMessage(msg).TargetCompositeAndClaim()
}
