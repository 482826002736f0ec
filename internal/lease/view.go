package lease

import (
	"context"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// Reads of a fleet's slot leases: the views acquisition ranks by.

// Slots lists the live slot leases of a fleet's proxies from the cache, by
// proxy name.
func (s *Store) Slots(ctx context.Context, namespace, fleet string) (map[string][]*coordv1.Lease, error) {
	items, err := s.fleetLeases(ctx, namespace, fleet, fleetv1alpha1.LeaseKindSlot)
	if err != nil {
		return nil, err
	}
	// Only the live slots: not the maps an acquisition orders slots by.
	live := map[string][]*coordv1.Lease{}
	for i := range items {
		if le := &items[i]; !s.expired(le) {
			p := fleetv1alpha1.ProxyName(le)
			live[p] = append(live[p], le)
		}
	}
	return live, nil
}

// A SlotView is one read of a fleet's slot leases from the cache: what an
// acquisition ranks its candidates by (Live, Sticky) and orders each
// candidate's slots by (AcquireIn), so that one try lists the namespace's
// Leases once rather than once for each. Read-only: its leases are the
// cache's own.
type SlotView struct {
	// Live are the unexpired slots, by proxy name.
	Live map[string][]*coordv1.Lease

	items   []coordv1.Lease
	state   map[string]slotState
	expired map[string]bool
}

// View reads a fleet's slot leases from the cache.
func (s *Store) View(ctx context.Context, namespace, fleet string) (*SlotView, error) {
	items, err := s.fleetLeases(ctx, namespace, fleet, fleetv1alpha1.LeaseKindSlot)
	if err != nil {
		return nil, err
	}
	return s.viewOf(items), nil
}

// ViewOf reads the slot leases of some of a fleet's proxies from the
// cache: what an acquisition that ranks a sample of a large fleet needs.
// Without the cache's indexes it is View.
func (s *Store) ViewOf(ctx context.Context, namespace, fleet string, proxies []string) (*SlotView, error) {
	var all []coordv1.Lease
	for _, p := range proxies {
		items, ok, err := s.listBy(ctx, namespace, indexProxy, fleet+"/"+p)
		if err != nil {
			return nil, errors.Wrap(err, errListLeases)
		}
		if !ok {
			return s.View(ctx, namespace, fleet)
		}
		all = append(all, items...)
	}
	return s.viewOf(all), nil
}

// fleetLeases lists a fleet's leases of one kind from the cache, read
// only (the cache's own objects).
func (s *Store) fleetLeases(ctx context.Context, namespace, fleet, kind string) ([]coordv1.Lease, error) {
	items, ok, err := s.listBy(ctx, namespace, indexKind, fleet+"/"+kind)
	if ok || err != nil {
		return items, errors.Wrap(err, errListLeases)
	}
	l := &coordv1.LeaseList{}
	if err := s.Cache.List(ctx, l, client.InNamespace(namespace), client.UnsafeDisableDeepCopy,
		client.MatchingLabels{fleetv1alpha1.LabelFleet: ownership.LabelValue(fleet), fleetv1alpha1.LabelLeaseKind: kind}); err != nil {
		return nil, errors.Wrap(err, errListLeases)
	}
	return l.Items, nil
}

// viewOf is the view of slot leases read.
func (s *Store) viewOf(items []coordv1.Lease) *SlotView {
	v := &SlotView{Live: map[string][]*coordv1.Lease{}, items: items, state: make(map[string]slotState, len(items)), expired: map[string]bool{}}
	for i := range items {
		le := &items[i]
		if s.expired(le) {
			v.state[le.Name] = stateExpired
			// expired are the slots the cache shows over: only those are
			// read back for a takeover, whatever order they are tried in.
			v.expired[le.Name] = true
			continue
		}
		v.state[le.Name] = stateLive
		p := fleetv1alpha1.ProxyName(le)
		v.Live[p] = append(v.Live[p], le)
	}
	return v
}

// Held returns the IDs of the live leases of a fleet granted to identity,
// from the cache.
func (s *Store) Held(ctx context.Context, namespace, fleet, identity string) (map[string]bool, error) {
	items, ok, err := s.listBy(ctx, namespace, indexIdentity, fleet+"/"+identity)
	if err != nil {
		return nil, errors.Wrap(err, errListLeases)
	}
	if !ok {
		if items, err = s.fleetLeases(ctx, namespace, fleet, fleetv1alpha1.LeaseKindSlot); err != nil {
			return nil, err
		}
	}
	out := map[string]bool{}
	for i := range items {
		le := &items[i]
		if le.Annotations[AnnotationIdentity] == identity && fleetv1alpha1.FleetName(le) == fleet && !s.expired(le) {
			out[le.Namespace+"/"+le.Name+"/"+string(le.UID)] = true
		}
	}
	return out, nil
}
