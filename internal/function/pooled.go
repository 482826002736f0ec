package function

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/response"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// poolRecheck is how soon a pooled fleet is composed again while budget
// moves between its pools. Each step waits for a pool to acknowledge, which
// its status change announces (Crossplane composes the fleet again when a
// pool changes); this only bounds a missed event.
const poolRecheck = 30 * time.Second

// budget is a share of a fleet's rollout budget: surge proxies, proxies
// taken out of service, and replacements of proxies that are down not Ready
// yet (repairs: max(maxSurge, 1) for the fleet, so that a backend that
// cannot run proxies is not flooded with them, however many pools it has).
type budget struct{ surge, unavailable, repairs int }

// observedPool is one ProxyPool of the fleet, as observed.
type observedPool struct {
	index int
	name  string
	// replicas is its spec's, granted its spec's budget.
	replicas int
	granted  budget
	// reported says the pool wrote a status; desired, acked, usage and
	// the counts are what it reported.
	reported bool
	desired  int
	acked    budget
	wanted   int
	// wantedFree counts the wanted proxies no lease holds: a unit granted
	// for one is used at once.
	wantedFree int
	inUse      budget
	// ledger is the budget the fleet's own status says it granted last.
	ledger budget
	// repairsWanted counts its proxies that are down and due for a
	// replacement, replaced or waiting.
	repairsWanted int
	counts        poolCounts
	faults        []fleetv1alpha1.PoolFault
	revision      string
	ready         bool
	// stalled holds its RolloutStalled condition's message while True.
	stalled string
	// recycling is its recycle grants, what it did with them, and its
	// recycles.
	recycling observedPoolRecycling
}

// poolCounts are a pool's counts, as its status reports them; leased is
// the fleet's alone (from its summaries, -1 when none counts them): a
// steady pool does not count its own.
type poolCounts struct {
	replicas, ready, healthy, updated, leased, duplicates, failing int
	// beyond is the pool's status.egress.beyondLimit.
	beyond int
}

func (c *poolCounts) add(o poolCounts) {
	c.replicas += o.replicas
	c.ready += o.ready
	c.healthy += o.healthy
	c.updated += o.updated
	c.duplicates += o.duplicates
	c.failing += o.failing
	c.beyond += o.beyond
}

// poolResourceName is the composition resource name of pool k.
func poolResourceName(k int) string { return "pool-" + strconv.Itoa(k) }

// poolName is the name of a fleet's pool k: <fleet>-pool-<k>, or, where
// that passes the 63 characters Crossplane allows an XR's name, the
// fleet's name cut short and a hash of it whole in its place.
func poolName(fleet string, k int) string {
	suffix := "-pool-" + strconv.Itoa(k)
	if len(fleet)+len(suffix) <= maxXRName {
		return fleet + suffix
	}
	sum := sha256.Sum256([]byte(fleet))
	tag := "-" + hex.EncodeToString(sum[:])[:8]
	return fleet[:maxXRName-len(suffix)-len(tag)] + tag + suffix
}

// maxXRName is the longest name Crossplane allows a composite resource.
const maxXRName = 63

