package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Kinds of the pool API: a pooled ProxyFleet composes ProxyPools, each of
// which composes its share of the fleet's Proxies.
const (
	// ProxyPoolKind is the namespaced composite resource of one pool.
	ProxyPoolKind = "ProxyPool"
	// ProxyPoolResource is its plural, as RBAC names it.
	ProxyPoolResource = "proxypools"
	// LabelPool names the pool a Proxy belongs to (the ProxyPool's name,
	// through ownership.LabelValue).
	LabelPool = Group + "/pool"
)

// PoolBudget is the share of its fleet's rollout budget a pool may use:
// surge Proxies above its replicas, and Ready Proxies it may take out of
// service. The fleet hands each unit to one pool at a time, so that however
// many pools roll at once, the fleet's spec.rotation bounds hold.
type PoolBudget struct {
	// MaxSurge is how many Proxies above its replicas the pool may make.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxSurge int32 `json:"maxSurge,omitempty"`
	// MaxUnavailable is how many Ready Proxies below its replicas the pool
	// may take out of service.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxUnavailable int32 `json:"maxUnavailable,omitempty"`
	// MaxRepairs is how many replacements of its proxies that are down
	// the pool may have under way, not Ready yet: its share of the
	// fleet's max(maxSurge, 1), so that a backend that cannot run proxies
	// is not flooded with them.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxRepairs int32 `json:"maxRepairs,omitempty"`
	// MaxRecycles is how many recycles (spec.recycling of the fleet, or
	// spec.diversity.replaceBeyondLimit) the pool may start on the grant
	// RecyclesSince names: its share of the fleet's bound, which the
	// fleet grants one recycle at a time, after its back-off and never
	// below its floor. A grant has no time window: only a fresh grant
	// lets the pool start more.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxRecycles int32 `json:"maxRecycles,omitempty"`
	// RecyclesSince is when the fleet made the grant of MaxRecycles, and
	// names it: a replacement the pool makes on it carries it (the
	// recycle-grant annotation), and the pool counts the grant's recycles
	// by that, whatever its clock.
	// +kubebuilder:validation:Format=date-time
	// +optional
	RecyclesSince string `json:"recyclesSince,omitempty"`
}

