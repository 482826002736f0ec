// Package function is function-proxyfleet: it composes a ProxyFleet into
// Proxy managed resources, spread over zones, rotated by age, replaced when
// unhealthy, and reports the fleet's health on the XR.
package function

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/request"
	"github.com/crossplane/function-sdk-go/resource"
	"github.com/crossplane/function-sdk-go/resource/composed"
	"github.com/crossplane/function-sdk-go/response"
	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// ConditionFleetHealthy is the XR condition that says how healthy the fleet is.
const ConditionFleetHealthy = "FleetHealthy"

// Labels Crossplane puts on a LegacyCluster XR that a claim created.
const (
	labelClaimName      = "crossplane.io/claim-name"
	labelClaimNamespace = "crossplane.io/claim-namespace"
)

// requiredLeases names the Lease objects the function asks Crossplane for.
const requiredLeases = "leases"

// Function composes ProxyFleets.
type Function struct {
	fnv1.UnimplementedFunctionRunnerServiceServer

	log logging.Logger
	now func() time.Time
}

// New returns the function. now is its clock; nil means time.Now.
func New(log logging.Logger, now func() time.Time) *Function {
	if now == nil {
		now = time.Now
	}
	return &Function{log: log, now: now}
}

// RunFunction composes one ProxyFleet. Bad input gets a Fatal result that
// names the field; it never panics.
func (f *Function) RunFunction(_ context.Context, req *fnv1.RunFunctionRequest) (rsp *fnv1.RunFunctionResponse, err error) {
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
	if err != nil {
		response.Fatal(rsp, err)
		return rsp, nil
	}

	rsp.Requirements = &fnv1.Requirements{Resources: map[string]*fnv1.ResourceSelector{
		requiredLeases: {
			ApiVersion: "coordination.k8s.io/v1", Kind: "Lease", Namespace: &namespace,
			Match: &fnv1.ResourceSelector_MatchLabels{MatchLabels: &fnv1.MatchLabels{Labels: map[string]string{ownership.FleetLabel: fleetName}}},
		},
	}}
	leaseList, leasesKnown, err := request.GetRequiredResource(req, requiredLeases)
	if err != nil {
		response.Fatal(rsp, errors.Wrap(err, "cannot read the fleet's Lease objects"))
		return rsp, nil
	}
	leased := activeLeases(leaseList, now)

	observed, err := request.GetObservedComposedResources(req)
	if err != nil {
		response.Fatal(rsp, errors.Wrap(err, "cannot get observed composed resources"))
		return rsp, nil
	}
	members := observedMembers(observed, leased)
	p := decide(fleet, members, leasesKnown, now)

	desired, err := request.GetDesiredComposedResources(req)
	if err != nil {
		response.Fatal(rsp, errors.Wrap(err, "cannot get desired composed resources"))
		return rsp, nil
	}
	// Resources of other pipeline steps pass through untouched; the
	// function's own are exactly the plan's members.
	for name := range desired {
		if _, ok := ordinalOf(string(name)); ok {
			delete(desired, name)
		}
	}
	byOrdinal := map[int]*member{}
	for _, m := range members {
		byOrdinal[m.Ordinal] = m
	}
	for _, m := range p.keep {
		dc, err := fleet.proxy(m, byOrdinal)
		if err != nil {
			response.Fatal(rsp, err)
			return rsp, nil
		}
		desired[resource.Name(resourceName(m.Ordinal))] = dc
	}
	if err := response.SetDesiredComposedResources(rsp, desired); err != nil {
		response.Fatal(rsp, errors.Wrap(err, "cannot set desired composed resources"))
		return rsp, nil
	}

	dxr, err := request.GetDesiredCompositeResource(req)
	if err != nil {
		response.Fatal(rsp, errors.Wrap(err, "cannot get desired composite resource"))
		return rsp, nil
	}
	if err := setStatus(dxr, members, now); err != nil {
		response.Fatal(rsp, err)
		return rsp, nil
	}
	if err := response.SetDesiredCompositeResource(rsp, dxr); err != nil {
		response.Fatal(rsp, errors.Wrap(err, "cannot set desired composite resource"))
		return rsp, nil
	}
	report(rsp, fleet, members, p, now)
	return rsp, nil
}

