package discovery

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pkg/errors"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/reach"
)

// GatewayUser is what a gateway username says; apiv1 defines the grammar.
type GatewayUser = apiv1.GatewayUser

// ParseGatewayUser reads a gateway username (apiv1.ParseGatewayUser).
func ParseGatewayUser(u string) (GatewayUser, error) { return apiv1.ParseGatewayUser(u) }

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
// another proxy keeps its old lease while its old tunnels last.
type Gateway struct {
	Server  *Server
	Metrics *metrics.Gateway
	// Idle is how long a session outlives its last connection (default 1m).
	Idle time.Duration
	// DialTimeout bounds the connection to an upstream (default 10s).
	DialTimeout time.Duration
	// TunnelIdle is how long a tunnel may carry nothing either way before
	// it is closed (default 5m); any byte either way starts it again.
	TunnelIdle time.Duration
	// MaxConns bounds the connections open through this replica (default
	// 4096), MaxConnsPerNamespace those to the fleets of one namespace,
	// one tenant's (default 1024), and MaxConnsPerIdentity those of one
	// caller (default 256); sessions' connections count as any other.
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
	// (default 16): rotation reaches a larger fleet over time, an idle
	// seat giving way to another proxy at most every SeatTurnover/MaxSeats
	// (SeatTurnover: default a minute).
	MaxSeats     int
	SeatTurnover time.Duration

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
	// seatID is the identity the seats are leased as: this process's own,
	// which no caller can present, so none can renew or release a seat.
	seatID *auth.Identity
	// transport forwards plain HTTP through the chosen upstream, which
	// each request's context names.
	transport *http.Transport
	once      sync.Once
}

// gwSession is a session's current upstream.
type gwSession struct {
	id    *auth.Identity
	user  GatewayUser
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
	g  *granted
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
}

type upstreamKey struct{}

// reachKey holds, in a plain request's context, where its upstream may be
// dialed.
type reachKey struct{}

// reach is where up's proxy may be dialed: as its kind justifies, and one
// whose address its tenant chose within the platform's private networks.
func (gw *Gateway) reach(up *upstream) reach.Rule {
	r := up.g.m.Reach
	if r.NoPrivate {
		r.Permitted = gw.TenantPrivateNetworks
	} else if gw.PlatformLoopback && up.g.m.PlatformVM {
		r.Permitted = standInVMs
	}
	return r
}

// standInVMs is reach.StandInVMs, made once.
var standInVMs = reach.StandInVMs()

// gatewayHolderPrefix begins the holder of every lease the gateway takes,
// which no API lease may use.
const gatewayHolderPrefix = "gateway-"

// GatewaySeatHolder is the holder of a replica's seat Leases.
func GatewaySeatHolder(replica string) string { return gatewayHolderPrefix + "seats:" + replica }

// GatewaySessionHolder is the holder of a gateway session's Lease, by
// which any replica finds the session's proxy.
func GatewaySessionHolder(key string) string { return gatewayHolderPrefix + "session:" + key }

func (gw *Gateway) init() {
	gw.once.Do(func() {
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
		if gw.Idle <= 0 {
			gw.Idle = time.Minute
		}
		if gw.DialTimeout <= 0 {
			gw.DialTimeout = 10 * time.Second
		}
		if gw.TunnelIdle <= 0 {
			gw.TunnelIdle = 5 * time.Minute
		}
		if gw.MaxConns <= 0 {
			gw.MaxConns = 4096
		}
		if gw.MaxConnsPerIdentity <= 0 {
			gw.MaxConnsPerIdentity = 256
		}
		if gw.MaxConnsPerNamespace <= 0 {
			gw.MaxConnsPerNamespace = 1024
		}
		if gw.MaxSeats <= 0 {
			gw.MaxSeats = defaultMaxSeats
		}
		if gw.SeatTurnover <= 0 {
			gw.SeatTurnover = defaultSeatTurnover
		}
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
	})
}

// Run renews the leases in use and releases idle sessions until ctx ends,
// then releases every lease.
func (gw *Gateway) Run(ctx context.Context) {
	gw.init()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			gw.releaseAll()
			return
		case <-t.C:
			gw.tend(ctx)
		}
	}
}

// tend retires the upstreams of sessions idle for longer than Idle, and
// renews, at half their TTL, the leases in use; a lease that cannot be
// renewed (lost to expiry) is dropped, and its session leases anew.
func (gw *Gateway) tend(ctx context.Context) {
	now := gw.Server.now()
	var drop []*upstream
	type renewal struct {
		up       *upstream
		id, user string
		ttl      time.Duration
	}
	var renew []renewal
	gw.mu.Lock()
	for k, s := range gw.sessions {
		if s.conns == 0 && now.Sub(s.idle) >= gw.Idle && s.busy.TryLock() {
			delete(gw.sessions, k)
			if s.up != nil {
				if up := gw.retireLocked(s.up); up != nil {
					drop = append(drop, up)
				}
				s.up = nil
			}
			s.busy.Unlock()
		}
	}
	drop = append(drop, gw.idleSeatsLocked(now)...)
	for up := range gw.live {
		if up.g.g.ExpiresAt.Sub(now) < up.g.g.TTL/2 {
			renew = append(renew, renewal{up: up, id: up.g.g.ID, user: up.id.User, ttl: up.ttl})
		}
	}
	gw.Metrics.Sessions.Set(float64(len(gw.sessions)))
	seats := 0
	for _, ss := range gw.seats {
		seats += len(ss)
	}
	gw.Metrics.Seats.Set(float64(seats))
	gw.mu.Unlock()
	for _, up := range drop {
		gw.release(ctx, up)
	}
	for _, r := range renew {
		ttl, err := gw.renewalTTL(ctx, r.up, r.ttl)
		var g *lease.Grant
		if err == nil {
			g, err = gw.Server.Leases.Renew(ctx, r.id, r.user, ttl)
		}
		gw.mu.Lock()
		if err != nil && !lost(err) {
			// The API server failing: tried again at the next tick, while
			// the lease lives.
			gw.Server.Log.Debug("Cannot renew a gateway lease yet", "proxy", r.up.g.m.Name, "error", err)
		} else if err != nil {
			gw.Server.Log.Info("Cannot renew a gateway lease", "proxy", r.up.g.m.Name, "error", err)
			delete(gw.live, r.up)
			r.up.retired = true
			for _, s := range gw.sessions {
				if s.up == r.up {
					s.up, s.lost = nil, r.up.g.m.Name
				}
			}
		} else if gw.live[r.up] {
			r.up.g.g = g
		}
		gw.mu.Unlock()
	}
}

// lost reports whether a renewal failed for good: the lease is gone, not
// the caller's, or its proxy is being replaced past its deadline or gone.
func lost(err error) bool {
	var ae *problem.Error
	return errors.Is(err, lease.ErrNotFound) || errors.Is(err, lease.ErrNotYours) || errors.Is(err, errProxyGone) ||
		(errors.As(err, &ae) && ae.Reason == apiv1.ReasonDraining)
}

