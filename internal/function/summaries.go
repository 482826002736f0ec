package function

import (
	"encoding/json"
	"slices"
	"time"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"google.golang.org/protobuf/encoding/protojson"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// requiredSummaries names the LeaseSummaries the function asks Crossplane
// for: egress-discovery's accounts of the fleet's leases, one per replica.
// Crossplane caches and sends these few small objects, not the Leases.
const requiredSummaries = "leaseSummaries"

// requiredFleetSummaries names, for a pool, its fleet's fleet-wide
// summaries: which discovery replicas live, each of which must have
// summarised the pool before the pool trusts its own summaries.
const requiredFleetSummaries = "fleetLeaseSummaries"

// leaseView is what the fleet's LeaseSummaries say of its leases, merged
// conservatively.
type leaseView struct {
	// known: every summary parsed and at least one is fresh. Otherwise a
	// crawler may hold any proxy, and none is removed.
	known bool
	// why says what is missing while not known.
	why string
	// leased are the proxies a crawler may hold: listed by a fresh
	// summary, or by a stale one and still within the time it gave.
	leased map[string]bool
	// held sums, per proxy, the most holders any summary lists.
	held int
	// demand sums the fresh summaries' waiting and refused crawlers.
	demand leasewire.Demand
	// fresh are the fresh summaries, for drainSeen.
	fresh []*v1alpha1.LeaseSummarySpec
	// reportedHeld is the most leases any fresh summary's demand counts
	// (each replica counts every slot of the fleet): a pooled fleet's
	// held leases, whose own summaries list no proxy.
	reportedHeld int
	// reportedLeased is the most leased proxies any fresh summary of the
	// fleet as a whole counts (every pool's), and leasedReported whether
	// any did (a release before them did not).
	reportedLeased int
	leasedReported bool
	// next is the soonest the view changes with no summary written: a
	// fresh summary turns stale, a stale one's lease ends, one observed
	// ahead of every clock is no longer. Zero when nothing is due. A
	// summary written is a watch event (Crossplane watches what a
	// function requires, with realtime compositions), time passing is
	// not.
	next time.Time
	// burned are the proxies a fresh summary says leave from a burned
	// address (spec.recycling), with why.
	burned map[string]string
}

// due records that the view changes at at, if that is after now and
// sooner than any change recorded before.
func (v *leaseView) due(at, now time.Time) {
	if at.After(now) && (v.next.IsZero() || at.Before(v.next)) {
		v.next = at
	}
}

// coveredBy makes the view unknown unless every replica with a fresh
// summary among fleetWide (the fleet's, as a pool requires them) has a
// fresh summary in the view too: a replica that has not summarised the
// pool yet may hold a lease on one of its proxies, or not have seen one
// drain.
func (v *leaseView) coveredBy(fleetWide *leaseView) {
	if n := fleetWide.next; !n.IsZero() && (v.next.IsZero() || n.Before(v.next)) {
		// The fleet's summaries turning stale changes what covers it.
		v.next = n
	}
	if !v.known {
		return
	}
	if !fleetWide.known {
		v.known, v.why = false, "the fleet's own LeaseSummaries: "+fleetWide.why
		return
	}
	for _, w := range fleetWide.fresh {
		if !slices.ContainsFunc(v.fresh, func(s *v1alpha1.LeaseSummarySpec) bool { return s.Replica == w.Replica }) {
			v.known, v.why = false, "egress-discovery replica "+w.Replica+" has not summarised this pool yet"
			return
		}
	}
}

// drainSeen says whether every fresh summary lists name as draining, in
// the drain that began at since: every live discovery replica stopped
// handing it out before it observed, so a lease on it that none lists is
// none. A drain seen before (the proxy served again since, or another
// proxy had its name) does not count.
func (v *leaseView) drainSeen(name string, since time.Time) bool {
	if !v.known || len(v.fresh) == 0 || since.IsZero() {
		return false
	}
	for _, s := range v.fresh {
		if !slices.Contains(s.Draining, v1alpha1.DrainingProxy{Name: name, Since: since.Unix()}) {
			return false
		}
	}
	return true
}

// viewLeases reads the fleet's summaries as Crossplane sent them (sent
// says whether it did at all) and merges them: the union of the proxies
// they list as leased, fresh or, within the time each lease may be held,
// stale; a summary that does not parse makes every lease unknown, as no
// summary fresh does. maxTTL bounds how long a stale summary's leases
// count after it was observed.
func viewLeases(items []*fnv1.Resource, sent bool, fleet, pool string, maxTTL time.Duration, now time.Time) *leaseView {
	v := &leaseView{leased: map[string]bool{}}
	if !sent {
		v.why = "waiting for Crossplane to send the fleet's LeaseSummaries"
		return v
	}
	holders := map[string]int32{}
	bad := false
	for _, r := range items {
		s, ok := parseSummary(r)
		if !ok {
			bad = true
			continue
		}
		if s.Fleet != fleet || s.Pool != pool {
			// A long name's label is a hash prefix: another fleet's; or
			// another pool's.
			continue
		}
		observed := s.ObservedAt.Time
		if observed.IsZero() || observed.After(now.Add(leasewire.HoldSkew)) {
			// Observed in the future: no clock skew explains it (yet).
			bad = true
			v.due(observed.Add(-leasewire.HoldSkew), now)
			continue
		}
		v.merge(s, holders, maxTTL, now)
	}
	for _, n := range holders {
		v.held += int(n)
	}
	v.demand.Held = v.held
	switch {
	case bad:
		v.why = "a LeaseSummary of the fleet does not parse"
	case len(v.fresh) == 0:
		v.why = "no LeaseSummary of the fleet is fresh: is egress-discovery running?"
	default:
		v.known = true
	}
	return v
}

// merge adds one summary of the fleet, observed as it says, to the view:
// fresh, it counts whole; stale, its leases count within the time each may
// be held. holders collects, per proxy, the most holders any lists.
func (v *leaseView) merge(s *v1alpha1.LeaseSummarySpec, holders map[string]int32, maxTTL time.Duration, now time.Time) {
	observed := s.ObservedAt.Time
	until := leasewire.CountsUntil(s)
	fresh := now.Before(until.Add(leasewire.HoldSkew))
	if fresh {
		// A crashed replica's waiting and refused crawlers count until
		// its summary turns stale, as an autoscaler's stabilization
		// window would hold them: rewriting a fleet's summary more
		// often while crawlers wait would compose every pool that
		// requires it again each time.
		v.fresh = append(v.fresh, s)
		for _, b := range s.Burned {
			if b.Name != "" {
				if v.burned == nil {
					v.burned = map[string]string{}
				}
				v.burned[b.Name] = b.Reason
			}
		}
		v.reportedHeld = max(v.reportedHeld, int(s.Demand.Held))
		if n := s.Demand.LeasedProxies; n != nil {
			v.reportedLeased, v.leasedReported = max(v.reportedLeased, int(*n)), true
		}
		v.demand.Waiting += int(s.Demand.Waiting)
		v.demand.Refused += int(s.Demand.Refused)
		v.due(until.Add(leasewire.HoldSkew), now)
	}
	for _, l := range s.Leased {
		held := l.HeldUntil.Time
		if limit := observed.Add(maxTTL + leasewire.HoldSkew); held.After(limit) {
			held = limit
		}
		if !fresh && !now.Before(held) {
			continue
		}
		if !fresh {
			v.due(held, now)
		}
		v.leased[l.Name] = true
		holders[l.Name] = max(holders[l.Name], l.Holders)
	}
}

// parseSummary reads one LeaseSummary Crossplane sent; false when it is
// not one or does not parse. Times are read as RFC 3339 with any fraction,
// as written by any client.
func parseSummary(r *fnv1.Resource) (*v1alpha1.LeaseSummarySpec, bool) {
	b, err := protojson.Marshal(r.GetResource())
	if err != nil {
		return nil, false
	}
	var raw struct {
		Kind string `json:"kind"`
		Spec struct {
			Fleet      string `json:"fleet"`
			Pool       string `json:"pool"`
			Replica    string `json:"replica"`
			ObservedAt string `json:"observedAt"`
			ValidUntil string `json:"validUntil"`
			Leased     []struct {
				Name      string `json:"name"`
				Holders   int32  `json:"holders"`
				HeldUntil string `json:"heldUntil"`
			} `json:"leased"`
			Draining []v1alpha1.DrainingProxy `json:"draining"`
			Burned   []v1alpha1.BurnedProxy   `json:"burned"`
			Demand   v1alpha1.LeaseDemand     `json:"demand"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(b, &raw); err != nil || raw.Kind != v1alpha1.LeaseSummaryKind || raw.Spec.Fleet == "" {
		return nil, false
	}
	s := &v1alpha1.LeaseSummarySpec{Fleet: raw.Spec.Fleet, Pool: raw.Spec.Pool, Replica: raw.Spec.Replica, Draining: raw.Spec.Draining, Burned: raw.Spec.Burned, Demand: raw.Spec.Demand}
	var ok bool
	if s.ObservedAt, ok = microTime(raw.Spec.ObservedAt); !ok {
		return nil, false
	}
	if s.ValidUntil, ok = microTime(raw.Spec.ValidUntil); !ok {
		return nil, false
	}
	d := s.Demand
	if d.Held < 0 || d.Waiting < 0 || d.Refused < 0 || d.LeasedProxies != nil && *d.LeasedProxies < 0 {
		return nil, false
	}
	for _, l := range raw.Spec.Leased {
		until, ok := microTime(l.HeldUntil)
		if l.Name == "" || l.Holders < 0 || !ok {
			return nil, false
		}
		s.Leased = append(s.Leased, v1alpha1.LeasedProxy{Name: l.Name, Holders: l.Holders, HeldUntil: until})
	}
	return s, true
}

func microTime(s string) (metav1.MicroTime, bool) {
	t, err := time.Parse(time.RFC3339Nano, s)
	return metav1.MicroTime{Time: t}, err == nil
}

// requireLeases asks Crossplane for the fleet's LeaseSummaries, and reads
// those it sent: a pool's own (egress-discovery writes one per pool), a
// pooled fleet's of the fleet as a whole (its demand), a fleet's without
// pools all of them.
func requireLeases(rsp *fnv1.RunFunctionResponse, req *fnv1.RunFunctionRequest, fleet *Fleet, now time.Time) *leaseView {
	if rsp.Requirements == nil {
		rsp.Requirements = &fnv1.Requirements{}
	}
	if rsp.Requirements.Resources == nil {
		rsp.Requirements.Resources = map[string]*fnv1.ResourceSelector{}
	}
	namespace := fleet.Namespace
	selector, pool := leasewire.SummarySelector(fleet.Name), ""
	switch {
	case fleet.Pool != "":
		pool = ownership.LabelValue(fleet.Pool)
		selector = leasewire.SummaryLabels(fleet.Name, pool)
	case fleet.spec.Pools != nil:
		selector = leasewire.SummaryLabels(fleet.Name, "")
	}
	rsp.Requirements.Resources[requiredSummaries] = &fnv1.ResourceSelector{
		ApiVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.LeaseSummaryKind, Namespace: &namespace,
		Match: &fnv1.ResourceSelector_MatchLabels{MatchLabels: &fnv1.MatchLabels{Labels: selector}},
	}
	summaries, sent := req.GetRequiredResources()[requiredSummaries]
	_, maxTTL := fleet.spec.Leases.TTLs()
	view := viewLeases(summaries.GetItems(), sent, fleet.Name, pool, maxTTL, now)
	switch {
	case fleet.Pool != "":
		rsp.Requirements.Resources[requiredFleetSummaries] = &fnv1.ResourceSelector{
			ApiVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.LeaseSummaryKind, Namespace: &namespace,
			Match: &fnv1.ResourceSelector_MatchLabels{MatchLabels: &fnv1.MatchLabels{Labels: leasewire.SummaryLabels(fleet.Name, "")}},
		}
		whole, sent := req.GetRequiredResources()[requiredFleetSummaries]
		view.coveredBy(viewLeases(whole.GetItems(), sent, fleet.Name, "", maxTTL, now))
	case fleet.spec.Pools != nil:
		// The fleet-wide summaries list no pool's proxies: held leases
		// are what their demand counts.
		view.held = max(view.held, view.reportedHeld)
		view.demand.Held = view.held
	}
	return view
}
