// Package lease hands out proxies to crawlers through coordination.k8s.io
// Lease objects: one object per (proxy, slot index < maxLeases), so at most
// maxLeases crawlers hold a proxy at once, across every discovery replica.
// The API server is the only record: a slot is taken by creating its object
// (AlreadyExists means taken) or by updating an expired one guarded by its
// resourceVersion, and a replica can die at any moment without losing or
// double-granting anything.
package lease

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// Labels and annotations on lease objects.
const (
	LabelHolder      = fleetv1alpha1.Group + "/holder"
	LabelSticky      = fleetv1alpha1.Group + "/sticky"
	LabelBanDomain   = fleetv1alpha1.Group + "/ban-domain"
	AnnotationHolder = fleetv1alpha1.Group + "/holder"
	// AnnotationIdentity records who was granted a lease (the caller's
	// authenticated user name): only they may renew, release or report
	// through it.
	AnnotationIdentity = fleetv1alpha1.Group + "/identity"
	AnnotationDomain   = fleetv1alpha1.Group + "/domain"
	// AnnotationReplicas lists, comma-separated, the egress-discovery
	// replicas that use a lease together (a gateway session whose
	// connections reach several): the one that granted it (Granter) and
	// each that took it up. Each takes itself off when its use ends, and
	// the last one deletes the lease; one killed meanwhile leaves it to
	// lapse at its expiry.
	AnnotationReplicas = fleetv1alpha1.Group + "/gateway-replicas"
)

// Errors the API maps to status codes.
var (
	// ErrUnavailable means every candidate slot is taken.
	ErrUnavailable = errors.New("no proxy slot available")
	// ErrNotFound means the lease does not exist or is no longer the caller's.
	ErrNotFound = errors.New("lease not found")
	// ErrInvalidTTL means a TTL a Lease object cannot carry: under a second,
	// or more seconds than its int32 duration holds.
	ErrInvalidTTL = errors.New("lease TTL must be between 1s and 68 years")
	// ErrNotYours says a lease was granted to another identity.
	ErrNotYours = errors.New("the lease was granted to another identity: only its holder may renew, release or report through it")
)

// Candidate is a proxy that may be leased.
type Candidate struct {
	Namespace, Fleet, Proxy string
	MaxLeases               int
	// Sticky marks the sticky key's last proxy: the slots the cache shows
	// held are tried with its free ones, before other candidates'.
	Sticky bool
}

// Grant is a lease held by a crawler.
type Grant struct {
	ID        string
	Namespace string
	Fleet     string
	Proxy     string
	Slot      int
	Holder    string
	ExpiresAt time.Time
	// TTL is how long the lease runs from its grant or last renewal.
	TTL time.Duration
}

