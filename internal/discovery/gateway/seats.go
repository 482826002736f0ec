package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// Run renews the leases in use and releases idle sessions until ctx ends,
// then releases every lease.
func (gw *Gateway[S]) Run(ctx context.Context) {
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
func (gw *Gateway[S]) tend(ctx context.Context) {
	now := gw.Server.Allocator().Time()
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
		if up.g.Grant.ExpiresAt.Sub(now) < up.g.Grant.TTL/2 {
			renew = append(renew, renewal{up: up, id: up.g.Grant.ID, user: up.id.User, ttl: up.ttl})
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
			g, err = gw.Server.Store().Renew(ctx, r.id, r.user, ttl)
		}
		gw.mu.Lock()
		if err != nil && !lost(err) {
			// The API server failing: tried again at the next tick, while
			// the lease lives.
			gw.Server.Allocator().Log.Debug("Cannot renew a gateway lease yet", "proxy", r.up.g.Member.Name, "error", err)
		} else if err != nil {
			gw.Server.Allocator().Log.Info("Cannot renew a gateway lease", "proxy", r.up.g.Member.Name, "error", err)
			delete(gw.live, r.up)
			r.up.retired = true
			for _, s := range gw.sessions {
				if s.up == r.up {
					s.up, s.lost = nil, r.up.g.Member.Name
				}
			}
		} else if gw.live[r.up] {
			r.up.g.Grant = g
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
func (gw *Gateway[S]) idleSeatsLocked(now time.Time) []*upstream {
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
func (gw *Gateway[S]) renewalTTL(ctx context.Context, up *upstream, ttl time.Duration) (time.Duration, error) {
	p := &v1alpha1.Proxy{}
	if err := gw.Server.Allocator().Catalog.Cache.Get(ctx, types.NamespacedName{Namespace: up.g.Member.Namespace, Name: up.g.Member.Name}, p); err != nil {
		if kerrors.IsNotFound(err) {
			return 0, errors.Wrapf(errProxyGone, "proxy %s", up.g.Member.Name)
		}
		return ttl, nil
	}
	since := catalog.DrainSince(p)
	if since.IsZero() {
		return ttl, nil
	}
	_, maxTTL, err := gw.Server.Allocator().Catalog.TTLs(ctx, up.g.Member.Namespace, up.g.Member.Fleet)
	if err != nil {
		return ttl, nil //nolint:nilerr // Renewed as it was; the next round reads the TTLs again.
	}
	return gw.Server.Allocator().DrainedTTL(p.Name, since, maxTTL, ttl)
}

// retireLocked marks up as taking no new connection and returns it when
// its lease is to go back now (no connection uses it).
func (gw *Gateway[S]) retireLocked(up *upstream) *upstream {
	up.retired = true
	if up.refs == 0 && gw.live[up] {
		delete(gw.live, up)
		return up
	}
	return nil
}

// unref is a connection done with up: the lease goes back when up is
// retired and this was its last connection.
func (gw *Gateway[S]) unref(up *upstream) {
	gw.mu.Lock()
	if up.refs--; up.refs == 0 {
		up.idle = gw.Server.Allocator().Time()
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
func (gw *Gateway[S]) abandon(up *upstream) {
	gw.mu.Lock()
	back := gw.retireLocked(up)
	gw.mu.Unlock()
	if back != nil {
		gw.release(context.Background(), back)
	}
}

func (gw *Gateway[S]) releaseAll() {
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

func (gw *Gateway[S]) release(ctx context.Context, up *upstream) {
	if up.session {
		// Another replica may use it still: the last one deletes it.
		if ok, err := gw.Server.Store().Leave(context.WithoutCancel(ctx), up.g.Grant.ID, up.id.User, gw.Replica, !up.adopted); ok && err == nil {
			gw.Server.Allocator().Released(up.g.Grant.Namespace, up.g.Grant.Fleet, up.id.User, up.g.Grant.ID)
		}
		return
	}
	if err := gw.Server.Store().Release(context.WithoutCancel(ctx), up.g.Grant.ID, up.id.User); err == nil {
		gw.Server.Allocator().Released(up.g.Grant.Namespace, up.g.Grant.Fleet, up.id.User, up.g.Grant.ID)
	}
}

// admit counts a connection to a fleet of namespace ns against the
// replica's, the namespace's and the caller's bounds, and returns its end:
// one tenant's callers cannot take every connection of the replica.
func (gw *Gateway[S]) admit(id *auth.Identity, ns string) (func(), error) {
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

// seat gives a connection without a session the seat of the proxy the
// rotation strategy (the username's, else the fleet's) chooses among the
// fleet's that serve domain, leasing one there when it has none (rotate);
// failing that, the least loaded of the replica's seats for its fleet and
// zone, or one leased anywhere (pickSeat). The connection counts against
// the caller's quota.
func (gw *Gateway[S]) seat(ctx context.Context, id *auth.Identity, u User, domain string, exclude map[string]bool) (*upstream, func(), error) {
	p, err := gw.Server.Allocator().Catalog.Policy(ctx, u.Namespace, u.Fleet)
	if err != nil {
		return nil, nil, err
	}
	leave, err := gw.Server.Allocator().HoldConn(ctx, u.Namespace, u.Fleet, id, p)
	if err != nil {
		return nil, nil, err
	}
	key := u.Namespace + "/" + u.Fleet + "\x00" + u.Zone
	strategy := u.Rotate
	if strategy == "" {
		strategy = p.Rotation
	}
	rule := gw.Server.Allocator().PacingFor(ctx, u.Namespace, u.Fleet, p, domain)
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
		if f, err := gw.Server.Allocator().Catalog.Members(ctx, u.Namespace, u.Fleet); err == nil {
			paced := gw.Server.Allocator().PacedAmong(u.Namespace+"/"+u.Fleet, rule, f.Items, gw.Server.Allocator().Time())
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
func (gw *Gateway[S]) pickSeat(ctx context.Context, key string, id *auth.Identity, u User, domain string, exclude map[string]bool) (*upstream, error) {
	for {
		best, held := gw.leastLoaded(ctx, key, u.Zone, domain, exclude)
		gw.mu.Lock()
		if best != nil && best.retired {
			gw.mu.Unlock()
			return nil, nil
		}
		take, busy := gw.taking[key]
		hold := gw.Server.Allocator().Time().Before(gw.seatHold[key])
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
				if take.err != nil && !take.gone {
					return nil, take.err
				}
				// Leased, or the taker's own connection went (its wait cut
				// short, not this one's): look again.
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
		up, err := gw.lease(ctx, id, u, domain, SeatHolder(gw.Replica), held, true, best == nil, "")
		gw.mu.Lock()
		delete(gw.taking, key)
		take.err, take.gone = err, ctx.Err() != nil
		close(take.done)
		switch {
		case err == nil:
			gw.seats[key] = append(gw.seats[key], up)
			up.refs++
			gw.mu.Unlock()
			return up, nil
		case best != nil && !best.retired:
			gw.seatHold[key] = gw.Server.Allocator().Time().Add(time.Second)
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
func (gw *Gateway[S]) leastLoaded(ctx context.Context, key, zone, domain string, exclude map[string]bool) (*upstream, map[string]bool) {
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
		held[up.g.Member.Name] = true
		if exclude[up.g.Member.Name] {
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
func (gw *Gateway[S]) lease(ctx context.Context, id *auth.Identity, u User, domain, holder string, exclude map[string]bool, seat, wait bool, only string) (*upstream, error) {
	req := &apiv1.AcquireRequest{Fleet: u.Namespace + "/" + u.Fleet, Holder: holder, Zone: u.Zone, Domain: domain}
	a, err := gw.Server.Allocator().AcquisitionOf(ctx, req, u.Namespace, u.Fleet, id)
	if err != nil {
		return nil, err
	}
	a.Exclude, a.Only = exclude, only
	if seat {
		a.ID, a.Seat, a.Caller = gw.seatID, true, id
		if !wait {
			a.Wait = 0
		}
	}
	g, err := gw.Server.Allocator().GrantFor(ctx, a)
	if err != nil {
		return nil, err
	}
	raw, err := gw.Server.Allocator().Catalog.ProxyURL(ctx, g.Member)
	if err == nil {
		var pu *url.URL
		if pu, err = url.Parse(raw); err == nil {
			gw.Server.Allocator().Metrics.Acquisitions.Inc()
			up := &upstream{id: a.ID, g: g, ttl: a.TTL, session: !seat, since: g.Grant.AcquiredAt}
			if up.since.IsZero() {
				up.since = gw.Server.Allocator().Time()
			}
			up.url.Store(pu)
			gw.mu.Lock()
			gw.live[up] = true
			gw.mu.Unlock()
			return up, nil
		}
	}
	// A session's lease may be shared already: it leaves as one.
	gw.release(ctx, &upstream{id: a.ID, g: g, session: !seat})
	return nil, err
}
