package function

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/response"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
)

// A pooled fleet composes ProxyPools, and each pool its Proxies. The
// fleet sizes and spreads (replicas, autoscaling, zones), hands out its
// rollout budget a unit at a time, and rolls the pools' counts up; a pool
// runs the same planner a fleet without pools runs on its own Proxies,
// with the replicas, zone order and budget its fleet gave it. A Proxy is
// composed by one pool for its whole life: pool k's ordinals start at
// k x PoolOrdinalSpan.

// Keys of a pool's budget, in its spec and its status.
const (
	keyMaxSurge       = "maxSurge"
	keyMaxUnavailable = "maxUnavailable"
	keyMaxRepairs     = "maxRepairs"
)

// runPool composes one ProxyPool.
func (f *Function) runPool(rsp *fnv1.RunFunctionResponse, req *fnv1.RunFunctionRequest, name, namespace string, xr map[string]any, now time.Time) {
	fleet, err := parsePool(name, namespace, xr)
	if err != nil {
		response.Fatal(rsp, err)
		return
	}
	members := observedMembers(req.GetObserved().GetResources(), nil, fleet.Revision)
	egress := assessEgress(fleet, members, f.asn)
	var burned map[string]string
	if fleet.poolRecycling != nil {
		burned = fleet.poolRecycling.burned
	}
	xrStatus := field(req.GetObserved().GetComposite().GetResource(), "status").GetStructValue()
	// A pool reads its leases only when knowing them could change what it
	// does: its plan with every lease unknown is not steady. A steady pool
	// requires no LeaseSummary, so Crossplane composes it on no summary
	// written (each composition applies every Proxy of the pool): lease
	// churn and summary refreshes compose the pools that replace or remove
	// something, not all of them. The choice depends only on what Crossplane
	// observed and the time (a proxy reaching maxAge makes a pool busy, and
	// the requeue comes no later than that), never on the summaries, so the
	// requirements it asks for stay the same when it calls again with them.
	// What it would recycle makes it busy: it reads its leases then. The
	// picks depend on nothing a lease says, so they are made once.
	recycled := pickRecycles(fleet, members, burned, xrStatus, now)
	probe := make([]*member, len(members))
	for i, m := range members {
		c := *m // decide marks the members it drains
		probe[i] = &c
	}
	p := decide(fleet, probe, false, now)
	quiet := steadyPlan(fleet, probe, p)
	if quiet {
		members = probe
	} else {
		view := requireLeases(rsp, req, fleet, now)
		for _, m := range members {
			m.Leased = view.leased[m.Name]
			m.DrainSeen = view.drainSeen(m.Name, m.DrainSince)
		}
		p = decide(fleet, members, view.known, now)
		p.leasesChange = view.next
	}
	recycled.settle(p, now)
	if err := composeProxies(rsp, fleet, members, p, now); err != nil {
		response.Fatal(rsp, err)
		return
	}
	setPoolStatus(rsp.Desired, fleet, members, p, !quiet, now)
	// Only the count: a fleet reads every pool in one message, and pools'
	// distinct networks do not add up (egress-discovery counts the fleet
	// whole); the label names the Proxies.
	compositeStatus(rsp.Desired).Fields["egress"] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
		keyBeyondLimit: structpb.NewNumberValue(float64(len(egress.Excess))),
	}})
	setRecycles(rsp, recycled)
	setPoolRecycleStatus(rsp.Desired, fleet, recycled, p.keep, now)
	ro := progress(fleet, members, xrStatus, now)
	// A pool's rollout clock runs only while it holds budget: one waiting
	// for its turn is not stalled, and starts its clock when its turn
	// comes.
	waiting := ro != nil && fleet.MaxSurge == 0 && fleet.MaxUnavailable == 0
	if !waiting {
		setRollout(field(rsp.Desired.Composite.Resource, "status").GetStructValue(), ro)
	}
	setReady(rsp.Desired, fleet, members)
	report(rsp, fleet, members, p, ro, now)
	reportDuplicates(rsp, members)
	if waiting {
		response.ConditionFalse(rsp, ConditionRolloutStalled, "WaitingForBudget").
			WithMessage(fmt.Sprintf("%d proxies to replace wait for a share of the fleet's rollout budget (spec.rotation of the ProxyFleet)", ro.remaining)).TargetCompositeAndClaim()
	} else {
		reportRollout(rsp, fleet, members, p, ro, now)
	}
	base := response.DefaultTTL
	if ro == nil && steadyPlan(fleet, members, p) {
		base = poolSteadyRecheck
	}
	ttl := requeueFrom(base, fleet, members, p, now)
	if ro != nil && !fleet.Paused && !waiting {
		if left := ro.since.Add(fleet.ProgressDeadline).Sub(now); left > 0 && left < ttl {
			ttl = max(left, time.Second)
		}
	}
	rsp.Meta.Ttl = durationpb.New(ttl)
}

