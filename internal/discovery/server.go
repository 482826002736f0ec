// Package discovery is egress-discovery's HTTP API: crawlers list a fleet's
// healthy proxies and lease them (TTL, renew, release, at most maxLeases
// holders per proxy), report bans per domain, and read a status page. Every
// replica serves; all state is in the API server, but for the acquisitions
// waiting for a slot, which a replica keeps in memory and may lose without
// losing a grant.
//
// The service splits by concern into packages: catalog is the read model
// (fleets, proxies, policies), auth authenticates and authorises callers,
// problem is how a refusal is answered, allocator grants leases (quota,
// admission, waiting, refusals, bans, pacing) on a small interface over
// the lease store, gateway is the rotating gateway, and ttlcache the
// bounded caches they share. This package is the REST API over them and
// the background jobs that publish what the function reads.
//
// Its files: server.go routes and authenticates, compat.go keeps the names
// its callers used before the split, errors.go answers errors, decode.go
// reads requests, fleets.go, leases.go and bans.go are the handlers,
// ratelimit.go and limit.go bound callers and requests in flight,
// snapshot.go caches rendered listings, status.go and signin.go are the
// status page, summary.go and demand.go publish each replica's lease summaries
// and demand, sweeper.go deletes what expired, fleetmetrics.go exports
// per-fleet metrics, and tlsserve.go serves TLS with a reloaded key pair.
package discovery

import (
	"context"
	"crypto/rand"
	_ "embed"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/gateway"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/egressip"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
)

// maxBody bounds request bodies.
const maxBody = 16 << 10

//go:embed openapi.json
var openAPI []byte

// ReplicaName is a name for this replica in all it publishes (its demand
// and lease summaries, its share of a fleet's pacing): the host name and 8
// random characters, so that a restarted replica is another.
func ReplicaName() string {
	host, _ := os.Hostname()
	return host + "-" + rand.Text()[:8]
}

// ServerConfig is what NewServer builds a Server from.
type ServerConfig struct {
	// ASN, when set, says which autonomous system an egress IP belongs to:
	// the fleet metrics and the status page count ASNs.
	ASN     egressip.ASNLookup
	Catalog *catalog.Catalog
	Leases  *lease.Store
	Auth    auth.Authenticator
	Metrics *metrics.Discovery
	Log     logging.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Version, when set, changes whenever a watched Proxy or Lease does.
	// Listings are then answered from a snapshot rendered at the same
	// version within the same second (leases also expire with time), so a
	// crawler fleet polling a large fleet costs little; and waiting
	// acquisitions try again when it changes.
	Version func() uint64
	// Limits, when set, bound each identity's request rate: over it, a
	// request is answered 429 with Retry-After.
	Limits *auth.IdentityLimits
	// MaxBansPerFleet and MaxBansPerIdentity bound the live bans of a
	// fleet, and of the identities reporting them in it; zero sets no
	// bound. A ban over either is answered 429.
	MaxBansPerFleet, MaxBansPerIdentity int
	// MaxWaiting and MaxWaitingPerIdentity bound the acquisitions waiting
	// for a slot on this replica, in all and of one identity; zero means
	// DefaultMaxWaiting and DefaultMaxWaitingPerIdentity. Over either, an
	// acquisition is answered its refusal at once.
	MaxWaiting, MaxWaitingPerIdentity int
	// PlainHTTPCookie sends the status page's sign-in cookie without
	// Secure, for a page a browser reaches over plain HTTP: configured
	// explicitly (--status-page-plain-http), never inferred from the
	// connection, which behind a TLS-terminating ingress is plain too.
	PlainHTTPCookie bool
	// Replicas, when set, counts the replicas serving a fleet, which share
	// its pacing (Replicas, allocator.Allocator.Replicas).
	Replicas func(ctx context.Context, namespace, fleet string) (int, error)
	// Replica names this replica (allocator.Allocator.Replica).
	Replica string
}

