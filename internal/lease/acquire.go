package lease

import (
	"context"
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

// Acquisition: a free slot taken by creating its object, an expired one
// replaced under a UID and resourceVersion guard.

// Request asks for a lease.
type Request struct {
	// Identity is the caller's authenticated user name, recorded on the
	// lease.
	Identity  string
	Holder    string
	TTL       time.Duration
	StickyKey string
	// FreeOnly tries only the slots the cache shows free or expired, so
	// that a caller retrying on a full fleet costs no write per try.
	FreeOnly bool
	// SkipHeld tries, of the slots the cache shows held, only the sticky
	// candidate's: for a caller that tries a sample of a fleet first and
	// the whole fleet after.
	SkipHeld bool
}

// slotState is what the (possibly stale) cache says of a slot.
type slotState int

const (
	stateAbsent slotState = iota
	stateExpired
	stateLive
)

// Acquire takes a free slot on the first candidate that has one; callers
// order candidates by preference. It fails with ErrUnavailable when all are
// taken. The cache only orders the attempts (free slots first, then expired
// ones, live ones last); every decision is the API server's.
func (s *Store) Acquire(ctx context.Context, cands []Candidate, r Request) (*Grant, error) {
	if !validTTL(r.TTL) {
		return nil, ErrInvalidTTL
	}
	if len(cands) == 0 {
		return nil, ErrUnavailable
	}
	v, err := s.View(ctx, cands[0].Namespace, cands[0].Fleet)
	if err != nil {
		return nil, err
	}
	return s.AcquireIn(ctx, v, cands, r)
}

// AcquireIn is Acquire with the fleet's slots as view read them (just
// before, by the caller that ranked cands by it): the view only orders the
// attempts, as the cache does for Acquire.
func (s *Store) AcquireIn(ctx context.Context, v *SlotView, cands []Candidate, r Request) (*Grant, error) {
	if !validTTL(r.TTL) {
		return nil, ErrInvalidTTL
	}
	if len(cands) == 0 {
		return nil, ErrUnavailable
	}
	at := &attempt{s: s, r: r, expired: v.expired}
	// Every candidate's free and expired slots first, in the callers'
	// order (the sticky key's proxy's held ones too: a slot its holder
	// just released may not be in the cache yet). Then slots the cache
	// shows held, for a release it has not seen, at most maxHeldTries of
	// them: a full fleet costs a few writes per try, not one per slot.
	var held []slotOf
	for _, c := range cands {
		free, taken := s.slotOrder(c, v.state)
		if c.Sticky && !r.FreeOnly {
			// Within the same bound as any candidate's held slots.
			n := min(len(taken), maxHeldTries)
			free, taken = append(free, taken[:n]...), taken[n:]
		}
		for _, slot := range taken {
			held = append(held, slotOf{c, slot})
		}
		if g, err := at.run(ctx, c, free); g != nil || err != nil {
			return g, err
		}
	}
	if r.FreeOnly || r.SkipHeld {
		return nil, ErrUnavailable
	}
	for i, d := range held {
		if i == maxHeldTries {
			break
		}
		if g, err := at.run(ctx, d.c, []int{d.slot}); g != nil || err != nil {
			return g, err
		}
	}
	// Last, the slots another caller of this replica was taking.
	for _, d := range at.deferred {
		g, err := s.take(ctx, d.c, d.slot, r, v.expired[SlotName(d.c.Proxy, d.slot)])
		if unmakeable(err) {
			continue
		}
		if err != nil || g != nil {
			return g, err
		}
	}
	return nil, ErrUnavailable
}

// slotOf is one slot of a candidate.
type slotOf struct {
	c    Candidate
	slot int
}

// attempt is one acquisition's tries.
type attempt struct {
	s       *Store
	r       Request
	expired map[string]bool
	// deferred are the slots another caller of this replica was taking:
	// come back to only if nothing else is free.
	deferred []slotOf
}

// run tries slots of c in order, until one is granted.
func (a *attempt) run(ctx context.Context, c Candidate, slots []int) (*Grant, error) {
	for _, slot := range slots {
		name := SlotName(c.Proxy, slot)
		key := c.Namespace + "/" + name
		if _, busy := a.s.inflight.LoadOrStore(key, struct{}{}); busy {
			a.deferred = append(a.deferred, slotOf{c, slot})
			continue
		}
		g, err := a.s.take(ctx, c, slot, a.r, a.expired[name])
		a.s.inflight.Delete(key)
		if unmakeable(err) {
			// The API server refuses this slot's object (a name too long,
			// say): another slot may serve.
			continue
		}
		if err != nil || g != nil {
			return g, err
		}
	}
	return nil, nil
}

// maxHeldTries bounds the slots an acquisition tries that the cache shows
// held: in a full fleet of 10 000 proxies every one would be a write that
// fails.
const maxHeldTries = 16

// slotOrder orders a candidate's slots: free, then expired (free), and
// those the cache shows held or this replica took or found taken lately
// (taken). One this replica released lately counts as free, whatever the
// cache shows yet.
func (s *Store) slotOrder(c Candidate, state map[string]slotState) (free, taken []int) {
	states := make([]slotState, c.MaxLeases)
	for i := range c.MaxLeases {
		name := SlotName(c.Proxy, i)
		key := c.Namespace + "/" + name
		states[i] = state[name]
		switch {
		case s.seenTaken(key):
			// Taken lately, by this replica's word: tried last. One the
			// cache shows expired is still taken over when tried, or
			// callers hammering a full fleet would keep its expired slots
			// "taken" for ever.
			states[i] = stateLive
		case s.freedLately(key):
			states[i] = stateAbsent
		}
	}
	for _, want := range []slotState{stateAbsent, stateExpired} {
		for i := range c.MaxLeases {
			if states[i] == want {
				free = append(free, i)
			}
		}
	}
	for i := range c.MaxLeases {
		if states[i] == stateLive {
			taken = append(taken, i)
		}
	}
	return free, taken
}

// take tries one slot: create it, or replace an expired one. It returns
// nil, nil when the slot is held by someone else. Only a slot the cache saw
// expired is read back for a takeover: one the cache saw free or live that
// exists was just taken, and reading it would only cost a round trip.
// unmakeable reports whether the API server refused a slot's object as
// invalid: no retry makes it, and the acquisition tries the next slot.
func unmakeable(err error) bool {
	return err != nil && kerrors.IsInvalid(err)
}

func (s *Store) take(ctx context.Context, c Candidate, slot int, r Request, maybeExpired bool) (*Grant, error) {
	// In flight first, then the re-check: a summary either lists the
	// proxy as taken, or was made before the re-check, which then sees
	// what that summary saw (a drain) or later.
	defer s.taking.begin(c.Namespace, c.Fleet, c.Proxy)()
	if s.Serving != nil && !s.Serving(ctx, c.Namespace, c.Fleet, c.Proxy, slot) {
		return nil, nil
	}
	now := s.Now()
	want := &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: SlotName(c.Proxy, slot), Namespace: c.Namespace,
			Labels: map[string]string{
				fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindSlot,
				LabelHolder:                  ownership.LabelValue(r.Holder),
			},
			Annotations: map[string]string{AnnotationHolder: r.Holder},
		},
		Spec: coordv1.LeaseSpec{
			HolderIdentity:       ptr.To(r.Holder),
			LeaseDurationSeconds: ptr.To(int32(r.TTL / time.Second)),
			AcquireTime:          &metav1.MicroTime{Time: now},
			RenewTime:            &metav1.MicroTime{Time: now},
		},
	}
	if r.Identity != "" {
		want.Annotations[AnnotationIdentity] = r.Identity
	}
	names(&want.ObjectMeta, c.Fleet, c.Proxy)
	s.own(ctx, &want.ObjectMeta, c.Proxy)
	if h := StickyHash(r.StickyKey); h != "" {
		want.Labels[LabelSticky] = h
	}
	// Create fills in the object it is given, UID included.
	key := c.Namespace + "/" + want.Name
	obj := want.DeepCopy()
	err := s.Client.Create(ctx, obj)
	if err == nil {
		s.wrote(obj)
		s.noteTaken(key)
		g := grant(obj, c, slot)
		s.remember(g, r.Identity, s.stick(c, r.StickyKey, obj))
		return g, nil
	}
	if !kerrors.IsAlreadyExists(err) {
		return nil, errors.Wrap(err, errCreateLease)
	}
	s.noteTaken(key)
	if !maybeExpired {
		return nil, nil
	}
	cur := &coordv1.Lease{}
	if err := s.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: want.Name}, cur); err != nil {
		if kerrors.IsNotFound(err) {
			return nil, nil // swept meanwhile; another try may create it
		}
		return nil, errors.Wrap(err, errGetLease)
	}
	if !s.expired(cur) {
		return nil, nil
	}
	// Replace an expired slot: delete exactly the object we saw (UID and
	// resourceVersion), then create anew. Of replicas racing for it, one
	// deletes and one creates; the new object's UID names the new grant, so
	// the old holder can neither renew nor release it.
	guard := []client.DeleteOption{client.Preconditions{UID: &cur.UID, ResourceVersion: &cur.ResourceVersion}}
	if s.unguarded {
		time.Sleep(s.unguardedGap)
		guard = nil
	}
	if err := s.Client.Delete(ctx, cur, guard...); err != nil && !kerrors.IsNotFound(err) {
		if kerrors.IsConflict(err) {
			return nil, nil
		}
		return nil, errors.Wrap(err, errReplaceExpired)
	}
	obj = want.DeepCopy()
	if err := s.Client.Create(ctx, obj); err != nil {
		if kerrors.IsAlreadyExists(err) {
			return nil, nil
		}
		return nil, errors.Wrap(err, errCreateLease)
	}
	s.wrote(obj)
	s.noteTaken(key)
	g := grant(obj, c, slot)
	s.remember(g, r.Identity, s.stick(c, r.StickyKey, obj))
	return g, nil
}

func grant(l *coordv1.Lease, c Candidate, slot int) *Grant {
	return &Grant{
		ID: leaseID(l), Namespace: l.Namespace, Fleet: c.Fleet, Proxy: c.Proxy, Slot: slot,
		Holder: *l.Spec.HolderIdentity, ExpiresAt: ExpiresAt(l), TTL: leaseTTL(l), AcquiredAt: acquired(l),
	}
}
