package discovery

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
)

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
		out.Items = append(out.Items, apiv1.Fleet{Namespace: ns, Name: name, Proxies: len(ms), Healthy: allocator.CountHealthy(ms)})
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
	ms, err := s.Allocator().Fleet(r.Context(), id, ns, name)
	if err != nil {
		return err
	}
	p, err := s.Catalog.Policy(r.Context(), ns, name)
	if err != nil {
		return err
	}
	held, err := s.Allocator().Usage(r.Context(), ns, name, id)
	if err != nil {
		return err
	}
	u := &apiv1.Usage{Identity: id.User, Leases: held}
	if q, from, ok := allocator.QuotaOf(p.Quotas, id); ok {
		u.Quota, u.QuotaFrom = &q, from
	}
	frac := allocator.HealthyFraction(ms, p)
	problem.WriteJSON(w, http.StatusOK, apiv1.Fleet{
		Namespace: ns, Name: name, Proxies: len(ms), Healthy: allocator.CountHealthy(ms), Usage: u,
		Admission: &apiv1.Admission{
			Admitting: frac >= p.MinHealthyFraction, HealthyFraction: frac, MinHealthyFraction: p.MinHealthyFraction,
			MaxWaitSeconds: p.MaxWait.Seconds(), Waiting: s.Allocator().FleetDepth(ns, name),
		},
	})
	return nil
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
	if err := s.Allocator().AuthorizeFleet(r.Context(), id, ns, name); err != nil {
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
	second := s.Now().Unix()
	// Authorised above, before the snapshot: not reviewed twice.
	ms, err := s.Allocator().Members(r.Context(), ns, name)
	if err != nil {
		return err
	}
	ok, bans, err := s.Allocator().Healthy(r.Context(), ms, q.Get("zone"), exclude, domain)
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
	ms, err := s.Allocator().Fleet(r.Context(), id, ns, name)
	if err != nil {
		return err
	}
	ok, _, err := s.Allocator().Healthy(r.Context(), ms, r.URL.Query().Get("zone"), nil, domain)
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
