package allocator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// DefaultCooldown is a ban's cooldown when the report names none.
const DefaultCooldown = 30 * time.Minute

// recentBanTime is how long a ban this replica recorded is counted
// besides its cache: longer than the cache takes to show it.
const recentBanTime = 10 * time.Second

type recentBan struct {
	ban lease.Ban
	at  time.Time
}

// recentBans returns the bans this replica recorded in the fleet in the
// last recentBanTime that listed does not hold yet, forgetting older ones.
func (s *Allocator) recentBans(key string, listed []lease.Ban) []lease.Ban {
	s.banMu.Lock()
	defer s.banMu.Unlock()
	var out []lease.Ban
	kept := s.bansMade[key][:0]
	for _, r := range s.bansMade[key] {
		if s.now().Sub(r.at) >= recentBanTime {
			continue
		}
		kept = append(kept, r)
		if !slices.ContainsFunc(listed, func(b lease.Ban) bool { return b.Proxy == r.ban.Proxy && strings.EqualFold(b.Domain, r.ban.Domain) }) {
			out = append(out, r.ban)
		}
	}
	if len(kept) == 0 {
		delete(s.bansMade, key)
	} else {
		s.bansMade[key] = kept
	}
	return out
}

// Ban checks a new ban against the bounds and records it, one at a time
// per replica, so that reports racing on it cannot pass a bound together.
func (s *Allocator) Ban(ctx context.Context, ns, fleet, proxy, domain string, cooldown time.Duration, id *auth.Identity) error {
	s.banRecord.Lock()
	defer s.banRecord.Unlock()
	if err := s.banAllowed(ctx, ns, fleet, proxy, domain, id); err != nil {
		return err
	}
	if err := s.Leases.Ban(ctx, ns, fleet, proxy, domain, cooldown, id.User); err != nil {
		return err
	}
	// The target banned the proxy's address: its history keeps the ban
	// past the proxy, for whichever proxy leaves from it next.
	if err := s.Leases.RecordIPBan(ctx, ns, fleet, proxy, s.EgressIPOf(ctx, ns, fleet, proxy), domain, cooldown); err != nil {
		return err
	}
	s.addresses.forget(ns + "/" + fleet)
	s.banMu.Lock()
	defer s.banMu.Unlock()
	if s.bansMade == nil {
		s.bansMade = map[string][]recentBan{}
	}
	key := ns + "/" + fleet
	// An extended ban is one ban, not another.
	made := slices.DeleteFunc(s.bansMade[key], func(r recentBan) bool {
		return r.ban.Proxy == proxy && strings.EqualFold(r.ban.Domain, domain)
	})
	s.bansMade[key] = append(made, recentBan{ban: lease.Ban{Proxy: proxy, Domain: domain, Identity: id.User}, at: s.now()})
	return nil
}

// EgressIPOf is a proxy's egress IP as the catalogue shows it; "" when it
// is not known (nor the proxy the fleet's).
func (s *Allocator) EgressIPOf(ctx context.Context, ns, fleet, proxy string) string {
	ms, err := s.Catalog.Fleet(ctx, ns, fleet)
	if err != nil {
		return ""
	}
	if m := catalog.MemberNamed(ms, proxy); m != nil {
		return m.EgressIP
	}
	return ""
}

// RecentBans is how far back a ban in an egress IP's history makes the
// IP one handed out after clean ones.
const RecentBans = 24 * time.Hour

// addressMemory is how long a fleet's indexed IP histories are used before
// they are read again: an acquisition costs one lookup, not a parse of
// every history. A ban this replica records drops the fleet's index: the
// next acquisition reads it again, as far as the cache shows it then.
const addressMemory = time.Second

// addresses is a fleet's egress IP histories, indexed: the IPs with a ban
// within RecentBans, and those banned now, by domain.
type addresses struct {
	at      time.Time
	tainted map[string]bool
	banned  map[string]map[string]bool
}

// maxAddressBooks bounds the fleets whose indexed histories are kept.
const maxAddressBooks = 1024

// addressBook holds the fleets' indexed histories; a full book starts over.
type addressBook struct {
	mu sync.Mutex
	m  map[string]*addresses
}