// errProxyGone is a renewal of a lease whose proxy no longer exists.
var errProxyGone = errors.New("the proxy is gone")

// idleSeatsLocked retires the seats without a connection for Idle and
// forgets retired ones, returning the leases to give back; gw.mu is held.
func (gw *Gateway) idleSeatsLocked(now time.Time) []*upstream {
	var drop []*upstream
	for k, seats := range gw.seats {
		kept := seats[:0]
		for _, up := range seats {
			if !up.retired && up.refs == 0 && now.Sub(up.idle) >= gw.Idle {
				if back := gw.retireLocked(up); back != nil {
					drop = append(drop, back)
				}
			}
			if !up.retired {
				kept = append(kept, up)
			}
		}
		clear(seats[len(kept):])
		if gw.seats[k] = kept; len(kept) == 0 {
			delete(gw.seats, k)
		}
	}
	for k, until := range gw.seatHold {
		if !now.Before(until) {
			delete(gw.seatHold, k)
		}
	}
	return drop
}

// renewalTTL is the TTL to renew up's lease for: its own, but no further
// than the deadline of a proxy being replaced (as the API renews), so
// that the gateway cannot hold a rollout up either.
func (gw *Gateway) renewalTTL(ctx context.Context, up *upstream, ttl time.Duration) (time.Duration, error) {
	p := &v1alpha1.Proxy{}
	if err := gw.Server.Catalog.Cache.Get(ctx, types.NamespacedName{Namespace: up.g.m.Namespace, Name: up.g.m.Name}, p); err != nil {
		if kerrors.IsNotFound(err) {
			return 0, errors.Wrapf(errProxyGone, "proxy %s", up.g.m.Name)
		}
		return ttl, nil
	}
	since := catalog.DrainSince(p)
	if since.IsZero() {
		return ttl, nil
	}
	_, maxTTL, err := gw.Server.Catalog.TTLs(ctx, up.g.m.Namespace, up.g.m.Fleet)
	if err != nil {
		return ttl, nil //nolint:nilerr // Renewed as it was; the next round reads the TTLs again.
	}
	return gw.Server.drainedTTL(p.Name, since, maxTTL, ttl)
}

// retireLocked marks up as taking no new connection and returns it when
// its lease is to go back now (no connection uses it).
func (gw *Gateway) retireLocked(up *upstream) *upstream {
	up.retired = true
	if up.refs == 0 && gw.live[up] {
		delete(gw.live, up)
		return up
	}
	return nil
}

// unref is a connection done with up: the lease goes back when up is
// retired and this was its last connection.
func (gw *Gateway) unref(up *upstream) {
	gw.mu.Lock()
	if up.refs--; up.refs == 0 {
		up.idle = gw.Server.now()
	}
	var back *upstream
	if up.refs == 0 && up.retired && gw.live[up] {
		delete(gw.live, up)
		back = up
	}
	gw.mu.Unlock()
	if back != nil {
		gw.release(context.Background(), back)
	}
}

// abandon retires an upstream that could not be reached: no connection
// takes it any more, and its lease goes back when its last one ends.
func (gw *Gateway) abandon(up *upstream) {
	gw.mu.Lock()
	back := gw.retireLocked(up)
	gw.mu.Unlock()
	if back != nil {
		gw.release(context.Background(), back)
	}
}

func (gw *Gateway) releaseAll() {
	gw.mu.Lock()
	all := gw.live
	gw.live, gw.sessions, gw.seats = map[*upstream]bool{}, map[string]*gwSession{}, map[string][]*upstream{}
	gw.closed = true
	gw.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for up := range all {
		gw.release(ctx, up)
	}
}

func (gw *Gateway) release(ctx context.Context, up *upstream) {
	if up.session {
		// Another replica may use it still: the last one deletes it.
		if ok, err := gw.Server.Leases.Leave(context.WithoutCancel(ctx), up.g.g.ID, up.id.User, gw.Replica, !up.adopted); ok && err == nil {
			gw.Server.released(up.g.g.Namespace, up.g.g.Fleet, up.id.User, up.g.g.ID)
		}
		return
	}
	if err := gw.Server.Leases.Release(context.WithoutCancel(ctx), up.g.g.ID, up.id.User); err == nil {
		gw.Server.released(up.g.g.Namespace, up.g.g.Fleet, up.id.User, up.g.g.ID)
	}
}

// admit counts a connection to a fleet of namespace ns against the
// replica's, the namespace's and the caller's bounds, and returns its end:
// one tenant's callers cannot take every connection of the replica.
func (gw *Gateway) admit(id *auth.Identity, ns string) (func(), error) {
	gw.mu.Lock()
	defer gw.mu.Unlock()
	if gw.conns >= gw.MaxConns {
		return nil, &gwError{code: http.StatusServiceUnavailable, reason: "GatewayFull", retryAfter: 1,
			msg: fmt.Sprintf("the gateway holds %d connections, its bound (--gateway-max-conns); retry shortly", gw.conns)}
	}
	if gw.byNS[ns] >= gw.MaxConnsPerNamespace {
		return nil, &gwError{code: http.StatusTooManyRequests, reason: apiv1.ReasonRateLimited, retryAfter: 1,
			msg: fmt.Sprintf("the fleets of namespace %s hold %d connections through this gateway replica, their bound (--gateway-max-conns-per-namespace); close some first", ns, gw.byNS[ns])}
	}
	if gw.byCaller[id.User] >= gw.MaxConnsPerIdentity {
		return nil, &gwError{code: http.StatusTooManyRequests, reason: apiv1.ReasonRateLimited, retryAfter: 1,
			msg: fmt.Sprintf("%s holds %d connections through this gateway replica, its bound (--gateway-max-conns-per-identity); close some first", id.User, gw.byCaller[id.User])}
	}
	gw.conns++
	gw.byCaller[id.User]++
	gw.byNS[ns]++
	return func() {
		gw.mu.Lock()
		defer gw.mu.Unlock()
		gw.conns--
		if gw.byCaller[id.User]--; gw.byCaller[id.User] <= 0 {
			delete(gw.byCaller, id.User)
		}
		if gw.byNS[ns]--; gw.byNS[ns] <= 0 {
			delete(gw.byNS, ns)
		}
	}, nil
}

// Reasons of the gateway's own refusals.
const (
	reasonUpstreamUnavailable = "UpstreamUnavailable"
	reasonUpstreamRefused     = "UpstreamRefused"
	reasonShuttingDown        = "ShuttingDown"
	// reasonSessionProxyGone: a strict session's proxy serves it no more.
	reasonSessionProxyGone = "SessionProxyGone"
	// reasonUpstreamAddressRefused: the proxy is published at an address
	// its kind does not justify.
	reasonUpstreamAddressRefused = "UpstreamAddressRefused"
)

