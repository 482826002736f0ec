// Package function is function-proxyfleet: it composes a ProxyFleet into
// Proxy managed resources, spread over zones, rotated by age, replaced when
// unhealthy, and reports the fleet's health on the XR.
package function

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/request"
	"github.com/crossplane/function-sdk-go/response"
	"github.com/pkg/errors"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/egressip"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// ConditionFleetHealthy is the XR condition that says how healthy the fleet is.
const ConditionFleetHealthy = "FleetHealthy"

// Labels Crossplane puts on a LegacyCluster XR that a claim created.
const (
	labelClaimName      = "crossplane.io/claim-name"
	labelClaimNamespace = "crossplane.io/claim-namespace"
)

// Function composes ProxyFleets.
type Function struct {
	fnv1.UnimplementedFunctionRunnerServiceServer

	log logging.Logger
	now func() time.Time
	// discovery is egress-discovery's ServiceAccount, which each fleet
	// grants access to its Leases and auth Secret; nil grants none.
	discovery *types.NamespacedName
	// asn says which autonomous system an egress IP belongs to, for
	// spec.diversity.maxPerASN; nil counts none.
	asn egressip.ASNLookup
}

// New returns the function. now is its clock; nil means time.Now.
func New(log logging.Logger, now func() time.Time) *Function {
	if now == nil {
		now = time.Now
	}
	return &Function{log: log, now: now, discovery: &DefaultDiscoveryServiceAccount}
}

// WithDiscovery sets egress-discovery's ServiceAccount, which each fleet
// grants access to its Leases and auth Secret; nil grants none, for
// installations without egress-discovery.
func (f *Function) WithDiscovery(sa *types.NamespacedName) *Function {
	f.discovery = sa
	return f
}

// WithASN sets the IP-to-ASN database spec.diversity.maxPerASN is counted
// with; nil counts no ASN.
func (f *Function) WithASN(asn egressip.ASNLookup) *Function {
	f.asn = asn
	return f
}

// RunFunction composes one ProxyFleet. Bad input gets a Fatal result that
// names the field; it never panics.
func (f *Function) RunFunction(_ context.Context, req *fnv1.RunFunctionRequest) (*fnv1.RunFunctionResponse, error) {
	began := time.Now()
	rsp, err := f.run(req)
	observeRun(req, rsp, time.Since(began))
	return rsp, err
}

