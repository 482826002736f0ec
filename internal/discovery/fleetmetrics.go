package discovery

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/egressip"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// Fleet-level metrics, one series per fleet (namespace, fleet): what the
// alerting rules of cluster/monitoring watch. They are computed from the
// replica's caches when scraped, so they never go stale.
var (
	fleetLabels      = []string{"namespace", "fleet"}
	descProxies      = prometheus.NewDesc("egress_fleet_proxies", "Proxies the fleet has.", fleetLabels, nil)
	descHealthy      = prometheus.NewDesc("egress_fleet_healthy_proxies", "Proxies of the fleet that pass their probe and are Ready.", fleetLabels, nil)
	descDesired      = prometheus.NewDesc("egress_fleet_desired_proxies", "Proxies the fleet aims at: spec.replicas, or what spec.autoscaling chose.", fleetLabels, nil)
	descMinAvailable = prometheus.NewDesc("egress_fleet_min_available_proxies", "Healthy proxies below which the fleet is degraded: desired - spec.rotation.maxUnavailable.", fleetLabels, nil)
	descDuplicate    = prometheus.NewDesc("egress_fleet_duplicate_egress_ip_proxies", "Proxies of the fleet that share their egress IP with another.", fleetLabels, nil)
	descHeld         = prometheus.NewDesc("egress_fleet_leases_held", "Leases crawlers hold on the fleet's proxies.", fleetLabels, nil)
	descCapacity     = prometheus.NewDesc("egress_fleet_lease_capacity", "Leases the fleet's healthy proxies can hold: healthy proxies x maxLeasesPerProxy.", fleetLabels, nil)
	descWaiting      = prometheus.NewDesc("egress_fleet_leases_waiting", "Acquisitions of the fleet waiting for a slot on this replica.", fleetLabels, nil)
	descBans         = prometheus.NewDesc("egress_fleet_bans", "Live domain bans on the fleet's proxies (counted; the domains are no label).", fleetLabels, nil)
	descStalled      = prometheus.NewDesc("egress_fleet_rollout_stalled", "1 while the fleet's rollout makes no progress past its progressDeadline.", fleetLabels, nil)
	descSpread       = prometheus.NewDesc("egress_fleet_gateway_connections_per_proxy",
		"This replica's gateway connections of the last 10 minutes per serving proxy of the fleet, at a quantile of the proxies (0: the least used, 1: the most): how rotation spreads them.", append(fleetLabels, "quantile"), nil)
	descUsed      = prometheus.NewDesc("egress_fleet_gateway_proxies_used", "Proxies of the fleet that carried any of this replica's gateway connections in the last 10 minutes.", fleetLabels, nil)
	descAddresses = prometheus.NewDesc("egress_fleet_egress_addresses", "Distinct egress IPs the fleet's healthy proxies leave from.", fleetLabels, nil)
	descPrefixes  = prometheus.NewDesc("egress_fleet_egress_prefixes",
		"Distinct prefixes the fleet's healthy proxies leave from, as targets group clients: IPv4 /24s (family ipv4), IPv6 /64s (family ipv6).", append(fleetLabels, "family"), nil)
	descASNs      = prometheus.NewDesc("egress_fleet_egress_asns", "Distinct autonomous systems the fleet's healthy proxies leave from (with --asn-database only).", fleetLabels, nil)
	descBannedIPs = prometheus.NewDesc("egress_fleet_banned_addresses",
		"Egress IPs of the fleet banned now by some domain (their history's live bans, whichever proxy leaves from them), by how many domains ban each: 1, 2-4, 5+ (the domains are no label).", append(fleetLabels, "domains"), nil)
	descBeyond = prometheus.NewDesc("egress_fleet_beyond_diversity_limit_proxies", "Proxies of the fleet beyond a cap of its spec.diversity (per IPv4 /24, IPv6 /64 or ASN): handed out last.", fleetLabels, nil)
	// What spec.recycling did and holds back, as the fleet's status says
	// (fleets with spec.recycling or spec.diversity.replaceBeyondLimit only).
	descRecyclesDay = prometheus.NewDesc("egress_fleet_recycles_last_day",
		"Proxies spec.recycling replaced in the last day to draw another egress IP, by the rule that judged the address burned: domains (banned by K domains), times (K times by one), diversity (beyond a cap of spec.diversity, with replaceBeyondLimit), other.", append(fleetLabels, "reason"), nil)
	descRecyclesHour = prometheus.NewDesc("egress_fleet_recycles_last_hour", "Proxies spec.recycling replaced in the last hour (at most egress_fleet_recycles_max_per_hour; the back-off may allow fewer).", fleetLabels, nil)
	descRecycleBound = prometheus.NewDesc("egress_fleet_recycles_max_per_hour", "spec.recycling.maxPerHour: the most recycles the fleet starts in any hour.", fleetLabels, nil)
	descBurned       = prometheus.NewDesc("egress_fleet_burned_proxies_waiting", "Proxies due for a recycle (an egress IP spec.recycling judges burned, or beyond a cap with spec.diversity.replaceBeyondLimit) that no recycle replaces yet, for whatever reason (status.egress.recycleWaiting says why).", fleetLabels, nil)
	descAtBound      = prometheus.NewDesc("egress_fleet_recycles_at_bound", "1 while some proxies due for a recycle wait for spec.recycling's hourly bound or back-off alone (status.egress.recyclesAtBound).", fleetLabels, nil)
	descSeenAgain    = prometheus.NewDesc("egress_fleet_addresses_seen_again", "Proxies leaving from an egress IP a recycle of the last day gave back: the cloud handed it out again.", fleetLabels, nil)
	// Per pool, in a pooled fleet only, counted from the Proxies each pool
	// has: a pool that lost every proxy while the fleet as a whole keeps
	// its floor. (A pool that composes none has no series; the fleet's
	// own counts fall short of its desired replicas then.)
	poolLabels      = append(append([]string{}, fleetLabels...), "pool")
	descPoolProxies = prometheus.NewDesc("egress_pool_proxies", "Proxies of one ProxyPool of a pooled fleet.", poolLabels, nil)
	descPoolHealthy = prometheus.NewDesc("egress_pool_healthy_proxies", "Proxies of one ProxyPool of a pooled fleet that pass their probe and are Ready.", poolLabels, nil)
)