// gwError is a refusal of the gateway: a status, a reason and words, and
// for 407 the challenge.
type gwError struct {
	code       int
	reason     string
	msg        string
	retryAfter int
	// dial marks an upstream that could not be reached, which another
	// proxy may serve.
	dial bool
}

// ProblemReason is the reason code the gateway's refusal is counted by
// (problem.ReasonOf).
func (e *gwError) ProblemReason() string { return e.reason }

// retriable reports whether a failed CONNECT may be tried on another
// proxy: the upstream was not reached, or answered other than 403 (its
// destination policy, the same on every proxy).
func retriable(err error) bool {
	var ge *gwError
	return errors.As(err, &ge) && (ge.dial || ge.reason == reasonUpstreamUnavailable || ge.code == http.StatusBadGateway)
}

// upstreamFailed reports whether the upstream itself failed (not
// reached, or broke off its handshake), rather than answering about the
// target: only then is it retired.
func upstreamFailed(err error) bool {
	var ge *gwError
	return errors.As(err, &ge) && (ge.dial || ge.reason == reasonUpstreamUnavailable)
}

// rather is the refusal to answer when a connection's first upstream
// failed with first and no other could be chosen (retry): the first, when
// it says the upstream is published where the gateway does not dial,
// which is what the caller (or the platform) must fix.
func rather(first, retry error) error {
	var ge *gwError
	if errors.As(first, &ge) && ge.reason == reasonUpstreamAddressRefused {
		return first
	}
	return retry
}

// unreached reports whether a plain request failed before reaching the
// upstream: dialling it, or its CONNECT for the transport.
func unreached(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && (op.Op == "dial" || op.Op == "proxyconnect")
}

func (e *gwError) Error() string { return e.msg }

func proxyAuthRequired(msg string) *gwError {
	return &gwError{code: http.StatusProxyAuthRequired, reason: apiv1.ReasonUnauthenticated, msg: msg}
}

// refuse answers a refusal, with Proxy-Status (RFC 9209) naming the
// gateway and the error.
func (gw *Gateway) refuse(w http.ResponseWriter, err error) {
	var ge *gwError
	if !errors.As(err, &ge) {
		ae := problem.ToAPIError(err)
		ge = &gwError{code: ae.Code, reason: ae.Reason, msg: ae.Msg, retryAfter: ae.RetryAfter}
		switch {
		case ae.Code == http.StatusUnauthorized:
			ge.code = http.StatusProxyAuthRequired
		case ae.Reason == apiv1.ReasonNoFreeSlot || ae.Reason == apiv1.ReasonTooFewHealthy:
			// A proxy client knows 503 with Retry-After, not the API's 409.
			ge.code = http.StatusServiceUnavailable
		}
	}
	if ge.code == http.StatusProxyAuthRequired {
		w.Header().Set("Proxy-Authenticate", `Basic realm="egress-discovery gateway"`)
	}
	if ge.retryAfter > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(ge.retryAfter))
	}
	w.Header().Set("Proxy-Status", fmt.Sprintf("egress-discovery; error=%s; details=%q", proxyStatusError(ge.code), ge.reason))
	problem.WriteJSON(w, ge.code, apiv1.Error{Error: apiv1.ErrorDetail{Code: ge.code, Reason: ge.reason, Message: ge.msg}})
}

// proxyStatusError is RFC 9209's error type for a refusal.
func proxyStatusError(code int) string {
	switch code {
	case http.StatusProxyAuthRequired, http.StatusForbidden:
		return "http_request_denied"
	case http.StatusBadGateway:
		return "proxy_internal_response"
	case http.StatusGatewayTimeout:
		return "connection_timeout"
	case http.StatusBadRequest:
		return "http_request_error"
	default:
		return "proxy_internal_error"
	}
}

// ServeHTTP serves CONNECT and absolute-URI requests.
func (gw *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	gw.init()
	start := time.Now()
	caller, user, err := gw.authenticate(r)
	if err != nil {
		gw.refuse(w, err)
		return
	}
	target, domain, err := destination(r)
	if err != nil {
		gw.refuse(w, err)
		return
	}
	leave, err := gw.admit(caller, user.Namespace)
	if err != nil {
		gw.refuse(w, err)
		return
	}
	defer leave()
	fleet := user.Namespace + "/" + user.Fleet
	up, done, moved, err := gw.choose(r.Context(), caller, user, domain, nil)
	if err != nil {
		gw.Server.Metrics.Denials.WithLabelValues(problem.ReasonOf(err)).Inc()
		gw.refuse(w, err)
		return
	}
	gw.Metrics.ChooseLatency.Observe(time.Since(start).Seconds())
	gw.Metrics.Connections.WithLabelValues(fleet).Inc()
	gw.Metrics.ConnectionsTotal.WithLabelValues(fleet).Inc()
	defer gw.Metrics.Connections.WithLabelValues(fleet).Dec()
	if r.Method == http.MethodConnect {
		gw.tunnel(w, r, caller, user, target, domain, up, done, moved)
		return
	}
	gw.forward(w, r, caller, user, domain, up, done, moved)
}

// authenticate reads Proxy-Authorization: Basic, the username in the
// gateway's grammar and the password a bearer token, and authorises the
// caller's use of the fleet.
func (gw *Gateway) authenticate(r *http.Request) (*auth.Identity, GatewayUser, error) {
	h := r.Header.Get("Proxy-Authorization")
	scheme, enc, _ := strings.Cut(strings.TrimSpace(h), " ")
	if !strings.EqualFold(scheme, "Basic") {
		return nil, GatewayUser{}, proxyAuthRequired("the gateway needs Proxy-Authorization: Basic, with <namespace>_<fleet>[_session_<key>][_zone_<zone>] as the username and a discovery token as the password")
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return nil, GatewayUser{}, proxyAuthRequired("Proxy-Authorization is not valid base64")
	}
	name, token, ok := strings.Cut(string(b), ":")
	if !ok || token == "" {
		return nil, GatewayUser{}, proxyAuthRequired("Proxy-Authorization has no password: give a discovery token as the password")
	}
	return gw.signIn(r.Context(), r.RemoteAddr, name, token)
}

