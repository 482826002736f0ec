// Package lease hands out proxies to crawlers through coordination.k8s.io
// Lease objects: one object per (proxy, slot index < maxLeases), so at most
// maxLeases crawlers hold a proxy at once, across every discovery replica.
// The API server is the only record: a slot is taken by creating its object
// (AlreadyExists means taken) or by updating an expired one guarded by its
// resourceVersion, and a replica can die at any moment without losing or
// double-granting anything.
//
// Files by concern:
//   - store.go: the Store, its errors, labels and what a replica observes
//     of expiry;
//   - names.go: the name grammar of lease objects (slots, IDs, sticky
//     hashes) and what a Lease says of itself (expiry, holding);
//   - view.go: reads of a fleet's slot leases, the views acquisition ranks
//     by; index.go: the cache's indexes those reads use;
//   - acquire.go: taking a slot (create, or replace an expired one under a
//     UID and resourceVersion guard);
//   - renew.go: a grant's reads, renewal and release;
//   - share.go: a lease shared by the gateway replicas a session reaches;
//   - sticky.go: a sticky key's last proxy; memory.go: what a replica
//     remembers of its own writes that its cache may not show yet;
//   - bans.go: (proxy, domain) bans; ipbans.go: the ban history of each
//     egress IP of a fleet, which outlives the proxy; sweep.go: the sweep
//     of leases whose proxy is gone or that lapsed long ago;
//   - summary.go: the LeaseSummaries and demand Leases a replica writes,
//     its count of its fleet's leases and waiting crawlers, for the
//     function (their wire format is internal/leasewire's).
package lease

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
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
	// AnnotationBanAnswer marks a ban recorded from an origin's answer
	// (the gateway saw one of the fleet's spec.gateway.banStatusCodes)
	// rather than reported: its value is the answer's status code. Such
	// bans are bounded apart from reported ones.
	AnnotationBanAnswer = fleetv1alpha1.Group + "/ban-answer"
	// AnnotationBanReplica names the egress-discovery replica that
	// recorded a ban from an origin's answer: each replica bans by
	// answers within its share of a fleet.
	AnnotationBanReplica = fleetv1alpha1.Group + "/ban-replica"
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
	// AcquiredAt is when the lease was granted (its acquireTime), by the
	// granting replica's clock.
	AcquiredAt time.Time
}

// StoreConfig is what NewStore builds a Store from.
type StoreConfig struct {
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
	// FleetOwnerOf, when set, names the object that owns the fleet's
	// records that outlive its proxies (the ban history of its egress
	// IPs): the proxy's controller, its fleet or pool, so that deleting
	// the fleet deletes them.
	FleetOwnerOf func(ctx context.Context, namespace, proxy string) *metav1.OwnerReference
	// OwnerOf, when set, names the object that owns a proxy's leases and
	// bans, so that they are garbage-collected with it: they never outlive
	// the proxy, even where nobody is left to sweep them. nil, or a nil
	// answer, makes them unowned.
	OwnerOf func(ctx context.Context, namespace, proxy string) *metav1.OwnerReference
}

// Store keeps leases and bans in the API server. Build it with NewStore.
type Store struct {
	StoreConfig

	// inflight holds the slots this replica is trying to take right now, so
	// that its concurrent callers spread over different slots instead of
	// racing for one; recent holds slots it just granted or found taken,
	// which its cache may not show yet. Both only order attempts, like the
	// cache: the API server decides every grant.
	inflight sync.Map // namespace/name
	// histories remembers the ban histories parsed, by object UID and
	// resourceVersion, so that an acquisition does not parse each IP's
	// history again.
	histories parsedHistories
	recent    sync.Map // namespace/name -> time.Time (taken until)
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

// NewStore builds a Store, its zero settings taking their defaults.
func NewStore(cfg StoreConfig) *Store {
	if cfg.Reader == nil {
		cfg.Reader = cfg.Client
	}
	if cfg.Cache == nil {
		cfg.Cache = cfg.Client
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Store{StoreConfig: cfg}
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
	now := s.Now()
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
	s.written.note(l, s.Now())
	s.observed.Store(l.Namespace+"/"+l.Name, observation{uid: l.UID, renew: l.Spec.RenewTime.Time, ttl: *l.Spec.LeaseDurationSeconds, seen: s.Now()})
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

// validTTL says whether a Lease object can carry ttl as its duration.
func validTTL(ttl time.Duration) bool {
	return ttl >= time.Second && ttl/time.Second <= math.MaxInt32
}