// poolSteadyRecheck is how long a steady pool waits before it is composed
// again unprompted, rather than the minute of a fleet. Every change of its
// Proxies or its spec is a watch event that composes it at once (it
// requires no LeaseSummary while steady), and a proxy's maxAge or a hold
// on an unhealthy one still bring it back when due; a steady pool removes
// nothing, so summaries turning stale decide nothing. Each composition applies
// every Proxy of the pool: at 105 proxies a minute's recheck was a
// request per proxy per minute (make scale).
const poolSteadyRecheck = 10 * time.Minute

// steadyPlan reports whether a plan changes nothing and waits for
// nothing: every replica held by a Ready, healthy proxy of the current
// template that is not draining, and no other proxy.
func steadyPlan(f *Fleet, members []*member, p *plan) bool {
	if p.leaseWait || p.created > 0 || p.removed > 0 || p.inFlight > 0 || p.due > 0 || p.repairsWanted > 0 ||
		len(p.keep) != int(f.Replicas) || len(members) != len(p.keep) {
		return false
	}
	for _, m := range p.keep {
		if !m.Ready || !m.Healthy || m.Revision != f.Revision || m.CredentialsOutdated || m.Draining || !m.DrainSince.IsZero() {
			return false
		}
	}
	return true
}

// parsePool reads a ProxyPool: its fleet's template with the pool's
// replicas and zones, and the budget the fleet handed it in place of the
// fleet's own maxSurge and maxUnavailable. Ready is still judged by the
// fleet's maxUnavailable, so that a pool's readiness does not move with
// the budget it holds.
func parsePool(name, namespace string, xr map[string]any) (*Fleet, error) {
	spec, _ := xr["spec"].(map[string]any)
	fleetName, _ := spec["fleet"].(string)
	if fleetName == "" {
		return nil, fieldError("spec.fleet", "must name the ProxyFleet this pool belongs to")
	}
	index, ok := spec["index"].(float64)
	if !ok {
		if i, isInt := spec["index"].(int64); isInt {
			index, ok = float64(i), true
		}
	}
	if !ok || index < 1 || index > fleetv1alpha1.MaxPools || index != math.Trunc(index) {
		return nil, fieldError("spec.index", "must be a whole number between 1 and %d, not %v", fleetv1alpha1.MaxPools, spec["index"])
	}
	if want := poolName(fleetName, int(index)); name != want {
		// Names are unique in a namespace: so no two pools of a fleet
		// share an index, and none composes another's Proxies.
		return nil, fieldError("metadata.name", "%q must be %q, the name fleet %s gives its pool %d: ProxyPools are made by their fleet", name, want, fleetName, int(index))
	}
	template, _ := spec["template"].(map[string]any)
	if template == nil {
		return nil, fieldError("spec.template", "is required: the fleet's spec as this pool applies it")
	}
	fleet, err := parseFleet(fleetName, namespace, template)
	if err != nil {
		return nil, errors.Wrap(err, "spec.template")
	}
	if fleet.autoscale != nil || fleet.spec.Pools != nil {
		return nil, fieldError("spec.template", "must have neither autoscaling nor pools: the fleet sizes its pools")
	}
	budget, _ := spec["budget"].(map[string]any)
	surge, unavailable, repairs := number(budget[keyMaxSurge]), number(budget[keyMaxUnavailable]), number(budget[keyMaxRepairs])
	if surge < 0 || unavailable < 0 || repairs < 0 {
		return nil, fieldError("spec.budget", "maxSurge, maxUnavailable and maxRepairs must not be negative")
	}
	switch mode, _ := spec["scaleDown"].(string); mode {
	case "", fleetv1alpha1.PoolScaleDownImmediate:
	case fleetv1alpha1.PoolScaleDownDrain:
		// The planner drains what it removes as an autoscaled fleet's.
		fleet.autoscale = &autoscaler{}
	default:
		return nil, fieldError("spec.scaleDown", "must be Immediate or Drain, not %q", mode)
	}
	status, _ := xr["status"].(map[string]any)
	if fleet.poolRecycling, err = parsePoolRecycling(spec, status); err != nil {
		return nil, err
	}
	fleet.Pool, fleet.OrdinalBase = name, int(index)*fleetv1alpha1.PoolOrdinalSpan
	fleet.readyFloor = fleet.Replicas - fleet.MaxUnavailable
	fleet.MaxSurge, fleet.MaxUnavailable, fleet.repairs = surge, unavailable, repairs
	return fleet, nil
}

// number reads a whole number from unstructured JSON; -1 when it is not
// one, 0 when absent.
func number(v any) int {
	switch n := v.(type) {
	case nil:
		return 0
	case float64:
		if n == math.Trunc(n) && n >= 0 && n <= math.MaxInt32 {
			return int(n)
		}
	case int64:
		if n >= 0 && n <= math.MaxInt32 {
			return int(n)
		}
	}
	return -1
}

