package discovery

import (
	_ "embed"
	"html/template"
	"net/http"
	"sort"
	"strings"
	"time"
)

//go:embed status.html
var statusHTML string

var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"pct": func(a, b int) int {
		if b == 0 {
			return 0
		}
		return 100 * a / b
	},
}).Parse(statusHTML))

type statusProxy struct {
	member
	Leases int
	Bans   []string
	// SharedIP: another proxy of the fleet leaves from its egress IP.
	SharedIP bool
}

type statusFleet struct {
	Namespace, Name string
	Proxies         []statusProxy
	Healthy         int
	// DistinctIPs counts the fleet's distinct known egress IPs.
	DistinctIPs int
	// Sizing is what the fleet's XR says of its size; nil when it cannot
	// be read.
	Sizing *FleetSizing
}

// status renders the status page: fleets, proxies, health, latency, egress
// IP, lease use against maxLeases and bans, without JavaScript.
func (s *Server) status(w http.ResponseWriter, r *http.Request, id *Identity) error {
	all, err := s.Catalog.All(r.Context())
	if err != nil {
		return err
	}
	var fleets []statusFleet
	for key, ms := range all {
		ns, name, _ := strings.Cut(key, "/")
		if s.Auth.Authorize(r.Context(), id, ns, name) != nil {
			continue
		}
		slots, err := s.Leases.Slots(r.Context(), ns, name)
		if err != nil {
			return err
		}
		bans, err := s.Leases.Bans(r.Context(), ns, name)
		if err != nil {
			return err
		}
		f := statusFleet{Namespace: ns, Name: name, Sizing: s.Catalog.Sizing(r.Context(), ns, name)}
		perIP := sharedIPs(ms)
		f.DistinctIPs = len(perIP)
		for _, m := range ms {
			if m.Healthy {
				f.Healthy++
			}
			f.Proxies = append(f.Proxies, statusProxy{member: m, Leases: len(slots[m.Name]), Bans: bans[m.Name], SharedIP: perIP[m.EgressIP] > 1})
		}
		fleets = append(fleets, f)
	}
	sort.Slice(fleets, func(i, j int) bool { return fleets[i].Namespace+fleets[i].Name < fleets[j].Namespace+fleets[j].Name })
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, cookieErr := r.Cookie(TokenCookie)
	if err := statusTemplate.Execute(w, struct {
		Fleets   []statusFleet
		Now      string
		SignedIn bool
	}{fleets, s.now().UTC().Format(time.RFC3339), bearer(r) == "" && cookieErr == nil}); err != nil {
		s.Log.Info("Cannot render status page", "error", err)
	}
	return nil
}