// Store keeps leases and bans in the API server.
type Store struct {
	// Client writes to the API server (its reads may be a manager's
	// cache).
	Client client.Client
	// Reader reads what must be current from the API server itself; nil
	// means Client.
	Reader client.Reader
	// Cache is a possibly stale view used only to choose which slots to try
	// first; nil means Client.
	Cache client.Reader
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Serving, when set, says whether a proxy may still be handed out, as
	// this replica's cache shows it now: each take asks it once the take
	// counts as in flight (Leased lists the proxy from then on), and gives
	// up on a proxy it refuses. A proxy that began to drain after the
	// candidates were chosen gets no lease that a summary listing it as
	// draining could miss. It is also asked whether the proxy is still the
	// fleet's and slot still below its maxLeases as the cache shows them
	// now: the candidates may have been ranked on older figures (a lowered
	// maxLeasesPerProxy), and a slot beyond the new maximum is one holder
	// too many.
	Serving func(ctx context.Context, namespace, fleet, proxy string, slot int) bool
	// OwnerOf, when set, names the object that owns a proxy's leases and
	// bans, so that they are garbage-collected with it: they never outlive
	// the proxy, even where nobody is left to sweep them. nil, or a nil
	// answer, makes them unowned.
	OwnerOf func(ctx context.Context, namespace, proxy string) *metav1.OwnerReference

	// inflight holds the slots this replica is trying to take right now, so
	// that its concurrent callers spread over different slots instead of
	// racing for one; recent holds slots it just granted or found taken,
	// which its cache may not show yet. Both only order attempts, like the
	// cache: the API server decides every grant.
	inflight sync.Map // namespace/name
	recent   sync.Map // namespace/name -> time.Time (taken until)
	// freed holds slots this replica released lately, which its cache may
	// still show held: tried as free.
	freed sync.Map // namespace/name -> time.Time (free until)
	// stuck remembers, for a while, the proxy each sticky key was last
	// granted here: a key's next acquisition may come before the cache
	// shows the last grant.
	stuck sync.Map // namespace/fleet/hash -> stuckEntry
	// written are the slots this replica wrote lately, and taking the
	// proxies it is taking a slot of now, for its summaries.
	written ownWrites
	taking  takes
	// granted remembers the grants this replica made, by ID, with their
	// identity, so that their holder's release or renewal costs no read;
	// others are read from the cache or the API server. An identity never
	// changes on a grant (a new grant is a new object, and ID).
	granted     sync.Map // ID -> grantedEntry
	grantsSince atomic.Int64
	// observed records, per slot object, the renewal last seen and when
	// this replica first saw it, on its own monotonic clock: a slot is
	// taken over only once its renewal has stood unchanged for its TTL
	// plus ExpiryMargin, as client-go's leader election judges a leader.
	// No replica compares another's clock with its own.
	observed sync.Map // namespace/name -> observation
	// idx says whether Cache has the Lease indexes (index.go).
	idx indexes

	// margin replaces ExpiryMargin when set; only tests set it, to make
	// takeovers quick.
	margin time.Duration
	// unguarded, which only a test sets, makes a broken store: it takes
	// expired slots over without the UID and resourceVersion
	// preconditions, after waiting unguarded, so that the fault tests can
	// show their checker catches the double grants that follow.
	unguarded    bool
	unguardedGap time.Duration
}

// observation is a slot's renewal as this replica saw it.
type observation struct {
	uid   types.UID
	renew time.Time
	ttl   int32
	// seen is when this replica first saw the renewal, by its clock,
	// whose monotonic reading Sub uses: a wall clock set forward or back
	// moves it not at all.
	seen time.Time
}

// ExpiryMargin is how long past its TTL a replica waits, from the moment
// it first saw a slot's last renewal, before it takes the slot over: room
// for the grant's answer to reach the crawler, and for the crawler's own
// clock, which its TTL is measured on, to start later.
const ExpiryMargin = 5 * time.Second

func (s *Store) expiryMargin() time.Duration {
	if s.margin > 0 {
		return s.margin
	}
	return ExpiryMargin
}

// expired judges a slot over from this replica's own observation: not
// held, or its renewal unchanged for its TTL plus ExpiryMargin since this
// replica first saw it. A replica that has just started, or has not seen a
// slot before, waits the whole TTL: it never takes a slot over early,
// whatever the clocks of the replica that renewed it and its own say.
func (s *Store) expired(l *coordv1.Lease) bool { return s.stale(l, 0) }

// stale is expired, extra longer.
func (s *Store) stale(l *coordv1.Lease, extra time.Duration) bool {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return true
	}
	now := s.now()
	key := l.Namespace + "/" + l.Name
	cur := observation{uid: l.UID, renew: l.Spec.RenewTime.Time, ttl: *l.Spec.LeaseDurationSeconds, seen: now}
	if v, ok := s.observed.Load(key); ok {
		o := v.(observation) //nolint:forcetypeassert // Only observations are stored.
		if o.uid == cur.uid && o.renew.Equal(cur.renew) && o.ttl == cur.ttl {
			return now.Sub(o.seen) >= time.Duration(o.ttl)*time.Second+s.expiryMargin()+extra
		}
	}
	s.observed.Store(key, cur)
	return false
}