// observedPools reads the fleet's ProxyPools, by index, with the budget
// the fleet's status (xrStatus) says it granted each last.
func observedPools(observed map[string]*fnv1.Resource, xrStatus *structpb.Struct, now time.Time) map[int]*observedPool {
	ledger := map[string]budget{}
	recycleLedger := map[string]recycleGrant{}
	for _, v := range field(xrStatus, "pools").GetListValue().GetValues() {
		e := v.GetStructValue()
		ledger[str(e, "name")] = budget{whole(field(e, "budget", keyMaxSurge)), whole(field(e, "budget", keyMaxUnavailable)), whole(field(e, "budget", keyMaxRepairs))}
		recycleLedger[str(e, "name")] = grantOf(field(e, "budget").GetStructValue())
	}
	out := map[int]*observedPool{}
	for name, oc := range observed {
		k, err := strconv.Atoi(strings.TrimPrefix(name, "pool-"))
		r := oc.GetResource()
		if !strings.HasPrefix(name, "pool-") || err != nil || k < 1 || str(r, "kind") != fleetv1alpha1.ProxyPoolKind {
			continue
		}
		spec, status := field(r, "spec").GetStructValue(), field(r, "status").GetStructValue()
		p := &observedPool{
			index: k, name: str(r, "metadata", "name"),
			replicas: whole(field(spec, "template", "replicas")),
			granted:  budget{whole(field(spec, "budget", keyMaxSurge)), whole(field(spec, "budget", keyMaxUnavailable)), whole(field(spec, "budget", keyMaxRepairs))},
		}
		if b := field(status, "budget").GetStructValue(); b != nil {
			p.reported = true
			p.desired = whole(field(status, "desiredReplicas"))
			p.acked = budget{whole(field(b, keyMaxSurge)), whole(field(b, keyMaxUnavailable)), whole(field(b, keyMaxRepairs))}
			p.wanted = whole(field(b, "wanted"))
			p.wantedFree = whole(field(b, "wantedUnleased"))
			p.inUse = budget{whole(field(b, "surgeInUse")), whole(field(b, "unavailableInUse")), whole(field(b, "repairsInUse"))}
			p.repairsWanted = whole(field(b, "repairsWanted"))
		} else {
			// Not composed yet: it may act on its spec's budget.
			p.acked = p.granted
		}
		p.counts = poolCounts{
			replicas: whole(field(status, "replicas")), ready: whole(field(status, "readyReplicas")),
			healthy: whole(field(status, "healthyReplicas")), updated: whole(field(status, "updatedReplicas")),
			duplicates: whole(field(status, "duplicateEgressIPs")),
			failing:    whole(field(status, "failing")),
			beyond:     whole(field(status, "egress", keyBeyondLimit)),
		}
		p.ledger = ledger[p.name]
		p.recycling = readPoolRecycling(spec, status, recycleLedger[p.name], now)
		p.revision = str(status, "observedRevision")
		for _, v := range field(status, "faults").GetListValue().GetValues() {
			p.faults = append(p.faults, fleetv1alpha1.PoolFault{Proxy: str(v.GetStructValue(), "proxy"), Reason: str(v.GetStructValue(), "reason")})
		}
		for _, c := range field(status, "conditions").GetListValue().GetValues() {
			cs := c.GetStructValue()
			isTrue := str(cs, "status") == string(corev1.ConditionTrue)
			switch str(cs, "type") {
			case "Ready":
				p.ready = isTrue
			case ConditionRolloutStalled:
				if isTrue {
					p.stalled = str(cs, "message")
				}
			}
		}
		out[k] = p
	}
	return out
}

// whole reads a non-negative whole number; 0 when it is none.
func whole(v *structpb.Value) int { return max(number(v.AsInterface()), 0) }

// poolPlan is what the fleet decides for one pool.
type poolPlan struct {
	index    int
	replicas int
	zones    []string
	grant    budget
	// recycles is the recycle grant it is given.
	recycles recycleGrant
	observed *observedPool
}

// sizePools splits replicas over pools of at most perPool, filling them in
// order so that only the last is partly full: growing or shrinking the
// fleet changes one pool, and moves no Proxy. Pools beyond those needed
// keep a plan of 0 replicas until they are empty, then are left out (and
// so deleted). Each pool fills the fleet's zones starting where the pools
// before it left off, so that the fleet is spread as one level would be.
func sizePools(replicas, perPool int, zones []string, observed map[int]*observedPool) []*poolPlan {
	n := (replicas + perPool - 1) / perPool
	var out []*poolPlan
	for k := 1; k <= n; k++ {
		out = append(out, &poolPlan{index: k, replicas: min(perPool, replicas-(k-1)*perPool), zones: rotated(zones, (k-1)*perPool)})
	}
	extra := make([]int, 0, len(observed))
	for k := range observed {
		if k > n {
			extra = append(extra, k)
		}
	}
	sort.Ints(extra)
	for _, k := range extra {
		o := observed[k]
		if o.replicas == 0 && o.reported && o.desired == 0 && o.counts.replicas == 0 {
			// Empty, and composed as such: nothing of it can come back.
			continue
		}
		out = append(out, &poolPlan{index: k, zones: rotated(zones, (k-1)*perPool)})
	}
	for _, p := range out {
		p.observed = observed[p.index]
	}
	return out
}

// rotated returns zones starting at offset (mod its length).
func rotated(zones []string, offset int) []string {
	if len(zones) == 0 {
		return zones
	}
	offset %= len(zones)
	return append(append([]string{}, zones[offset:]...), zones[:offset]...)
}