// activeLeases returns the names of proxies a crawler holds an unexpired
// lease on: a holder, and renewTime + leaseDurationSeconds in the future.
func activeLeases(leases []resource.Required, now time.Time) map[string]bool {
	out := map[string]bool{}
	for _, l := range leases {
		obj := l.Resource.Object
		holder, _, _ := unstructured.NestedString(obj, "spec", "holderIdentity")
		renew, _, _ := unstructured.NestedString(obj, "spec", "renewTime")
		secs, _, _ := unstructured.NestedFieldNoCopy(obj, "spec", "leaseDurationSeconds")
		var ttl time.Duration
		switch v := secs.(type) {
		case int64:
			ttl = time.Duration(v) * time.Second
		case float64:
			ttl = time.Duration(v * float64(time.Second))
		}
		t, err := time.Parse(time.RFC3339Nano, renew)
		if holder == "" || err != nil || !t.Add(ttl).After(now) {
			continue
		}
		out[l.Resource.GetLabels()[ownership.ProxyLabel]] = true
	}
	return out
}

// observedMembers reads the fleet's observed Proxies.
func observedMembers(observed map[resource.Name]resource.ObservedComposed, leased map[string]bool) []*member {
	var out []*member
	for name, oc := range observed {
		ord, ok := ordinalOf(string(name))
		if !ok || oc.Resource.GetKind() != v1alpha1.ProxyKind {
			continue
		}
		r := oc.Resource
		labels := r.GetLabels()
		m := &member{Ordinal: ord, Name: r.GetName(), Zone: labels[ownership.ZoneLabel], Created: r.GetCreationTimestamp().Time, Replaces: -1}
		if v, err := strconv.Atoi(labels[ownership.ReplacesLabel]); err == nil {
			m.Replaces = v
		}
		m.Generation, _ = strconv.Atoi(labels[ownership.GenerationLabel])
		c := r.GetCondition(xpv2.TypeReady)
		m.Ready = c.Status == corev1.ConditionTrue
		m.Since = c.LastTransitionTime.Time
		if m.Since.IsZero() {
			m.Since = m.Created
		}
		m.Healthy, _ = r.GetBool("status.atProvider.healthy")
		host, _ := r.GetString("status.atProvider.host")
		port, _ := r.GetInteger("status.atProvider.port")
		if host != "" && port > 0 {
			m.Endpoint = net.JoinHostPort(host, strconv.FormatInt(port, 10))
		}
		m.EgressIP, _ = r.GetString("status.atProvider.egressIP")
		m.Error, _ = r.GetString("status.atProvider.lastProbeError")
		m.Leased = leased[m.Name]
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ordinal < out[j].Ordinal })
	return out
}