// wrote records a slot this replica just wrote (granted or renewed): its
// renewal is seen now.
func (s *Store) wrote(l *coordv1.Lease) {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return
	}
	s.written.note(l, s.now())
	s.observed.Store(l.Namespace+"/"+l.Name, observation{uid: l.UID, renew: l.Spec.RenewTime.Time, ttl: *l.Spec.LeaseDurationSeconds, seen: s.now()})
}

// forget drops the observations of slots that no longer exist.
func (s *Store) forget(exist map[string]bool) {
	s.observed.Range(func(k, _ any) bool {
		if !exist[k.(string)] { //nolint:forcetypeassert // Only strings are keys.
			s.observed.Delete(k)
		}
		return true
	})
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

type grantedEntry struct {
	identity string
	until    time.Time
	// stuck is the sticky memory's key the grant made, if any: its
	// release forgets it.
	stuck string
}

// grantRemembered is how long a grant's identity is remembered: long
// enough for a crawler that releases at once; later ones are read.
const grantRemembered = time.Minute

// remember notes a grant; every 1024 grants, those remembered past
// grantRemembered (or their expiry) are forgotten, so the map holds at most
// a minute of grants.
func (s *Store) remember(g *Grant, identity, stuck string) {
	s.granted.Store(g.ID, grantedEntry{identity: identity, until: minTime(g.ExpiresAt, s.now().Add(grantRemembered)), stuck: stuck})
	if s.grantsSince.Add(1)%1024 != 0 {
		return
	}
	now := s.now()
	s.granted.Range(func(k, v any) bool {
		if now.After(v.(grantedEntry).until) { //nolint:forcetypeassert // Only entries are stored.
			s.granted.Delete(k)
		}
		return true
	})
	s.freed.Range(func(k, v any) bool {
		if now.After(v.(time.Time)) { //nolint:forcetypeassert // Only times are stored.
			s.freed.Delete(k)
		}
		return true
	})
	s.stuck.Range(func(k, v any) bool {
		if now.After(v.(stuckEntry).until) { //nolint:forcetypeassert // Only entries are stored.
			s.stuck.Delete(k)
		}
		return true
	})
}

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
	s.stuck.Store(k, stuckEntry{proxy: c.Proxy, lease: l.Name, uid: l.UID, until: s.now().Add(stuckFor)})
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
	if !ok || s.now().After(e.(stuckEntry).until) || v.shows(e.(stuckEntry).lease, e.(stuckEntry).uid) { //nolint:forcetypeassert // Only entries are stored.
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

// recentlyTaken is how long a slot this replica saw taken is tried last.
const recentlyTaken = time.Second

func (s *Store) noteTaken(key string) {
	s.freed.Delete(key)
	s.recent.Store(key, s.now().Add(recentlyTaken))
}

// freedLately says whether this replica released the slot within
// recentlyTaken.
func (s *Store) freedLately(key string) bool {
	v, ok := s.freed.Load(key)
	if !ok {
		return false
	}
	if s.now().After(v.(time.Time)) { //nolint:forcetypeassert // Only times are stored.
		s.freed.Delete(key)
		return false
	}
	return true
}

func (s *Store) seenTaken(key string) bool {
	v, ok := s.recent.Load(key)
	if !ok {
		return false
	}
	if s.now().After(v.(time.Time)) {
		s.recent.Delete(key)
		return false
	}
	return true
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Store) reader() client.Reader {
	if s.Reader != nil {
		return s.Reader
	}
	return s.Client
}

func (s *Store) cache() client.Reader {
	if s.Cache != nil {
		return s.Cache
	}
	return s.Client
}

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

// HoldSkew is how much longer than its TTL Holds counts a lease as held:
// the clocks of the discovery replica that renewed it and of the reader may
// disagree by this much.
const HoldSkew = 30 * time.Second

// Holds reports whether a seat lease may still hold its proxy at now: it has
// a holder, and renewTime + leaseDurationSeconds + HoldSkew has not passed.
// It errs on the side of "held", so that a proxy a crawler may still be
// using is not rotated away under it, but within bounds a lease written by
// anyone but egress-discovery could exceed: a duration counts for at most
// maxTTL, the fleet's longest, and a renewTime further ahead of now than
// HoldSkew, which no replica writes, holds nothing.
func Holds(l *coordv1.Lease, now time.Time, maxTTL time.Duration) bool {
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return false
	}
	renew := l.Spec.RenewTime.Time
	if renew.After(now.Add(HoldSkew)) {
		return false
	}
	ttl := min(time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second, maxTTL)
	return now.Before(renew.Add(ttl).Add(HoldSkew))
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
		return "", "", "", errors.Errorf("leaseID %q is not <namespace>/<name>/<token>", id)
	}
	return parts[0], parts[1], parts[2], nil
}

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
			return nil, errors.Wrap(err, "cannot list leases")
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
		return items, errors.Wrap(err, "cannot list leases")
	}
	l := &coordv1.LeaseList{}
	if err := s.cache().List(ctx, l, client.InNamespace(namespace), client.UnsafeDisableDeepCopy,
		client.MatchingLabels{fleetv1alpha1.LabelFleet: ownership.LabelValue(fleet), fleetv1alpha1.LabelLeaseKind: kind}); err != nil {
		return nil, errors.Wrap(err, "cannot list leases")
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

// Held returns the IDs of the live leases of a fleet granted to identity,
// from the cache.
func (s *Store) Held(ctx context.Context, namespace, fleet, identity string) (map[string]bool, error) {
	items, ok, err := s.listBy(ctx, namespace, indexIdentity, fleet+"/"+identity)
	if err != nil {
		return nil, errors.Wrap(err, "cannot list leases")
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
	now := s.now()
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
		return nil, errors.Wrap(err, "cannot create lease")
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
		return nil, errors.Wrap(err, "cannot get lease")
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
		return nil, errors.Wrap(err, "cannot replace expired lease")
	}
	obj = want.DeepCopy()
	if err := s.Client.Create(ctx, obj); err != nil {
		if kerrors.IsAlreadyExists(err) {
			return nil, nil
		}
		return nil, errors.Wrap(err, "cannot create lease")
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
		Holder: *l.Spec.HolderIdentity, ExpiresAt: ExpiresAt(l), TTL: leaseTTL(l),
	}
}

// leaseTTL is a lease's duration.
func leaseTTL(l *coordv1.Lease) time.Duration {
	if l.Spec.LeaseDurationSeconds == nil {
		return 0
	}
	return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
}

// Get returns a live lease by ID, checking that it is still the caller's:
// the same grant (UID), and granted to identity (leases granted before
// identities were recorded are anybody's who knows their ID).
func (s *Store) Get(ctx context.Context, id, identity string) (*coordv1.Lease, error) {
	ns, name, tok, err := ParseID(id)
	if err != nil {
		return nil, err
	}
	l := &coordv1.Lease{}
	if err := s.reader().Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, l); err != nil {
		if kerrors.IsNotFound(err) {
			return nil, ErrNotFound
		}
		return nil, errors.Wrap(err, "cannot get lease")
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
	if v, ok := s.granted.Load(id); ok && !s.now().After(v.(grantedEntry).until) { //nolint:forcetypeassert // Only entries are stored.
		if e := v.(grantedEntry); e.identity != "" && e.identity != identity { //nolint:forcetypeassert // Only entries are stored.
			return ErrNotYours
		}
		return nil
	}
	l := &coordv1.Lease{}
	key := types.NamespacedName{Namespace: ns, Name: name}
	if err := s.cache().Get(ctx, key, l); err != nil || string(l.UID) != tok {
		if err := s.reader().Get(ctx, key, l); err != nil {
			if kerrors.IsNotFound(err) {
				return ErrNotFound
			}
			return errors.Wrap(err, "cannot get lease")
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

// validTTL says whether a Lease object can carry ttl as its duration.
func validTTL(ttl time.Duration) bool {
	return ttl >= time.Second && ttl/time.Second <= math.MaxInt32
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

// Granter stands in AnnotationReplicas for the replica that granted the
// lease, which did not name itself; no host name has parentheses.
const Granter = "(granter)"

// replicasPath is AnnotationReplicas in a JSON patch.
var replicasPath = "/metadata/annotations/" + strings.ReplaceAll(AnnotationReplicas, "/", "~1")

// sharers reads AnnotationReplicas; nil when the lease was never shared.
func sharers(l *coordv1.Lease) []string {
	v, ok := l.Annotations[AnnotationReplicas]
	if !ok {
		return nil
	}
	out := []string{}
	for _, r := range strings.Split(v, ",") {
		if r != "" && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// Share renews a lease as Renew does and adds replica to the replicas
// that use it (the granter too, the first time), in one call guarded by
// the resourceVersion it read: a second replica takes up a lease another
// granted.
func (s *Store) Share(ctx context.Context, id, identity string, ttl time.Duration, replica string) (*Grant, error) {
	for range 5 {
		l, err := s.Get(ctx, id, identity)
		if err != nil {
			return nil, err
		}
		users := sharers(l)
		if users == nil {
			users = []string{Granter}
		}
		if !slices.Contains(users, replica) {
			users = append(users, replica)
		}
		g, err := s.renew(ctx, id, identity, ttl, patchOp{opTest, "/metadata/resourceVersion", l.ResourceVersion},
			patchOp{"add", replicasPath, strings.Join(users, ",")})
		if !errors.Is(err, ErrNotFound) {
			return g, err
		}
		// Gone, or changed since it was read: read it again.
	}
	return nil, ErrNotFound
}

// Leave ends replica's use of a lease (the granter's when granter): it
// takes the replica off the lease's replicas, and deletes the lease when
// none is left or it was never shared. It reports whether it deleted it.
// Each write is guarded by the resourceVersion it read, and retried on a
// conflict; a lease still changing after that is left to lapse.
func (s *Store) Leave(ctx context.Context, id, identity, replica string, granter bool) (bool, error) {
	if granter {
		replica = Granter
	}
	for range 5 {
		l, err := s.Get(ctx, id, identity)
		if err != nil {
			return false, err
		}
		users := sharers(l)
		if users == nil && !granter {
			// Never shared: not this replica's to delete.
			return false, nil
		}
		left := slices.DeleteFunc(slices.Clone(users), func(r string) bool { return r == replica })
		rv := l.ResourceVersion
		if len(left) == 0 {
			err = s.Client.Delete(ctx, &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: l.Namespace, Name: l.Name}}, client.Preconditions{UID: &l.UID, ResourceVersion: &rv})
			if err == nil {
				s.released(l.Namespace, l.Name, id)
				return true, nil
			}
		} else {
			if len(left) == len(users) {
				return false, nil
			}
			patch, _ := json.Marshal([]patchOp{{opTest, "/metadata/uid", string(l.UID)}, {opTest, "/metadata/resourceVersion", rv},
				{opReplace, replicasPath, strings.Join(left, ",")}})
			err = s.Client.Patch(ctx, &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: l.Namespace, Name: l.Name}}, client.RawPatch(types.JSONPatchType, patch))
			if err == nil {
				return false, nil
			}
		}
		switch {
		case kerrors.IsNotFound(err):
			return false, ErrNotFound
		case kerrors.IsConflict(err) || kerrors.IsInvalid(err):
			// Renewed or shared since it was read: read it again.
		default:
			return false, errors.Wrap(err, "cannot release lease")
		}
	}
	return false, nil
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
	if err := s.cache().Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, cur); err == nil && string(cur.UID) == uid && s.expired(cur) {
		return nil, ErrNotFound
	}
	patch, _ := json.Marshal(append([]patchOp{
		{opTest, "/metadata/uid", uid},
		{opTest, "/metadata/labels/" + strings.ReplaceAll(fleetv1alpha1.LabelLeaseKind, "/", "~1"), fleetv1alpha1.LeaseKindSlot},
		{opReplace, "/spec/renewTime", metav1.MicroTime{Time: s.now()}},
		{opReplace, "/spec/leaseDurationSeconds", int32(ttl / time.Second)},
	}, extra...))
	l := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := s.Client.Patch(ctx, l, client.RawPatch(types.JSONPatchType, patch)); err != nil {
		if kerrors.IsNotFound(err) || kerrors.IsInvalid(err) || kerrors.IsConflict(err) || kerrors.IsBadRequest(err) {
			return nil, ErrNotFound
		}
		return nil, errors.Wrap(err, "cannot renew lease")
	}
	s.wrote(l)
	return s.toGrant(l, id), nil
}

func (s *Store) toGrant(l *coordv1.Lease, id string) *Grant {
	slot, _ := strconv.Atoi(l.Name[strings.LastIndex(l.Name, "-")+1:])
	return &Grant{ID: id, Namespace: l.Namespace, Fleet: fleetv1alpha1.FleetName(l), Proxy: fleetv1alpha1.ProxyName(l),
		Slot: slot, Holder: ptr.Deref(l.Spec.HolderIdentity, ""), ExpiresAt: ExpiresAt(l), TTL: leaseTTL(l)}
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
	return errors.Wrap(err, "cannot release lease")
}

// released forgets what this replica remembers of a grant it deleted.
func (s *Store) released(namespace, name, id string) {
	if v, ok := s.granted.Load(id); ok && v.(grantedEntry).stuck != "" { //nolint:forcetypeassert // Only entries are stored.
		if _, _, uid, err := ParseID(id); err == nil {
			s.unstick(v.(grantedEntry).stuck, types.UID(uid)) //nolint:forcetypeassert // Only entries are stored.
		}
	}
	s.recent.Delete(namespace + "/" + name)
	s.freed.Store(namespace+"/"+name, s.now().Add(recentlyTaken))
	s.written.drop(namespace + "/" + name)
	s.granted.Delete(id)
}

// HeldBy returns the live slot lease of a fleet that holder holds for
// identity (of several, the one granted last: a session that moved keeps
// its old lease while tunnels on it run), read from the API server: a
// lease another replica granted a moment ago is in no cache yet.
func (s *Store) HeldBy(ctx context.Context, namespace, fleet, holder, identity string) (*Grant, error) {
	l := &coordv1.LeaseList{}
	if err := s.reader().List(ctx, l, client.InNamespace(namespace), client.MatchingLabels{fleetv1alpha1.LabelFleet: ownership.LabelValue(fleet),
		fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindSlot, LabelHolder: ownership.LabelValue(holder)}); err != nil {
		return nil, errors.Wrap(err, "cannot list leases")
	}
	var best *coordv1.Lease
	for i := range l.Items {
		le := &l.Items[i]
		// Expired by this replica's observation or by the clock: a lease
		// others count as lapsed is not brought back.
		if s.expired(le) || Expired(le, s.now()) || fleetv1alpha1.FleetName(le) != fleet ||
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

// Sticky returns the proxy a sticky key last held in a fleet, if any.
func (s *Store) Sticky(ctx context.Context, namespace, fleet, key string) (string, error) {
	h := StickyHash(key)
	if h == "" {
		return "", nil
	}
	items, ok, err := s.listBy(ctx, namespace, indexSticky, fleet+"/"+h)
	if err != nil {
		return "", errors.Wrap(err, "cannot list leases")
	}
	if !ok {
		l := &coordv1.LeaseList{}
		if err := s.cache().List(ctx, l, client.InNamespace(namespace), client.UnsafeDisableDeepCopy, client.MatchingLabels{fleetv1alpha1.LabelFleet: ownership.LabelValue(fleet), LabelSticky: h}); err != nil {
			return "", errors.Wrap(err, "cannot list leases")
		}
		items = l.Items
	}
	return s.stickyOf(items, namespace, fleet, key), nil
}

// BanName is the name of a (proxy, domain) ban object.
func BanName(proxy, domain string) string {
	sum := sha256.Sum256([]byte(strings.ToLower(domain)))
	return fmt.Sprintf("%s-ban-%s", proxy, hex.EncodeToString(sum[:])[:12])
}

// Ban records that a proxy is banned for a domain until cooldown passes. It
// is a Lease object too, so every replica honours it.
func (s *Store) Ban(ctx context.Context, namespace, fleet, proxy, domain string, cooldown time.Duration, identity string) error {
	if !validTTL(cooldown) {
		return ErrInvalidTTL
	}
	domain = strings.ToLower(domain)
	now := s.now()
	want := &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: BanName(proxy, domain), Namespace: namespace,
			Labels: map[string]string{
				fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindBan,
				LabelBanDomain:               ownership.LabelValue(domain),
			},
			Annotations: map[string]string{AnnotationDomain: domain},
		},
		Spec: coordv1.LeaseSpec{
			HolderIdentity: ptr.To("ban:" + domain), LeaseDurationSeconds: ptr.To(int32(cooldown / time.Second)),
			AcquireTime: &metav1.MicroTime{Time: now}, RenewTime: &metav1.MicroTime{Time: now},
		},
	}
	if identity != "" {
		want.Annotations[AnnotationIdentity] = identity
	}
	names(&want.ObjectMeta, fleet, proxy)
	s.own(ctx, &want.ObjectMeta, proxy)
	err := s.Client.Create(ctx, want)
	if !kerrors.IsAlreadyExists(err) {
		return errors.Wrap(err, "cannot record ban")
	}
	cur := &coordv1.Lease{}
	if err := s.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: want.Name}, cur); err != nil {
		return errors.Wrap(err, "cannot get ban")
	}
	if Expired(cur, now) {
		// A lapsed ban not swept yet: the new one is the new reporter's.
		cur.Labels, cur.Annotations = want.Labels, want.Annotations
	}
	cur.Spec = want.Spec
	return errors.Wrap(s.Client.Update(ctx, cur), "cannot extend ban")
}