// allocate hands out the fleet's rollout budget. A pool keeps what it was
// granted while it wants budget or uses some (no more than it wants or
// uses); one that does neither is granted none. A unit is free only once no
// pool may act on it any more: not granted in a pool's spec, nor in the
// fleet's own record of its last grants (its status, which a stale view of
// the pool cannot hide), not acknowledged in the pool's status as the
// budget it was last composed with, not in use. Free units go to the pools
// that want them, one each in turn: first those with a due proxy no lease
// holds, which can use a unit at once, then the others, lowest index
// first. So a unit moves from one pool to another only after the first
// acknowledged giving it up, and however many pools roll at once, their
// use never exceeds the fleet's.
func allocate(total budget, pools []*poolPlan) {
	surge := make([]int, len(pools))
	unavailable := make([]int, len(pools))
	wants := make([]int, len(pools))
	ready := make([]bool, len(pools))
	for i, p := range pools {
		o := p.observed
		if o == nil {
			continue
		}
		wants[i], ready[i] = o.wanted, o.wantedFree > 0
		if o.wanted > 0 || o.inUse.surge > 0 {
			surge[i] = min(o.granted.surge, max(o.wanted, o.inUse.surge))
		}
		if o.wanted > 0 || o.inUse.unavailable > 0 {
			unavailable[i] = min(o.granted.unavailable, max(o.wanted, o.inUse.unavailable))
		}
	}
	share(total.surge, pools, surge, wants, ready, func(o *observedPool) []int {
		return []int{o.granted.surge, o.ledger.surge, o.acked.surge, o.inUse.surge}
	})
	share(total.unavailable, pools, unavailable, wants, ready, func(o *observedPool) []int {
		return []int{o.granted.unavailable, o.ledger.unavailable, o.acked.unavailable, o.inUse.unavailable}
	})
	repairs := make([]int, len(pools))
	repairWants := make([]int, len(pools))
	everyone := make([]bool, len(pools))
	for i, p := range pools {
		everyone[i] = true
		if o := p.observed; o != nil {
			repairWants[i] = o.repairsWanted
			if o.repairsWanted > 0 || o.inUse.repairs > 0 {
				repairs[i] = min(o.granted.repairs, max(o.repairsWanted, o.inUse.repairs))
			}
		}
	}
	share(total.repairs, pools, repairs, repairWants, everyone, func(o *observedPool) []int {
		return []int{o.granted.repairs, o.ledger.repairs, o.acked.repairs, o.inUse.repairs}
	})
	for i, p := range pools {
		p.grant = budget{surge[i], unavailable[i], repairs[i]}
	}
}

// share distributes total units of one kind: grants holds what each pool
// keeps, and is raised in turn for the pools that want more, as long as
// units are free (those ready to use one first); held says what else a
// pool may still act on.
func share(total int, pools []*poolPlan, grants, wants []int, ready []bool, held func(*observedPool) []int) {
	committed := func(i int) int {
		c := grants[i]
		if o := pools[i].observed; o != nil {
			for _, v := range held(o) {
				c = max(c, v)
			}
		}
		return c
	}
	// The fleet's budget was lowered: the highest pools give up what
	// they hold beyond it first.
	sum := 0
	for i := range grants {
		sum += grants[i]
	}
	for i := len(grants) - 1; i >= 0 && sum > total; i-- {
		cut := min(grants[i], sum-total)
		grants[i] -= cut
		sum -= cut
	}
	free := total
	for i := range pools {
		free -= committed(i)
	}
	// What a pool may act on anyway costs nothing more to grant, within
	// the fleet's budget.
	for i := range pools {
		if wants[i] > grants[i] {
			raised := min(wants[i], committed(i), grants[i]+total-sum)
			if raised > grants[i] {
				sum += raised - grants[i]
				grants[i] = raised
			}
		}
	}
	for _, first := range []bool{true, false} {
		for free > 0 {
			given := false
			for i := range pools {
				if free == 0 {
					break
				}
				if (ready[i] || !first) && wants[i] > grants[i] && grants[i] >= committed(i) {
					grants[i]++
					free--
					given = true
				}
			}
			if !given {
				break
			}
		}
	}
}

