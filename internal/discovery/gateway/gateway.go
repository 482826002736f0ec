// Package gateway is egress-discovery's rotating gateway: one HTTP (and
// SOCKS5) proxy URL for every crawler tool, which authenticates the
// crawler, chooses a proxy of its fleet for each connection (rotating
// without a session, keeping one with it), leases it through the
// allocator, and tunnels or forwards the request through that proxy's
// Squid. It calls the allocator and the lease store of its Backend, never
// the REST API.
//
// The files split by concern: gateway.go holds the Gateway and its
// upstreams, backend.go what it needs of egress-discovery, front.go the
// proxy front (authentication, the username grammar, refusals and their
// Proxy-Status), sessions.go sessions (lifetime, strict, moving, adopting
// another replica's), seats.go the replica's seats and the leases under
// every upstream (taking, renewing, giving back), rotate.go the rotation
// strategies, pacing.go pacing per egress IP and domain, bans.go the bans
// recorded from an origin's answer status, tunnel.go CONNECT tunnels and
// plain-HTTP forwarding (dialing, egress headers, idle deadlines),
// socks.go the SOCKS5 listener, and idle_linux.go how long a connection
// has been quiet, from the kernel's TCP_INFO (idle_other.go cannot tell).
package gateway

import (
	"context"
	"crypto/rand"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/reach"
)

// User is what a gateway username says; apiv1 defines the grammar.
type User = apiv1.GatewayUser

// ParseUser reads a gateway username (apiv1.ParseGatewayUser).
func ParseUser(u string) (User, error) { return apiv1.ParseGatewayUser(u) }

// The defaults of a Gateway's settings: a zero field takes its default
// here, and egress-discovery's flags show and pass these same values.
const (
	DefaultIdle                 = time.Minute
	DefaultDialTimeout          = 10 * time.Second
	DefaultTunnelIdle           = 5 * time.Minute
	DefaultMaxConns             = 4096
	DefaultMaxConnsPerNamespace = 1024
	DefaultMaxConnsPerIdentity  = 256
	DefaultMaxSeats             = 16
	DefaultSeatTurnover         = time.Minute
)

// Config is what New builds a Gateway from.
type Config[S Backend] struct {
	Server  S
	Metrics *metrics.Gateway
	// Idle is how long a session outlives its last connection (default
	// DefaultIdle).
	Idle time.Duration
	// DialTimeout bounds the connection to an upstream (default
	// DefaultDialTimeout).
	DialTimeout time.Duration
	// TunnelIdle is how long a tunnel may carry nothing either way before
	// it is closed (default DefaultTunnelIdle); any byte either way starts
	// it again.
	TunnelIdle time.Duration
	// MaxConns bounds the connections open through this replica,
	// MaxConnsPerNamespace those to the fleets of one namespace, one
	// tenant's, and MaxConnsPerIdentity those of one caller (defaults
	// DefaultMaxConns, DefaultMaxConnsPerNamespace,
	// DefaultMaxConnsPerIdentity); sessions' connections count as any
	// other.
	MaxConns, MaxConnsPerNamespace, MaxConnsPerIdentity int
	// TenantPrivateNetworks are the private networks (loopback
	// included) a proxy whose address its tenant chose (External, or of
	// a namespaced ProviderConfig) may be dialed in: the platform's
	// policy, as the provider's flag of the same name. Nil: none.
	TenantPrivateNetworks *reach.Networks
	// PlatformLoopback permits a platform GCP VM (reach.PlatformVM) at
	// reach.StandInVMs, 127.1.0.0/16: for make scale, whose stand-in VMs
	// listen there; never in a cluster (a VM is not on the gateway's own
	// loopback). Every other proxy keeps its kind's rule.
	PlatformLoopback bool
	// Replica names this replica in its seats' Lease holder (default the
	// host name).
	Replica string
	// MaxSeats bounds the seats this replica holds per fleet and zone
	// (default DefaultMaxSeats): rotation reaches a larger fleet over
	// time, an idle seat giving way to another proxy at most every
	// SeatTurnover/MaxSeats (default DefaultSeatTurnover).
	MaxSeats     int
	SeatTurnover time.Duration
}