// Unban lifts a proxy's ban for a domain (an "ok" report).
func (s *Store) Unban(ctx context.Context, namespace, proxy, domain string) error {
	err := s.Client.Delete(ctx, &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: BanName(proxy, strings.ToLower(domain))}})
	return errors.Wrap(client.IgnoreNotFound(err), "cannot lift ban")
}

// Ban is one live ban, and who reported it.
type Ban struct{ Proxy, Domain, Identity string }

// ActiveBans lists a fleet's live bans, from the cache.
func (s *Store) ActiveBans(ctx context.Context, namespace, fleet string) ([]Ban, error) {
	items, err := s.fleetLeases(ctx, namespace, fleet, fleetv1alpha1.LeaseKindBan)
	if err != nil {
		return nil, errors.Wrap(err, "cannot list bans")
	}
	var out []Ban
	now := s.now()
	for i := range items {
		if b := &items[i]; !Expired(b, now) && fleetv1alpha1.FleetName(b) == fleet {
			out = append(out, Ban{Proxy: fleetv1alpha1.ProxyName(b), Domain: b.Annotations[AnnotationDomain], Identity: b.Annotations[AnnotationIdentity]})
		}
	}
	return out, nil
}

// Bans lists a fleet's live bans: proxy name to banned domains.
func (s *Store) Bans(ctx context.Context, namespace, fleet string) (map[string][]string, error) {
	items, err := s.fleetLeases(ctx, namespace, fleet, fleetv1alpha1.LeaseKindBan)
	if err != nil {
		return nil, errors.Wrap(err, "cannot list bans")
	}
	out := map[string][]string{}
	now := s.now()
	for i := range items {
		if b := &items[i]; !Expired(b, now) && fleetv1alpha1.FleetName(b) == fleet {
			out[fleetv1alpha1.ProxyName(b)] = append(out[fleetv1alpha1.ProxyName(b)], b.Annotations[AnnotationDomain])
		}
	}
	return out, nil
}