// runPooledFleet composes a fleet of ProxyPools.
func (f *Function) runPooledFleet(rsp *fnv1.RunFunctionResponse, req *fnv1.RunFunctionRequest, fleet *Fleet, now time.Time) {
	for name := range req.GetObserved().GetResources() {
		if _, ok := ordinalOf(name); ok {
			// Adding spec.pools to a fleet of Proxies is refused by the
			// schema; one stored otherwise is not torn down here.
			response.Fatal(rsp, fieldError("spec.pools", "is set on a fleet that composes Proxies itself (%s): they cannot move into pools; remove spec.pools, or create a new fleet with it", name))
			return
		}
	}
	xrStatus := field(req.GetObserved().GetComposite().GetResource(), "status").GetStructValue()
	observed := observedPools(req.GetObserved().GetResources(), xrStatus, now)
	var total poolCounts
	holders := 0
	for _, o := range observed {
		total.add(o.counts)
		holders += o.replicas
	}
	// The fleet-wide summaries carry the fleet's demand and how many of
	// its proxies are leased: a steady pool does not read its own, so the
	// pools' counts do not add up to the fleet's. Each summary written
	// composes the fleet (its pools, not their Proxies), at most every
	// leasewire.SummaryInterval per discovery replica.
	view := requireLeases(rsp, req, fleet, now)
	total.leased = -1 // unknown: no fresh summary counts them
	if view.leasedReported {
		total.leased = min(view.reportedLeased, total.replicas)
	}
	var sc *scaling
	if fleet.autoscale != nil {
		sc = autoscale(req, fleet, health{healthy: total.healthy, failing: total.failing, holders: holders}, view, now)
	}
	plans := sizePools(fleet.Replicas, int(fleet.spec.Pools.ProxiesPerPool), fleet.Zones, observed)
	allocate(budget{fleet.MaxSurge, fleet.MaxUnavailable, max(fleet.MaxSurge, 1)}, plans)
	recycled := planPoolRecycles(fleet, plans, view.burned, xrStatus, total.healthy, now)

	desired := desiredResources(rsp)
	for name := range desired {
		if strings.HasPrefix(name, "pool-") {
			delete(desired, name)
		}
	}
	for _, p := range plans {
		r, err := fleet.pool(p, recycled.burned[p.index])
		if err != nil {
			response.Fatal(rsp, err)
			return
		}
		desired[poolResourceName(p.index)] = r
	}
	if err := f.grantAccess(rsp, fleet); err != nil {
		response.Fatal(rsp, err)
		return
	}
	setFleetStatus(rsp.Desired, fleet, plans, total)
	setPooledRecycles(rsp, plans, recycled, now)
	reportScaling(rsp, fleet, sc)
	reportPools(rsp, fleet, plans, total)
	reportPoolsDiversity(rsp, fleet, plans, total)
	for _, w := range fleet.Warnings {
		response.Warning(rsp, errors.New(w)).TargetCompositeAndClaim()
	}
	rsp.Desired.Composite.Ready = fnv1.Ready_READY_FALSE
	if total.ready >= fleet.servingFloor() {
		rsp.Desired.Composite.Ready = fnv1.Ready_READY_TRUE
	}
	ttl := response.DefaultTTL
	for _, p := range plans {
		if !p.settled() {
			ttl = poolRecheck
		}
	}
	if sc != nil {
		ttl = min(ttl, leasewire.DemandInterval)
		if fleet.Replicas == 0 {
			ttl = min(ttl, leasewire.DemandInterval/2)
		}
	}
	rsp.Meta.Ttl = durationpb.New(ttl)
}

// settled: the pool was composed with what the plan grants it, and
// acknowledged it.
func (p *poolPlan) settled() bool {
	o := p.observed
	return o != nil && o.acked == p.grant && o.granted == p.grant && o.recycling.acked == p.recycles && o.recycling.granted == p.recycles
}