// signIn authenticates a gateway caller, HTTP's or SOCKS5's, by its
// username (the grammar) and its password (a discovery token), bounds its
// rate and authorises its use of the fleet.
func (gw *Gateway) signIn(ctx context.Context, remote, name, token string) (*auth.Identity, GatewayUser, error) {
	user, err := ParseGatewayUser(name)
	if err != nil {
		return nil, GatewayUser{}, &gwError{code: http.StatusProxyAuthRequired, reason: apiv1.ReasonInvalid, msg: err.Error()}
	}
	ctx = auth.WithClientAddress(ctx, remote)
	id, err := gw.Server.Auth.AuthenticateToken(ctx, token)
	if err != nil {
		return nil, GatewayUser{}, err
	}
	if err := gw.Server.limit(id); err != nil {
		return nil, GatewayUser{}, err
	}
	if err := gw.Server.authorizeFleet(ctx, id, user.Namespace, user.Fleet); err != nil {
		return nil, GatewayUser{}, err
	}
	return id, user, nil
}

// destination is where a request goes (host:port) and the domain bans are
// kept for.
func destination(r *http.Request) (string, string, error) {
	var host string
	switch {
	case r.Method == http.MethodConnect:
		host = r.Host
	case r.URL.IsAbs() && (r.URL.Scheme == "http" || r.URL.Scheme == "https"):
		host = r.URL.Host
	default:
		return "", "", &gwError{code: http.StatusBadRequest, reason: apiv1.ReasonInvalid,
			msg: "the gateway is a forward proxy: send CONNECT host:port, or a request with an absolute http:// URL"}
	}
	h, port, err := net.SplitHostPort(host)
	if err != nil {
		h, port = host, "80"
		if r.URL.Scheme == "https" {
			port = "443"
		}
	}
	if h == "" || port == "" {
		return "", "", &gwError{code: http.StatusBadRequest, reason: apiv1.ReasonInvalid, msg: fmt.Sprintf("no host in %q", host)}
	}
	if !validHost(h) {
		return "", "", &gwError{code: http.StatusBadRequest, reason: apiv1.ReasonInvalid, msg: fmt.Sprintf("%.64q is not a host name or address", h)}
	}
	// A ban on example.com holds for example.com. too.
	return net.JoinHostPort(h, port), strings.TrimSuffix(strings.ToLower(strings.Trim(h, "[]")), "."), nil
}

// validHost says whether h (a CONNECT's or SOCKS5 request's host, IPv6
// brackets off) may be dialed and key bans and the rotation's memory: a
// host name of at most 253 characters, or an address without a zone; no
// spaces, separators or control bytes.
func validHost(h string) bool {
	if h == "" || len(h) > 253 || strings.ContainsAny(h, "/@\\%") {
		return false
	}
	for _, r := range h {
		if r <= ' ' || r == 0x7f {
			return false
		}
	}
	return true
}

// choose gives a connection its upstream: the session's (moved off a
// proxy banned for domain, excluded, of another zone, or no longer
// serving, unless the session is strict; and started again on another
// proxy once its lifetime is over), or for a connection without a session
// a seat. done ends the connection's use of it; moved names the proxy a
// loose session just left.
func (gw *Gateway) choose(ctx context.Context, id *auth.Identity, u GatewayUser, domain string, exclude map[string]bool) (up *upstream, done func(), moved string, err error) {
	gw.mu.Lock()
	closed := gw.closed
	gw.mu.Unlock()
	if closed {
		return nil, nil, "", &gwError{code: http.StatusServiceUnavailable, reason: reasonShuttingDown, retryAfter: 1, msg: "this gateway replica is shutting down; retry"}
	}
	if u.Session == "" {
		up, done, err := gw.seat(ctx, id, u, domain, exclude)
		return up, done, "", err
	}
	if u.Lifetime > 0 {
		_, maxTTL, err := gw.Server.Catalog.TTLs(ctx, u.Namespace, u.Fleet)
		if err != nil {
			return nil, nil, "", err
		}
		if u.Lifetime > maxTTL {
			return nil, nil, "", &gwError{code: http.StatusProxyAuthRequired, reason: apiv1.ReasonInvalid,
				msg: fmt.Sprintf("username: lifetime_%s is longer than the fleet's spec.leases.maxTTL (%s)", u.Lifetime, maxTTL)}
		}
	}
	return gw.session(ctx, id, u, domain, exclude)
}

// session is choose for a connection of a session.
func (gw *Gateway) session(ctx context.Context, id *auth.Identity, u GatewayUser, domain string, exclude map[string]bool) (*upstream, func(), string, error) {
	key := id.User + "\x00" + u.Namespace + "/" + u.Fleet + "\x00" + u.Session
	gw.mu.Lock()
	s := gw.sessions[key]
	if s == nil {
		s = &gwSession{id: id, user: u}
		gw.sessions[key] = s
	}
	s.conns++
	gw.mu.Unlock()
	leave := func() {
		gw.mu.Lock()
		s.conns--
		s.idle = gw.Server.now()
		gw.mu.Unlock()
	}
	s.busy.Lock()
	defer s.busy.Unlock()
	cur, gone, ended, notHere := gw.current(ctx, s, u, domain, exclude)
	if notHere != "" {
		// A strict session's proxy that serves it, but not this
		// connection (banned for its domain): refused, not moved.
		leave()
		gw.Metrics.StrictRefusals.Inc()
		return nil, nil, "", &gwError{code: http.StatusBadGateway, reason: reasonSessionProxyGone,
			msg: fmt.Sprintf("session %s is strict and its proxy %s does not serve %s (banned for it): use another session for it", u.Session, notHere, domain)}
	}
	if gone != "" && u.Strict {
		// A strict session never moves: its proxy answers, or nothing.
		gw.mu.Lock()
		s.lost = gone
		gw.mu.Unlock()
		leave()
		gw.Metrics.StrictRefusals.Inc()
		return nil, nil, "", &gwError{code: http.StatusBadGateway, reason: reasonSessionProxyGone,
			msg: fmt.Sprintf("session %s is strict and its proxy %s no longer serves it (gone, unhealthy, being replaced, banned for %s or unreachable): start another session", u.Session, gone, domain)}
	}
	if cur == nil {
		var err error
		if cur, err = gw.resume(ctx, id, u, domain, exclude, ended); err != nil {
			leave()
			// A session that never got an upstream is forgotten at once,
			// so refused keys do not pile up until Idle; conns 0 means no
			// other connection has it in hand.
			gw.mu.Lock()
			if s.conns == 0 && s.up == nil && gw.sessions[key] == s {
				delete(gw.sessions, key)
			}
			gw.mu.Unlock()
			return nil, nil, "", err
		}
	}
	gw.mu.Lock()
	s.up, s.user, s.lost = cur, u, ""
	cur.refs++
	gw.mu.Unlock()
	if err := gw.paceSession(ctx, u, domain, &cur.g.m); err != nil {
		gw.unref(cur)
		leave()
		return nil, nil, "", err
	}
	moved := ""
	if gone != "" && gone != cur.g.m.Name {
		moved = gone
		gw.Metrics.SessionsMoved.Inc()
	}
	return cur, func() { gw.unref(cur); leave() }, moved, nil
}