// run composes one request; RunFunction measures it.
func (f *Function) run(req *fnv1.RunFunctionRequest) (rsp *fnv1.RunFunctionResponse, err error) {
	rsp = response.To(req, response.DefaultTTL)
	defer func() {
		// A bug must not take the function server down with it.
		if r := recover(); r != nil {
			response.Fatal(rsp, errors.Errorf("function-proxyfleet failed unexpectedly: %v", r))
			err = nil
		}
	}()
	now := f.now().UTC().Truncate(time.Second)

	oxr, err := request.GetObservedCompositeResource(req)
	if err != nil {
		response.Fatal(rsp, errors.Wrap(err, "cannot get the observed composite resource"))
		return rsp, nil
	}
	xr := oxr.Resource
	if xr.GetKind() == fleetv1alpha1.ProxyPoolKind {
		f.runPool(rsp, req, xr.GetName(), xr.GetNamespace(), xr.Object, now)
		return rsp, nil
	}
	fleetName, namespace := xr.GetName(), xr.GetNamespace()
	if namespace == "" {
		// A LegacyCluster XProxyFleet is cluster scoped; its Proxies live in
		// the namespace of the claim that made it.
		namespace = xr.GetLabels()[labelClaimNamespace]
		if namespace == "" {
			response.Fatal(rsp, errors.Errorf("metadata.labels[%s] is missing: create a %s through a ProxyFleetClaim, whose namespace its Proxies live in", labelClaimNamespace, xr.GetKind()))
			return rsp, nil
		}
		if c := xr.GetLabels()[labelClaimName]; c != "" {
			fleetName = c
		}
	}
	spec, _ := xr.Object["spec"].(map[string]any)
	fleet, err := parseFleet(fleetName, namespace, spec)
	if err == nil && fleet.autoscale != nil && xr.GetNamespace() == "" {
		// egress-discovery publishes the demand of namespaced
		// ProxyFleets only: a legacy fleet would never wake from zero.
		err = fieldError("spec.autoscaling", "is for namespaced ProxyFleets (crawl.example.com/v1alpha1, kind ProxyFleet); a %s made through a ProxyFleetClaim is sized by spec.replicas: remove spec.autoscaling", xr.GetKind())
	}
	if err == nil && fleet.spec.Pools != nil && xr.GetNamespace() == "" {
		err = fieldError("spec.pools", "is for namespaced ProxyFleets (crawl.example.com/v1alpha1, kind ProxyFleet); a %s made through a ProxyFleetClaim has one level of Proxies: remove spec.pools", xr.GetKind())
	}
	if err != nil {
		response.Fatal(rsp, err)
		return rsp, nil
	}
	if fleet.spec.Pools != nil {
		f.runPooledFleet(rsp, req, fleet, now)
		return rsp, nil
	}

	view := requireLeases(rsp, req, fleet, now)
	members := observedMembers(req.GetObserved().GetResources(), view.leased, fleet.Revision)
	for _, m := range members {
		m.DrainSeen = view.drainSeen(m.Name, m.DrainSince)
	}
	egress := assessEgress(fleet, members, f.asn)
	recycled := pickRecycles(fleet, members, view.burned, field(req.GetObserved().GetComposite().GetResource(), "status").GetStructValue(), now)
	sc := autoscale(req, fleet, countsOf(members, now), view, now)
	p := decide(fleet, members, view.known, now)
	p.leasesChange = view.next
	recycled.settle(p, now)
	if err := composeProxies(rsp, fleet, members, p, now); err != nil {
		response.Fatal(rsp, err)
		return rsp, nil
	}
	if err := f.grantAccess(rsp, fleet); err != nil {
		response.Fatal(rsp, err)
		return rsp, nil
	}
	finish(rsp, req, fleet, members, p, sc, now)
	compositeStatus(rsp.Desired).Fields["egress"] = egressStatus(egress)
	setRecycles(rsp, recycled)
	reportDiversity(rsp, fleet, len(egress.Excess), egress.Excess)
	return rsp, nil
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

// desiredResources returns the response's desired resources, made if need
// be.
func desiredResources(rsp *fnv1.RunFunctionResponse) map[string]*fnv1.Resource {
	if rsp.Desired == nil {
		rsp.Desired = &fnv1.State{}
	}
	if rsp.Desired.Resources == nil {
		rsp.Desired.Resources = map[string]*fnv1.Resource{}
	}
	return rsp.Desired.Resources
}

// composeProxies sets the desired Proxies: exactly the plan's members.
// Resources of other pipeline steps pass through untouched.
func composeProxies(rsp *fnv1.RunFunctionResponse, fleet *Fleet, members []*member, p *plan, now time.Time) error {
	desired := desiredResources(rsp)
	for name := range desired {
		if _, ok := ordinalOf(name); ok {
			delete(desired, name)
		}
	}
	byOrdinal := map[int]*member{}
	for _, m := range members {
		byOrdinal[m.Ordinal] = m
	}
	c, err := fleet.composer(now)
	if err != nil {
		return err
	}
	for _, m := range p.keep {
		desired[resourceName(m.Ordinal)] = c.proxy(m, byOrdinal)
	}
	return nil
}

// grantAccess composes the Role and RoleBinding that let egress-discovery
// serve the fleet.
func (f *Function) grantAccess(rsp *fnv1.RunFunctionResponse, fleet *Fleet) error {
	grant, err := f.access(fleet)
	if err != nil {
		return err
	}
	desired := desiredResources(rsp)
	delete(desired, resourceAccessRole)
	delete(desired, resourceAccessBinding)
	for name, r := range grant {
		desired[name] = r
	}
	return nil
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
		response.Warning(rsp, errors.Errorf("Crossplane sent this fleet's Proxies and leases in %.1f MiB, more than half of gRPC's 4 MiB limit: at 4 MiB the fleet can no longer be composed; lower spec.replicas or spec.leases.maxLeasesPerProxy, or split the fleet", float64(n)/(1<<20))).TargetCompositeAndClaim()
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

// observedMembers reads the fleet's observed Proxies. Each nested object is
// looked up once: with thousands of proxies these lookups are most of the
// function's work. A Proxy without a template revision label was made
// before revisions were, when every Proxy was rewritten to the template of
// the last composition: it is of the current revision.
func observedMembers(observed map[string]*fnv1.Resource, leased map[string]bool, current string) []*member {
	out := make([]*member, 0, len(observed))
	for name, oc := range observed {
		ord, ok := ordinalOf(name)
		r := oc.GetResource().GetFields()
		if !ok || r["kind"].GetStringValue() != v1alpha1.ProxyKind {
			continue
		}
		meta := r["metadata"].GetStructValue().GetFields()
		labels := meta["labels"].GetStructValue().GetFields()
		status := r["status"].GetStructValue().GetFields()
		ap := status["atProvider"].GetStructValue().GetFields()
		m := &member{
			Ordinal: ord, Name: meta["name"].GetStringValue(), Zone: labels[fleetv1alpha1.LabelZone].GetStringValue(),
			Replaces: -1, Healthy: ap["healthy"].GetBoolValue(),
			EgressIP: ap["egressIP"].GetStringValue(), Error: ap["lastProbeError"].GetStringValue(),
			Revision: labels[fleetv1alpha1.LabelTemplateRevision].GetStringValue(), spec: r["spec"],

			CredentialsOutdated: ap["credentialsOutdated"].GetBoolValue(),
		}
		if m.Revision == "" {
			m.Revision = current
		}
		if ann := meta["annotations"].GetStructValue().GetFields(); ann[fleetv1alpha1.AnnotationRecycleOf].GetStringValue() != "" {
			m.RecycleOf, m.RecycleIP = ann[fleetv1alpha1.AnnotationRecycleOf].GetStringValue(), ann[fleetv1alpha1.AnnotationRecycleIP].GetStringValue()
			m.RecycleReason = ann[fleetv1alpha1.AnnotationRecycleReason].GetStringValue()
			m.RecycleAt, _ = time.Parse(time.RFC3339, ann[fleetv1alpha1.AnnotationRecycleAt].GetStringValue())
			m.RecycleGrant = ann[fleetv1alpha1.AnnotationRecycleGrant].GetStringValue()
		}
		m.Created, _ = time.Parse(time.RFC3339, meta["creationTimestamp"].GetStringValue())
		if v := labels[fleetv1alpha1.LabelReplaces].GetStringValue(); v != "" {
			if o, err := strconv.Atoi(v); err == nil {
				m.Replaces = o
			}
		}
		if v := labels[fleetv1alpha1.LabelRotationGeneration].GetStringValue(); v != "" {
			m.Generation, _ = strconv.Atoi(v)
		}
		if v, err := strconv.ParseInt(labels[fleetv1alpha1.LabelDrainingSince].GetStringValue(), 10, 64); err == nil && v > 0 {
			m.DrainSince = time.Unix(v, 0).UTC()
		}
		if v := labels[fleetv1alpha1.LabelUnhealthyStreak].GetStringValue(); v != "" {
			m.Streak, _ = strconv.Atoi(v)
			m.Streak = max(m.Streak, 0)
		}
		for _, c := range status["conditions"].GetListValue().GetValues() {
			cf := c.GetStructValue().GetFields()
			if cf["type"].GetStringValue() == "Ready" {
				m.Ready = cf["status"].GetStringValue() == string(corev1.ConditionTrue)
				m.Since, _ = time.Parse(time.RFC3339, cf["lastTransitionTime"].GetStringValue())
				// The provider refused it by its ProviderConfig's
				// policy: the fleet says why, and a replacement, which
				// would be refused alike, is not made.
				if !m.Ready && cf["reason"].GetStringValue() == v1alpha1.ReasonNotPermitted {
					m.Refused = true
					m.Error = cf["message"].GetStringValue()
				}
				break
			}
		}
		if m.Since.IsZero() {
			m.Since = m.Created
		}
		if host, port := ap["host"].GetStringValue(), ap["port"].GetNumberValue(); host != "" && port > 0 {
			m.Endpoint = net.JoinHostPort(host, strconv.Itoa(int(port)))
		}
		m.Leased = leased[m.Name]
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ordinal < out[j].Ordinal })
	return out
}

// composer builds the fleet's desired Proxies. The part of a Proxy's spec
// that depends only on the fleet and the zone is built once per zone and
// shared, read-only, by every Proxy of that zone.
type composer struct {
	f         *Fleet
	now       time.Time
	perZone   map[string]*structpb.Value
	configRef *structpb.Value
	// Read-only values shared by many Proxies: a fleet of thousands would
	// otherwise allocate the same labels and spec thousands of times.
	apiVersion, kind, namespace, fleet *structpb.Value
	// pool labels a pool's Proxies with its name; nil for a fleet's.
	pool *structpb.Value
	// annotations name the fleet exactly; the fleet label may be a hash.
	annotations *structpb.Value
	zones       map[string]*structpb.Value
	specs       map[string]*structpb.Value
	labels      map[[7]string]*structpb.Value
}

func (f *Fleet) composer(now time.Time) (*composer, error) {
	s := f.spec
	c := &composer{
		f: f, now: now, perZone: map[string]*structpb.Value{}, zones: map[string]*structpb.Value{},
		specs: map[string]*structpb.Value{}, labels: map[[7]string]*structpb.Value{},
		apiVersion: structpb.NewStringValue(v1alpha1.SchemeGroupVersion.String()),
		kind:       structpb.NewStringValue(v1alpha1.ProxyKind),
		namespace:  structpb.NewStringValue(f.Namespace),
		fleet:      structpb.NewStringValue(ownership.LabelValue(f.Name)),
		annotations: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			fleetv1alpha1.AnnotationFleet: structpb.NewStringValue(f.Name),
		}}),
	}
	if f.Pool != "" {
		c.pool = structpb.NewStringValue(ownership.LabelValue(f.Pool))
	}
	ref := map[string]string{"kind": s.ProviderConfigRef.Kind, "name": s.ProviderConfigRef.Name}
	c.configRef = structpb.NewStructValue(strings2struct(ref))
	for _, zone := range f.Zones {
		fp := v1alpha1.ProxyParameters{
			Mode:                       v1alpha1.ProxyModeManaged,
			Port:                       *s.Proxy.Port,
			AuthSecretRef:              s.Proxy.AuthSecretRef,
			AllowedSourceRanges:        s.Proxy.AllowedSourceRanges,
			AllowedPrivateDestinations: s.Proxy.AllowedPrivateDestinations,
			HealthCheck:                s.HealthCheck,
			MaxLeases:                  *s.Leases.MaxLeasesPerProxy,
			CredentialGracePeriod:      f.credentialGracePeriod(),
		}
		switch {
		case s.Placement.Local != nil:
			fp.Local = s.Placement.Local.DeepCopy()
		case s.Placement.Kubernetes != nil:
			k := s.Placement.Kubernetes.DeepCopy()
			if k.NodeSelector == nil {
				k.NodeSelector = map[string]string{}
			}
			k.NodeSelector[corev1.LabelTopologyZone] = zone
			fp.Kubernetes = k
		case s.Placement.GCP != nil:
			fp.GCP = &v1alpha1.GCPPlacement{Zone: zone, GCPInstance: *s.Placement.GCP.DeepCopy()}
		case s.Placement.AWS != nil:
			fp.AWS = &v1alpha1.AWSPlacement{Zone: zone, AWSInstance: *s.Placement.AWS.DeepCopy()}
		}
		// Through JSON, so that unset fields stay unset (omitempty) and the
		// apiserver applies the CRD's defaults.
		v, err := toValue(fp)
		if err != nil {
			return nil, errors.Wrap(err, "cannot compose spec.forProvider")
		}
		c.perZone[zone] = v
		c.zones[zone] = structpb.NewStringValue(zone)
		c.specs[zone] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"providerConfigRef": c.configRef,
			"forProvider":       v,
		}})
	}
	return c, nil
}

