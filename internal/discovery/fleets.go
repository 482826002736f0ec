package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
)

// fleetName says whether a fleet could have this namespace and name.
func fleetName(namespace, name string) bool {
	return len(validation.IsDNS1123Label(namespace)) == 0 && len(validation.IsDNS1123Subdomain(name)) == 0
}

// authorizeFleet checks a fleet named in a path and authorises its use.
// Names no fleet can have cost no access review, nor a cache entry.
func (s *Server) authorizeFleet(ctx context.Context, id *auth.Identity, namespace, name string) error {
	if !fleetName(namespace, name) {
		return problem.ErrFleetNotFound
	}
	return s.Auth.Authorize(ctx, id, namespace, name)
}

// fleetOf checks and authorises a fleet named in a path, and returns its
// proxies.
func (s *Server) fleetOf(ctx context.Context, id *auth.Identity, namespace, name string) ([]catalog.Member, error) {
	if err := s.authorizeFleet(ctx, id, namespace, name); err != nil {
		return nil, err
	}
	return s.members(ctx, namespace, name)
}

// members returns a fleet's proxies; a fleet without any is not found.
func (s *Server) members(ctx context.Context, namespace, name string) ([]catalog.Member, error) {
	ms, err := s.Catalog.Fleet(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	if len(ms) == 0 {
		return nil, problem.ErrFleetNotFound
	}
	return ms, nil
}

func countHealthy(ms []catalog.Member) int {
	n := 0
	for _, m := range ms {
		if m.Healthy {
			n++
		}
	}
	return n
}

func (s *Server) fleets(w http.ResponseWriter, r *http.Request, id *auth.Identity) error {
	all, err := s.Catalog.All(r.Context())
	if err != nil {
		return err
	}
	out := apiv1.FleetList{Items: []apiv1.Fleet{}}
	for key, ms := range all {
		ns, name, _ := strings.Cut(key, "/")
		if s.Auth.Authorize(r.Context(), id, ns, name) != nil {
			continue
		}
		out.Items = append(out.Items, apiv1.Fleet{Namespace: ns, Name: name, Proxies: len(ms), Healthy: countHealthy(ms)})
	}
	sort.Slice(out.Items, func(i, j int) bool {
		return out.Items[i].Namespace+"/"+out.Items[i].Name < out.Items[j].Namespace+"/"+out.Items[j].Name
	})
	problem.WriteJSON(w, http.StatusOK, out)
	return nil
}

// fleet answers one fleet, with the caller's usage and quota and the
// state of its admission control.
func (s *Server) fleet(w http.ResponseWriter, r *http.Request, id *auth.Identity) error {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	ms, err := s.fleetOf(r.Context(), id, ns, name)
	if err != nil {
		return err
	}
	p, err := s.Catalog.Policy(r.Context(), ns, name)
	if err != nil {
		return err
	}
	held, err := s.usage(r.Context(), ns, name, id)
	if err != nil {
		return err
	}
	u := &apiv1.Usage{Identity: id.User, Leases: held}
	if q, from, ok := quotaOf(p.Quotas, id); ok {
		u.Quota, u.QuotaFrom = &q, from
	}
	frac := healthyFraction(ms, p)
	problem.WriteJSON(w, http.StatusOK, apiv1.Fleet{
		Namespace: ns, Name: name, Proxies: len(ms), Healthy: countHealthy(ms), Usage: u,
		Admission: &apiv1.Admission{
			Admitting: frac >= p.MinHealthyFraction, HealthyFraction: frac, MinHealthyFraction: p.MinHealthyFraction,
			MaxWaitSeconds: p.MaxWait.Seconds(), Waiting: s.queues.fleetDepth(ns, name),
		},
	})
	return nil
}

// healthy filters a fleet's proxies: healthy, not draining (being
// replaced), accepting the auth Secret's credentials, in the zone, not
// excluded, not banned for the domain, nor leaving from an egress IP
// banned for it through another proxy. It returns the fleet's bans too.
func (s *Server) healthy(ctx context.Context, ms []catalog.Member, zone string, exclude map[string]bool, domain string) ([]catalog.Member, map[string][]string, error) {
	var bans map[string][]string
	if len(ms) > 0 {
		var err error
		if bans, err = s.Leases.Bans(ctx, ms[0].Namespace, ms[0].Fleet); err != nil {
			return nil, nil, err
		}
	}
	admit, err := s.admits(ctx, ms, zone, exclude, domain)
	if err != nil {
		return nil, nil, err
	}
	out := make([]catalog.Member, 0, len(ms))
	for i := range ms {
		if admit(&ms[i]) {
			out = append(out, ms[i])
		}
	}
	return out, bans, nil
}

// admits says which of a fleet's proxies (ms, sorted by name) healthy
// keeps, one at a time: an acquisition in a large fleet asks it of a
// sample. It reads the bans for the domain only, none without one.
func (s *Server) admits(ctx context.Context, ms []catalog.Member, zone string, exclude map[string]bool, domain string) (func(*catalog.Member) bool, error) {
	var banned map[string]bool
	if len(ms) > 0 && domain != "" {
		var err error
		if banned, err = s.Leases.BannedFor(ctx, ms[0].Namespace, ms[0].Fleet, domain); err != nil {
			return nil, err
		}
	}
	// A target that banned a proxy banned its egress IP: every proxy
	// leaving from that IP is banned for the domain too. A banned proxy
	// not among ms (the gateway asks of one proxy) is read from the cache.
	bannedIPs := map[string]bool{}
	for name := range banned {
		ip := ""
		if m := catalog.MemberNamed(ms, name); m != nil {
			ip = m.EgressIP
		} else if s.Catalog != nil && s.Catalog.Cache != nil {
			p := &v1alpha1.Proxy{}
			if err := s.Catalog.Cache.Get(ctx, types.NamespacedName{Namespace: ms[0].Namespace, Name: name}, p); err == nil && fleetv1alpha1.FleetName(p) == ms[0].Fleet {
				ip = catalog.ToMember(p).EgressIP
			}
		}
		if ip != "" {
			bannedIPs[ip] = true
		}
	}
	return func(m *catalog.Member) bool {
		if !m.Serving() || (zone != "" && m.Zone != zone) || exclude[m.Name] {
			return false
		}
		return !banned[m.Name] && (m.EgressIP == "" || !bannedIPs[m.EgressIP])
	}, nil
}

func (s *Server) proxies(w http.ResponseWriter, r *http.Request, id *auth.Identity) error {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	q := r.URL.Query()
	domain := q.Get("notBannedFor")
	if domain != "" && !domainRe.MatchString(domain) {
		return &problem.BadRequest{Field: "notBannedFor", Msg: fmt.Sprintf("%q is not a domain name", domain)}
	}
	exclude := map[string]bool{}
	for _, e := range strings.Split(q.Get("exclude"), ",") {
		if e != "" {
			exclude[e] = true
		}
	}
	if err := s.authorizeFleet(r.Context(), id, ns, name); err != nil {
		return err
	}
	key := ns + "/" + name + "?" + r.URL.RawQuery
	if body, ok := s.snapshot(key); ok {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
		return nil
	}
	var version uint64
	if s.Version != nil {
		version = s.Version()
	}
	second := s.now().Unix()
	// Authorised above, before the snapshot: not reviewed twice.
	ms, err := s.members(r.Context(), ns, name)
	if err != nil {
		return err
	}
	ok, bans, err := s.healthy(r.Context(), ms, q.Get("zone"), exclude, domain)
	if err != nil {
		return err
	}
	slots, err := s.Leases.Slots(r.Context(), ns, name)
	if err != nil {
		return err
	}
	out := apiv1.ProxyList{Items: make([]apiv1.Proxy, 0, len(ok))}
	for _, m := range ok {
		out.Items = append(out.Items, apiv1.Proxy{
			Name: m.Name, Zone: m.Zone, Endpoint: m.Endpoint(), EgressIP: m.EgressIP, LatencyMs: m.LatencyMs,
			Leases: len(slots[m.Name]), MaxLeases: m.MaxLeases, BannedFor: bans[m.Name],
		})
	}
	body, err := json.Marshal(out)
	if err != nil {
		return err
	}
	body = append(body, '\n')
	s.keep(key, version, second, body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
	return nil
}

// proxiesTxt serves one proxy URL (with credentials) per line, for clients
// such as scrapy-rotating-proxies that reload a list from a URL.
func (s *Server) proxiesTxt(w http.ResponseWriter, r *http.Request, id *auth.Identity) error {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	domain := r.URL.Query().Get("notBannedFor")
	if domain != "" && !domainRe.MatchString(domain) {
		return &problem.BadRequest{Field: "notBannedFor", Msg: fmt.Sprintf("%q is not a domain name", domain)}
	}
	ms, err := s.fleetOf(r.Context(), id, ns, name)
	if err != nil {
		return err
	}
	ok, _, err := s.healthy(r.Context(), ms, r.URL.Query().Get("zone"), nil, domain)
	if err != nil {
		return err
	}
	var b strings.Builder
	for _, m := range ok {
		u, err := s.Catalog.ProxyURL(r.Context(), m)
		if err != nil {
			return err
		}
		b.WriteString(u + "\n")
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = io.WriteString(w, b.String())
	return nil
}