// current is the session's upstream when it may carry this connection
// (s.busy held), else nil with the proxy it lost (gone: retired, lost
// its lease, stopped serving, excluded) or whose lifetime ended (ended);
// or, for a strict session whose proxy serves it still but not this
// connection (a ban for its domain), that proxy (notHere), kept.
func (gw *Gateway) current(ctx context.Context, s *gwSession, u GatewayUser, domain string, exclude map[string]bool) (cur *upstream, gone, ended, notHere string) {
	gw.mu.Lock()
	cur = s.up
	if cur != nil && cur.retired {
		// Its lease was lost, or its proxy stopped answering.
		gone, s.up, cur = cur.g.m.Name, nil, nil
	}
	if cur == nil && gone == "" {
		gone = s.lost
	}
	gw.mu.Unlock()
	leaveIt := func() {
		gw.mu.Lock()
		back := gw.retireLocked(cur)
		s.up, cur = nil, nil
		gw.mu.Unlock()
		if back != nil {
			gw.release(ctx, back)
		}
	}
	if cur != nil && u.Lifetime > 0 && !gw.Server.now().Before(cur.since.Add(u.Lifetime)) {
		// The session's lifetime is over: it starts again, on another
		// proxy when one serves.
		ended = cur.g.m.Name
		gw.Metrics.SessionsEnded.Inc()
		leaveIt()
		return nil, "", ended, ""
	}
	if cur == nil {
		return nil, gone, "", ""
	}
	if exclude[cur.g.m.Name] {
		gone = cur.g.m.Name
		leaveIt()
		return nil, gone, "", ""
	}
	if ok, forGood := gw.check(ctx, cur, u.Zone, domain); !ok {
		if u.Strict && !forGood {
			return nil, "", "", cur.g.m.Name
		}
		gone = cur.g.m.Name
		leaveIt()
	}
	return cur, gone, "", ""
}

// resume gives a session an upstream: the lease another replica serves it
// on, else a new lease, off the proxy whose lifetime for it just ended
// (ended) when another serves.
func (gw *Gateway) resume(ctx context.Context, id *auth.Identity, u GatewayUser, domain string, exclude map[string]bool, ended string) (*upstream, error) {
	// Another replica may serve the session already (on a proxy that
	// serves this connection too).
	if cur := gw.adopt(ctx, id, u, domain, exclude); cur != nil {
		if cur.g.m.Name != ended && (u.Lifetime == 0 || gw.Server.now().Before(cur.since.Add(u.Lifetime))) {
			return cur, nil
		}
		// Its lifetime is over there too.
		if ended == "" {
			ended = cur.g.m.Name
			gw.Metrics.SessionsEnded.Inc()
		}
		gw.abandon(cur)
	}
	avoid := exclude
	if ended != "" {
		avoid = map[string]bool{ended: true}
		for k := range exclude {
			avoid[k] = true
		}
	}
	up, err := gw.lease(ctx, id, u, domain, GatewaySessionHolder(u.Session), avoid, false, true, "")
	if err != nil && ended != "" && refusal(err) {
		// No other proxy: the session starts again on the same one.
		up, err = gw.lease(ctx, id, u, domain, GatewaySessionHolder(u.Session), exclude, false, true, "")
	}
	return up, err
}

// adopt takes up the lease another replica granted the session, when its
// proxy serves the connection, so that a session whose connections reach
// several replicas keeps one proxy. The write that renews the lease adds
// this replica to those using it: each renews it while it uses it and
// takes itself off when done, and the last deletes it.
func (gw *Gateway) adopt(ctx context.Context, id *auth.Identity, u GatewayUser, domain string, exclude map[string]bool) *upstream {
	g, err := gw.Server.Leases.HeldBy(ctx, u.Namespace, u.Fleet, GatewaySessionHolder(u.Session), id.User)
	if err != nil || exclude[g.Proxy] || g.Fleet != u.Fleet || gw.holds(g.ID) {
		return nil
	}
	p := &v1alpha1.Proxy{}
	if err := gw.Server.Catalog.Cache.Get(ctx, types.NamespacedName{Namespace: g.Namespace, Name: g.Proxy}, p); err != nil {
		return nil
	}
	ttl, _, err := gw.Server.Catalog.TTLs(ctx, u.Namespace, u.Fleet)
	if err != nil {
		return nil
	}
	up := &upstream{id: id, g: &granted{g: g, m: catalog.ToMember(p)}, ttl: ttl, session: true, adopted: true, since: g.AcquiredAt}
	if !gw.serves(ctx, up, u.Zone, domain) || up.url.Load() == nil {
		return nil
	}
	if ttl, err = gw.renewalTTL(ctx, up, ttl); err != nil {
		return nil
	}
	shared, err := gw.Server.Leases.Share(ctx, g.ID, id.User, ttl, gw.Replica)
	if err != nil {
		return nil
	}
	up.g.g = shared
	gw.mu.Lock()
	gw.live[up] = true
	gw.mu.Unlock()
	gw.Metrics.SessionsAdopted.Inc()
	return up
}

// holds reports whether this replica uses the lease id already (one its
// session moved off, whose tunnels still run): taking it up a second time
// would name the replica on it once for two uses, and the first to end
// would leave it, or delete it, under the other.
func (gw *Gateway) holds(id string) bool {
	gw.mu.Lock()
	defer gw.mu.Unlock()
	for up := range gw.live {
		if up.g.g.ID == id {
			return true
		}
	}
	return false
}

// serves reports whether up's proxy, as the cache shows it now, may take
// a new connection for zone and domain: it serves (healthy, not being
// replaced, taking the credentials discovery hands out), is of the zone
// and not banned for the domain. It refreshes up's credentials.
func (gw *Gateway) serves(ctx context.Context, up *upstream, zone, domain string) bool {
	ok, _ := gw.check(ctx, up, zone, domain)
	return ok
}

// check is serves, and gone when the proxy serves no connection at all
// any more (whatever the zone or domain).
func (gw *Gateway) check(ctx context.Context, up *upstream, zone, domain string) (ok, gone bool) {
	p := &v1alpha1.Proxy{}
	if err := gw.Server.Catalog.Cache.Get(ctx, types.NamespacedName{Namespace: up.g.m.Namespace, Name: up.g.m.Name}, p); err != nil {
		return false, kerrors.IsNotFound(err)
	}
	m := catalog.ToMember(p)
	if !m.Serving() || m.Fleet != up.g.m.Fleet {
		return false, true
	}
	admit, err := gw.Server.admits(ctx, []catalog.Member{m}, zone, nil, domain)
	if err != nil || !admit(&m) {
		return false, false
	}
	// The credentials the proxy takes now, for connections from here on.
	if raw, err := gw.Server.Catalog.ProxyURL(ctx, m); err == nil {
		if pu, err := url.Parse(raw); err == nil {
			up.url.Store(pu)
		}
	}
	return true, false
}

