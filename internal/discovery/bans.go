package discovery

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// report records a crawler's verdict on its leased proxy for a domain. A
// ban is a Lease object in the API server, so every replica honours it.
func (s *Server) report(w http.ResponseWriter, r *http.Request, id *auth.Identity) error {
	leaseID, ns, fleet, p, err := s.leaseOf(r, id)
	if err != nil {
		return err
	}
	// Only a crawler holding the lease may report through it.
	if _, err := s.Leases.Get(r.Context(), leaseID, id.User); err != nil {
		return err
	}
	return s.applyReport(w, r, ns, fleet, p.Name, id)
}

// reportSession is a report through a gateway session: it bans (or
// clears) for a domain the proxy that the caller's session of the fleet
// holds. The session's proxy is read from its Lease, so any replica
// answers, not only the one serving the session.
func (s *Server) reportSession(w http.ResponseWriter, r *http.Request, id *auth.Identity) error {
	ns, fleet, key := r.PathValue("namespace"), r.PathValue("name"), r.PathValue("key")
	if err := s.authorizeFleet(r.Context(), id, ns, fleet); err != nil {
		return err
	}
	if !apiv1.ValidSessionKey(key) {
		return &problem.BadRequest{Field: "key", Msg: fmt.Sprintf("%q is not a gateway session key", key)}
	}
	slots, err := s.Leases.Slots(r.Context(), ns, fleet)
	if err != nil {
		return err
	}
	proxy := ""
	for p, ls := range slots {
		for _, l := range ls {
			if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == GatewaySessionHolder(key) &&
				l.Annotations[lease.AnnotationIdentity] == id.User && !lease.Expired(l, s.now()) {
				proxy = p
			}
		}
	}
	if proxy == "" {
		return &problem.Error{Code: http.StatusNotFound, Reason: apiv1.ReasonLeaseNotFound,
			Msg: fmt.Sprintf("you hold no gateway session %q of %s/%s (it ends %s after its last connection)", key, ns, fleet, "--gateway-idle")}
	}
	return s.applyReport(w, r, ns, fleet, proxy, id)
}

// applyReport reads a report's body and bans the proxy for its domain, or
// clears the ban.
func (s *Server) applyReport(w http.ResponseWriter, r *http.Request, ns, fleet, proxy string, id *auth.Identity) error {
	req := &apiv1.ReportRequest{}
	if err := decode(r, req); err != nil {
		return err
	}
	if !domainRe.MatchString(req.Domain) {
		return &problem.BadRequest{Field: "domain", Msg: fmt.Sprintf("%q is not a domain name", req.Domain)}
	}
	switch req.Outcome {
	case "banned":
		pol, err := s.Catalog.Policy(r.Context(), ns, fleet)
		if err != nil {
			return err
		}
		cooldown, err := parseDuration("cooldown", req.Cooldown, min(defaultCooldown, pol.MaxBanCooldown), time.Second, pol.MaxBanCooldown, "the fleet's spec.leases.maxBanCooldown")
		if err != nil {
			return err
		}
		if err := s.ban(r.Context(), ns, fleet, proxy, req.Domain, cooldown, id); err != nil {
			return err
		}
		s.Metrics.Bans.Inc()
	case "ok":
		if err := s.Leases.Unban(r.Context(), ns, proxy, req.Domain); err != nil {
			return err
		}
	default:
		return &problem.BadRequest{Field: "outcome", Msg: fmt.Sprintf("%q must be banned or ok", req.Outcome)}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// defaultCooldown is a ban's cooldown when the report names none.
const defaultCooldown = 30 * time.Minute

// recentBanTime is how long a ban this replica recorded is counted
// besides its cache: longer than the cache takes to show it.
const recentBanTime = 10 * time.Second

type recentBan struct {
	ban lease.Ban
	at  time.Time
}

// recentBans returns the bans this replica recorded in the fleet in the
// last recentBanTime that listed does not hold yet, forgetting older ones.
func (s *Server) recentBans(key string, listed []lease.Ban) []lease.Ban {
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

// ban checks a new ban against the bounds and records it, one at a time
// per replica, so that reports racing on it cannot pass a bound together.
func (s *Server) ban(ctx context.Context, ns, fleet, proxy, domain string, cooldown time.Duration, id *auth.Identity) error {
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
	return &problem.Error{Code: http.StatusTooManyRequests, Reason: apiv1.ReasonBanLimit, Msg: msg}
}

// banAllowed checks a new ban against the fleet's and the identity's
// bounds; extending a ban that is live already is always allowed. Replicas
// count from their caches, so the bounds hold up to what they grant at the
// same moment.
func (s *Server) banAllowed(ctx context.Context, ns, fleet, proxy, domain string, id *auth.Identity) error {
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
