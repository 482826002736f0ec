package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LeaseSummarySpec is what one egress-discovery replica saw of one fleet's
// leases at one moment.
type LeaseSummarySpec struct {
	// Fleet is the name of the fleet summarised, as its Proxies' fleet
	// annotation says it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Fleet string `json:"fleet"`

	// Pool is the ProxyPool summarised (its crawl.example.com/pool label
	// value), in a pooled fleet, whose every pool has a summary of its
	// own; empty for the fleet as a whole, which carries its demand and
	// the proxies of no pool.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Pool string `json:"pool,omitempty"`

	// Replica names the egress-discovery replica that wrote this summary.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Replica string `json:"replica"`

	// ObservedAt is when the replica read what it summarises, by its
	// clock.
	ObservedAt metav1.MicroTime `json:"observedAt"`

	// ValidUntil is when this summary stops counting: a replica rewrites
	// it well before then, so one that stopped writing (it died) is told
	// from one with nothing new to say.
	ValidUntil metav1.MicroTime `json:"validUntil"`

	// Leased lists the proxies of the fleet crawlers hold leases on. An
	// atomic list: the apiserver's managedFields then name the list, not
	// each entry, which would double what the function is sent per proxy.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10000
	Leased []LeasedProxy `json:"leased,omitempty"`

	// Draining lists the proxies of the fleet the replica saw draining
	// when it observed, each with the drain it saw (the value of its
	// crawl.example.com/draining-since label), and so hands to no crawler
	// any more: a proxy it lists here and not in leased had no lease this
	// replica knew of after it stopped handing it out in that drain.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10000
	Draining []DrainingProxy `json:"draining,omitempty"`

	// Burned lists the proxies whose egress IP is burned by the fleet's
	// spec.recycling, as the replica's ban histories say, with why.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10000
	Burned []BurnedProxy `json:"burned,omitempty"`

	// Demand is the replica's share of the fleet's lease demand.
	// +optional
	Demand LeaseDemand `json:"demand,omitempty"`
}

// LeasedProxy is one proxy crawlers hold leases on.
type LeasedProxy struct {
	// Name of the Proxy.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// Holders is how many leases are held on it.
	// +kubebuilder:validation:Minimum=1
	Holders int32 `json:"holders"`

	// HeldUntil is the latest time any of those leases may still be held
	// without a renewal this replica would see: the lease's renewal time
	// plus its TTL (at most the fleet's maxTTL) plus the margin for
	// replicas' clocks.
	HeldUntil metav1.MicroTime `json:"heldUntil"`
}

// DrainingProxy is one proxy seen draining.
type DrainingProxy struct {
	// Name of the Proxy.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Since is when its drain began, in Unix seconds, as its
	// crawl.example.com/draining-since label says: a drain seen before it
	// stopped draining, or of another proxy of the same name, does not
	// count for this one.
	Since int64 `json:"since"`
}

// BurnedProxy is a proxy whose egress IP is burned.
type BurnedProxy struct {
	// Name of the Proxy.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Reason the address is burned.
	// +kubebuilder:validation:MaxLength=256
	Reason string `json:"reason"`
}

// LeaseDemand is lease demand on a fleet, as counts.
type LeaseDemand struct {
	// Held is how many leases are held.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Held int32 `json:"held,omitempty"`
	// Waiting is how many acquisitions wait for a slot now.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Waiting int32 `json:"waiting,omitempty"`
	// Refused is how many crawlers were refused a lease for want of a
	// slot or of healthy proxies within the last minute.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Refused int32 `json:"refused,omitempty"`
	// LeasedProxies is how many of the fleet's proxies, in every pool, a
	// crawler may hold a lease on as this replica counts them for safety
	// (the leases in its cache, its own grants the cache may not show yet,
	// and takes in flight): what a pooled fleet shows as its
	// leasedReplicas, since its steady pools do not read their leases.
	// Set in the summary of the fleet as a whole; absent from one written
	// by a release before it.
	// +kubebuilder:validation:Minimum=0
	// +optional
	LeasedProxies *int32 `json:"leasedProxies,omitempty"`
}

// A LeaseSummary is egress-discovery's account of one fleet's leases, one
// per fleet and discovery replica, in the fleet's namespace:
// function-proxyfleet reads these instead of the leases themselves, so
// Crossplane caches and sends a few small objects rather than every Lease
// in the cluster. Only egress-discovery writes them (an admission policy
// keeps everyone else out).
// +kubebuilder:object:root=true
// +kubebuilder:printcolumn:name="FLEET",type="string",JSONPath=".spec.fleet"
// +kubebuilder:printcolumn:name="REPLICA",type="string",JSONPath=".spec.replica"
// +kubebuilder:printcolumn:name="OBSERVED",type="date",JSONPath=".spec.observedAt"
// +kubebuilder:printcolumn:name="VALID-UNTIL",type="string",JSONPath=".spec.validUntil"
// +kubebuilder:resource:scope=Namespaced,categories={egress}
type LeaseSummary struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec LeaseSummarySpec `json:"spec"`
}

// +kubebuilder:object:root=true

// LeaseSummaryList contains a list of LeaseSummary.
type LeaseSummaryList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LeaseSummary `json:"items"`
}