// pool is the desired ProxyPool of a plan: the fleet's spec, defaults
// applied, with the pool's replicas and zone order, without autoscaling,
// pools, spec.recycling (the fleet holds its bound, and names the pool's
// burned Proxies) or the gateway's settings (discovery reads those from
// the fleet: a change of them composes no pool), and the budget and
// recycles it is granted.
func (f *Fleet) pool(p *poolPlan, burned []fleetv1alpha1.PoolBurned) (*fnv1.Resource, error) {
	t := f.spec.DeepCopy()
	replicas := int32(p.replicas)
	t.Replicas, t.Zones, t.Autoscaling, t.Pools, t.Gateway, t.Recycling = &replicas, p.zones, nil, nil, nil, nil
	template, err := toValue(t)
	if err != nil {
		return nil, errors.Wrap(err, "cannot compose a pool's spec.template")
	}
	scaleDown := fleetv1alpha1.PoolScaleDownImmediate
	if f.autoscale != nil {
		scaleDown = fleetv1alpha1.PoolScaleDownDrain
	}
	r := &fnv1.Resource{Resource: &structpb.Struct{Fields: map[string]*structpb.Value{
		"apiVersion": structpb.NewStringValue(fleetv1alpha1.SchemeGroupVersion.String()),
		"kind":       structpb.NewStringValue(fleetv1alpha1.ProxyPoolKind),
		"metadata": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"name":      structpb.NewStringValue(poolName(f.Name, p.index)),
			"namespace": structpb.NewStringValue(f.Namespace),
			"labels": structpb.NewStructValue(strings2struct(map[string]string{
				fleetv1alpha1.LabelFleet: ownership.LabelValue(f.Name),
			})),
			"annotations": structpb.NewStructValue(strings2struct(map[string]string{
				fleetv1alpha1.AnnotationFleet: f.Name,
			})),
		}}),
		"spec": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"fleet":     structpb.NewStringValue(f.Name),
			"index":     structpb.NewNumberValue(float64(p.index)),
			"scaleDown": structpb.NewStringValue(scaleDown),
			"budget": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				keyMaxSurge:       structpb.NewNumberValue(float64(p.grant.surge)),
				keyMaxUnavailable: structpb.NewNumberValue(float64(p.grant.unavailable)),
				keyMaxRepairs:     structpb.NewNumberValue(float64(p.grant.repairs)),
			}}),
			"template": template,
		}}),
	}}}
	spec := r.Resource.Fields["spec"].GetStructValue()
	p.recycles.put(spec.Fields["budget"].GetStructValue())
	if len(burned) > 0 {
		list := make([]*structpb.Value, len(burned))
		for i, b := range burned {
			list[i] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				"name": structpb.NewStringValue(b.Name), keyReason: structpb.NewStringValue(b.Reason),
			}})
		}
		spec.Fields["burned"] = structpb.NewListValue(&structpb.ListValue{Values: list})
	}
	if p.observed != nil && p.observed.ready {
		r.Ready = fnv1.Ready_READY_TRUE
	}
	return r, nil
}

// setFleetStatus rolls the pools' counts up into the fleet's status, with
// one entry per pool and none per Proxy.
func setFleetStatus(desired *fnv1.State, f *Fleet, plans []*poolPlan, total poolCounts) {
	status := compositeStatus(desired)
	n := func(v int) *structpb.Value { return structpb.NewNumberValue(float64(v)) }
	updated := 0
	pools := make([]*structpb.Value, 0, len(plans))
	for _, p := range plans {
		o := p.observed
		if o == nil {
			o = &observedPool{name: poolName(f.Name, p.index)}
		}
		if o.revision == f.Revision {
			updated += o.counts.updated
		}
		ps := &structpb.Struct{Fields: map[string]*structpb.Value{
			"name":            structpb.NewStringValue(poolName(f.Name, p.index)),
			"replicas":        n(o.counts.replicas),
			"readyReplicas":   n(o.counts.ready),
			"healthyReplicas": n(o.counts.healthy),
			"updatedReplicas": n(o.counts.updated),
		}}
		if p.grant != (budget{}) || p.recycles.k > 0 {
			b := &structpb.Struct{Fields: map[string]*structpb.Value{
				keyMaxSurge: n(p.grant.surge), keyMaxUnavailable: n(p.grant.unavailable), keyMaxRepairs: n(p.grant.repairs),
			}}
			p.recycles.put(b)
			ps.Fields["budget"] = structpb.NewStructValue(b)
		}
		pools = append(pools, structpb.NewStructValue(ps))
	}
	status.Fields["replicas"] = n(total.replicas)
	status.Fields["readyReplicas"] = n(total.ready)
	status.Fields["healthyReplicas"] = n(total.healthy)
	status.Fields["updatedReplicas"] = n(updated)
	if total.leased >= 0 {
		status.Fields["leasedReplicas"] = n(total.leased)
	}
	status.Fields["duplicateEgressIPs"] = n(total.duplicates)
	status.Fields["egress"] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{keyBeyondLimit: n(total.beyond)}})
	status.Fields["observedRevision"] = structpb.NewStringValue(f.Revision)
	status.Fields["desiredReplicas"] = n(f.Replicas)
	status.Fields["pools"] = structpb.NewListValue(&structpb.ListValue{Values: pools})
}