// Gateway is egress-discovery's rotating gateway: an HTTP forward proxy
// that crawlers use as their only proxy URL. It authenticates them with
// the password of Proxy-Authorization as a bearer token (the API's
// authenticator and `use` authorisation), leases an upstream of the fleet
// the username names through the API's own lease path (quotas, admission,
// waiting, bans for the target's domain), and chains the connection to
// that upstream with the fleet's credentials, which the crawler never sees.
//
// A session keeps its upstream until it has had no open connection for
// Idle. Connections without a session run on seats: leases the replica
// itself holds, one per proxy it uses, shared by every caller of the
// fleet (and zone), each connection on the least loaded; a seat is added
// on another proxy when every seat has a connection, and given back after
// Idle without one. A caller's connections without a session count
// against its lease quota, one each. Every lease in use is renewed at
// half its TTL (no further than a draining proxy's deadline), and given
// back only when no connection uses it any more: a session moved to
// another proxy keeps its old lease while its old tunnels last. Build it
// with New.
type Gateway[S Backend] struct {
	Config[S]

	// mu guards everything below, and every session's and upstream's
	// fields but a session's busy.
	mu       sync.Mutex
	sessions map[string]*gwSession
	// live are the upstreams whose lease is held, for renewal.
	live     map[*upstream]bool
	conns    int
	byCaller map[string]int
	byNS     map[string]int
	// seats are the replica's own leases for connections without a
	// session, by fleet and zone; taking marks a seat being leased for a
	// key (closed when done), and seatHold when the last seat lease for a
	// key was refused, until which none is tried again while a seat is.
	seats    map[string][]*upstream
	taking   map[string]*seatTake
	seatHold map[string]time.Time
	// closed is set when Run has given every lease back: no connection
	// takes an upstream any more.
	closed bool
	// rotor is the rotation's memory (uses by caller, round-robin turns);
	// turnover is when each key's seats may next give way to another
	// proxy.
	rotor    rotor
	turnover map[string]time.Time
	// bansSeen are the (fleet, proxy, domain) bans this replica recorded
	// from an origin's answer lately: a burst of 429s records one.
	bansSeen map[string]time.Time
	// banWrites counts the bans from origins' answers being written, and
	// nsBanWrites those of each namespace.
	banWrites   int
	nsBanWrites map[string]int
	// seatID is the identity the seats are leased as: this process's own,
	// which no caller can present, so none can renew or release a seat.
	seatID *auth.Identity
	// transport forwards plain HTTP through the chosen upstream, which
	// each request's context names.
	transport *http.Transport
}

// gwSession is a session's current upstream.
type gwSession struct {
	id    *auth.Identity
	user  User
	up    *upstream
	conns int
	// idle is when the last connection closed.
	idle time.Time
	// lost is the proxy the session lost (its lease, or the proxy's
	// service), which a strict session does not move from.
	lost string
	// busy serialises choosing the session's upstream.
	busy sync.Mutex
}

// upstream is a leased proxy, how to reach it, and who uses it.
type upstream struct {
	id *auth.Identity
	g  *allocator.Granted
	// url is http://user:pass@host:port, with the credentials the proxy
	// takes now.
	url atomic.Pointer[url.URL]
	// refs are the connections using it; retired is set when no new one
	// may (its session moved on, or its seat went idle): the lease goes
	// back when both say so.
	refs    int
	retired bool
	// idle is when the last connection closed.
	idle time.Time
	// ttl is the TTL the lease was asked for, which renewals ask again
	// (a draining proxy's renewals are shorter).
	ttl time.Duration
	// since is when the lease was granted.
	since time.Time
	// session is set on a session's lease, which other replicas may
	// share, and adopted when this replica took it up from another: it
	// is deleted only by the last replica to leave it.
	session, adopted bool
}

