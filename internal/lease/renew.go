package lease

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// A grant's life after acquisition: reads, renewal and release, each
// guarded by the grant's UID and identity.

// Get returns a live lease by ID, checking that it is still the caller's:
// the same grant (UID), and granted to identity (leases granted before
// identities were recorded are anybody's who knows their ID).
func (s *Store) Get(ctx context.Context, id, identity string) (*coordv1.Lease, error) {
	ns, name, tok, err := ParseID(id)
	if err != nil {
		return nil, err
	}
	l := &coordv1.Lease{}
	if err := s.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, l); err != nil {
		if kerrors.IsNotFound(err) {
			return nil, ErrNotFound
		}
		return nil, errors.Wrap(err, errGetLease)
	}
	if string(l.UID) != tok || l.Labels[fleetv1alpha1.LabelLeaseKind] != fleetv1alpha1.LeaseKindSlot || s.expired(l) {
		return nil, ErrNotFound
	}
	if !grantedTo(l, identity) {
		return nil, ErrNotYours
	}
	return l, nil
}

// grantedTo says whether a lease was granted to identity.
func grantedTo(l *coordv1.Lease, identity string) bool {
	got, ok := l.Annotations[AnnotationIdentity]
	return !ok || got == identity
}

// owned checks, from the cache when it holds the grant (an identity never
// changes on a grant) and else from the API server, that the lease id
// names was granted to identity.
func (s *Store) owned(ctx context.Context, id, identity string) error {
	ns, name, tok, err := ParseID(id)
	if err != nil {
		return err
	}
	if v, ok := s.granted.Load(id); ok && !s.Now().After(v.(grantedEntry).until) { //nolint:forcetypeassert // Only entries are stored.
		if e := v.(grantedEntry); e.identity != "" && e.identity != identity { //nolint:forcetypeassert // Only entries are stored.
			return ErrNotYours
		}
		return nil
	}
	l := &coordv1.Lease{}
	key := types.NamespacedName{Namespace: ns, Name: name}
	if err := s.Cache.Get(ctx, key, l); err != nil || string(l.UID) != tok {
		if err := s.Reader.Get(ctx, key, l); err != nil {
			if kerrors.IsNotFound(err) {
				return ErrNotFound
			}
			return errors.Wrap(err, errGetLease)
		}
	}
	if string(l.UID) != tok {
		return ErrNotFound
	}
	if !grantedTo(l, identity) {
		return ErrNotYours
	}
	return nil
}

// JSON patch operations.
const (
	opTest    = "test"
	opReplace = "replace"
)

// patchOp is one operation of a JSON patch (RFC 6902).
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// Renew extends a lease by ttl from now, in one guarded call: a JSON patch
// whose first operation tests the lease's UID, so a slot released or
// replaced meanwhile is never extended.
func (s *Store) Renew(ctx context.Context, id, identity string, ttl time.Duration) (*Grant, error) {
	return s.renew(ctx, id, identity, ttl)
}

func (s *Store) renew(ctx context.Context, id, identity string, ttl time.Duration, extra ...patchOp) (*Grant, error) {
	if !validTTL(ttl) {
		return nil, ErrInvalidTTL
	}
	ns, name, uid, err := ParseID(id)
	if err != nil {
		return nil, err
	}
	if err := s.owned(ctx, id, identity); err != nil {
		return nil, err
	}
	// A lease this replica has seen expire is over, even if nobody has
	// taken its slot yet: renewing it would let its holder keep a lease it
	// no longer counts (against a quota, say) once it lapsed.
	cur := &coordv1.Lease{}
	if err := s.Cache.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, cur); err == nil && string(cur.UID) == uid && s.expired(cur) {
		return nil, ErrNotFound
	}
	patch, _ := json.Marshal(append([]patchOp{
		{opTest, "/metadata/uid", uid},
		{opTest, "/metadata/labels/" + strings.ReplaceAll(fleetv1alpha1.LabelLeaseKind, "/", "~1"), fleetv1alpha1.LeaseKindSlot},
		{opReplace, "/spec/renewTime", metav1.MicroTime{Time: s.Now()}},
		{opReplace, "/spec/leaseDurationSeconds", int32(ttl / time.Second)},
	}, extra...))
	l := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := s.Client.Patch(ctx, l, client.RawPatch(types.JSONPatchType, patch)); err != nil {
		if kerrors.IsNotFound(err) || kerrors.IsInvalid(err) || kerrors.IsConflict(err) || kerrors.IsBadRequest(err) {
			return nil, ErrNotFound
		}
		return nil, errors.Wrap(err, errRenewLease)
	}
	s.wrote(l)
	return s.toGrant(l, id), nil
}

