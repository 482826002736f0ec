package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
)

// session is choose for a connection of a session.
func (gw *Gateway[S]) session(ctx context.Context, id *auth.Identity, u User, domain string, exclude map[string]bool) (*upstream, func(), string, error) {
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
		s.idle = gw.Server.Allocator().Time()
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
	if err := gw.paceSession(ctx, u, domain, &cur.g.Member); err != nil {
		gw.unref(cur)
		leave()
		return nil, nil, "", err
	}
	moved := ""
	if gone != "" && gone != cur.g.Member.Name {
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
func (gw *Gateway[S]) current(ctx context.Context, s *gwSession, u User, domain string, exclude map[string]bool) (cur *upstream, gone, ended, notHere string) {
	gw.mu.Lock()
	cur = s.up
	if cur != nil && cur.retired {
		// Its lease was lost, or its proxy stopped answering.
		gone, s.up, cur = cur.g.Member.Name, nil, nil
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
	if cur != nil && u.Lifetime > 0 && !gw.Server.Allocator().Time().Before(cur.since.Add(u.Lifetime)) {
		// The session's lifetime is over: it starts again, on another
		// proxy when one serves.
		ended = cur.g.Member.Name
		gw.Metrics.SessionsEnded.Inc()
		leaveIt()
		return nil, "", ended, ""
	}
	if cur == nil {
		return nil, gone, "", ""
	}
	if exclude[cur.g.Member.Name] {
		gone = cur.g.Member.Name
		leaveIt()
		return nil, gone, "", ""
	}
	if ok, forGood := gw.check(ctx, cur, u.Zone, domain); !ok {
		if u.Strict && !forGood {
			return nil, "", "", cur.g.Member.Name
		}
		gone = cur.g.Member.Name
		leaveIt()
	}
	return cur, gone, "", ""
}

// resume gives a session an upstream: the lease another replica serves it
// on, else a new lease, off the proxy whose lifetime for it just ended
// (ended) when another serves.
func (gw *Gateway[S]) resume(ctx context.Context, id *auth.Identity, u User, domain string, exclude map[string]bool, ended string) (*upstream, error) {
	// Another replica may serve the session already (on a proxy that
	// serves this connection too).
	if cur := gw.adopt(ctx, id, u, domain, exclude); cur != nil {
		if cur.g.Member.Name != ended && (u.Lifetime == 0 || gw.Server.Allocator().Time().Before(cur.since.Add(u.Lifetime))) {
			return cur, nil
		}
		// Its lifetime is over there too.
		if ended == "" {
			ended = cur.g.Member.Name
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
	up, err := gw.lease(ctx, id, u, domain, SessionHolder(u.Session), avoid, false, true, "")
	if err != nil && ended != "" && allocator.Refusal(err) {
		// No other proxy: the session starts again on the same one.
		up, err = gw.lease(ctx, id, u, domain, SessionHolder(u.Session), exclude, false, true, "")
	}
	return up, err
}

// adopt takes up the lease another replica granted the session, when its
// proxy serves the connection, so that a session whose connections reach
// several replicas keeps one proxy. The write that renews the lease adds
// this replica to those using it: each renews it while it uses it and
// takes itself off when done, and the last deletes it.
func (gw *Gateway[S]) adopt(ctx context.Context, id *auth.Identity, u User, domain string, exclude map[string]bool) *upstream {
	g, err := gw.Server.Store().HeldBy(ctx, u.Namespace, u.Fleet, SessionHolder(u.Session), id.User)
	if err != nil || exclude[g.Proxy] || g.Fleet != u.Fleet || gw.holds(g.ID) {
		return nil
	}
	p := &v1alpha1.Proxy{}
	if err := gw.Server.Allocator().Catalog.Cache.Get(ctx, types.NamespacedName{Namespace: g.Namespace, Name: g.Proxy}, p); err != nil {
		return nil
	}
	ttl, _, err := gw.Server.Allocator().Catalog.TTLs(ctx, u.Namespace, u.Fleet)
	if err != nil {
		return nil
	}
	up := &upstream{id: id, g: &allocator.Granted{Grant: g, Member: catalog.ToMember(p)}, ttl: ttl, session: true, adopted: true, since: g.AcquiredAt}
	if !gw.serves(ctx, up, u.Zone, domain) || up.url.Load() == nil {
		return nil
	}
	if ttl, err = gw.renewalTTL(ctx, up, ttl); err != nil {
		return nil
	}
	shared, err := gw.Server.Store().Share(ctx, g.ID, id.User, ttl, gw.Replica)
	if err != nil {
		return nil
	}
	up.g.Grant = shared
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
func (gw *Gateway[S]) holds(id string) bool {
	gw.mu.Lock()
	defer gw.mu.Unlock()
	for up := range gw.live {
		if up.g.Grant.ID == id {
			return true
		}
	}
	return false
}

// serves reports whether up's proxy, as the cache shows it now, may take
// a new connection for zone and domain: it serves (healthy, not being
// replaced, taking the credentials discovery hands out), is of the zone
// and not banned for the domain. It refreshes up's credentials.
func (gw *Gateway[S]) serves(ctx context.Context, up *upstream, zone, domain string) bool {
	ok, _ := gw.check(ctx, up, zone, domain)
	return ok
}

// check is serves, and gone when the proxy serves no connection at all
// any more (whatever the zone or domain).
func (gw *Gateway[S]) check(ctx context.Context, up *upstream, zone, domain string) (ok, gone bool) {
	p := &v1alpha1.Proxy{}
	if err := gw.Server.Allocator().Catalog.Cache.Get(ctx, types.NamespacedName{Namespace: up.g.Member.Namespace, Name: up.g.Member.Name}, p); err != nil {
		return false, kerrors.IsNotFound(err)
	}
	m := catalog.ToMember(p)
	if !m.Serving() || m.Fleet != up.g.Member.Fleet {
		return false, true
	}
	admit, err := gw.Server.Allocator().Admits(ctx, []catalog.Member{m}, zone, nil, domain)
	if err != nil || !admit(&m) {
		return false, false
	}
	// The credentials the proxy takes now, for connections from here on.
	if raw, err := gw.Server.Allocator().Catalog.ProxyURL(ctx, m); err == nil {
		if pu, err := url.Parse(raw); err == nil {
			up.url.Store(pu)
		}
	}
	return true, false
}
