package function

import (
	"strconv"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// The composer: the desired Proxy of each member, its labels and
// annotations, and the desired resources of the response.

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