// forget drops a fleet's index: a ban was recorded.
func (b *addressBook) forget(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, key)
}

// addressesOf is the fleet's indexed IP histories, read at most every
// addressMemory.
func (s *Allocator) addressesOf(ctx context.Context, ns, fleet string) (*addresses, error) {
	key, now := ns+"/"+fleet, s.now()
	s.addresses.mu.Lock()
	a, ok := s.addresses.m[key]
	s.addresses.mu.Unlock()
	if ok && now.Sub(a.at) < addressMemory && !now.Before(a.at) {
		return a, nil
	}
	hist, err := s.Leases.IPHistories(ctx, ns, fleet)
	if err != nil {
		return nil, err
	}
	a = &addresses{at: now, tainted: map[string]bool{}, banned: map[string]map[string]bool{}}
	since := now.Add(-RecentBans).Unix()
	for ip, h := range hist {
		for _, b := range h {
			if b.At >= since {
				a.tainted[ip] = true
			}
			if b.Until > now.Unix() {
				if a.banned[b.Domain] == nil {
					a.banned[b.Domain] = map[string]bool{}
				}
				a.banned[b.Domain][ip] = true
			}
		}
	}
	s.addresses.mu.Lock()
	if s.addresses.m == nil || len(s.addresses.m) >= maxAddressBooks {
		s.addresses.m = map[string]*addresses{}
	}
	s.addresses.m[key] = a
	s.addresses.mu.Unlock()
	return a, nil
}

// LiftIPBan ends the live ban of domain in the history of proxy's egress IP
// (an "ok" report on it): the address serves the domain again at once.
func (s *Allocator) LiftIPBan(ctx context.Context, ns, fleet, proxy, domain string) error {
	if err := s.Leases.LiftIPBan(ctx, ns, fleet, s.EgressIPOf(ctx, ns, fleet, proxy), domain); err != nil {
		return err
	}
	s.addresses.forget(ns + "/" + fleet)
	return nil
}

// Tainted are the egress IPs (lease.CanonicalIP) of the fleet with a ban
// in their history within RecentBans: handed out after clean ones. Read
// it, never change it.
func (s *Allocator) Tainted(ctx context.Context, ns, fleet string) (map[string]bool, error) {
	a, err := s.addressesOf(ctx, ns, fleet)
	if err != nil {
		return nil, err
	}
	return a.tainted, nil
}

// banLimit is the refusal of a ban over a bound.
func banLimit(msg string) *problem.Error {
	return &problem.Error{Code: problem.StatusTooManyRequests, Reason: apiv1.ReasonBanLimit, Msg: msg}
}

// banAllowed checks a new ban against the fleet's and the identity's
// bounds; extending a ban that is live already is always allowed. Replicas
// count from their caches, so the bounds hold up to what they grant at the
// same moment.
func (s *Allocator) banAllowed(ctx context.Context, ns, fleet, proxy, domain string, id *auth.Identity) error {
	if s.MaxBansPerFleet <= 0 && s.MaxBansPerIdentity <= 0 {
		return nil
	}
	bans, err := s.Leases.ActiveBans(ctx, ns, fleet)
	if err != nil {
		return err
	}
	// With the bans this replica recorded lately, which its cache may
	// not show yet: reports racing on one replica count each other.
	bans = append(bans, s.recentBans(ns+"/"+fleet, bans)...)
	mine := 0
	for _, b := range bans {
		if b.Proxy == proxy && strings.EqualFold(b.Domain, domain) {
			return nil
		}
		if b.Identity == id.User {
			mine++
		}
	}
	switch {
	case s.MaxBansPerFleet > 0 && len(bans) >= s.MaxBansPerFleet:
		return banLimit(fmt.Sprintf("fleet %s/%s has %d live bans, its bound (--max-bans-per-fleet): lift some with an \"ok\" report, or wait for their cooldowns", ns, fleet, len(bans)))
	case s.MaxBansPerIdentity > 0 && mine >= s.MaxBansPerIdentity:
		return banLimit(fmt.Sprintf("%s has %d live bans in fleet %s/%s, its bound (--max-bans-per-identity)", id.User, mine, ns, fleet))
	}
	return nil
}