// reportPools sets a pooled fleet's conditions: FleetHealthy names the
// pools and Proxies at fault, DuplicateEgressIP counts the Proxies whose
// pool has another on their IP, RolloutStalled names the pools behind.
func reportPools(rsp *fnv1.RunFunctionResponse, f *Fleet, plans []*poolPlan, total poolCounts) {
	var faults []string
	behind := 0
	var stalled, stuck []string
	for _, p := range plans {
		o := p.observed
		if o == nil {
			continue
		}
		if o.stalled != "" {
			stuck = append(stuck, o.name+": "+o.stalled)
		}
		for _, fault := range o.faults {
			faults = append(faults, fmt.Sprintf("%s: %s %s", o.name, fault.Proxy, fault.Reason))
		}
		if o.revision != f.Revision {
			behind += o.counts.replicas
		} else {
			behind += o.counts.replicas - o.counts.updated
		}
		if o.wanted > 0 && p.grant == (budget{}) {
			stalled = append(stalled, o.name)
		}
	}
	parts := []string{fmt.Sprintf("%d/%d proxies healthy in %d pools", total.healthy, max(total.replicas, f.Replicas), len(plans))}
	if total.replicas != f.Replicas {
		parts[0] += fmt.Sprintf(" (replicas %d)", f.Replicas)
	}
	if len(faults) > 3 {
		faults = append(faults[:3], fmt.Sprintf("and more in %d pools", countFaulty(plans)-min(countFaulty(plans), 3)))
	}
	parts = append(parts, faults...)
	if behind > 0 {
		r := fmt.Sprintf("rolling out template revision %s: %d proxies to replace", f.Revision, behind)
		if len(stalled) > 0 {
			r += fmt.Sprintf(", %d pools wait for the fleet's rollout budget (spec.rotation.maxSurge %d, maxUnavailable %d)", len(stalled), f.MaxSurge, f.MaxUnavailable)
		}
		parts = append(parts, r)
	}
	msg := strings.Join(parts, "; ")
	setFleetHealthy(rsp, f.Replicas, total.healthy, msg)
	if total.duplicates > 0 {
		response.ConditionTrue(rsp, ConditionDuplicateEgressIP, "SharedEgressIP").
			WithMessage(fmt.Sprintf("%d proxies share their egress IP with another of their pool: to a target they are one client; each pool's DuplicateEgressIP condition names them", total.duplicates)).TargetCompositeAndClaim()
	} else {
		response.ConditionFalse(rsp, ConditionDuplicateEgressIP, "DistinctEgressIPs").
			WithMessage("no proxy shares its egress IP with another of its pool").TargetCompositeAndClaim()
	}
	switch {
	case len(stuck) > 0:
		if len(stuck) > 3 {
			stuck = append(stuck[:3], fmt.Sprintf("and %d more pools", len(stuck)-3))
		}
		response.ConditionTrue(rsp, ConditionRolloutStalled, "ProgressDeadlineExceeded").WithMessage(strings.Join(stuck, "; ")).TargetCompositeAndClaim()
	case behind == 0:
		response.ConditionFalse(rsp, ConditionRolloutStalled, "Complete").WithMessage(fmt.Sprintf("every pool composes template revision %s", f.Revision)).TargetCompositeAndClaim()
	default:
		response.ConditionFalse(rsp, ConditionRolloutStalled, "Progressing").WithMessage(fmt.Sprintf("%d proxies left to replace; each pool's RolloutStalled condition says whether it is stuck", behind)).TargetCompositeAndClaim()
	}
}

// reportPoolsDiversity sets a pooled fleet's EgressDiversity condition
// from its pools' counts, naming the pools with proxies beyond a cap.
func reportPoolsDiversity(rsp *fnv1.RunFunctionResponse, f *Fleet, plans []*poolPlan, total poolCounts) {
	beyond := map[string]string{}
	for _, p := range plans {
		if o := p.observed; o != nil && o.counts.beyond > 0 {
			beyond[o.name] = fmt.Sprintf("%d of its proxies", o.counts.beyond)
		}
	}
	reportDiversity(rsp, f, total.beyond, beyond)
}

func countFaulty(plans []*poolPlan) int {
	n := 0
	for _, p := range plans {
		if p.observed != nil && len(p.observed.faults) > 0 {
			n++
		}
	}
	return n
}