// seat gives a connection without a session the seat of the proxy the
// rotation strategy (the username's, else the fleet's) chooses among the
// fleet's that serve domain, leasing one there when it has none (rotate);
// failing that, the least loaded of the replica's seats for its fleet and
// zone, or one leased anywhere (pickSeat). The connection counts against
// the caller's quota.
func (gw *Gateway) seat(ctx context.Context, id *auth.Identity, u GatewayUser, domain string, exclude map[string]bool) (*upstream, func(), error) {
	p, err := gw.Server.Catalog.Policy(ctx, u.Namespace, u.Fleet)
	if err != nil {
		return nil, nil, err
	}
	leave, err := gw.Server.holdConn(ctx, u.Namespace, u.Fleet, id, p)
	if err != nil {
		return nil, nil, err
	}
	key := u.Namespace + "/" + u.Fleet + "\x00" + u.Zone
	strategy := u.Rotate
	if strategy == "" {
		strategy = p.Rotation
	}
	rule := p.PacingFor(domain)
	up, err := gw.rotatePaced(ctx, key, strategy, id, u, domain, exclude, rule)
	if err != nil {
		leave()
		return nil, nil, err
	}
	if up != nil {
		return up, func() { gw.unref(up); leave() }, nil
	}
	if rule != nil {
		// The seats as they are, off the proxies whose IP is paced.
		if f, err := gw.Server.Catalog.Members(ctx, u.Namespace, u.Fleet); err == nil {
			paced := gw.Server.pace.pacedAmong(u.Namespace+"/"+u.Fleet, rule, f.Items, gw.Server.now())
			for k := range exclude {
				paced[k] = true
			}
			exclude = paced
		}
	}
	for range 3 {
		up, err := gw.pickSeat(ctx, key, id, u, domain, exclude)
		if err != nil {
			leave()
			return nil, nil, err
		}
		if up != nil && rule != nil {
			// The seats as they are: their IP's pacing holds too.
			if err := gw.paceSeat(ctx, u, domain, rule, up); err != nil {
				gw.unref(up)
				leave()
				return nil, nil, err
			}
		}
		if up != nil {
			return up, func() { gw.unref(up); leave() }, nil
		}
	}
	leave()
	return nil, nil, &gwError{code: http.StatusServiceUnavailable, reason: reasonUpstreamUnavailable, retryAfter: 1,
		msg: "the gateway's seats for this fleet changed under three attempts to take one; retry"}
}

