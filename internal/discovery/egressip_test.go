package discovery_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/egressip"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	dmetrics "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
)

// TestDistinctEgressIPsFirst: crawlers-0 and crawlers-1 leave from one
// IP, so to a target they are one client. A lease goes to crawlers-2,
// which has an IP of its own, whenever it has a free slot, even when it is
// the busier; once it has none the two others serve, except for a domain
// that banned either of them, since it banned their IP. The status page
// says which IPs are shared.
func TestDistinctEgressIPsFirst(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	fleet(t, ns, "crawlers", 3, 2, nil)
	p := &v1alpha1.Proxy{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "crawlers-1"}, p); err != nil {
		t.Fatal(err)
	}
	p.Status.AtProvider.EgressIP = "198.51.100.0" // crawlers-0's
	if err := bed.Client.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	srv := server(t, fmt.Sprintf("team %[1]s team\n", ns))
	c := &apiv1.Client{BaseURL: srv.URL, Token: "team"}
	acquire := func(domain string) (*apiv1.Lease, error) {
		return c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "h", TTL: "1m", Domain: domain})
	}
	must := func(domain string) *apiv1.Lease {
		g, err := acquire(domain)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	// Eight times: without the preference, a random one of three.
	for i := range 8 {
		g := must("")
		if g.Proxy != "crawlers-2" {
			t.Fatalf("lease %d went to %s; want crawlers-2, the one proxy with an egress IP of its own", i, g.Proxy)
		}
		if err := c.Release(ctx, g.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	// Half full, crawlers-2 is still first: a distinct IP before load.
	must("")
	if g := must(""); g.Proxy != "crawlers-2" {
		t.Fatalf("with one of crawlers-2's two slots held, the next lease went to %s; want crawlers-2", g.Proxy)
	}
	// Full, the shared ones serve; a ban of crawlers-1 for a domain holds
	// for crawlers-0, which leaves from the same IP.
	banned := must("")
	if banned.Proxy == "crawlers-2" {
		t.Fatalf("crawlers-2's slots are held; the next lease went to it again")
	}
	if err := c.Report(ctx, banned.LeaseID, apiv1.ReportRequest{Domain: "shop.example", Outcome: "banned"}); err != nil {
		t.Fatal(err)
	}
	if g, err := acquire("shop.example"); err == nil {
		t.Fatalf("shop.example banned %s, and so its IP; a lease for it went to %s, which shares that IP", banned.Proxy, g.Proxy)
	} else if ae := apiErr(err); ae == nil || ae.Detail.Reason != apiv1.ReasonNoFreeSlot {
		t.Fatalf("shop.example banned %s's IP: want %s, got %v", banned.Proxy, apiv1.ReasonNoFreeSlot, err)
	}
	if g := must("other.example"); g.Proxy == "crawlers-2" {
		t.Fatalf("another domain: a lease went to the full crawlers-2")
	}
	code, _, body := call(t, srv, "team", "GET", "/", "")
	page := string(body)
	if code != 200 || !strings.Contains(page, "2 distinct egress IPs in 1 IPv4 /24s and 0 IPv6 /64s") || strings.Count(page, ">shared<") != 2 {
		t.Errorf("the status page shows 2 distinct egress IPs, both in one /24, and two proxies' IP shared (%d):\n%s", code, page)
	}
}

// setEgressIP changes a test Proxy's egress IP, and with label its
// beyond-diversity-limit label.
func setEgressIP(t *testing.T, ns, name, ip string, beyond bool) {
	t.Helper()
	bed := sharedBed.Env(t)
	ctx := context.Background()
	p := &v1alpha1.Proxy{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, p); err != nil {
		t.Fatal(err)
	}
	if beyond {
		p.Labels[fleetv1alpha1.LabelBeyondDiversityLimit] = "true"
		if err := bed.Client.Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	p.Status.AtProvider.EgressIP = ip
	if err := bed.Client.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
}

// TestLeasesSpreadOverNetworks: a target counts an IPv4 /24 (an IPv6
// /64) as one client, so leases go to the network holding the fewest
// first, and within it to the least loaded proxy. crawlers-0 and -1 share
// 198.51.100.0/24; crawlers-2 and -3 are alone in theirs.
func TestLeasesSpreadOverNetworks(t *testing.T) {
	ns := sharedBed.Env(t).Namespace(t)
	fleet(t, ns, "crawlers", 4, 2, nil)
	setEgressIP(t, ns, "crawlers-2", "203.0.113.7", false)
	setEgressIP(t, ns, "crawlers-3", "2001:db8::7", false)
	network := map[string]string{"crawlers-0": "A", "crawlers-1": "A", "crawlers-2": "B", "crawlers-3": "C"}
	srv := server(t, fmt.Sprintf("team %[1]s team\n", ns))
	c := &apiv1.Client{BaseURL: srv.URL, Token: "team"}
	for round := range 5 {
		var got []string
		var held []string
		for range 3 {
			g, err := c.Acquire(context.Background(), apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "h", TTL: "1m"})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, network[g.Proxy])
			held = append(held, g.LeaseID)
		}
		if got[0] == got[1] || got[1] == got[2] || got[0] == got[2] {
			t.Fatalf("round %d: three leases went to networks %v; want one in each of the three", round, got)
		}
		// Each network holds one: the fourth goes to A's idle proxy, the
		// least loaded of all; the fifth to B or C, which hold one lease
		// to A's two.
		g4, err := c.Acquire(context.Background(), apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "h", TTL: "1m"})
		if err != nil {
			t.Fatal(err)
		}
		g5, err := c.Acquire(context.Background(), apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "h", TTL: "1m"})
		if err != nil {
			t.Fatal(err)
		}
		if network[g4.Proxy] != "A" || network[g5.Proxy] == "A" {
			t.Fatalf("round %d: the fourth lease went to %s and the fifth to %s; want A's idle proxy, then B or C", round, g4.Proxy, g5.Proxy)
		}
		for _, id := range append(held, g4.LeaseID, g5.LeaseID) {
			if err := c.Release(context.Background(), id); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestBeyondDiversityLimitLast: a proxy its fleet labels beyond
// spec.diversity is handed out only once every other proxy is full; the
// fleet metrics count it, and the fleet's ASNs where a database is given,
// and the status page says so.
func TestBeyondDiversityLimitLast(t *testing.T) {
	ns := sharedBed.Env(t).Namespace(t)
	fleet(t, ns, "crawlers", 4, 1, nil)
	setEgressIP(t, ns, "crawlers-1", "198.51.100.1", true)
	srv := server(t, fmt.Sprintf("team %[1]s team\n", ns))
	c := &apiv1.Client{BaseURL: srv.URL, Token: "team"}
	acquire := func() *apiv1.Lease {
		g, err := c.Acquire(context.Background(), apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "h", TTL: "1m"})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	for i := range 8 {
		g := acquire()
		if g.Proxy == "crawlers-1" {
			t.Fatalf("lease %d went to crawlers-1, beyond the fleet's diversity caps, with three others free", i)
		}
		if err := c.Release(context.Background(), g.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		acquire()
	}
	if g := acquire(); g.Proxy != "crawlers-1" {
		t.Errorf("with the others full the lease went to %s; crawlers-1 still serves, last", g.Proxy)
	}

	bed := sharedBed.Env(t)
	s := discovery.NewServer(discovery.ServerConfig{
		Catalog: discovery.NewCatalog(discovery.CatalogConfig{Cache: bed.Client, Direct: bed.Client, Fleets: bed.Client}),
		Leases:  lease.NewStore(lease.StoreConfig{Client: bed.Client}), Metrics: dmetrics.NewDiscovery(), Log: logging.NewNopLogger(),
		ASN: egressip.Table{netip.MustParsePrefix("198.51.100.0/25"): 64500, netip.MustParsePrefix("198.51.100.128/25"): 64501},
	})
	for name, want := range map[string]float64{"egress_fleet_beyond_diversity_limit_proxies": 1, "egress_fleet_egress_asns": 1} {
		if got, ok := fleetGauge(t, discovery.FleetCollector{Server: s}, name, ns); !ok || got != want {
			t.Errorf("%s of the fleet: %v (%v), want %v", name, got, ok, want)
		}
	}
	code, _, body := call(t, srv, "team", "GET", "/", "")
	if code != 200 || !strings.Contains(string(body), "4 distinct egress IPs in 1 IPv4 /24s and 0 IPv6 /64s, 1 beyond spec.diversity") {
		t.Errorf("the status page (%d) says how many proxies are beyond spec.diversity:\n%s", code, body)
	}
}

// fleetGauge is the value of the fleet metric name for namespace ns's
// fleet, as c collects it (the shared bed holds other tests' fleets).
func fleetGauge(t *testing.T, c prometheus.Collector, name, ns string) (float64, bool) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "namespace" && l.GetValue() == ns {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// TestBanFollowsTheAddress: a target bans an address, not a proxy. A ban
// reported on a proxy holds for the proxy that leaves from its address
// next, after the first is gone; and an address with a recent ban in its
// history is handed out after clean ones, for any domain.
func TestBanFollowsTheAddress(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	fleet(t, ns, "crawlers", 3, 1, nil)
	srv := server(t, fmt.Sprintf("team %[1]s team\n", ns))
	c := &apiv1.Client{BaseURL: srv.URL, Token: "team"}
	acquire := func(domain string) (*apiv1.Lease, error) {
		return c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "h", TTL: "1m", Domain: domain})
	}
	g, err := acquire("")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Report(ctx, g.LeaseID, apiv1.ReportRequest{Domain: "shop.example", Outcome: "banned"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, g.LeaseID); err != nil {
		t.Fatal(err)
	}
	// The banned proxy goes; another takes its address.
	gone := &v1alpha1.Proxy{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: g.Proxy}, gone); err != nil {
		t.Fatal(err)
	}
	if err := bed.Client.Delete(ctx, gone); err != nil {
		t.Fatal(err)
	}
	var heir, clean string
	for _, n := range []string{"crawlers-0", "crawlers-1", "crawlers-2"} {
		switch {
		case n == g.Proxy:
		case heir == "":
			heir = n
		default:
			clean = n
		}
	}
	setEgressIP(t, ns, heir, gone.Status.AtProvider.EgressIP, false)

	// The fleet shows the banned address whichever proxy leaves from it.
	if got, ok := fleetGauge(t, discovery.FleetCollector{Server: discovery.NewServer(discovery.ServerConfig{
		Catalog: discovery.NewCatalog(discovery.CatalogConfig{Cache: bed.Client, Direct: bed.Client, Fleets: bed.Client}),
		Leases:  lease.NewStore(lease.StoreConfig{Client: bed.Client}), Metrics: dmetrics.NewDiscovery(), Log: logging.NewNopLogger(),
	})}, "egress_fleet_banned_addresses", ns); !ok || got != 1 {
		t.Errorf("egress_fleet_banned_addresses of the fleet: %v (%v), want 1 banned by one domain", got, ok)
	}
	if code, _, body := call(t, srv, "team", "GET", "/", ""); code != 200 || !strings.Contains(string(body), "1 banned now by some domain") {
		t.Errorf("the status page (%d) counts the banned address:\n%s", code, body)
	}

	// Any domain: the clean proxy first, every time.
	for i := range 6 {
		l, err := acquire("other.example")
		if err != nil {
			t.Fatal(err)
		}
		if l.Proxy != clean {
			t.Fatalf("lease %d went to %s, whose address shop.example banned lately; want %s, clean", i, l.Proxy, clean)
		}
		if err := c.Release(ctx, l.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	// shop.example: never the heir of the banned address.
	l, err := acquire("shop.example")
	if err != nil || l.Proxy != clean {
		t.Fatalf("shop.example: %v, %v; want %s", l, err, clean)
	}
	if l2, err := acquire("shop.example"); err == nil {
		t.Fatalf("shop.example banned %s; a lease for it went to %s, which leaves from that address now", gone.Status.AtProvider.EgressIP, l2.Proxy)
	} else if ae := apiErr(err); ae == nil || ae.Detail.Reason != apiv1.ReasonNoFreeSlot {
		t.Fatalf("shop.example banned %s: want %s, got %v", gone.Status.AtProvider.EgressIP, apiv1.ReasonNoFreeSlot, err)
	}
	// Another domain still gets the heir, last.
	l3, err := acquire("other.example")
	if err != nil || l3.Proxy != heir {
		t.Fatalf("other.example with %s full: %v, %v; want %s", clean, l3, err, heir)
	}
	// A crawler finds shop.example fine through the heir: the address's
	// ban ends now, and the heir serves shop.example again.
	if err := c.Report(ctx, l3.LeaseID, apiv1.ReportRequest{Domain: "shop.example", Outcome: "ok"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, l3.LeaseID); err != nil {
		t.Fatal(err)
	}
	if l4, err := acquire("shop.example"); err != nil || l4.Proxy != heir {
		t.Errorf("shop.example after an ok report through %s: %v, %v", heir, l4, err)
	}
}

// TestBanHistoryOwnedByTheFleet: an address's ban history belongs to the
// fleet: the Proxy's controller, or in a pooled fleet (a ProxyPool
// controls its Proxies, and may go while its fleet stays) the ProxyFleet.
func TestBanHistoryOwnedByTheFleet(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	xr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyFleet",
		"metadata": map[string]any{"name": "pooled", "namespace": ns},
		"spec": map[string]any{
			"replicas": int64(1), "zones": []any{"zone-a"}, "placement": map[string]any{"local": map[string]any{}},
			"proxy": map[string]any{"authSecretRef": map[string]any{"name": "auth"}}, "healthCheck": map[string]any{"url": "https://example.com/ip"},
		},
	}}
	if err := bed.Client.Create(ctx, xr); err != nil {
		t.Fatal(err)
	}
	fleet(t, ns, "pooled", 1, 1, nil)
	p := &v1alpha1.Proxy{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "pooled-0"}, p); err != nil {
		t.Fatal(err)
	}
	owner := discovery.ProxyController(bed.Client, bed.Client)
	if o := owner(ctx, ns, "pooled-0"); o != nil {
		t.Errorf("a Proxy without a controller names no owner: %+v", o)
	}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "crawl.example.com/v1alpha1", Kind: "ProxyPool", Name: "pooled-pool-1", UID: "0b7c6a2e-1111-4222-8333-944455556666", Controller: ptr.To(true)}}
	if err := bed.Client.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	if o := owner(ctx, ns, "pooled-0"); o == nil || o.Kind != "ProxyFleet" || o.Name != "pooled" || o.UID != xr.GetUID() {
		t.Errorf("a pooled Proxy's history is owned by its ProxyFleet: %+v", o)
	}
}