func (s *Store) toGrant(l *coordv1.Lease, id string) *Grant {
	slot, _ := strconv.Atoi(l.Name[strings.LastIndex(l.Name, "-")+1:])
	return &Grant{ID: id, Namespace: l.Namespace, Fleet: fleetv1alpha1.FleetName(l), Proxy: fleetv1alpha1.ProxyName(l),
		Slot: slot, Holder: ptr.Deref(l.Spec.HolderIdentity, ""), ExpiresAt: ExpiresAt(l), TTL: leaseTTL(l), AcquiredAt: acquired(l)}
}

// Release gives a lease back in one call: a delete guarded by the grant's
// UID, so a slot someone else holds now is never freed.
func (s *Store) Release(ctx context.Context, id, identity string) error {
	ns, name, uid, err := ParseID(id)
	if err != nil {
		return err
	}
	if err := s.owned(ctx, id, identity); err != nil {
		return err
	}
	u := types.UID(uid)
	err = s.Client.Delete(ctx, &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.Preconditions{UID: &u})
	if kerrors.IsConflict(err) || kerrors.IsNotFound(err) {
		return ErrNotFound
	}
	if err == nil {
		s.released(ns, name, id)
	}
	return errors.Wrap(err, errReleaseLease)
}

// released forgets what this replica remembers of a grant it deleted.
func (s *Store) released(namespace, name, id string) {
	if v, ok := s.granted.Load(id); ok && v.(grantedEntry).stuck != "" { //nolint:forcetypeassert // Only entries are stored.
		if _, _, uid, err := ParseID(id); err == nil {
			s.unstick(v.(grantedEntry).stuck, types.UID(uid)) //nolint:forcetypeassert // Only entries are stored.
		}
	}
	s.recent.Delete(namespace + "/" + name)
	s.freed.Store(namespace+"/"+name, s.Now().Add(recentlyTaken))
	s.written.drop(namespace + "/" + name)
	s.granted.Delete(id)
}

// HeldBy returns the live slot lease of a fleet that holder holds for
// identity (of several, the one granted last: a session that moved keeps
// its old lease while tunnels on it run), read from the API server: a
// lease another replica granted a moment ago is in no cache yet.
func (s *Store) HeldBy(ctx context.Context, namespace, fleet, holder, identity string) (*Grant, error) {
	l := &coordv1.LeaseList{}
	if err := s.Reader.List(ctx, l, client.InNamespace(namespace), client.MatchingLabels{fleetv1alpha1.LabelFleet: ownership.LabelValue(fleet),
		fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindSlot, LabelHolder: ownership.LabelValue(holder)}); err != nil {
		return nil, errors.Wrap(err, errListLeases)
	}
	var best *coordv1.Lease
	for i := range l.Items {
		le := &l.Items[i]
		// Expired by this replica's observation or by the clock: a lease
		// others count as lapsed is not brought back.
		if s.expired(le) || Expired(le, s.Now()) || fleetv1alpha1.FleetName(le) != fleet ||
			ptr.Deref(le.Spec.HolderIdentity, "") != holder || le.Annotations[AnnotationIdentity] != identity {
			continue
		}
		if best == nil || acquired(le).After(acquired(best)) {
			best = le
		}
	}
	if best == nil {
		return nil, ErrNotFound
	}
	return s.toGrant(best, leaseID(best)), nil
}
