package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Package type metadata.
const (
	// Group is the API group of ProxyFleets, their claims and the labels
	// the fleet's parts share.
	Group   = "crawl.example.com"
	Version = "v1alpha1"
)

// Kinds of the fleet API. Crossplane serves them from the XRDs; there is no
// Go scheme registration because Crossplane, not this product, owns them.
const (
	// ProxyFleetKind is the namespaced composite resource.
	ProxyFleetKind = "ProxyFleet"
	// ProxyFleetResource is its plural, as RBAC names it.
	ProxyFleetResource = "proxyfleets"
	// XProxyFleetKind is the LegacyCluster composite resource.
	XProxyFleetKind = "XProxyFleet"
	// ProxyFleetClaimKind is the claim of an XProxyFleet.
	ProxyFleetClaimKind = "ProxyFleetClaim"
	// ProxyFleetClaimResource is its plural, as RBAC names it.
	ProxyFleetClaimResource = "proxyfleetclaims"
)

// SchemeGroupVersion is the group version of the fleet API.
var SchemeGroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// Labels function-proxyfleet puts on the Proxies it composes and
// egress-discovery on the Lease objects it grants, so that both sides and the
// provider speak of fleets and proxies the same way. Values go through
// ownership.LabelValue, since names may be longer than a label value.
const (
	// LabelFleet names the fleet a Proxy or a Lease belongs to.
	LabelFleet = Group + "/fleet"
	// AnnotationFleet holds the fleet's name exactly, for names that do not
	// fit a label value.
	AnnotationFleet = Group + "/fleet"
	// LabelZone is a Proxy's zone.
	LabelZone = Group + "/zone"
	// LabelRotationGeneration counts the replacements of a fleet ordinal.
	LabelRotationGeneration = Group + "/rotation-generation"
	// LabelTemplateRevision names the revision of the fleet's proxy
	// template a Proxy was made from, as a pod-template-hash does.
	LabelTemplateRevision = Group + "/template-revision"
	// LabelUnhealthyStreak counts the replacements of unhealthy proxies in
	// a row that led to a Proxy, none of which turned Ready; absent once
	// the Proxy has been Ready.
	LabelUnhealthyStreak = Group + "/unhealthy-streak"
	// LabelDrainingSince marks a Proxy that is being replaced (a template
	// change, a removed zone, its age): egress-discovery hands out no new
	// leases on it, and renews its leases only until this time (Unix
	// seconds) plus the fleet's maxTTL, so that no crawler holds a rollout
	// up for longer.
	LabelDrainingSince = Group + "/draining-since"
	// LabelDuplicateEgressIP marks a Proxy ("true") whose egress IP
	// another proxy of its fleet shares.
	LabelDuplicateEgressIP = Group + "/duplicate-egress-ip"
	// LabelBeyondDiversityLimit marks a Proxy ("true") beyond a cap of
	// its fleet's spec.diversity: egress-discovery hands it out last.
	LabelBeyondDiversityLimit = Group + "/beyond-diversity-limit"
	// AnnotationRecycleOf names, on a Proxy made to recycle another
	// (spec.recycling), the Proxy it replaces; AnnotationRecycleIP,
	// AnnotationRecycleReason and AnnotationRecycleAt that one's egress
	// IP, why it was burned and when the recycle started (RFC 3339). The
	// replacement carries the decision, applied with it: the fleet's
	// status may be written later, or not at all.
	AnnotationRecycleOf     = Group + "/recycle-of"
	AnnotationRecycleIP     = Group + "/recycle-ip"
	AnnotationRecycleReason = Group + "/recycle-reason"
	AnnotationRecycleAt     = Group + "/recycle-at"
	// AnnotationRecycleGrant names, on a Proxy a pool made to recycle
	// another, the recycle grant it used (its recyclesSince): the pool
	// counts the recycles of a grant by it, whatever its clock.
	AnnotationRecycleGrant = Group + "/recycle-grant"
	// LabelReplaces names the ordinal a surge Proxy replaces.
	LabelReplaces = Group + "/replaces"
	// LabelProxy names the Proxy a Lease is held on.
	LabelProxy = Group + "/proxy"
	// AnnotationProxy holds that Proxy's name exactly.
	AnnotationProxy = Group + "/proxy"
	// LabelLeaseKind tells a crawler's lease seat from a domain ban, which
	// egress-discovery also keeps as a Lease object.
	LabelLeaseKind = Group + "/lease-kind"
	// LeaseKindSlot is a crawler's seat on a proxy.
	LeaseKindSlot = "slot"
	// LeaseKindBan is a domain ban on a proxy.
	LeaseKindBan = "ban"
	// LeaseKindIPBans is the ban history of one egress IP of a fleet,
	// which outlives the proxies that left from it.
	LeaseKindIPBans = "ipbans"
	// LeaseKindDemand is one egress-discovery replica's share of a
	// fleet's lease demand, which the function sizes an autoscaled fleet
	// by.
	LeaseKindDemand = "demand"
)

// FleetName returns the name of the fleet a Proxy or a Lease belongs to.
// Labels carry names encoded to fit a label value; the annotation carries
// them exactly, and objects written before it existed have only the label.
func FleetName(o metav1.Object) string {
	if v, ok := o.GetAnnotations()[AnnotationFleet]; ok {
		return v
	}
	return o.GetLabels()[LabelFleet]
}

// ProxyName returns the name of the proxy a Lease is held on.
func ProxyName(o metav1.Object) string {
	if v, ok := o.GetAnnotations()[AnnotationProxy]; ok {
		return v
	}
	return o.GetLabels()[LabelProxy]
}