// TestRecyclingVisible: what a fleet's status says of its recycles (the
// day's, by rule; the hour's against spec.recycling.maxPerHour; the burned
// waiting and why; the addresses seen again) is in the fleet metrics and
// on the status page; a fleet without spec.recycling has none of these
// series.
func TestRecyclingVisible(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	fleet(t, ns, "crawlers", 2, 1, nil)
	fleetXR(t, ns, "crawlers", 2, nil)
	xr := &unstructured.Unstructured{}
	xr.SetGroupVersionKind(fleetv1alpha1.SchemeGroupVersion.WithKind(fleetv1alpha1.ProxyFleetKind))
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "crawlers"}, xr); err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedMap(xr.Object, map[string]any{"bannedByDomains": int64(2), "maxPerHour": int64(3)}, "spec", "recycling")
	if err := bed.Client.Update(ctx, xr); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	rec := func(ago time.Duration, reason string) any {
		return map[string]any{"proxy": "crawlers-9", "egressIP": "203.0.113.9", "reason": reason, "time": now.Add(-ago).UTC().Format(time.RFC3339)}
	}
	_ = unstructured.SetNestedMap(xr.Object, map[string]any{
		"desiredReplicas": int64(2),
		"egress": map[string]any{
			"beyondLimit": int64(0), "seenAgain": int64(1), "burned": int64(2),
			"recycleWaiting": "crawlers-0, crawlers-1: spec.recycling's bounds: at most 3 recycles an hour", "recyclesAtBound": true,
			"recycles": []any{
				rec(5*time.Hour, "203.0.113.7 banned by 2 or more domains within 1h0m0s"),
				rec(40*time.Minute, "203.0.113.8 banned 5 or more times by one domain within 1h0m0s"),
				rec(10*time.Minute, "203.0.113.9 banned by 2 or more domains within 1h0m0s"),
			},
		},
	}, "status")
	if err := bed.Client.Status().Update(ctx, xr); err != nil {
		t.Fatal(err)
	}
	other := bed.Namespace(t)
	fleet(t, other, "plain", 1, 1, nil)
	fleetXR(t, other, "plain", 1, nil)
	// A VM fleet replacing proxies beyond its diversity caps, without
	// spec.recycling, recycles too: its series are there.
	vms := bed.Namespace(t)
	fleet(t, vms, "vms", 1, 1, nil)
	fleetXR(t, vms, "vms", 1, nil)
	vx := &unstructured.Unstructured{}
	vx.SetGroupVersionKind(fleetv1alpha1.SchemeGroupVersion.WithKind(fleetv1alpha1.ProxyFleetKind))
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: vms, Name: "vms"}, vx); err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedMap(vx.Object, map[string]any{"gcp": map[string]any{}}, "spec", "placement")
	_ = unstructured.SetNestedMap(vx.Object, map[string]any{"maxPerIPv4Prefix": int64(1), "replaceBeyondLimit": true}, "spec", "diversity")
	if err := bed.Client.Update(ctx, vx); err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedMap(vx.Object, map[string]any{"desiredReplicas": int64(1)}, "status")
	if err := bed.Client.Status().Update(ctx, vx); err != nil {
		t.Fatal(err)
	}

	s := discovery.NewServer(discovery.ServerConfig{
		Catalog: discovery.NewCatalog(discovery.CatalogConfig{Cache: bed.Client, Direct: bed.Client, Fleets: bed.Client}),
		Leases:  lease.NewStore(lease.StoreConfig{Client: bed.Client}), Metrics: dmetrics.NewDiscovery(), Log: logging.NewNopLogger(),
	})
	c := discovery.FleetCollector{Server: s}
	for name, want := range map[string]float64{
		"egress_fleet_recycles_last_hour": 2, "egress_fleet_recycles_max_per_hour": 3,
		"egress_fleet_burned_proxies_waiting": 2, "egress_fleet_addresses_seen_again": 1, "egress_fleet_recycles_at_bound": 1,
	} {
		if got, ok := fleetGauge(t, c, name, ns); !ok || got != want {
			t.Errorf("%s of the fleet: %v (%v), want %v", name, got, ok, want)
		}
		if _, ok := fleetGauge(t, c, name, other); ok {
			t.Errorf("%s of a fleet without spec.recycling", name)
		}
	}
	if got, ok := fleetGauge(t, c, "egress_fleet_recycles_max_per_hour", vms); !ok || got != 2 {
		t.Errorf("egress_fleet_recycles_max_per_hour of a fleet replacing proxies beyond its caps: %v (%v), want the default 2", got, ok)
	}
	byReason := map[string]float64{}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "egress_fleet_recycles_last_day" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] == ns {
				byReason[labels["reason"]] = m.GetGauge().GetValue()
			}
		}
	}
	if want := map[string]float64{"domains": 2, "times": 1, "diversity": 0, "other": 0}; fmt.Sprint(byReason) != fmt.Sprint(want) {
		t.Errorf("egress_fleet_recycles_last_day by reason: %v, want %v", byReason, want)
	}

	srv := server(t, fmt.Sprintf("team %[1]s team\n", ns))
	code, _, body := call(t, srv, "team", "GET", "/", "")
	if want := "recycling: 3 recycles in the last day (at most 3 an hour), 1 addresses seen again; 2 due waiting (at the bound): crawlers-0, crawlers-1: spec.recycling&#39;s bounds: at most 3 recycles an hour"; code != 200 || !strings.Contains(string(body), want) {
		t.Errorf("the status page (%d) says %q:\n%s", code, want, body)
	}
}