// proxy is the desired Proxy of a member.
func (f *Fleet) proxy(m *member, observed map[int]*member) (*resource.DesiredComposed, error) {
	s := f.spec
	labels := map[string]string{
		ownership.FleetLabel:      f.Name,
		ownership.ZoneLabel:       m.Zone,
		ownership.GenerationLabel: strconv.Itoa(m.Generation),
	}
	if _, ok := observed[m.Replaces]; ok {
		labels[ownership.ReplacesLabel] = strconv.Itoa(m.Replaces)
	}
	fp := v1alpha1.ProxyParameters{
		Mode:                v1alpha1.ProxyModeManaged,
		Port:                i32(s.Proxy.Port, 3128),
		AuthSecretRef:       s.Proxy.AuthSecretRef,
		AllowedSourceRanges: s.Proxy.AllowedSourceRanges,
		HealthCheck:         s.HealthCheck,
		MaxLeases:           i32(s.Leases.MaxLeasesPerProxy, 1),
	}
	switch {
	case s.Placement.Local != nil:
		fp.Local = s.Placement.Local.DeepCopy()
	case s.Placement.Kubernetes != nil:
		k := s.Placement.Kubernetes.DeepCopy()
		if k.NodeSelector == nil {
			k.NodeSelector = map[string]string{}
		}
		k.NodeSelector[corev1.LabelTopologyZone] = m.Zone
		fp.Kubernetes = k
	case s.Placement.GCP != nil:
		g := s.Placement.GCP
		fp.GCP = &v1alpha1.GCPPlacement{Zone: m.Zone, MachineType: g.MachineType, Image: g.Image, Network: g.Network, NetworkTags: g.NetworkTags, CloudInit: g.CloudInit}
	}
	ref := &xpv2.ProviderConfigReference{Kind: v1alpha1.ClusterProviderConfigKind, Name: "default"}
	if r := s.ProviderConfigRef; r != nil {
		if r.Kind != "" {
			ref.Kind = r.Kind
		}
		if r.Name != "" {
			ref.Name = r.Name
		}
	}
	p := &v1alpha1.Proxy{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.ProxyKind},
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", f.Name, m.Ordinal), Namespace: f.Namespace, Labels: labels},
		Spec: v1alpha1.ProxySpec{
			ManagedResourceSpec: xpv2.ManagedResourceSpec{ProviderConfigReference: ref},
			ForProvider:         fp,
		},
	}
	// Through JSON rather than the unstructured converter, so that unset
	// fields stay unset (omitempty) and the apiserver applies the CRD's
	// defaults; a desired resource carries no status.
	b, err := json.Marshal(p)
	if err != nil {
		return nil, errors.Wrapf(err, "cannot compose %s", p.Name)
	}
	u := composed.New()
	if err := json.Unmarshal(b, &u.Object); err != nil {
		return nil, errors.Wrapf(err, "cannot compose %s", p.Name)
	}
	delete(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	dc := &resource.DesiredComposed{Resource: u, Ready: resource.ReadyUnspecified}
	if o, ok := observed[m.Ordinal]; ok && o.Ready {
		dc.Ready = resource.ReadyTrue
	}
	return dc, nil
}

// setStatus writes the fleet's observed state to the XR.
func setStatus(dxr *resource.Composite, members []*member, now time.Time) error {
	var ready, healthy int
	proxies := make([]any, 0, len(members))
	for _, m := range members {
		if m.Ready {
			ready++
		}
		if m.Healthy {
			healthy++
		}
		proxies = append(proxies, map[string]any{
			"name": m.Name, "endpoint": m.Endpoint, "zone": m.Zone, "egressIP": m.EgressIP,
			"healthy": m.Healthy, "age": duration.HumanDuration(now.Sub(m.Created)),
		})
	}
	for path, v := range map[string]any{
		"status.replicas":        int64(len(members)),
		"status.readyReplicas":   int64(ready),
		"status.healthyReplicas": int64(healthy),
		"status.proxies":         proxies,
	} {
		if err := dxr.Resource.SetValue(path, v); err != nil {
			return errors.Wrapf(err, "cannot set %s", path)
		}
	}
	return nil
}

// report sets the FleetHealthy condition, and a Warning result only on real
// trouble: a proxy unavailable for longer than replaceUnhealthyAfter.
func report(rsp *fnv1.RunFunctionResponse, f *Fleet, members []*member, p *plan, now time.Time) {
	healthy := 0
	var sick []string
	trouble := false
	for _, m := range members {
		if m.Healthy {
			healthy++
			continue
		}
		down := now.Sub(m.Since)
		msg := fmt.Sprintf("proxy %s unhealthy for %s", m.Name, duration.HumanDuration(down))
		if m.Error != "" {
			msg += ": " + m.Error
		}
		sick = append(sick, msg)
		if !m.Ready && down >= f.ReplaceUnhealthyAfter {
			trouble = true
		}
	}
	parts := []string{fmt.Sprintf("%d/%d proxies healthy", healthy, f.Replicas)}
	if len(sick) > 3 {
		sick = append(sick[:3], fmt.Sprintf("and %d more", len(sick)-3))
	}
	parts = append(parts, sick...)
	if p.inFlight+p.created > 0 {
		parts = append(parts, fmt.Sprintf("%d replacements or additions in flight", p.inFlight+p.created))
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