// PoolBurned is one of a pool's Proxies whose egress IP its fleet's
// spec.recycling judges burned, as egress-discovery's summary of the
// fleet names it.
type PoolBurned struct {
	// Name is the Proxy's name.
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Reason says why its address is burned (at most MaxPoolBurnedReason
	// bytes).
	// +kubebuilder:validation:MaxLength=96
	Reason string `json:"reason"`
}

// ProxyPoolSpec is one pool of a pooled fleet, as the fleet composes it.
// Nobody writes it but the fleet.
type ProxyPoolSpec struct {
	// Fleet is the name of the ProxyFleet the pool belongs to; its Proxies
	// carry the fleet's label, which egress-discovery finds them by.
	// +kubebuilder:validation:MinLength=1
	Fleet string `json:"fleet"`
	// Index numbers the pool within its fleet, from 1; its Proxies'
	// ordinals start at Index x 10 000 000.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=96
	Index int32 `json:"index"`
	// Budget is the share of the fleet's rollout budget the pool may use
	// now.
	// +optional
	Budget PoolBudget `json:"budget,omitempty"`
	// Burned are the pool's Proxies whose egress IP the fleet's
	// spec.recycling judges burned, those to recycle first (by ordinal),
	// at most MaxPoolBurned: the pool recycles them within
	// Budget.MaxRecycles.
	// +kubebuilder:validation:MaxItems=2
	// +optional
	Burned []PoolBurned `json:"burned,omitempty"`
	// ScaleDown says how the pool removes Proxies above its replicas:
	// Immediate, as spec.replicas falling does; or Drain, as an autoscaled
	// fleet does: only Proxies no crawler holds a lease on, once every
	// egress-discovery replica saw them draining.
	// +kubebuilder:validation:Enum=Immediate;Drain
	// +kubebuilder:default=Immediate
	// +optional
	ScaleDown string `json:"scaleDown,omitempty"`
	// Template is the fleet's spec as this pool applies it: its replicas
	// are the pool's, its zones in the order the pool fills them.
	Template ProxyFleetSpec `json:"template"`
}

// Ways a pool scales down.
const (
	PoolScaleDownImmediate = "Immediate"
	PoolScaleDownDrain     = "Drain"
)

// PoolBudgetStatus says what a pool did with its budget, when it was last
// composed: the fleet moves budget to another pool only once the pool
// acknowledged giving it up, and nothing of it is in use.
type PoolBudgetStatus struct {
	// MaxSurge and MaxUnavailable are the budget the pool was composed
	// with.
	MaxSurge       int32 `json:"maxSurge,omitempty"`
	MaxUnavailable int32 `json:"maxUnavailable,omitempty"`
	// Wanted counts the pool's Proxies due for replacement (age, a
	// template change, a removed zone) that are not replaced yet.
	Wanted int32 `json:"wanted,omitempty"`
	// WantedUnleased counts those of them no lease holds, which a unit
	// of budget replaces at once.
	WantedUnleased int32 `json:"wantedUnleased,omitempty"`
	// SurgeInUse counts the pool's Proxies above its replicas.
	SurgeInUse int32 `json:"surgeInUse,omitempty"`
	// MaxRepairs is the repairs the pool was composed with;
	// RepairsWanted counts its Proxies that are down and due, replaced or
	// waiting; RepairsInUse its replacements of them not Ready yet.
	MaxRepairs    int32 `json:"maxRepairs,omitempty"`
	RepairsWanted int32 `json:"repairsWanted,omitempty"`
	RepairsInUse  int32 `json:"repairsInUse,omitempty"`
	// UnavailableInUse counts the Ready Proxies its changes took out of
	// service: those it drains, and those made in place of a holder it
	// removed first, until they are Ready. A Proxy that failed does not
	// count.
	UnavailableInUse int32 `json:"unavailableInUse,omitempty"`
	// MaxRecycles and RecyclesSince are the recycle grant the pool was
	// composed with; RecyclesUsed counts the recycles it started on it;
	// RecyclesWanted counts its burned Proxies that a recycle could
	// replace now but for the grant (or a surge slot, holding one);
	// RecyclesLastHour counts its recycles of the last hour, which its
	// fleet holds its bound by should its own list be lost.
	MaxRecycles      int32  `json:"maxRecycles,omitempty"`
	RecyclesSince    string `json:"recyclesSince,omitempty"`
	RecyclesUsed     int32  `json:"recyclesUsed,omitempty"`
	RecyclesWanted   int32  `json:"recyclesWanted,omitempty"`
	RecyclesLastHour int32  `json:"recyclesLastHour,omitempty"`
}

// Bounds of what a pool's spec and status say of recycling, so that an
// observed pool stays within PoolMessageBytes. MaxPoolBurned bounds the
// burned Proxies a fleet names in a pool's spec, MaxPoolBurnedReason each
// one's reason: the fleet grants a pool one recycle at a time, and leaves
// out of the list those it knows cannot be recycled (an address a recycle
// gave back). MaxPoolRecycleRecords bounds the recycles a pool's status
// lists, newest last, with reasons of at most MaxPoolBurnedReason bytes:
// the fleet grants the next only once it observed the last used, in the
// same status as its record, which it merges into its own list of the
// day. MaxPoolWaiting bounds the pool's status.egress.recycleWaiting.
const (
	MaxPoolBurned         = 2
	MaxPoolBurnedReason   = 96
	MaxPoolRecycleRecords = 1
	MaxPoolWaiting        = 128
)

// PoolFault is one Proxy of a pool at fault.
type PoolFault struct {
	// Proxy is the Proxy's name.
	Proxy string `json:"proxy"`
	// Reason says why it is unhealthy or out of service, cut to
	// MaxPoolFaultReason bytes (the Proxy's status says it whole).
	Reason string `json:"reason"`
}

// MaxPoolFaultReason bounds a pool fault's reason, so that an observed
// pool stays within PoolMessageBytes.
const MaxPoolFaultReason = 80

// ProxyPoolStatus is the observed pool: counts, not one entry per Proxy,
// so that the fleet, which reads every pool's status, stays small.
type ProxyPoolStatus struct {
	Replicas int32 `json:"replicas,omitempty"`
	// DesiredReplicas is the replicas the pool was composed with: the
	// fleet deletes a pool only once it was composed with none and has
	// none.
	DesiredReplicas *int32 `json:"desiredReplicas,omitempty"`
	ReadyReplicas   int32  `json:"readyReplicas,omitempty"`
	HealthyReplicas int32  `json:"healthyReplicas,omitempty"`
	UpdatedReplicas int32  `json:"updatedReplicas,omitempty"`
	// LeasedReplicas counts Proxies a crawler holds a lease on, when the
	// pool last read its leases: a steady pool reads none (its fleet
	// counts them), so it is absent then.
	// +optional
	LeasedReplicas *int32 `json:"leasedReplicas,omitempty"`
	// DuplicateEgressIPs counts Proxies whose egress IP another of the
	// pool's shares.
	DuplicateEgressIPs int32 `json:"duplicateEgressIPs,omitempty"`
	// Egress counts the pool's Proxies beyond the fleet's spec.diversity
	// (labelled beyond-diversity-limit), and lists its newest recycles
	// (MaxPoolRecycleRecords: its fleet lists the day's), with those that
	// wait and why.
	// +optional
	Egress *EgressStatus `json:"egress,omitempty"`
	// Failing counts Proxies unready for longer than it takes one to
	// boot, which the fleet's autoscaler tells an outage by.
	Failing int32 `json:"failing,omitempty"`
	// ObservedRevision is the template revision the pool composes.
	ObservedRevision string `json:"observedRevision,omitempty"`
	// Rollout is the progress of the pool's rollout, while it holds
	// budget.
	// +optional
	Rollout *RolloutStatus `json:"rollout,omitempty"`
	// Budget is what the pool did with its budget.
	// +optional
	Budget *PoolBudgetStatus `json:"budget,omitempty"`
	// Faults are the pool's Proxies at fault, worst first, at most three.
	// +kubebuilder:validation:MaxItems=3
	// +optional
	Faults []PoolFault `json:"faults,omitempty"`
}

// A ProxyPool is one pool of a pooled ProxyFleet: it composes its share of
// the fleet's Proxies, and rotates and replaces them within the budget the
// fleet hands it.
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced
type ProxyPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the pool as its fleet composes it.
	Spec ProxyPoolSpec `json:"spec"`
	// Status is the observed pool.
	Status ProxyPoolStatus `json:"status,omitempty"`
}