// proxy is the desired Proxy of a member. A Proxy observed Ready is marked
// ready, so the XR is Ready once all of its proxies are.
func (c *composer) proxy(m *member, observed map[int]*member) *fnv1.Resource {
	spec, ok := c.specs[m.Zone]
	if !ok || m.Revision != c.f.Revision {
		// Of an old template, or of a zone removed from spec.zones: it
		// keeps the spec it was made with until it is replaced.
		spec = c.kept(m, spec)
	}
	r := &fnv1.Resource{Resource: &structpb.Struct{Fields: map[string]*structpb.Value{
		"apiVersion": c.apiVersion,
		"kind":       c.kind,
		"metadata": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"name":        structpb.NewStringValue(c.f.Name + "-" + strconv.Itoa(m.Ordinal)),
			"namespace":   c.namespace,
			"labels":      c.labelsOf(m, observed),
			"annotations": c.annotationsOf(m),
		}}),
		"spec": spec,
	}}}
	if o, ok := observed[m.Ordinal]; ok && o.Ready {
		r.Ready = fnv1.Ready_READY_TRUE
	}
	return r
}

// annotationsOf is a member's annotations: the fleet's, shared, and on a
// member made to recycle another, what it recycles.
func (c *composer) annotationsOf(m *member) *structpb.Value {
	if m.RecycleOf == "" {
		return c.annotations
	}
	ann := &structpb.Struct{Fields: map[string]*structpb.Value{
		fleetv1alpha1.AnnotationFleet:         structpb.NewStringValue(c.f.Name),
		fleetv1alpha1.AnnotationRecycleOf:     structpb.NewStringValue(m.RecycleOf),
		fleetv1alpha1.AnnotationRecycleIP:     structpb.NewStringValue(m.RecycleIP),
		fleetv1alpha1.AnnotationRecycleReason: structpb.NewStringValue(m.RecycleReason),
		fleetv1alpha1.AnnotationRecycleAt:     structpb.NewStringValue(m.RecycleAt.UTC().Format(time.RFC3339)),
	}}
	if m.RecycleGrant != "" {
		ann.Fields[fleetv1alpha1.AnnotationRecycleGrant] = structpb.NewStringValue(m.RecycleGrant)
	}
	return structpb.NewStructValue(ann)
}

