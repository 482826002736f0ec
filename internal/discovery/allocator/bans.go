package allocator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
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
