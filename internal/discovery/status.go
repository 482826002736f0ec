package discovery

import (
	_ "embed"
	"fmt"
	"html/template"
	"net/http"
	"net/netip"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/egressip"
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

// statusRows is how many proxies the status page lists per fleet and page:
// a fleet of thousands is summarised, its proxies at fault listed first.
const statusRows = 50

type statusProxy struct {
	catalog.Member
	Leases int
	Bans   []string
	// SharedIP: another proxy of the fleet leaves from its egress IP.
	SharedIP bool
	// Why says why it is at fault: unhealthy or out of service; "" when
	// it serves.
	Why string
}

// statusGroup counts the proxies of one pool or zone.
type statusGroup struct {
	Name                              string
	Proxies, Healthy, Serving, Faults int
	Leases, Capacity                  int
}

func (g *statusGroup) add(p *statusProxy) {
	g.Proxies++
	if p.Healthy {
		g.Healthy++
	}
	if p.Serving() {
		g.Serving++
	}
	if p.Why != "" {
		g.Faults++
	}
	g.Leases += p.Leases
	g.Capacity += p.MaxLeases
}

// diversity counts the distinct egress IPs, networks and (with asn) ASNs
// of the members keep takes.
func diversity(ms []catalog.Member, asn egressip.ASNLookup, keep func(*catalog.Member) bool) egressip.Report {
	known := make([]egressip.Member, 0, len(ms))
	for i := range ms {
		m := &ms[i]
		if !keep(m) {
			continue
		}
		if ip, err := netip.ParseAddr(m.EgressIP); err == nil {
			known = append(known, egressip.Member{Name: m.Name, IP: ip})
		}
	}
	return egressip.Assess(known, egressip.Limits{}, asn)
}

type statusFleet struct {
	Namespace, Name string
	Total, Healthy  int
	// DistinctIPs counts the fleet's distinct known egress IPs;
	// Prefixes4 and Prefixes6 the IPv4 /24s and IPv6 /64s they fall in,
	// which is how targets group clients.
	DistinctIPs, Prefixes4, Prefixes6 int
	// ASNs counts their autonomous systems, -1 without an ASN database;
	// Beyond the proxies beyond the fleet's spec.diversity.
	ASNs, Beyond int
	// BannedIPs counts its egress IPs some domain bans now (their ban
	// histories).
	BannedIPs int
	// Sizing is what the fleet's XR says of its size; nil when it cannot
	// be read.
	Sizing *catalog.FleetSizing
	// Pools and Zones count its proxies per pool (a pooled fleet) and
	// per zone.
	Pools, Zones []statusGroup
	// Faults counts its proxies at fault; Shown are those of this page
	// (at fault first), of Matching that the filter keeps, from First.
	Faults, Matching, First, Last int
	Shown                         []statusProxy
	// Prev and Next link to the pages around this one; "" at an end.
	Prev, Next string
	// Spread is how this replica's gateway connections of the last
	// minutes spread over the fleet's serving proxies.
	Spread allocator.Spread
}

// queryFleet is the status page's query parameter naming a fleet.
const queryFleet = "fleet"

// statusQuery is what the page's URL asks for: a fleet (ns/name), a pool,
// a zone, only the proxies at fault, and a page.
type statusQuery struct {
	fleet, pool, zone string
	faults            bool
	page              int
}

func parseStatusQuery(v url.Values) statusQuery {
	q := statusQuery{fleet: v.Get(queryFleet), pool: v.Get("pool"), zone: v.Get("zone"), faults: v.Get("show") == "faults"}
	if n, err := strconv.Atoi(v.Get("page")); err == nil && n > 1 {
		// Past the last page is the last page; no page count overflows.
		q.page = min(n, 1<<20) - 1
	}
	return q
}

func (q statusQuery) link(ns, name string, page int) string {
	v := url.Values{queryFleet: {ns + "/" + name}, "page": {strconv.Itoa(page + 1)}}
	if q.pool != "" {
		v.Set("pool", q.pool)
	}
	if q.zone != "" {
		v.Set("zone", q.zone)
	}
	if q.faults {
		v.Set("show", "faults")
	}
	return "/?" + v.Encode()
}

// whyAtFault says why a proxy is unhealthy or out of service; "" when it
// serves.
func whyAtFault(m catalog.Member) string {
	var why string
	switch {
	case m.Booting:
		why = "booting: not Ready yet"
	case !m.Healthy:
		why = "unhealthy"
	case !m.DrainSince.IsZero():
		return "draining since " + m.DrainSince.UTC().Format(time.RFC3339) + ": being replaced, takes no new leases"
	case m.CredentialsOutdated:
		return "accepts only the previous credentials: being replaced"
	default:
		return ""
	}
	if m.Problem != "" {
		why += ": " + m.Problem
	}
	return why
}

// summarise builds one fleet's part of the page: counts per pool and zone
// over all its proxies, and the page of proxies the query asks for, those
// at fault first.
func summarise(ns, name string, ms []catalog.Member, leases map[string]int, bans map[string][]string, asn egressip.ASNLookup, q statusQuery) statusFleet {
	f := statusFleet{Namespace: ns, Name: name, Total: len(ms)}
	perIP := catalog.SharedIPs(ms)
	f.DistinctIPs = len(perIP)
	div := diversity(ms, asn, func(*catalog.Member) bool { return true })
	f.Prefixes4, f.Prefixes6, f.ASNs = div.Prefixes4, div.Prefixes6, div.ASNs
	pools, zones := map[string]*statusGroup{}, map[string]*statusGroup{}
	group := func(in map[string]*statusGroup, key string) *statusGroup {
		g, ok := in[key]
		if !ok {
			g = &statusGroup{Name: key}
			in[key] = g
		}
		return g
	}
	var matching []statusProxy
	for _, m := range ms {
		p := statusProxy{Member: m, Leases: leases[m.Name], Bans: bans[m.Name], SharedIP: perIP[m.EgressIP] > 1, Why: whyAtFault(m)}
		if p.Healthy {
			f.Healthy++
		}
		if p.Why != "" {
			f.Faults++
		}
		if m.BeyondDiversityLimit {
			f.Beyond++
		}
		if m.Pool != "" {
			group(pools, m.Pool).add(&p)
		}
		group(zones, m.Zone).add(&p)
		if (q.pool == "" || q.pool == m.Pool) && (q.zone == "" || q.zone == m.Zone) && (!q.faults || p.Why != "") {
			matching = append(matching, p)
		}
	}
	f.Pools, f.Zones = sortedGroups(pools), sortedGroups(zones)
	sort.SliceStable(matching, func(i, j int) bool { return matching[i].Why != "" && matching[j].Why == "" })
	f.Matching = len(matching)
	start := min(q.page*statusRows, max(len(matching)-1, 0)/statusRows*statusRows)
	f.First = start + 1
	f.Shown = matching[start:min(start+statusRows, len(matching))]
	f.Last = start + len(f.Shown)
	if len(f.Shown) == 0 {
		f.First = 0
	}
	page := start / statusRows
	if page > 0 {
		f.Prev = q.link(ns, name, page-1)
	}
	if start+statusRows < len(matching) {
		f.Next = q.link(ns, name, page+1)
	}
	return f
}

func sortedGroups(in map[string]*statusGroup) []statusGroup {
	out := make([]statusGroup, 0, len(in))
	for _, g := range in {
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// status renders the status page: per fleet its health, sizing, counts
// per pool and zone, and its proxies (at fault first, with why; paged) with
// latency, egress IP, lease use against maxLeases and bans, without
// JavaScript. ?fleet=ns/name, pool, zone, show=faults and page narrow it.
func (s *Server) status(w http.ResponseWriter, r *http.Request, id *auth.Identity) error {
	all, err := s.Catalog.All(r.Context())
	if err != nil {
		return err
	}
	q := parseStatusQuery(r.URL.Query())
	var fleets []statusFleet
	for key, ms := range all {
		ns, name, _ := strings.Cut(key, "/")
		if q.fleet != "" && q.fleet != key {
			continue
		}
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
		held := make(map[string]int, len(slots))
		for proxy, ls := range slots {
			held[proxy] = len(ls)
		}
		f := summarise(ns, name, ms, held, bans, s.ASN, q)
		f.Sizing = s.Catalog.Sizing(r.Context(), ns, name)
		if hist, err := s.Leases.IPHistories(r.Context(), ns, name); err == nil {
			for _, n := range bannedAddresses(hist, s.Now()) {
				f.BannedIPs += n
			}
		}
		f.Spread = s.Allocator().SpreadOf(key, allocator.ServingNames(ms), s.Now())
		fleets = append(fleets, f)
	}
	sort.Slice(fleets, func(i, j int) bool { return fleets[i].Namespace+fleets[i].Name < fleets[j].Namespace+fleets[j].Name })
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, cookieErr := r.Cookie(auth.TokenCookie)
	filter := ""
	if q != (statusQuery{}) {
		filter = fmt.Sprintf("fleet %q, pool %q, zone %q, faults only %t, page %d", q.fleet, q.pool, q.zone, q.faults, q.page+1)
	}
	if err := statusTemplate.Execute(w, struct {
		Fleets   []statusFleet
		Now      string
		SignedIn bool
		Filter   string
	}{fleets, s.Now().UTC().Format(time.RFC3339), auth.Bearer(r) == "" && cookieErr == nil, filter}); err != nil {
		s.Log.Info("Cannot render status page", "error", err)
	}
	return nil
}