// kept is the spec an outdated member keeps: its observed providerConfigRef
// and forProvider, with the fleet's current leases per proxy and credential
// grace period, which change nothing on the proxy. Without an observed spec (never the case: members
// are outdated only through what was observed) it gets current, the
// current template's spec of its zone, or of the fleet's first zone.
func (c *composer) kept(m *member, current *structpb.Value) *structpb.Value {
	old := m.spec.GetStructValue().GetFields()
	fp := old["forProvider"].GetStructValue()
	if fp == nil || old["providerConfigRef"] == nil {
		if current == nil {
			current = c.specs[c.f.Zones[0]]
		}
		return current
	}
	fields := make(map[string]*structpb.Value, len(fp.GetFields()))
	for k, v := range fp.GetFields() {
		fields[k] = v
	}
	fields["maxLeases"] = structpb.NewNumberValue(float64(*c.f.spec.Leases.MaxLeasesPerProxy))
	if g := c.f.credentialGracePeriod(); g != nil && fp.GetFields()["authSecretRef"] != nil {
		fields["credentialGracePeriod"] = structpb.NewStringValue(g.Duration.String())
	}
	return structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
		"providerConfigRef": old["providerConfigRef"],
		"forProvider":       structpb.NewStructValue(&structpb.Struct{Fields: fields}),
	}})
}