// seatTake is a seat being leased; err is its refusal, once done is
// closed.
type seatTake struct {
	done chan struct{}
	err  error
	// gone says the taker's own connection went while it waited: its
	// refusal is its own, not one for those waiting on it.
	gone bool
}

type upstreamKey struct{}

// reachKey holds, in a plain request's context, where its upstream may be
// dialed.
type reachKey struct{}

// reach is where up's proxy may be dialed: as its kind justifies, and one
// whose address its tenant chose within the platform's private networks.
func (gw *Gateway[S]) reach(up *upstream) reach.Rule {
	r := up.g.Member.Reach
	if r.NoPrivate {
		r.Permitted = gw.TenantPrivateNetworks
	} else if gw.PlatformLoopback && up.g.Member.PlatformVM {
		r.Permitted = standInVMs
	}
	return r
}

// standInVMs is reach.StandInVMs, made once.
var standInVMs = reach.StandInVMs()

// HolderPrefix begins the holder of every lease the gateway takes,
// which no API lease may use.
const HolderPrefix = "gateway-"

// SeatHolder is the holder of a replica's seat Leases.
func SeatHolder(replica string) string { return HolderPrefix + "seats:" + replica }

// SessionHolder is the holder of a gateway session's Lease, by
// which any replica finds the session's proxy.
func SessionHolder(key string) string { return HolderPrefix + "session:" + key }

// New builds a Gateway, its zero settings taking their defaults.
func New[S Backend](cfg Config[S]) *Gateway[S] {
	gw := &Gateway[S]{Config: cfg}
	gw.sessions, gw.live, gw.byCaller, gw.byNS = map[string]*gwSession{}, map[*upstream]bool{}, map[string]int{}, map[string]int{}
	gw.seats, gw.taking, gw.seatHold = map[string][]*upstream{}, map[string]*seatTake{}, map[string]time.Time{}
	if gw.Replica == "" {
		gw.Replica, _ = os.Hostname()
	}
	if gw.Replica == "" {
		// Replicas sharing a session's lease tell themselves apart by it.
		gw.Replica = "replica-" + rand.Text()
	}
	gw.seatID = &auth.Identity{User: auth.SeatIdentityPrefix + rand.Text()}
	orDefault(&gw.Idle, DefaultIdle)
	orDefault(&gw.DialTimeout, DefaultDialTimeout)
	orDefault(&gw.TunnelIdle, DefaultTunnelIdle)
	orDefault(&gw.MaxConns, DefaultMaxConns)
	orDefault(&gw.MaxConnsPerIdentity, DefaultMaxConnsPerIdentity)
	orDefault(&gw.MaxConnsPerNamespace, DefaultMaxConnsPerNamespace)
	orDefault(&gw.MaxSeats, DefaultMaxSeats)
	orDefault(&gw.SeatTurnover, DefaultSeatTurnover)
	gw.turnover = map[string]time.Time{}
	gw.transport = &http.Transport{
		Proxy: func(r *http.Request) (*url.URL, error) {
			if u, ok := r.Context().Value(upstreamKey{}).(*url.URL); ok {
				return u, nil
			}
			return nil, errors.New("no upstream chosen")
		},
		// Each upstream is dialed as its kind justifies, on the
		// address its name resolves to at this dial.
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			r, ok := ctx.Value(reachKey{}).(reach.Rule)
			if !ok {
				return nil, errors.New("no upstream chosen")
			}
			return r.Dial(ctx, network, addr, gw.DialTimeout)
		},
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
	}
	if gw.Metrics == nil {
		gw.Metrics = metrics.NewGateway()
	}
	return gw
}

// orDefault sets *v to def when it is not positive: a Gateway's zero
// settings take their defaults.
func orDefault[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}
