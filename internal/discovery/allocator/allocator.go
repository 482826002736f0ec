// Package allocator is how egress-discovery hands out proxies, whoever
// asks: the REST API's leases and the gateway's seats go through the same
// rules. It authorises the fleet, reads its policy, bounds each caller by
// its quota (counting what its cache may not show yet), refuses while the
// fleet is below its healthy share (admission), lets an acquisition wait
// for a slot in a queue per fleet, ranks the proxies (the sticky key's
// first, then those leaving from an egress IP of their own, then the least
// loaded; a sample of a large fleet), remembers refusals as the demand an
// autoscaled fleet is sized by, records bans within their bounds, and
// paces each egress IP per domain. It knows nothing of HTTP: its refusals
// are problem.Errors, which the API and the gateway answer each in their
// own way, and it reads and writes leases only through Store.
//
// The files split by concern: allocator.go holds the Allocator and the
// Store it needs, fleets.go authorises fleets and says which proxies an
// acquisition admits, acquire.go grants, admission.go bounds and queues,
// quota.go counts callers, demand.go remembers refusals, bans.go records
// bans, pacing.go paces egress IPs, spread.go counts how the gateway's
// connections spread, and parse.go reads durations of requests.
package allocator

import (
	"context"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	coordv1 "k8s.io/api/coordination/v1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
)

// coordLease is a Lease object.
type coordLease = coordv1.Lease

// Store is what the allocator needs of the lease store (lease.Store):
// slots, sticky keys, bans and the holders' counts.
type Store interface {
	Slots(ctx context.Context, namespace, fleet string) (map[string][]*coordv1.Lease, error)
	View(ctx context.Context, namespace, fleet string) (*lease.SlotView, error)
	ViewOf(ctx context.Context, namespace, fleet string, proxies []string) (*lease.SlotView, error)
	AcquireIn(ctx context.Context, view *lease.SlotView, cands []lease.Candidate, req lease.Request) (*lease.Grant, error)
	Sticky(ctx context.Context, namespace, fleet, key string) (string, error)
	StickyIn(view *lease.SlotView, namespace, fleet, key string) string
	Held(ctx context.Context, namespace, fleet, identity string) (map[string]bool, error)
	Bans(ctx context.Context, namespace, fleet string) (map[string][]string, error)
	BannedFor(ctx context.Context, namespace, fleet, domain string) (map[string]bool, error)
	ActiveBans(ctx context.Context, namespace, fleet string) ([]lease.Ban, error)
	Ban(ctx context.Context, namespace, fleet, proxy, domain string, cooldown time.Duration, identity string) error
	BanFromAnswer(ctx context.Context, namespace, fleet, proxy, domain string, cooldown time.Duration, identity string, status int, replica string) error
	RecordIPBan(ctx context.Context, namespace, fleet, proxy, ip, domain string, cooldown time.Duration) error
	RecordAnswerIPBan(ctx context.Context, namespace, fleet, proxy, ip, domain string, cooldown time.Duration) error
	IPHistories(ctx context.Context, namespace, fleet string) (map[string][]lease.IPBan, error)
	LiftIPBan(ctx context.Context, namespace, fleet, ip, domain string) error
}

// Authorizer authorises an identity's use of a fleet (auth.Kubernetes).
type Authorizer interface {
	Authorize(ctx context.Context, id *auth.Identity, namespace, fleet string) error
}

// Config is what New builds an Allocator from.
type Config struct {
	Catalog *catalog.Catalog
	Leases  Store
	Auth    Authorizer
	Metrics *metrics.Discovery
	Log     logging.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Version, when set, changes whenever a watched Proxy or Lease does:
	// waiting acquisitions try again when it changes.
	Version func() uint64
	// MaxBansPerFleet and MaxBansPerIdentity bound the live bans crawlers
	// report in a fleet, and those of each identity in it; bans taken from
	// origins' answers have a bound of their own, a quarter of
	// MaxBansPerFleet (BanFromAnswer). Zero sets no bound. A ban over a
	// bound is refused 429.
	MaxBansPerFleet, MaxBansPerIdentity int
	// MaxWaiting and MaxWaitingPerIdentity bound the acquisitions waiting
	// for a slot on this replica, in all and of one identity; zero means
	// DefaultMaxWaiting and DefaultMaxWaitingPerIdentity. Over either, an
	// acquisition is refused at once.
	MaxWaiting, MaxWaitingPerIdentity int
	// Replicas, when set, counts the egress-discovery replicas serving a
	// fleet (discovery.Replicas: their LeaseSummaries), which share its
	// pacing: each paces at its share (PacingFor). Nil: this one alone.
	Replicas func(ctx context.Context, namespace, fleet string) (int, error)
	// Replica names this replica on the bans it records from origins'
	// answers, of which it may hold its share of a fleet (BanFromAnswer).
	Replica string
}

// Allocator grants leases and seats. Build it with New.
type Allocator struct {
	Config

	// banRecord serialises the bound check and the write of a ban, per
	// fleet (by a hash of its key: one fleet's slow writes hold up few
	// others); bansMade are the bans this replica recorded lately, by
	// fleet.
	banRecord [banLocks]chan struct{}
	banMu     sync.Mutex
	bansMade  map[string][]recentBan

	// queues are the acquisitions waiting for a slot, by fleet.
	queues waitQueues
	// quotas count the leases each identity holds or is being granted.
	quotas quotaBook
	// refused remembers the acquisitions refused lately, by fleet, for
	// the demand an autoscaled fleet is sized by.
	refused refusals
	// pace holds the pacing buckets of the fleets' egress IPs; spread
	// counts the gateway's connections by fleet and proxy.
	pace   pacer
	spread spreadBook
	// shares remembers each fleet's replica count for a second.
	sharesMu sync.Mutex
	shares   map[string]replicaCount
	// addresses remembers each fleet's egress IP histories, indexed, for
	// a second.
	addresses addressBook
}

// New builds an Allocator, its zero settings taking their defaults.
func New(cfg Config) *Allocator {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxWaiting <= 0 {
		cfg.MaxWaiting = DefaultMaxWaiting
	}
	if cfg.MaxWaitingPerIdentity <= 0 {
		cfg.MaxWaitingPerIdentity = DefaultMaxWaitingPerIdentity
	}
	s := &Allocator{Config: cfg, bansMade: map[string][]recentBan{}}
	for i := range s.banRecord {
		s.banRecord[i] = make(chan struct{}, 1)
	}
	return s
}

// Time is the allocator's clock.
func (s *Allocator) Time() time.Time { return s.Now() }