// FleetCollector exports the fleet-level metrics of every fleet.
type FleetCollector struct{ Server *Server }

// Describe sends the descriptors of the fleet-level metrics.
func (c FleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descProxies, descHealthy, descDesired, descMinAvailable, descDuplicate, descHeld, descCapacity, descWaiting, descBans, descStalled, descSpread, descUsed, descAddresses, descPrefixes, descASNs, descBeyond, descBannedIPs,
		descRecyclesDay, descRecyclesHour, descRecycleBound, descBurned, descAtBound, descSeenAgain, descPoolProxies, descPoolHealthy} {
		ch <- d
	}
}

// Collect reads every fleet from the caches.
func (c FleetCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s := c.Server
	all, err := s.Catalog.All(ctx)
	if err != nil {
		return
	}
	for key, ms := range all {
		ns, name, _ := strings.Cut(key, "/")
		gauge := func(d *prometheus.Desc, v int) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), ns, name)
		}
		healthy, capacity, dup, beyond := 0, 0, 0, 0
		perIP := catalog.SharedIPs(ms)
		for _, m := range ms {
			if m.Healthy {
				healthy++
				capacity += m.MaxLeases
			}
			if perIP[m.EgressIP] > 1 {
				dup++
			}
			if m.BeyondDiversityLimit {
				beyond++
			}
		}
		if sp := s.Allocator().SpreadOf(key, allocator.ServingNames(ms), s.Now()); sp.Connections > 0 {
			gauge(descUsed, sp.Used)
			for _, q := range []struct {
				q string
				v uint64
			}{{"0", sp.Min}, {"0.5", sp.Median}, {"0.9", sp.P90}, {"1", sp.Max}} {
				ch <- prometheus.MustNewConstMetric(descSpread, prometheus.GaugeValue, float64(q.v), ns, name, q.q)
			}
		}
		gauge(descProxies, len(ms))
		gauge(descHealthy, healthy)
		collectPools(ch, ns, name, ms)
		gauge(descCapacity, capacity)
		gauge(descDuplicate, dup)
		div := diversity(ms, s.ASN, func(m *catalog.Member) bool { return m.Healthy })
		gauge(descAddresses, div.Addresses)
		gauge(descBeyond, beyond)
		if div.ASNs >= 0 {
			gauge(descASNs, div.ASNs)
		}
		ch <- prometheus.MustNewConstMetric(descPrefixes, prometheus.GaugeValue, float64(div.Prefixes4), ns, name, "ipv4")
		ch <- prometheus.MustNewConstMetric(descPrefixes, prometheus.GaugeValue, float64(div.Prefixes6), ns, name, "ipv6")
		if d, err := s.Allocator().DemandOf(ctx, ns, name); err == nil {
			gauge(descHeld, d.Held)
			gauge(descWaiting, d.Waiting)
		}
		if bans, err := s.Leases.Bans(ctx, ns, name); err == nil {
			n := 0
			for _, ds := range bans {
				n += len(ds)
			}
			gauge(descBans, n)
		}
		if hist, err := s.Leases.IPHistories(ctx, ns, name); err == nil {
			by := bannedAddresses(hist, s.Now())
			for _, b := range banBuckets {
				ch <- prometheus.MustNewConstMetric(descBannedIPs, prometheus.GaugeValue, float64(by[b]), ns, name, b)
			}
		}
		if sz := s.Catalog.Sizing(ctx, ns, name); sz != nil {
			gauge(descDesired, sz.Desired)
			gauge(descMinAvailable, max(sz.Desired-sz.MaxUnavailable, 0))
			stalled := 0
			if sz.RolloutStalled {
				stalled = 1
			}
			gauge(descStalled, stalled)
			if r := sz.Recycling; r != nil {
				day, hour := recycleCounts(r.Recycles, s.Now())
				for _, kind := range []string{egressip.ReasonDomains, egressip.ReasonTimes, egressip.ReasonDiversity, egressip.ReasonOther} {
					ch <- prometheus.MustNewConstMetric(descRecyclesDay, prometheus.GaugeValue, float64(day[kind]), ns, name, kind)
				}
				gauge(descRecyclesHour, hour)
				gauge(descRecycleBound, r.MaxPerHour)
				gauge(descBurned, r.Burned)
				atBound := 0
				if r.AtBound {
					atBound = 1
				}
				gauge(descAtBound, atBound)
				gauge(descSeenAgain, r.SeenAgain)
			}
		}
	}
}

