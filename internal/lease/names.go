package lease

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// The name grammar of lease objects and what a Lease says of itself.

// ProxyOf reads the proxy back from a slot object's name.
func ProxyOf(slotName string) (string, bool) {
	i := strings.LastIndex(slotName, "-slot-")
	if i <= 0 {
		return "", false
	}
	if _, err := strconv.Atoi(slotName[i+len("-slot-"):]); err != nil {
		return "", false
	}
	return slotName[:i], true
}

// SlotName is the name of a proxy's slot object.
func SlotName(proxy string, slot int) string {
	return proxy + "-slot-" + strconv.Itoa(slot)
}

// Expired reports whether a lease's renewTime + leaseDurationSeconds has
// passed by the clock now comes from: what a listing shows, and when a ban
// ends. A slot is never taken over on it, since the replica that renewed it
// may have another clock: the store judges that from its own observation.
// Anything that must not act while a crawler may still use the proxy asks
// Holds instead.
func Expired(l *coordv1.Lease, now time.Time) bool {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return true
	}
	return !l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second).After(now)
}

// Holds reports whether a seat lease may still hold its proxy at now: it has
// a holder, and renewTime + leaseDurationSeconds + HoldSkew (leasewire) has not passed.
// It errs on the side of "held", so that a proxy a crawler may still be
// using is not rotated away under it, but within bounds a lease written by
// anyone but egress-discovery could exceed: a duration counts for at most
// maxTTL, the fleet's longest, and a renewTime further ahead of now than
// HoldSkew (leasewire), which no replica writes, holds nothing.
func Holds(l *coordv1.Lease, now time.Time, maxTTL time.Duration) bool {
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return false
	}
	renew := l.Spec.RenewTime.Time
	if renew.After(now.Add(leasewire.HoldSkew)) {
		return false
	}
	ttl := min(time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second, maxTTL)
	return now.Before(renew.Add(ttl).Add(leasewire.HoldSkew))
}

// SeatSelector selects the seat leases of a fleet.
func SeatSelector(fleet string) map[string]string {
	return map[string]string{
		fleetv1alpha1.LabelFleet: ownership.LabelValue(fleet), fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindSlot,
	}
}

// names labels and annotates a lease with its fleet and proxy: labels to
// select by, annotations to read the names back exactly.
func names(meta *metav1.ObjectMeta, fleet, proxy string) {
	meta.Labels[fleetv1alpha1.LabelFleet] = ownership.LabelValue(fleet)
	meta.Labels[fleetv1alpha1.LabelProxy] = ownership.LabelValue(proxy)
	meta.Annotations[fleetv1alpha1.AnnotationFleet] = fleet
	meta.Annotations[fleetv1alpha1.AnnotationProxy] = proxy
}

// own makes the proxy's owner the owner of a lease or ban about to be made.
func (s *Store) own(ctx context.Context, meta *metav1.ObjectMeta, proxy string) {
	if s.OwnerOf == nil {
		return
	}
	if o := s.OwnerOf(ctx, meta.Namespace, proxy); o != nil {
		meta.OwnerReferences = []metav1.OwnerReference{*o}
	}
}

// ExpiresAt is when a lease runs out.
func ExpiresAt(l *coordv1.Lease) time.Time {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return time.Time{}
	}
	return l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
}

// StickyHash is the label value under which a sticky key is remembered.
func StickyHash(key string) string {
	if key == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])[:32]
}

// acquired is when l was granted (zero when it does not say).
func acquired(l *coordv1.Lease) time.Time {
	if l.Spec.AcquireTime == nil {
		return time.Time{}
	}
	return l.Spec.AcquireTime.Time
}

// leaseID is the ID of the grant l's object records, which ParseID splits.
func leaseID(l *coordv1.Lease) string {
	return l.Namespace + "/" + l.Name + "/" + string(l.UID)
}

// ParseID splits a lease ID into namespace, object name and the UID of the
// grant's object.
func ParseID(id string) (namespace, name, tok string, err error) {
	parts := strings.Split(id, "/")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return "", "", "", errors.Errorf(errFmtLeaseID, id)
	}
	return parts[0], parts[1], parts[2], nil
}

// leaseTTL is a lease's duration.
func leaseTTL(l *coordv1.Lease) time.Duration {
	if l.Spec.LeaseDurationSeconds == nil {
		return 0
	}
	return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
}
