package discovery

import (
	"fmt"
	"net/http"
	"time"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/gateway"
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
	if err := s.Allocator().AuthorizeFleet(r.Context(), id, ns, fleet); err != nil {
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
			if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == gateway.SessionHolder(key) &&
				l.Annotations[lease.AnnotationIdentity] == id.User && !lease.Expired(l, s.Now()) {
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
		cooldown, err := allocator.ParseDuration("cooldown", req.Cooldown, min(allocator.DefaultCooldown, pol.MaxBanCooldown), time.Second, pol.MaxBanCooldown, "the fleet's spec.leases.maxBanCooldown")
		if err != nil {
			return err
		}
		if err := s.Allocator().Ban(r.Context(), ns, fleet, proxy, req.Domain, cooldown, id); err != nil {
			return err
		}
		s.Metrics.Bans.Inc()
	case "ok":
		if err := s.Leases.Unban(r.Context(), ns, proxy, req.Domain); err != nil {
			return err
		}
		// The address is fine for the domain again: the ban in its
		// history ends now too, or the proxy would stay passed over.
		if err := s.Allocator().LiftIPBan(r.Context(), ns, fleet, proxy, req.Domain); err != nil {
			return err
		}
	default:
		return &problem.BadRequest{Field: "outcome", Msg: fmt.Sprintf("%q must be banned or ok", req.Outcome)}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