// labelsOf returns a member's labels, shared with every member of the same
// zone, generation and revision unless it is replacing another.
func (c *composer) labelsOf(m *member, observed map[int]*member) *structpb.Value {
	gen := strconv.Itoa(m.Generation)
	_, replacing := observed[m.Replaces]
	streak := ""
	if o, seen := observed[m.Ordinal]; m.Streak > 0 && (!seen || !o.Ready) {
		// Until it has been Ready: a Ready proxy ends the streak.
		streak = strconv.Itoa(m.Streak)
	}
	drain := ""
	if m.Draining {
		since := m.DrainSince
		if since.IsZero() || since.After(c.now) {
			since = c.now
		}
		drain = strconv.FormatInt(since.Unix(), 10)
	}
	dup, beyond := "", ""
	if m.Duplicate {
		dup = "true"
	}
	if m.Beyond != "" {
		beyond = "true"
	}
	key := [7]string{m.Zone, gen, m.Revision, streak, drain, dup, beyond}
	if v, ok := c.labels[key]; ok && !replacing {
		return v
	}
	l := &structpb.Struct{Fields: map[string]*structpb.Value{
		fleetv1alpha1.LabelFleet:              c.fleet,
		fleetv1alpha1.LabelZone:               structpb.NewStringValue(m.Zone),
		fleetv1alpha1.LabelRotationGeneration: structpb.NewStringValue(gen),
		fleetv1alpha1.LabelTemplateRevision:   structpb.NewStringValue(m.Revision),
	}}
	if streak != "" {
		l.Fields[fleetv1alpha1.LabelUnhealthyStreak] = structpb.NewStringValue(streak)
	}
	if drain != "" {
		l.Fields[fleetv1alpha1.LabelDrainingSince] = structpb.NewStringValue(drain)
	}
	if dup != "" {
		l.Fields[fleetv1alpha1.LabelDuplicateEgressIP] = structpb.NewStringValue(dup)
	}
	if beyond != "" {
		l.Fields[fleetv1alpha1.LabelBeyondDiversityLimit] = structpb.NewStringValue(beyond)
	}
	if c.pool != nil {
		l.Fields[fleetv1alpha1.LabelPool] = c.pool
	}
	if replacing {
		l.Fields[fleetv1alpha1.LabelReplaces] = structpb.NewStringValue(strconv.Itoa(m.Replaces))
		return structpb.NewStructValue(l)
	}
	v := structpb.NewStructValue(l)
	c.labels[key] = v
	return v
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

	var c *response.ConditionOption
	switch {
	case f.Replicas == 0:
		c = response.ConditionTrue(rsp, ConditionFleetHealthy, "ScaledToZero")
	case healthy >= f.Replicas:
		c = response.ConditionTrue(rsp, ConditionFleetHealthy, "AllHealthy")
	case healthy == 0:
		c = response.ConditionFalse(rsp, ConditionFleetHealthy, "NoHealthyProxies")
	default:
		c = response.ConditionFalse(rsp, ConditionFleetHealthy, "Degraded")
	}
	c.WithMessage(msg).TargetCompositeAndClaim()
	if trouble {
		response.Warning(rsp, errors.New(msg)).TargetCompositeAndClaim()
	}
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