// pickSeat takes a connection's place on a seat; nil (no error) when the
// seat it chose was retired meanwhile.
func (gw *Gateway) pickSeat(ctx context.Context, key string, id *auth.Identity, u GatewayUser, domain string, exclude map[string]bool) (*upstream, error) {
	for {
		best, held := gw.leastLoaded(ctx, key, u.Zone, domain, exclude)
		gw.mu.Lock()
		if best != nil && best.retired {
			gw.mu.Unlock()
			return nil, nil
		}
		take, busy := gw.taking[key]
		hold := gw.Server.now().Before(gw.seatHold[key])
		if best != nil && (best.refs == 0 || busy || hold || gw.seatCountLocked(key) >= gw.MaxSeats) {
			best.refs++
			gw.mu.Unlock()
			return best, nil
		}
		if busy {
			// No seat serves this connection: wait for the one being
			// leased, and share its refusal (each waiter trying in turn
			// would wait maxWait each).
			gw.mu.Unlock()
			select {
			case <-take.done:
				if take.err != nil {
					return nil, take.err
				}
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		take = &seatTake{done: make(chan struct{})}
		gw.taking[key] = take
		gw.mu.Unlock()
		for name := range exclude {
			held[name] = true
		}
		// With a seat to share, a full fleet is not waited for.
		up, err := gw.lease(ctx, id, u, domain, GatewaySeatHolder(gw.Replica), held, true, best == nil, "")
		gw.mu.Lock()
		delete(gw.taking, key)
		take.err = err
		close(take.done)
		switch {
		case err == nil:
			gw.seats[key] = append(gw.seats[key], up)
			up.refs++
			gw.mu.Unlock()
			return up, nil
		case best != nil && !best.retired:
			gw.seatHold[key] = gw.Server.now().Add(time.Second)
			best.refs++
			gw.mu.Unlock()
			return best, nil
		}
		gw.mu.Unlock()
		if best != nil {
			return nil, nil
		}
		return nil, err
	}
}

// leastLoaded is the seat of key with the fewest connections that serves
// zone and domain, and held the proxies key has seats on; a seat whose
// proxy serves no more is retired.
func (gw *Gateway) leastLoaded(ctx context.Context, key, zone, domain string, exclude map[string]bool) (*upstream, map[string]bool) {
	gw.mu.Lock()
	seats := append([]*upstream(nil), gw.seats[key]...)
	gw.mu.Unlock()
	held := map[string]bool{}
	var usable []*upstream
	for _, up := range seats {
		gw.mu.Lock()
		retired := up.retired
		gw.mu.Unlock()
		if retired {
			// Abandoned (its proxy failed, or is published where it is
			// not dialed): no reason to keep a new seat off its proxy.
			continue
		}
		held[up.g.m.Name] = true
		if exclude[up.g.m.Name] {
			continue
		}
		ok, gone := gw.check(ctx, up, zone, domain)
		if gone {
			gw.mu.Lock()
			back := gw.retireLocked(up)
			gw.mu.Unlock()
			if back != nil {
				gw.release(ctx, back)
			}
		}
		if ok {
			usable = append(usable, up)
		}
	}
	gw.mu.Lock()
	defer gw.mu.Unlock()
	var best *upstream
	for _, up := range usable {
		if !up.retired && (best == nil || up.refs < best.refs) {
			best = up
		}
	}
	return best, held
}

// lease grants a lease of the user's fleet through the API's own path and
// reads the upstream's URL with its credentials: the caller's lease for a
// session, the replica's for a seat (which waits for a slot only when
// wait).
func (gw *Gateway) lease(ctx context.Context, id *auth.Identity, u GatewayUser, domain, holder string, exclude map[string]bool, seat, wait bool, only string) (*upstream, error) {
	req := &apiv1.AcquireRequest{Fleet: u.Namespace + "/" + u.Fleet, Holder: holder, Zone: u.Zone, Domain: domain}
	a, err := gw.Server.acquisitionOf(ctx, req, u.Namespace, u.Fleet, id)
	if err != nil {
		return nil, err
	}
	a.exclude, a.only = exclude, only
	if seat {
		a.id, a.seat, a.caller = gw.seatID, true, id
		if !wait {
			a.wait = 0
		}
	}
	g, err := gw.Server.grantFor(ctx, a)
	if err != nil {
		return nil, err
	}
	raw, err := gw.Server.Catalog.ProxyURL(ctx, g.m)
	if err == nil {
		var pu *url.URL
		if pu, err = url.Parse(raw); err == nil {
			gw.Server.Metrics.Acquisitions.Inc()
			up := &upstream{id: a.id, g: g, ttl: a.ttl, session: !seat, since: g.g.AcquiredAt}
			if up.since.IsZero() {
				up.since = gw.Server.now()
			}
			up.url.Store(pu)
			gw.mu.Lock()
			gw.live[up] = true
			gw.mu.Unlock()
			return up, nil
		}
	}
	// A session's lease may be shared already: it leaves as one.
	gw.release(ctx, &upstream{id: a.id, g: g, session: !seat})
	return nil, err
}

// tunnel serves CONNECT: it opens a tunnel through the upstream (retried
// once on another proxy when the upstream fails before any byte reached
// the crawler), answers 200, and splices both ways.
func (gw *Gateway) tunnel(w http.ResponseWriter, r *http.Request, id *auth.Identity, u GatewayUser, target, domain string, up *upstream, done func(), moved string) {
	conn, up, done, moved, err := gw.open(r.Context(), id, u, target, domain, up, done, moved)
	if err != nil {
		gw.refuse(w, err)
		return
	}
	gw.Server.spread.record(u.Namespace+"/"+u.Fleet, up.g.m.Name, gw.Server.now())
	defer done()
	defer conn.Close() //nolint:errcheck // Closing a tunnel.
	hj, ok := w.(http.Hijacker)
	if !ok {
		gw.refuse(w, &gwError{code: http.StatusHTTPVersionNotSupported, reason: apiv1.ReasonInvalid, msg: "CONNECT needs HTTP/1.1"})
		return
	}
	client, rw, err := hj.Hijack()
	if err != nil {
		return
	}
	defer client.Close() //nolint:errcheck // Closing a tunnel.
	_ = client.SetDeadline(time.Time{})
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n"+egressHeaders(up, moved)+"\r\n"); err != nil {
		return
	}
	// Bytes the crawler sent after its CONNECT, already buffered.
	if n := rw.Reader.Buffered(); n > 0 {
		b, _ := rw.Peek(n)
		if _, err := conn.Write(b); err != nil {
			return
		}
		gw.Metrics.Bytes.WithLabelValues("up").Add(float64(n))
	}
	splice(client, conn, gw.TunnelIdle, gw.Metrics)
}

// open connects a tunnel to target through up, tried once more on another
// proxy when up failed before the target was reached (a session moves
// with it): the connection, the upstream and done that carry it, and the
// proxy a session left (moved). On an error done has been called.
func (gw *Gateway) open(ctx context.Context, id *auth.Identity, u GatewayUser, target, domain string, up *upstream, done func(), moved string) (net.Conn, *upstream, func(), string, error) {
	conn, err := gw.connect(ctx, up, target)
	if err != nil && retriable(err) && (!u.Strict || upstreamFailed(err)) {
		// A strict session moves for nothing: its proxy failing ends it
		// (choose answers SessionProxyGone), the target failing is the
		// target's answer.
		failed := up.g.m.Name
		if upstreamFailed(err) {
			gw.abandon(up)
		}
		done()
		first := err
		var left string
		up, done, left, err = gw.choose(ctx, id, u, domain, map[string]bool{failed: true})
		if left != "" {
			moved = left
		}
		if err != nil {
			return nil, nil, nil, "", rather(first, err)
		}
		if conn, err = gw.connect(ctx, up, target); err != nil {
			done()
			return nil, nil, nil, "", err
		}
	} else if err != nil {
		done()
		return nil, nil, nil, "", err
	}
	return conn, up, done, moved, nil
}

// connect opens a CONNECT tunnel to target through the upstream, with its
// credentials.
func (gw *Gateway) connect(ctx context.Context, up *upstream, target string) (net.Conn, error) {
	conn, err := gw.reach(up).Dial(ctx, "tcp", up.url.Load().Host, gw.DialTimeout)
	if errors.Is(err, reach.ErrRefused) {
		return nil, gw.refusedAddress(up, err)
	}
	if err != nil {
		gw.Metrics.UpstreamErrors.WithLabelValues("dial").Inc()
		return nil, &gwError{code: http.StatusBadGateway, reason: reasonUpstreamUnavailable, msg: fmt.Sprintf("upstream proxy %s does not answer", up.g.m.Name), dial: true}
	}
	_ = conn.SetDeadline(time.Now().Add(gw.DialTimeout))
	u := up.url.Load()
	pass, _ := u.User.Password()
	auth := base64.StdEncoding.EncodeToString([]byte(u.User.Username() + ":" + pass))
	if _, err := fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", target, target, auth); err != nil {
		_ = conn.Close()
		gw.Metrics.UpstreamErrors.WithLabelValues("handshake").Inc()
		return nil, &gwError{code: http.StatusBadGateway, reason: reasonUpstreamUnavailable, msg: fmt.Sprintf("upstream proxy %s broke off the CONNECT handshake", up.g.m.Name)}
	}
	br := bufio.NewReader(conn)
	rsp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		_ = conn.Close()
		gw.Metrics.UpstreamErrors.WithLabelValues("handshake").Inc()
		return nil, &gwError{code: http.StatusBadGateway, reason: reasonUpstreamUnavailable, msg: fmt.Sprintf("upstream proxy %s broke off the CONNECT handshake", up.g.m.Name)}
	}
	_ = rsp.Body.Close()
	if rsp.StatusCode != http.StatusOK {
		_ = conn.Close()
		gw.Metrics.UpstreamErrors.WithLabelValues("status").Inc()
		code := http.StatusBadGateway
		if rsp.StatusCode == http.StatusForbidden {
			// The upstream's destination policy refused the target.
			code = http.StatusForbidden
		}
		return nil, &gwError{code: code, reason: reasonUpstreamRefused, msg: fmt.Sprintf("upstream proxy %s answered %s to CONNECT %s", up.g.m.Name, rsp.Status, target)}
	}
	_ = conn.SetDeadline(time.Time{})
	if br.Buffered() > 0 {
		return &bufferedConn{Conn: conn, r: br}, nil
	}
	return conn, nil
}

// refusedAddress is the refusal of an upstream published at an address its
// kind does not justify (an External proxy pointed at the metadata server
// or an internal service): never dialed, and logged for the platform.
func (gw *Gateway) refusedAddress(up *upstream, err error) *gwError {
	gw.Metrics.UpstreamErrors.WithLabelValues("address").Inc()
	gw.Server.Log.Info("Refusing to dial a proxy at an address its kind does not justify", "proxy", up.g.m.Namespace+"/"+up.g.m.Name, "error", err)
	return &gwError{code: http.StatusBadGateway, reason: reasonUpstreamAddressRefused, dial: true,
		msg: fmt.Sprintf("upstream proxy %s is published at an address the gateway does not dial for its kind (link-local or metadata, loopback, or private where its tenant chose it); the gateway's log names it", up.g.m.Name)}
}

