// Package fake is an in-memory allocator.Store: the slots, sticky keys and
// bans of fleets, always current (no cache to lag), so that the
// allocator's rules are tested without an API server, as
// internal/backend/fake stands in for a backend. What the real store
// guards against (a stale cache, replicas racing for one slot) is
// lease.Store's to test; this one is exact by construction.
//
// One file: fake.go, the Store and its helpers for tests.
package fake

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// Store keeps leases and bans in memory. The zero value is empty and
// ready; Now, when set, is its clock.
type Store struct {
	Now func() time.Time
	// BanTakes, when set, is how long a ban's write takes, as an API
	// call does: callers racing on a bound overlap.
	BanTakes time.Duration
	// OnBan, when set, is told of each ban's write as it starts.
	OnBan func(proxy string)

	mu     sync.Mutex
	seq    int
	slots  map[string]*slot // by lease ID
	sticky map[string]string
	bans   map[string]ban // by fleet key, proxy and lower-case domain
	// ips are the ban histories of egress IPs, by fleet key and IP.
	ips map[string][]lease.IPBan
	// Writes counts the grants and bans written.
	Writes int
}

type slot struct {
	ns, fleet, proxy     string
	n                    int
	holder, identity, id string
	acquired, expires    time.Time
}

type ban struct {
	ns, fleet, proxy, domain, identity string
	until                              time.Time
	answer                             bool
	replica                            string
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// live are the unexpired slots of a fleet, by proxy; s.mu is held.
func (s *Store) live(ns, fleet string, now time.Time) map[string][]*slot {
	out := map[string][]*slot{}
	for _, sl := range s.slots {
		if sl.ns == ns && sl.fleet == fleet && now.Before(sl.expires) {
			out[sl.proxy] = append(out[sl.proxy], sl)
		}
	}
	return out
}

// object is a slot as a Lease object, as much of it as the allocator
// reads (its expiry).
func (sl *slot) object() *coordv1.Lease {
	secs := int32(sl.expires.Sub(sl.acquired) / time.Second)
	renew := metav1.NewMicroTime(sl.acquired)
	holder := sl.holder
	return &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: sl.ns, Name: lease.SlotName(sl.proxy, sl.n), UID: types.UID(sl.id), Labels: map[string]string{fleetv1alpha1.LabelFleet: sl.fleet}},
		Spec:       coordv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &renew, AcquireTime: &renew, LeaseDurationSeconds: &secs},
	}
}

func (s *Store) slotsOf(ns, fleet string, only map[string]bool) map[string][]*coordv1.Lease {
	out := map[string][]*coordv1.Lease{}
	for p, ss := range s.live(ns, fleet, s.now()) {
		if only != nil && !only[p] {
			continue
		}
		for _, sl := range ss {
			out[p] = append(out[p], sl.object())
		}
	}
	return out
}

// Slots returns a fleet's live slots by proxy.
func (s *Store) Slots(_ context.Context, namespace, fleet string) (map[string][]*coordv1.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slotsOf(namespace, fleet, nil), nil
}

// View returns a fleet's live slots; AcquireIn reads the store itself,
// not the view, which is never stale here.
func (s *Store) View(_ context.Context, namespace, fleet string) (*lease.SlotView, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &lease.SlotView{Live: s.slotsOf(namespace, fleet, nil)}, nil
}

// ViewOf returns the live slots of some of a fleet's proxies.
func (s *Store) ViewOf(_ context.Context, namespace, fleet string, proxies []string) (*lease.SlotView, error) {
	only := map[string]bool{}
	for _, p := range proxies {
		only[p] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return &lease.SlotView{Live: s.slotsOf(namespace, fleet, only)}, nil
}

// AcquireIn takes the first free slot of the first candidate that has
// one, in their order; lease.ErrUnavailable when none has.
func (s *Store) AcquireIn(_ context.Context, _ *lease.SlotView, cands []lease.Candidate, r lease.Request) (*lease.Grant, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for _, c := range cands {
		taken := map[int]bool{}
		for _, sl := range s.live(c.Namespace, c.Fleet, now)[c.Proxy] {
			taken[sl.n] = true
		}
		for n := range c.MaxLeases {
			if taken[n] {
				continue
			}
			s.seq++
			sl := &slot{ns: c.Namespace, fleet: c.Fleet, proxy: c.Proxy, n: n, holder: r.Holder, identity: r.Identity, acquired: now, expires: now.Add(r.TTL)}
			sl.id = fmt.Sprintf("%s/%s/uid-%d", c.Namespace, lease.SlotName(c.Proxy, n), s.seq)
			if s.slots == nil {
				s.slots = map[string]*slot{}
			}
			s.slots[sl.id] = sl
			if r.StickyKey != "" {
				if s.sticky == nil {
					s.sticky = map[string]string{}
				}
				s.sticky[c.Namespace+"/"+c.Fleet+"/"+r.StickyKey] = c.Proxy
			}
			s.Writes++
			return &lease.Grant{ID: sl.id, Namespace: c.Namespace, Fleet: c.Fleet, Proxy: c.Proxy, Slot: n, Holder: r.Holder, ExpiresAt: sl.expires, TTL: r.TTL, AcquiredAt: now}, nil
		}
	}
	return nil, lease.ErrUnavailable
}

// Release gives a lease back; lease.ErrNotYours when identity does not
// hold it, lease.ErrNotFound when it is gone.
func (s *Store) Release(_ context.Context, id, identity string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sl, ok := s.slots[id]
	switch {
	case !ok || !s.now().Before(sl.expires):
		return lease.ErrNotFound
	case sl.identity != identity:
		return lease.ErrNotYours
	}
	delete(s.slots, id)
	return nil
}

// Sticky is the proxy the sticky key was last granted on.
func (s *Store) Sticky(_ context.Context, namespace, fleet, key string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sticky[namespace+"/"+fleet+"/"+key], nil
}

// StickyIn is Sticky.
func (s *Store) StickyIn(_ *lease.SlotView, namespace, fleet, key string) string {
	p, _ := s.Sticky(context.Background(), namespace, fleet, key)
	return p
}

// Held returns the IDs of the live leases of a fleet granted to identity.
func (s *Store) Held(_ context.Context, namespace, fleet, identity string) (map[string]bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]bool{}
	for _, ss := range s.live(namespace, fleet, s.now()) {
		for _, sl := range ss {
			if sl.identity == identity {
				out[sl.id] = true
			}
		}
	}
	return out, nil
}

