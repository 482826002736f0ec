package discovery

import (
	"context"
	"net/http"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

func (s *Server) acquire(w http.ResponseWriter, r *http.Request, id *auth.Identity) error {
	start := time.Now()
	g, domain, err := s.grant(r, id)
	if err != nil {
		s.Metrics.Denials.WithLabelValues(problem.ReasonOf(err)).Inc()
		return err
	}
	u, err := s.Catalog.ProxyURL(r.Context(), g.Member)
	if err != nil {
		// Given back at once, not left to its TTL; counted against the
		// quota until it is.
		if s.Leases.Release(context.WithoutCancel(r.Context()), g.Grant.ID, id.User) == nil {
			s.Allocator().Released(g.Grant.Namespace, g.Grant.Fleet, id.User, g.Grant.ID)
		}
		s.Metrics.Denials.WithLabelValues(problem.ReasonOf(err)).Inc()
		return err
	}
	s.Metrics.Acquisitions.Inc()
	s.Metrics.AcquireLatency.Observe(time.Since(start).Seconds())
	problem.WriteJSON(w, http.StatusCreated, apiv1.Lease{LeaseID: g.Grant.ID, Proxy: g.Grant.Proxy, ProxyURL: u, ExpiresAt: g.Grant.ExpiresAt, TTLSeconds: int64(g.Grant.TTL / time.Second),
		Pacing: s.Allocator().PacingOf(r.Context(), g, domain)})
	return nil
}

// grant validates an acquisition, counts it against the caller's quota,
// and takes a slot, waiting for one if the fleet and the request allow.
func (s *Server) grant(r *http.Request, id *auth.Identity) (*allocator.Granted, string, error) {
	a, err := s.decodeAcquisition(r, id)
	if err != nil {
		return nil, "", err
	}
	g, err := s.Allocator().GrantFor(r.Context(), a)
	return g, a.Req.Domain, err
}

// decodeAcquisition reads an acquire request and the fleet's policy.
func (s *Server) decodeAcquisition(r *http.Request, id *auth.Identity) (*allocator.Acquisition, error) {
	req, ns, name, err := DecodeAcquire(r)
	if err != nil {
		return nil, err
	}
	return s.Allocator().AcquisitionOf(r.Context(), req, ns, name, id)
}

// leaseOf reads the lease named in the path and authorises its fleet. The
// fleet comes from the cached Proxy the slot belongs to, so renew and
// release cost one API call each.
func (s *Server) leaseOf(r *http.Request, id *auth.Identity) (leaseID, namespace, fleet string, p *v1alpha1.Proxy, err error) {
	leaseID = r.PathValue("namespace") + "/" + r.PathValue("name") + "/" + r.PathValue("token")
	namespace, name, _, err := lease.ParseID(leaseID)
	if err != nil {
		return "", "", "", nil, lease.ErrNotFound
	}
	proxy, ok := lease.ProxyOf(name)
	if !ok {
		return "", "", "", nil, lease.ErrNotFound
	}
	p = &v1alpha1.Proxy{}
	if err := s.Catalog.Cache.Get(r.Context(), types.NamespacedName{Namespace: namespace, Name: proxy}, p); err != nil {
		if kerrors.IsNotFound(err) {
			return "", "", "", nil, lease.ErrNotFound
		}
		return "", "", "", nil, err
	}
	fleet = fleetv1alpha1.FleetName(p)
	if err := s.Auth.Authorize(r.Context(), id, namespace, fleet); err != nil {
		return "", "", "", nil, err
	}
	return leaseID, namespace, fleet, p, nil
}

func (s *Server) renew(w http.ResponseWriter, r *http.Request, id *auth.Identity) error {
	leaseID, ns, fleet, p, err := s.leaseOf(r, id)
	if err != nil {
		return err
	}
	req := &apiv1.RenewRequest{}
	if err := decode(r, req); err != nil && !errors.Is(err, errEmptyBody) {
		return err
	}
	def, maxTTL, err := s.Catalog.TTLs(r.Context(), ns, fleet)
	if err != nil {
		return err
	}
	ttl, err := allocator.ParseTTL("ttl", req.TTL, def, maxTTL)
	if err != nil {
		return err
	}
	if since := catalog.DrainSince(p); !since.IsZero() {
		if ttl, err = s.Allocator().DrainedTTL(p.Name, since, maxTTL, ttl); err != nil {
			return err
		}
	}
	g, err := s.Leases.Renew(r.Context(), leaseID, id.User, ttl)
	if err != nil {
		return err
	}
	out := apiv1.Lease{LeaseID: g.ID, Proxy: g.Proxy, ExpiresAt: g.ExpiresAt, TTLSeconds: int64(ttl / time.Second)}
	// The URL with the credentials the proxy takes now, so that a crawler
	// renewing across a password change moves to the new one before the
	// previous one's grace ends; none for a proxy that still takes only
	// the credentials the crawler was given.
	if m := catalog.ToMember(p); !m.CredentialsOutdated {
		// The lease is renewed whatever happens here: a failure to read
		// the credentials leaves the URL out, never answers an error
		// that would make the crawler drop a lease it holds.
		if out.ProxyURL, err = s.Catalog.ProxyURL(r.Context(), m); err != nil {
			s.Log.Info("Renewed a lease without its proxy's URL", "lease", leaseID, "error", err)
		}
	}
	problem.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) release(w http.ResponseWriter, r *http.Request, id *auth.Identity) error {
	leaseID, ns, fleet, _, err := s.leaseOf(r, id)
	if err != nil {
		return err
	}
	if err := s.Leases.Release(r.Context(), leaseID, id.User); err != nil {
		return err
	}
	s.Allocator().Released(ns, fleet, id.User, leaseID)
	w.WriteHeader(http.StatusNoContent)
	return nil
}
