package allocator

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
)

// serviceAccountPrefix begins a ServiceAccount's user name.
const serviceAccountPrefix = "system:serviceaccount:"

// QuotaOf returns the lease bound of an identity in a fleet and the field
// it comes from; false when there is none. A ServiceAccount's or a static
// token's override wins over a group's; of several groups', the largest.
func QuotaOf(q *fleetv1alpha1.Quotas, id *auth.Identity) (int, string, bool) {
	if q == nil {
		return 0, "", false
	}
	group, groupFrom := -1, ""
	for i, o := range q.Overrides {
		from := fmt.Sprintf("spec.leases.quotas.overrides[%d]", i)
		switch {
		case o.ServiceAccount != "" && id.User == serviceAccountPrefix+strings.Replace(o.ServiceAccount, "/", ":", 1):
			return int(o.MaxLeases), from + " (serviceAccount " + o.ServiceAccount + ")", true
		case o.StaticToken != "" && id.User == auth.StaticPrefix+o.StaticToken:
			return int(o.MaxLeases), from + " (staticToken " + o.StaticToken + ")", true
		case o.Group != "" && int(o.MaxLeases) > group && hasGroup(id, o.Group):
			group, groupFrom = int(o.MaxLeases), from+" (group "+o.Group+")"
		}
	}
	if group >= 0 {
		return group, groupFrom, true
	}
	if q.MaxLeasesPerIdentity != nil && *q.MaxLeasesPerIdentity > 0 {
		return int(*q.MaxLeasesPerIdentity), "spec.leases.quotas.maxLeasesPerIdentity", true
	}
	return 0, "", false
}

func hasGroup(id *auth.Identity, g string) bool {
	for _, x := range id.Groups {
		if x == g {
			return true
		}
	}
	return false
}

// quotaBook counts, per fleet and identity, what the cache may not show
// yet: acquisitions in flight on this replica, and the grants it made
// lately. With the leases the cache shows, that bounds an identity's leases
// on one replica exactly; replicas granting at the same moment may each
// grant up to the bound, as their caches catch up within a second.
type quotaBook struct {
	mu      sync.Mutex
	pending map[string]int
	// conns are the gateway connections without a session open through
	// this replica, which count one each.
	conns map[string]int
	// connClosed holds, per key of conns, a channel closed (and dropped)
	// when a connection of that key ends: what a connection at its
	// caller's quota waits for. Only a waiter makes one, and only an end
	// of its own caller's connections wakes it.
	connClosed map[string]chan struct{}
	recent     map[string]map[string]time.Time // key -> lease ID -> granted at
	// gone are the leases released through this replica lately, which its
	// cache may still show: their holder may take another at once.
	gone map[string]time.Time // lease ID -> released at
	// goneSince counts releases since gone was last pruned.
	goneSince int
}

// recentGrantTime is how long a grant this replica made is counted besides
// its cache: longer than the cache takes to show it.
const recentGrantTime = 10 * time.Second

func quotaKey(ns, fleet, identity string) string { return ns + "/" + fleet + "\x00" + identity }

// Usage is how many leases of the fleet id holds, or is being granted on
// this replica.
func (s *Allocator) Usage(ctx context.Context, ns, fleet string, id *auth.Identity) (int, error) {
	held, err := s.Leases.Held(ctx, ns, fleet, id.User)
	if err != nil {
		return 0, err
	}
	s.quotas.mu.Lock()
	defer s.quotas.mu.Unlock()
	return s.quotas.count(quotaKey(ns, fleet, id.User), held, s.Now()), nil
}

// count adds to held what key has pending or was granted lately and held
// does not show; b.mu is held.
func (b *quotaBook) count(key string, held map[string]bool, now time.Time) int {
	n := b.pending[key] + b.conns[key]
	for id := range held {
		if at, ok := b.gone[id]; !ok || now.Sub(at) >= recentGrantTime {
			n++
		}
	}
	for id, at := range b.recent[key] {
		switch {
		case now.Sub(at) >= recentGrantTime || now.Before(at):
			delete(b.recent[key], id)
		case !held[id]:
			n++
		}
	}
	if len(b.recent[key]) == 0 {
		delete(b.recent, key)
	}
	return n
}

// Reserve counts an acquisition against id's quota in the fleet, or
// refuses it (429, QuotaExceeded) when id holds its quota already. done
// ends the reservation, recording the grant it made, if any.
func (s *Allocator) Reserve(ctx context.Context, ns, fleet string, id *auth.Identity, p *catalog.Policy) (done func(grantID string), err error) {
	quota, from, ok := QuotaOf(p.Quotas, id)
	if !ok {
		return func(string) {}, nil
	}
	held, err := s.Leases.Held(ctx, ns, fleet, id.User)
	if err != nil {
		return nil, err
	}
	key := quotaKey(ns, fleet, id.User)
	b := &s.quotas
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := b.count(key, held, s.Now()); n >= quota {
		return nil, &problem.Error{
			Code: problem.StatusTooManyRequests, Reason: apiv1.ReasonQuotaExceeded, RetryAfter: 5,
			Msg: fmt.Sprintf("%s holds %d leases of fleet %s/%s, its quota of %d (%s): release one first", id.User, n, ns, fleet, quota, from),
		}
	}
	if b.pending == nil {
		b.pending, b.recent = map[string]int{}, map[string]map[string]time.Time{}
	}
	b.pending[key]++
	return func(grantID string) {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.pending[key]--; b.pending[key] <= 0 {
			delete(b.pending, key)
		}
		if grantID == "" {
			return
		}
		if b.recent[key] == nil {
			b.recent[key] = map[string]time.Time{}
		}
		b.recent[key][grantID] = s.Now()
	}, nil
}

