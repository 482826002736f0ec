package lease

import (
	"context"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// Sticky keys: the proxy a key last held, from the cache and this
// replica's own grants of the last seconds.

// stuckFor is how long this replica remembers a sticky key's last grant:
// well past the time its cache takes to show it.
const stuckFor = 10 * time.Second

// stuckEntry is a sticky key's last grant here: its proxy and its
// Lease, by name and UID.
type stuckEntry struct {
	proxy, lease string
	uid          types.UID
	until        time.Time
}

// stick remembers the grant a sticky key was just given (l), and returns
// the memory's key ("" for no sticky key).
func (s *Store) stick(c Candidate, key string, l *coordv1.Lease) string {
	h := StickyHash(key)
	if h == "" {
		return ""
	}
	k := c.Namespace + "/" + c.Fleet + "/" + h
	s.stuck.Store(k, stuckEntry{proxy: c.Proxy, lease: l.Name, uid: l.UID, until: s.Now().Add(stuckFor)})
	return k
}

// unstick forgets a sticky key's grant, released: the key's next
// acquisition follows the cache again. Only that grant's memory: a newer
// grant of the key stays remembered.
func (s *Store) unstick(k string, uid types.UID) {
	if v, ok := s.stuck.Load(k); ok && v.(stuckEntry).uid == uid { //nolint:forcetypeassert // Only entries are stored.
		s.stuck.CompareAndDelete(k, v)
	}
}

// stickyOf returns the proxy a sticky key last held, given items, a read
// of (at least) the key's leases in a fleet. This replica's own grant of
// the last seconds comes first while items do not show it: the cache is
// behind this replica's write. Once they show it, they decide (the lease
// acquired last, which another replica may have granted since), so two
// replicas that each granted the key lately agree as soon as their caches
// have both grants.
func (s *Store) stickyOf(items []coordv1.Lease, namespace, fleet, key string) string {
	h := StickyHash(key)
	if h == "" {
		return ""
	}
	v := &SlotView{items: items}
	e, ok := s.stuck.Load(namespace + "/" + fleet + "/" + h)
	if !ok || s.Now().After(e.(stuckEntry).until) || v.shows(e.(stuckEntry).lease, e.(stuckEntry).uid) { //nolint:forcetypeassert // Only entries are stored.
		return v.Sticky(key)
	}
	return e.(stuckEntry).proxy //nolint:forcetypeassert // Only entries are stored.
}

// StickyIn returns the proxy a sticky key last held in a fleet, from
// view (a read of the fleet's slots) and this replica's own grants of the
// last seconds, which the view may not show yet.
func (s *Store) StickyIn(v *SlotView, namespace, fleet, key string) string {
	return s.stickyOf(v.items, namespace, fleet, key)
}

// shows says whether the view holds the Lease name with uid.
func (v *SlotView) shows(name string, uid types.UID) bool {
	for i := range v.items {
		if v.items[i].Name == name && v.items[i].UID == uid {
			return true
		}
	}
	return false
}

// Sticky returns the proxy a sticky key last held among the view's slots,
// if any: as Store.Sticky does, from the slots already read.
func (v *SlotView) Sticky(key string) string {
	h := StickyHash(key)
	if h == "" {
		return ""
	}
	var best *coordv1.Lease
	for i := range v.items {
		l := &v.items[i]
		if l.Labels[LabelSticky] != h {
			continue
		}
		if best == nil || l.Spec.AcquireTime != nil && (best.Spec.AcquireTime == nil || l.Spec.AcquireTime.After(best.Spec.AcquireTime.Time)) {
			best = l
		}
	}
	if best == nil {
		return ""
	}
	return fleetv1alpha1.ProxyName(best)
}

// Sticky returns the proxy a sticky key last held in a fleet, if any.
func (s *Store) Sticky(ctx context.Context, namespace, fleet, key string) (string, error) {
	h := StickyHash(key)
	if h == "" {
		return "", nil
	}
	items, ok, err := s.listBy(ctx, namespace, indexSticky, fleet+"/"+h)
	if err != nil {
		return "", errors.Wrap(err, errListLeases)
	}
	if !ok {
		l := &coordv1.LeaseList{}
		if err := s.Cache.List(ctx, l, client.InNamespace(namespace), client.UnsafeDisableDeepCopy, client.MatchingLabels{fleetv1alpha1.LabelFleet: ownership.LabelValue(fleet), LabelSticky: h}); err != nil {
			return "", errors.Wrap(err, errListLeases)
		}
		items = l.Items
	}
	return s.stickyOf(items, namespace, fleet, key), nil
}