// collectPools sends the proxies and healthy proxies of each pool of a
// pooled fleet's members ms; a fleet of one level has none.
func collectPools(ch chan<- prometheus.Metric, ns, name string, ms []catalog.Member) {
	pools := map[string]*[2]int{} // proxies, healthy
	for _, m := range ms {
		if m.Pool == "" {
			continue
		}
		if pools[m.Pool] == nil {
			pools[m.Pool] = &[2]int{}
		}
		pools[m.Pool][0]++
		if m.Healthy {
			pools[m.Pool][1]++
		}
	}
	for pool, n := range pools {
		ch <- prometheus.MustNewConstMetric(descPoolProxies, prometheus.GaugeValue, float64(n[0]), ns, name, pool)
		ch <- prometheus.MustNewConstMetric(descPoolHealthy, prometheus.GaugeValue, float64(n[1]), ns, name, pool)
	}
}

// recycleCounts counts the recycles of the last day by reason kind, and
// those of the last hour; one from the future (a skewed clock) counts as
// now.
func recycleCounts(marks []catalog.RecycleMark, now time.Time) (map[string]int, int) {
	day, hour := map[string]int{}, 0
	for _, m := range marks {
		at := egressip.NotAfter(m.At, now)
		if now.Sub(at) < 24*time.Hour {
			day[m.Kind]++
		}
		if now.Sub(at) < time.Hour {
			hour++
		}
	}
	return day, hour
}

// banBuckets are the values of egress_fleet_banned_addresses' domains label.
var banBuckets = []string{"1", "2-4", "5+"}

// bannedAddresses counts the IPs of hist banned now, by how many domains
// ban each (banBuckets).
func bannedAddresses(hist map[string][]lease.IPBan, now time.Time) map[string]int {
	out := map[string]int{}
	for _, h := range hist {
		domains := map[string]bool{}
		for _, b := range h {
			if b.Until > now.Unix() {
				domains[b.Domain] = true
			}
		}
		switch n := len(domains); {
		case n == 0:
		case n == 1:
			out["1"]++
		case n <= 4:
			out["2-4"]++
		default:
			out["5+"]++
		}
	}
	return out
}

// CatalogGauges count what the cache holds, read at each scrape (the
// cache's own objects, not copies of every one).
func CatalogGauges(c client.Reader) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "egress_discovery_active_leases", Help: "Unexpired leases held by crawlers."}, func() float64 {
			l := &coordv1.LeaseList{}
			if c.List(context.Background(), l, client.UnsafeDisableDeepCopy, client.MatchingLabels{fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindSlot}) != nil {
				return 0
			}
			n := 0
			for i := range l.Items {
				if !lease.Expired(&l.Items[i], time.Now()) {
					n++
				}
			}
			return float64(n)
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "egress_discovery_catalog_proxies", Help: "Proxies in the catalog."}, func() float64 {
			l := &v1alpha1.ProxyList{}
			if c.List(context.Background(), l, client.UnsafeDisableDeepCopy, client.HasLabels{fleetv1alpha1.LabelFleet}) != nil {
				return 0
			}
			return float64(len(l.Items))
		}),
	}
}