// HoldConn counts a gateway connection without a session against id's
// quota in the fleet while it is open, or refuses it (429, QuotaExceeded)
// when id holds its quota already, leases and such connections together.
// Connections are counted by the replica that serves them, and its peers'
// bounds do not see them: with R replicas a caller may hold up to R times
// its quota, less its leases, in connections without a session (the
// Service's ClientIP affinity keeps a caller on one replica). Each
// replica's share is bounded by the quota, and all connections by the
// gateway's per-identity and per-namespace bounds.
//
// A connection that finds the quota taken while the caller has such
// connections open on this replica waits up to ConnQuotaGrace for one to
// end: a crawler fetching page after page opens the next connection a
// moment before the gateway has seen the last one close, and is not
// refused for that.
func (s *Allocator) HoldConn(ctx context.Context, ns, fleet string, id *auth.Identity, p *catalog.Policy) (func(), error) {
	quota, from, bounded := QuotaOf(p.Quotas, id)
	var held map[string]bool
	if bounded {
		var err error
		if held, err = s.Leases.Held(ctx, ns, fleet, id.User); err != nil {
			return nil, err
		}
	}
	key := quotaKey(ns, fleet, id.User)
	b := &s.quotas
	b.mu.Lock()
	defer b.mu.Unlock()
	var grace <-chan time.Time
	for bounded {
		n := b.count(key, held, s.Now())
		if n < quota {
			break
		}
		if b.conns[key] == 0 {
			// Leases alone hold the quota: nothing here will end soon.
			return nil, connQuotaError(id, n, ns, fleet, quota, from)
		}
		if grace == nil {
			t := time.NewTimer(ConnQuotaGrace)
			defer t.Stop()
			grace = t.C
		}
		if b.connClosed == nil {
			b.connClosed = map[string]chan struct{}{}
		}
		closed := b.connClosed[key]
		if closed == nil {
			closed = make(chan struct{})
			b.connClosed[key] = closed
		}
		b.mu.Unlock()
		select {
		case <-closed:
			// Read the caller's leases again: one released meanwhile
			// frees its place too.
			if h, err := s.Leases.Held(ctx, ns, fleet, id.User); err == nil {
				held = h
			}
			b.mu.Lock()
		case <-grace:
			b.mu.Lock()
			return nil, connQuotaError(id, b.count(key, held, s.Now()), ns, fleet, quota, from)
		case <-ctx.Done():
			b.mu.Lock()
			return nil, ctx.Err()
		}
	}
	if b.conns == nil {
		b.conns = map[string]int{}
	}
	b.conns[key]++
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.conns[key]--; b.conns[key] <= 0 {
			delete(b.conns, key)
		}
		if ch := b.connClosed[key]; ch != nil {
			close(ch)
			delete(b.connClosed, key)
		}
	}, nil
}

// ConnQuotaGrace is how long a gateway connection at its caller's quota
// waits for one of the caller's connections on the replica to end.
const ConnQuotaGrace = 2 * time.Second

func connQuotaError(id *auth.Identity, n int, ns, fleet string, quota int, from string) error {
	return &problem.Error{
		Code: problem.StatusTooManyRequests, Reason: apiv1.ReasonQuotaExceeded, RetryAfter: 5,
		Msg: fmt.Sprintf("%s holds %d leases and gateway connections without a session on this replica in fleet %s/%s, its quota of %d (%s): close one first", id.User, n, ns, fleet, quota, from),
	}
}

// Released forgets a grant given back, so that its holder may take
// another at once.
func (s *Allocator) Released(ns, fleet, identity, grantID string) {
	b := &s.quotas
	b.mu.Lock()
	defer b.mu.Unlock()
	key := quotaKey(ns, fleet, identity)
	delete(b.recent[key], grantID)
	if len(b.recent[key]) == 0 {
		delete(b.recent, key)
	}
	now := s.Now()
	if b.gone == nil {
		b.gone = map[string]time.Time{}
	}
	// Forget what the cache shows by now, every 1024 releases: the map
	// holds at most recentGrantTime of them.
	if b.goneSince++; b.goneSince >= 1024 {
		b.goneSince = 0
		for id, at := range b.gone {
			if now.Sub(at) >= recentGrantTime || now.Before(at) {
				delete(b.gone, id)
			}
		}
	}
	b.gone[grantID] = now
}
