package lease

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
)

// Indexes of the cache's Leases, so that an acquisition in a fleet of
// 10 000 proxies with 10 000 leases reads the few leases it ranks by, not
// every Lease of the namespace: a label selector scans the namespace and
// copies each match.
const (
	// indexKind is a lease's fleet and kind: a fleet's slots, bans or
	// seats.
	indexKind = "egress.lease.fleet-kind"
	// indexProxy is a slot's fleet and proxy: one proxy's holders.
	indexProxy = "egress.lease.fleet-proxy"
	// indexSticky is a slot's fleet and sticky-key hash.
	indexSticky = "egress.lease.fleet-sticky"
	// indexIdentity is a slot's fleet and the identity it was granted to.
	indexIdentity = "egress.lease.fleet-identity"
	// indexBanDomain is a ban's fleet and domain.
	indexBanDomain = "egress.lease.fleet-ban-domain"
)

// leaseIndexes extract the values of each index from a Lease. Exact names
// (the annotations), not label values, so that two long fleet names whose
// labels are one hash are not one key; a name has no "/".
var leaseIndexes = map[string]client.IndexerFunc{
	indexKind: func(o client.Object) []string {
		k := o.GetLabels()[fleetv1alpha1.LabelLeaseKind]
		if k == "" {
			return nil
		}
		return []string{fleetv1alpha1.FleetName(o) + "/" + k}
	},
	indexProxy: func(o client.Object) []string {
		if o.GetLabels()[fleetv1alpha1.LabelLeaseKind] != fleetv1alpha1.LeaseKindSlot {
			return nil
		}
		return []string{fleetv1alpha1.FleetName(o) + "/" + fleetv1alpha1.ProxyName(o)}
	},
	indexSticky: func(o client.Object) []string {
		h := o.GetLabels()[LabelSticky]
		if h == "" || o.GetLabels()[fleetv1alpha1.LabelLeaseKind] != fleetv1alpha1.LeaseKindSlot {
			return nil
		}
		return []string{fleetv1alpha1.FleetName(o) + "/" + h}
	},
	indexIdentity: func(o client.Object) []string {
		if o.GetLabels()[fleetv1alpha1.LabelLeaseKind] != fleetv1alpha1.LeaseKindSlot {
			return nil
		}
		return []string{fleetv1alpha1.FleetName(o) + "/" + o.GetAnnotations()[AnnotationIdentity]}
	},
	indexBanDomain: func(o client.Object) []string {
		if o.GetLabels()[fleetv1alpha1.LabelLeaseKind] != fleetv1alpha1.LeaseKindBan {
			return nil
		}
		return []string{fleetv1alpha1.FleetName(o) + "/" + o.GetAnnotations()[AnnotationDomain]}
	},
}

// IndexCache adds the Lease indexes the store reads by to an informer
// cache; call it before the cache starts. A store adds them itself at its
// first read when they are missing (informers take indexes after they
// started), so this only makes a failure an error at startup.
func IndexCache(ctx context.Context, fi client.FieldIndexer) error {
	for name, f := range leaseIndexes {
		if err := fi.IndexField(ctx, &coordv1.Lease{}, name, f); err != nil {
			return errors.Wrapf(err, errFmtIndexBy, name)
		}
	}
	return nil
}

// indexes says whether the store's cache has the Lease indexes: unknown
// until a read finds out, then yes or no for good (no: not an informer
// cache, as a plain client some tests give; every read then selects by
// label).
type indexes struct {
	mu    sync.Mutex
	state atomic.Int32 // 0 unknown, indexedYes or indexedNo
}

const (
	indexedYes = 1
	indexedNo  = 2
)

func (s *Store) indexed(ctx context.Context, namespace string) bool {
	if st := s.idx.state.Load(); st != 0 {
		return st == indexedYes
	}
	s.idx.mu.Lock()
	defer s.idx.mu.Unlock()
	if st := s.idx.state.Load(); st != 0 {
		return st == indexedYes
	}
	fi, ok := s.Cache.(client.FieldIndexer)
	if !ok {
		s.idx.state.Store(indexedNo)
		return false
	}
	// Asked in the read's namespace: a cache of some namespaces answers
	// for no other.
	has := func(name string) bool {
		return s.Cache.List(ctx, &coordv1.LeaseList{}, client.InNamespace(namespace), client.MatchingFields{name: "-"}) == nil
	}
	for name, f := range leaseIndexes {
		if has(name) {
			continue
		}
		if err := fi.IndexField(ctx, &coordv1.Lease{}, name, f); err != nil && !has(name) {
			// Not now (the cache not synced, the request gone): the next
			// read tries again, and this one selects by label.
			return false
		}
	}
	s.idx.state.Store(indexedYes)
	return true
}

// listBy lists a namespace's cached Leases whose index has value, read
// only (the cache's own objects); ok is false when the cache has no
// indexes, and the caller selects by label instead.
func (s *Store) listBy(ctx context.Context, namespace, index, value string) (items []coordv1.Lease, ok bool, err error) {
	if !s.indexed(ctx, namespace) {
		return nil, false, nil
	}
	l := &coordv1.LeaseList{}
	if err := s.Cache.List(ctx, l, client.InNamespace(namespace), client.UnsafeDisableDeepCopy, client.MatchingFields{index: value}); err != nil {
		return nil, true, err
	}
	return l.Items, true, nil
}