// Server is the HTTP API. Build it with NewServer.
type Server struct {
	ServerConfig

	snapMu sync.Mutex
	snaps  map[string]snapshot

	allocator *allocator.Allocator
}

// NewServer builds a Server, its zero settings taking their defaults,
// and the allocator its API and gateway grant leases through.
func NewServer(cfg ServerConfig) *Server {
	a := allocator.New(allocator.Config{
		Catalog: cfg.Catalog, Leases: cfg.Leases, Auth: cfg.Auth, Metrics: cfg.Metrics, Log: cfg.Log, Now: cfg.Now, Version: cfg.Version,
		MaxBansPerFleet: cfg.MaxBansPerFleet, MaxBansPerIdentity: cfg.MaxBansPerIdentity,
		MaxWaiting: cfg.MaxWaiting, MaxWaitingPerIdentity: cfg.MaxWaitingPerIdentity,
		Replicas: cfg.Replicas, Replica: cfg.Replica,
	})
	// The settings both share take the allocator's defaults, written there
	// alone.
	cfg.Now, cfg.MaxWaiting, cfg.MaxWaitingPerIdentity = a.Now, a.MaxWaiting, a.MaxWaitingPerIdentity
	return &Server{ServerConfig: cfg, allocator: a}
}

// Allocator is the allocator of this server's leases: the API's and the
// gateway's grants go through it.
func (s *Server) Allocator() *allocator.Allocator { return s.allocator }

// Handler routes every endpoint.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openAPI)
	})
	mux.HandleFunc("GET /v1/fleets", s.authed(s.fleets))
	mux.HandleFunc("GET /v1/fleets/{namespace}/{name}", s.authed(s.fleet))
	mux.HandleFunc("GET /v1/fleets/{namespace}/{name}/proxies", s.authed(s.proxies))
	mux.HandleFunc("GET /v1/fleets/{namespace}/{name}/proxies.txt", s.authed(s.proxiesTxt))
	mux.HandleFunc("POST /v1/leases", s.authed(s.acquire))
	mux.HandleFunc("POST /v1/leases/{namespace}/{name}/{token}/renew", s.authed(s.renew))
	mux.HandleFunc("DELETE /v1/leases/{namespace}/{name}/{token}", s.authed(s.release))
	mux.HandleFunc("POST /v1/leases/{namespace}/{name}/{token}/report", s.authed(s.report))
	mux.HandleFunc("POST /v1/gateway/sessions/{namespace}/{name}/{key}/report", s.authed(s.reportSession))
	mux.HandleFunc("GET /{$}", s.statusPage)
	mux.HandleFunc("POST /signin", s.signIn)
	mux.HandleFunc("POST /signout", s.signOut)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		problem.WriteError(w, &problem.Error{Code: http.StatusNotFound, Reason: apiv1.ReasonNoEndpoint, Msg: fmt.Sprintf("no endpoint %s %s: see /openapi.json", r.Method, r.URL.Path)})
	})
	return mux
}

// handler serves one authenticated request; an error it returns is
// answered by fail, so that every endpoint maps errors the same way.
type handler func(w http.ResponseWriter, r *http.Request, id *auth.Identity) error

// authed authenticates every API call (401 without a valid token), bounds
// the caller's rate (429), and answers the handler's error.
func (s *Server) authed(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		r = r.WithContext(auth.WithClientAddress(r.Context(), r.RemoteAddr))
		id, err := s.Auth.Authenticate(r.Context(), r)
		if err == nil {
			err = s.limit(id)
		}
		if err == nil {
			err = h(w, r, id)
		}
		if err != nil {
			s.fail(w, err)
		}
	}
}

// Authenticator authenticates the server's callers (Auth).
func (s *Server) Authenticator() auth.Authenticator { return s.Auth }

// Store is the lease store (Leases), as the gateway uses it.
func (s *Server) Store() gateway.Leases { return s.Leases }

// IdentityLimits are the rate limits per identity (Limits) that the
// gateway's connections count against as the API's requests do; nil
// without limits.
func (s *Server) IdentityLimits() *auth.IdentityLimits { return s.Limits }