// setPoolStatus writes a pool's counts, what it did with its budget, and
// its Proxies at fault, worst first: never one entry per Proxy, since the
// fleet reads every pool's status in one message.
func setPoolStatus(desired *fnv1.State, f *Fleet, members []*member, p *plan, leasesRead bool, now time.Time) {
	status := compositeStatus(desired)
	var ready, healthy, updated, leased, dup, failing int
	var faults []*member
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
		if m.Leased {
			leased++
		}
		if m.Duplicate {
			dup++
		}
		if !m.Ready && !m.Refused && now.Sub(m.Created) >= failingAfter {
			failing++
		}
		if !m.Healthy || !m.Ready {
			faults = append(faults, m)
		}
	}
	sort.SliceStable(faults, func(i, j int) bool {
		if faults[i].Ready != faults[j].Ready {
			return !faults[i].Ready
		}
		return faults[i].Since.Before(faults[j].Since)
	})
	list := make([]*structpb.Value, 0, 3)
	for _, m := range faults[:min(len(faults), 3)] {
		list = append(list, structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"proxy":   structpb.NewStringValue(m.Name),
			keyReason: structpb.NewStringValue(truncateTo(faultOf(m), fleetv1alpha1.MaxPoolFaultReason)),
		}}))
	}
	n := func(v int) *structpb.Value { return structpb.NewNumberValue(float64(v)) }
	status.Fields["replicas"] = n(len(members))
	status.Fields["desiredReplicas"] = n(f.Replicas)
	status.Fields["readyReplicas"] = n(ready)
	status.Fields["healthyReplicas"] = n(healthy)
	status.Fields["updatedReplicas"] = n(updated)
	if leasesRead {
		// A steady pool does not read its leases: its fleet counts the
		// leased proxies from egress-discovery's fleet-wide summaries.
		status.Fields["leasedReplicas"] = n(leased)
	}
	status.Fields["duplicateEgressIPs"] = n(dup)
	status.Fields["failing"] = n(failing)
	status.Fields["observedRevision"] = structpb.NewStringValue(f.Revision)
	status.Fields["faults"] = structpb.NewListValue(&structpb.ListValue{Values: list})
	u := p.usage(f, now)
	status.Fields["budget"] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
		keyMaxSurge:        n(f.MaxSurge),
		keyMaxUnavailable:  n(f.MaxUnavailable),
		"wanted":           n(u.wanted),
		"wantedUnleased":   n(u.wantedFree),
		keyMaxRepairs:      n(f.repairs),
		"repairsWanted":    n(p.repairsWanted),
		"repairsInUse":     n(p.repairsInFlight),
		"surgeInUse":       n(u.surge),
		"unavailableInUse": n(u.unavailable),
	}})
}

// faultOf says why a Proxy is unhealthy or out of service.
func faultOf(m *member) string {
	why := "unhealthy"
	if !m.Ready {
		why = "not Ready"
	}
	why += " since " + m.Since.UTC().Format(time.RFC3339)
	if m.Error != "" {
		why += ": " + m.Error
	}
	return why
}

// compositeStatus returns the desired XR's status, made if need be.
func compositeStatus(desired *fnv1.State) *structpb.Struct {
	if desired.Composite == nil {
		desired.Composite = &fnv1.Resource{}
	}
	if desired.Composite.Resource == nil {
		desired.Composite.Resource = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	xr := desired.Composite.Resource
	status := field(xr, "status").GetStructValue()
	if status == nil {
		status = &structpb.Struct{Fields: map[string]*structpb.Value{}}
		xr.Fields["status"] = structpb.NewStructValue(status)
	}
	return status
}

// usage is what a pool's plan holds of its budget: the Ready replicas due
// for replacement it has not replaced yet (wanted; wantedFree of them no
// lease holds), the Proxies it keeps above its replicas (surge), and the
// Ready Proxies its changes took out of service (unavailable): holders it
// drains, and the proxies it made in place of a holder it removed first
// that are not Ready yet. A proxy that failed is no change of the fleet's,
// and holds no budget.
type usage struct{ wanted, wantedFree, surge, unavailable int }

func (p *plan) usage(f *Fleet, now time.Time) usage {
	u := usage{wanted: p.due, wantedFree: p.dueFree, surge: max(0, len(p.keep)-f.Replicas)}
	caused, available := 0, 0
	for _, m := range p.keep {
		inPlace := !m.Ready && m.Replaces < 0 && m.Generation > 0 && m.Streak == 0 && now.Sub(m.Created) < f.ReplaceUnhealthyAfter
		switch {
		case m.Ready && !m.Draining:
			available++
		case m.Ready || inPlace:
			caused++
		}
	}
	// Only below its replicas: a proxy draining above them (the pool
	// shrinking) takes nothing out of service.
	u.unavailable = min(caused, max(0, f.Replicas-available))
	return u
}

// String is for test failures.
func (u usage) String() string {
	return fmt.Sprintf("wanted %d (%d unleased), surge %d, unavailable %d", u.wanted, u.wantedFree, u.surge, u.unavailable)
}