// bufferedConn reads what the handshake's reader buffered first.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the connection beneath, as splice expects.
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// setEgressHeaders names, on a plain answer, the proxy and egress IP it
// came through, and the proxy a loose session left for it.
func setEgressHeaders(h http.Header, up *upstream, moved string) {
	h.Set("X-Egress-Proxy", up.g.m.Name)
	if up.g.m.EgressIP != "" {
		h.Set("X-Egress-IP", up.g.m.EgressIP)
	}
	if moved != "" {
		h.Set("X-Egress-Session-Moved", moved)
	}
}

// egressHeaders are the CONNECT answer's headers that name the proxy and
// egress IP a tunnel leaves through, and the proxy a loose session left
// for it; each line ends with CRLF.
func egressHeaders(up *upstream, moved string) string {
	h := "X-Egress-Proxy: " + up.g.m.Name + "\r\n"
	// Written raw: only an address, never what a status could smuggle in.
	if ip, err := netip.ParseAddr(up.g.m.EgressIP); err == nil && ip.Zone() == "" {
		h += "X-Egress-IP: " + ip.String() + "\r\n"
	}
	if moved != "" {
		h += "X-Egress-Session-Moved: " + moved + "\r\n"
	}
	return h
}

// splice copies both ways between the raw connections (TCP to TCP, the
// kernel's splice(2) moves the bytes), half-closing each direction as it
// ends. A tunnel that moves no data either way for idle is closed, one
// whose reader stopped reading too; any data either way starts the wait
// again, so a long download with a silent upload, or a slow event stream,
// stays open. What moved is read from the kernel's own account of each
// socket (TCP_INFO), which costs the copy nothing.
func splice(a, b net.Conn, idle time.Duration, m *metrics.Gateway) {
	done := make(chan struct{})
	go watchIdle(a, b, idle, done, m)
	var wg sync.WaitGroup
	cp := func(dst, src net.Conn, dir string) {
		defer wg.Done()
		n, _ := io.Copy(dst, src)
		m.Bytes.WithLabelValues(dir).Add(float64(n))
		if c, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = c.CloseWrite()
		} else {
			_ = dst.Close()
		}
	}
	wg.Add(2)
	go cp(b, a, "up")
	go cp(a, b, "down")
	wg.Wait()
	close(done)
}

// watchIdle closes a and b once neither has moved data for idle, until
// done; it judges by the connections whose socket can say (TCP), and
// closes nothing when neither can.
func watchIdle(a, b net.Conn, idle time.Duration, done <-chan struct{}, m *metrics.Gateway) {
	every := min(max(idle/4, 10*time.Millisecond), 15*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		quiet, known := time.Duration(1<<63-1), false
		for _, c := range []net.Conn{a, b} {
			if q, ok := quietFor(c); ok {
				quiet, known = min(quiet, q), true
			}
		}
		if known && quiet >= idle {
			m.IdleTunnels.Inc()
			_ = a.Close()
			_ = b.Close()
			return
		}
	}
}

// hopHeaders are not forwarded (RFC 9110 7.6.1), nor the gateway's own
// Proxy-Authorization.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// dropHopHeaders removes the hop-by-hop headers, and those the
// Connection header names (RFC 9110 7.6.1).
func dropHopHeaders(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			if name = textproto.TrimString(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// forward serves a plain HTTP request through the upstream's absolute-URI
// mode (retried once on another proxy when the upstream cannot be
// reached), and names the proxy in X-Egress-Proxy and X-Egress-IP.
func (gw *Gateway) forward(w http.ResponseWriter, r *http.Request, id *auth.Identity, u GatewayUser, domain string, up *upstream, done func(), moved string) {
	out := r.Clone(r.Context())
	out.RequestURI = ""
	dropHopHeaders(out.Header)
	if r.Body != nil && r.ContentLength == 0 {
		out.Body = nil
	}
	send := func(up *upstream) (*http.Response, error) {
		ctx := context.WithValue(context.WithValue(r.Context(), upstreamKey{}, up.url.Load()), reachKey{}, gw.reach(up))
		rsp, err := gw.transport.RoundTrip(out.WithContext(ctx))
		if errors.Is(err, reach.ErrRefused) {
			return nil, gw.refusedAddress(up, err)
		}
		if err != nil {
			gw.Metrics.UpstreamErrors.WithLabelValues("dial").Inc()
		}
		return rsp, err
	}
	name := up.g.m.Name
	rsp, err := send(up)
	// Retried only when the upstream could not be reached: the request
	// never left, so no origin sees it twice; and only without a body,
	// which the first try has consumed.
	if err != nil && (unreached(err) || upstreamFailed(err)) && out.Body == nil {
		var op *net.OpError
		if (errors.As(err, &op) && op.Op == "dial") || upstreamFailed(err) {
			gw.abandon(up)
		}
		done()
		first := err
		var left string
		up, done, left, err = gw.choose(r.Context(), id, u, domain, map[string]bool{name: true})
		if left != "" {
			moved = left
		}
		if err != nil {
			gw.refuse(w, rather(first, err))
			return
		}
		name = up.g.m.Name
		rsp, err = send(up)
	}
	defer done()
	var ge *gwError
	if errors.As(err, &ge) {
		gw.refuse(w, ge)
		return
	}
	if err != nil {
		gw.refuse(w, &gwError{code: http.StatusBadGateway, reason: reasonUpstreamUnavailable, msg: fmt.Sprintf("upstream proxy %s did not answer", name)})
		return
	}
	if rsp.StatusCode == http.StatusProxyAuthRequired {
		// The fleet's credentials, not the crawler's, were refused.
		_ = rsp.Body.Close()
		gw.Metrics.UpstreamErrors.WithLabelValues("status").Inc()
		gw.refuse(w, &gwError{code: http.StatusBadGateway, reason: reasonUpstreamRefused, msg: fmt.Sprintf("upstream proxy %s refused the fleet's credentials", name)})
		return
	}
	defer rsp.Body.Close() //nolint:errcheck // A response body.
	gw.Server.spread.record(u.Namespace+"/"+u.Fleet, up.g.m.Name, gw.Server.now())
	dropHopHeaders(rsp.Header)
	for k, vs := range rsp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	setEgressHeaders(w.Header(), up, moved)
	w.WriteHeader(rsp.StatusCode)
	// Each read is passed on at once: a stream (server-sent events, a
	// long poll) reaches the crawler as the origin sends it.
	n, _ := io.Copy(flushWriter{w: w, rc: http.NewResponseController(w)}, rsp.Body)
	gw.Metrics.Bytes.WithLabelValues("down").Add(float64(n))
}

// flushWriter flushes after every write.
type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}