// BannedFor returns the proxies of a fleet with a live ban for domain,
// from the cache: what an acquisition for the domain skips.
func (s *Store) BannedFor(ctx context.Context, namespace, fleet, domain string) (map[string]bool, error) {
	domain = strings.ToLower(domain)
	items, ok, err := s.listBy(ctx, namespace, indexBanDomain, fleet+"/"+domain)
	if err != nil {
		return nil, errors.Wrap(err, "cannot list bans")
	}
	if !ok {
		if items, err = s.fleetLeases(ctx, namespace, fleet, fleetv1alpha1.LeaseKindBan); err != nil {
			return nil, errors.Wrap(err, "cannot list bans")
		}
	}
	out := map[string]bool{}
	now := s.now()
	for i := range items {
		if b := &items[i]; !Expired(b, now) && fleetv1alpha1.FleetName(b) == fleet && strings.EqualFold(b.Annotations[AnnotationDomain], domain) {
			out[fleetv1alpha1.ProxyName(b)] = true
		}
	}
	return out, nil
}

// Sweep deletes expired slots and bans, and the leases of proxies that no
// longer exist. Each delete is guarded by the resourceVersion it saw, so a
// lease renewed or taken over meanwhile survives. Any replica may sweep.
func (s *Store) Sweep(ctx context.Context, proxyExists func(namespace, name string) bool, grace time.Duration) (int, error) {
	l := &coordv1.LeaseList{}
	if err := s.Client.List(ctx, l, client.HasLabels{fleetv1alpha1.LabelLeaseKind}); err != nil {
		return 0, errors.Wrap(err, "cannot list leases")
	}
	now := s.now()
	n := 0
	var firstErr error
	slots := map[string]bool{}
	// Every lease was listed: the observations of the others are of
	// slots that are gone.
	defer func() { s.forget(slots) }()
	for i := range l.Items {
		le := &l.Items[i]
		kind := le.Labels[fleetv1alpha1.LabelLeaseKind]
		gone := kind != fleetv1alpha1.LeaseKindDemand && !proxyExists(le.Namespace, fleetv1alpha1.ProxyName(le))
		over := Expired(le, now.Add(-grace))
		switch kind {
		case fleetv1alpha1.LeaseKindDemand:
			// Of no proxy: its replica rewrites it, and deletes it with
			// its fleet; one a dead replica left goes once long stale
			// (by the clock: a fast one deletes a live replica's, which
			// writes it again).
			over = Expired(le, now.Add(-DemandSweepAfter))
		case fleetv1alpha1.LeaseKindSlot:
			// A slot is over by this replica's observation, never by its
			// clock.
			slots[le.Namespace+"/"+le.Name] = true
			over = s.stale(le, grace)
		}
		if !gone && !over {
			continue
		}
		err := s.Client.Delete(ctx, le, client.Preconditions{UID: &le.UID, ResourceVersion: &le.ResourceVersion})
		switch {
		case err == nil:
			n++
		case kerrors.IsConflict(err), kerrors.IsNotFound(err):
		case firstErr == nil:
			// On to the others: one lease that cannot be deleted (a
			// namespace's policy, say) must not keep the rest, nor
			// stop the pass that keeps observations.
			firstErr = errors.Wrapf(err, "cannot sweep lease %s/%s", le.Namespace, le.Name)
		}
	}
	return n, firstErr
}