func banKey(ns, fleet, proxy, domain string) string {
	return ns + "/" + fleet + "/" + proxy + "/" + strings.ToLower(domain)
}

// Ban bans a proxy of a fleet for domain for cooldown (extending a live
// ban).
func (s *Store) Ban(ctx context.Context, namespace, fleet, proxy, domain string, cooldown time.Duration, identity string) error {
	return s.BanFromAnswer(ctx, namespace, fleet, proxy, domain, cooldown, identity, 0, "")
}

// BanFromAnswer is Ban for an origin's answer with status (0: a report).
// As the store does, extending a live ban keeps who recorded it.
func (s *Store) BanFromAnswer(_ context.Context, namespace, fleet, proxy, domain string, cooldown time.Duration, identity string, status int, replica string) error {
	if s.OnBan != nil {
		s.OnBan(proxy)
	}
	time.Sleep(s.BanTakes)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bans == nil {
		s.bans = map[string]ban{}
	}
	k, now := banKey(namespace, fleet, proxy, domain), s.now()
	b, live := s.bans[k]
	if !live || !now.Before(b.until) {
		b = ban{ns: namespace, fleet: fleet, proxy: proxy, domain: strings.ToLower(domain), identity: identity, answer: status != 0, replica: replica}
	}
	b.until = now.Add(cooldown)
	s.bans[k] = b
	s.Writes++
	return nil
}

func (s *Store) liveBans(ns, fleet string) []ban {
	var out []ban
	now := s.now()
	for _, b := range s.bans {
		if b.ns == ns && b.fleet == fleet && now.Before(b.until) {
			out = append(out, b)
		}
	}
	return out
}

// Bans lists a fleet's live bans: proxy name to banned domains.
func (s *Store) Bans(_ context.Context, namespace, fleet string) (map[string][]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]string{}
	for _, b := range s.liveBans(namespace, fleet) {
		out[b.proxy] = append(out[b.proxy], b.domain)
	}
	return out, nil
}

// BannedFor returns the proxies of a fleet with a live ban for domain.
func (s *Store) BannedFor(_ context.Context, namespace, fleet, domain string) (map[string]bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]bool{}
	for _, b := range s.liveBans(namespace, fleet) {
		if b.domain == strings.ToLower(domain) {
			out[b.proxy] = true
		}
	}
	return out, nil
}

// ActiveBans lists a fleet's live bans.
func (s *Store) ActiveBans(_ context.Context, namespace, fleet string) ([]lease.Ban, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []lease.Ban
	for _, b := range s.liveBans(namespace, fleet) {
		out = append(out, lease.Ban{Proxy: b.proxy, Domain: b.domain, Identity: b.identity, FromAnswer: b.answer, Replica: b.replica})
	}
	return out, nil
}

// RecordIPBan adds a ban to the history of ip in the fleet.
func (s *Store) RecordIPBan(_ context.Context, namespace, fleet, _, ip, domain string, cooldown time.Duration) error {
	return s.recordIPBan(namespace, fleet, ip, domain, cooldown, false)
}

// RecordAnswerIPBan is RecordIPBan for a ban from an origin's answer.
func (s *Store) RecordAnswerIPBan(_ context.Context, namespace, fleet, _, ip, domain string, cooldown time.Duration) error {
	return s.recordIPBan(namespace, fleet, ip, domain, cooldown, true)
}

func (s *Store) recordIPBan(namespace, fleet, ip, domain string, cooldown time.Duration, answer bool) error {
	if ip = lease.CanonicalIP(ip); ip == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ips == nil {
		s.ips = map[string][]lease.IPBan{}
	}
	now := s.now()
	k := namespace + "/" + fleet + "/" + ip
	s.ips[k] = append(s.ips[k], lease.IPBan{Domain: strings.ToLower(domain), At: now.Unix(), Until: now.Add(cooldown).Unix(), Answer: answer})
	return nil
}

// LiftIPBan ends the live bans of domain in ip's history.
func (s *Store) LiftIPBan(_ context.Context, namespace, fleet, ip, domain string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.ips[namespace+"/"+fleet+"/"+lease.CanonicalIP(ip)]
	now := s.now().Unix()
	for i := range h {
		if h[i].Domain == strings.ToLower(domain) && h[i].Until > now {
			h[i].Until = now
		}
	}
	return nil
}

// IPHistories are the ban histories of the fleet's egress IPs.
func (s *Store) IPHistories(_ context.Context, namespace, fleet string) (map[string][]lease.IPBan, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]lease.IPBan{}
	for k, h := range s.ips {
		if ip, ok := strings.CutPrefix(k, namespace+"/"+fleet+"/"); ok && !strings.Contains(ip, "/") {
			out[ip] = append([]lease.IPBan(nil), h...)
		}
	}
	return out, nil
}

var _ allocator.Store = &Store{}
