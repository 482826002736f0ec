package leasewire

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// Annotations of a demand Lease: one egress-discovery replica's share of a
// fleet's demand, as counts.
const (
	AnnotationDemandHeld    = fleetv1alpha1.Group + "/demand-held"
	AnnotationDemandWaiting = fleetv1alpha1.Group + "/demand-waiting"
	AnnotationDemandRefused = fleetv1alpha1.Group + "/demand-refused"
)

// DemandFreshness is how long a demand Lease counts after it was written
// (its leaseDurationSeconds): a replica rewrites its demand at least every
// DemandRefresh while any count is above zero, so one that died stops
// counting within a minute. A demand of zeros need not be rewritten: stale,
// it counts as zeros anyway.
const (
	DemandFreshness = time.Minute
	DemandRefresh   = 30 * time.Second
	// DemandInterval is the least time between two writes of one replica's
	// demand of one fleet.
	DemandInterval = 10 * time.Second
	// DemandSweepAfter is how long after it went stale a demand Lease is
	// deleted by any replica's sweeper: its own replica is gone.
	DemandSweepAfter = 10 * time.Minute
)

// Demand is lease demand on a fleet: leases held, acquisitions waiting
// for a slot now, and acquisitions refused for want of one within the last
// minute.
type Demand struct {
	Held, Waiting, Refused int
}

// Zero says whether nothing is asked for.
func (d Demand) Zero() bool { return d == Demand{} }

// Add sums two demands.
func (d Demand) Add(o Demand) Demand {
	return Demand{Held: d.Held + o.Held, Waiting: d.Waiting + o.Waiting, Refused: d.Refused + o.Refused}
}

// DemandName is the name of a replica's demand Lease of a fleet: a hash,
// since a fleet's name and a replica's together may exceed what an object
// name holds.
func DemandName(fleet, replica string) string {
	sum := sha256.Sum256([]byte(fleet + "\x00" + replica))
	return "egress-demand-" + hex.EncodeToString(sum[:])[:20]
}

// DemandSelector selects the demand Leases of a fleet.
func DemandSelector(fleet string) map[string]string {
	return map[string]string{
		fleetv1alpha1.LabelFleet: ownership.LabelValue(fleet), fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindDemand,
	}
}

// SetDemand writes a replica's demand of a fleet, as of now, onto l.
func SetDemand(l *coordv1.Lease, fleet, replica string, d Demand, now time.Time) {
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	for k, v := range DemandSelector(fleet) {
		l.Labels[k] = v
	}
	l.Annotations[fleetv1alpha1.AnnotationFleet] = fleet
	l.Annotations[AnnotationDemandHeld] = strconv.Itoa(d.Held)
	l.Annotations[AnnotationDemandWaiting] = strconv.Itoa(d.Waiting)
	l.Annotations[AnnotationDemandRefused] = strconv.Itoa(d.Refused)
	seconds := int32(DemandFreshness / time.Second)
	l.Spec = coordv1.LeaseSpec{HolderIdentity: &replica, LeaseDurationSeconds: &seconds, RenewTime: &metav1.MicroTime{Time: now}}
}

// maxDemand bounds each count read back, so that no object can make a sum
// overflow or a fleet grow past reason; a fleet's size is bounded anyway.
const maxDemand = 1 << 20

// ReadDemand reads the demand a Lease records for fleet, and says whether
// it counts at now: it is a demand Lease of exactly that fleet, written
// within DemandFreshness (and not more than HoldSkew ahead of now), with
// counts that parse. Anything else counts as no demand.
func ReadDemand(l *coordv1.Lease, fleet string, now time.Time) (Demand, bool) {
	if l.Labels[fleetv1alpha1.LabelLeaseKind] != fleetv1alpha1.LeaseKindDemand || fleetv1alpha1.FleetName(l) != fleet {
		return Demand{}, false
	}
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return Demand{}, false
	}
	renew := l.Spec.RenewTime.Time
	fresh := min(time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second, DemandFreshness)
	if renew.After(now.Add(HoldSkew)) || !now.Before(renew.Add(fresh+HoldSkew)) {
		return Demand{}, false
	}
	var d Demand
	for k, to := range map[string]*int{AnnotationDemandHeld: &d.Held, AnnotationDemandWaiting: &d.Waiting, AnnotationDemandRefused: &d.Refused} {
		n, err := strconv.Atoi(l.Annotations[k])
		if err != nil || n < 0 || n > maxDemand {
			return Demand{}, false
		}
		*to = n
	}
	return d, true
}
