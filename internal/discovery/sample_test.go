package discovery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	dmetrics "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// cachedServer serves discovery's API from a replica's informer cache of
// ns, as egress-discovery does (its Leases indexed, takes re-checked on
// the cached Proxy), to the static token "t".
func cachedServer(t *testing.T, ns string) (*httptest.Server, client.Client, cache.Cache, *dmetrics.Discovery) {
	t.Helper()
	c, ca := sharedBed.Env(t).Replica(t, ns, &coordv1.Lease{}, &v1alpha1.Proxy{})
	m := dmetrics.NewDiscovery()
	srv := httptest.NewServer((discovery.NewServer(discovery.ServerConfig{
		Catalog: discovery.NewCatalog(discovery.CatalogConfig{Cache: ca, Direct: c}),
		Leases:  lease.NewStore(lease.StoreConfig{Client: c, Cache: ca, Serving: discovery.ProxyServing(ca)}),
		Auth:    discovery.NewKubernetes(discovery.KubernetesConfig{Client: c, Static: staticTokens(t, "t "+ns+" crawler\n")}), Metrics: m, Log: logging.NewNopLogger(),
	})).Handler())
	t.Cleanup(srv.Close)
	return srv, c, ca, m
}

// TestLargeFleetAcquisition: in a fleet larger than a sample (150 proxies,
// one slot each), an acquisition ranks a random sample, yet every proxy's
// slot is granted before any is refused (the last ones only the whole
// fleet's ranking finds), the one slot freed in a full fleet is found, a
// sticky key keeps its proxy, and zone, exclusion and bans hold for the
// sample as for the fleet.
func TestLargeFleetAcquisition(t *testing.T) {
	ctx := context.Background()
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	const n = 150
	fleet(t, ns, "f", n, 1, nil)
	fleet(t, ns, "g", n, 3, nil)
	srv, c, ca, m := cachedServer(t, ns)
	acquire := func(body string) (int, apiv1.Lease) {
		t.Helper()
		code, _, out := call(t, srv, "t", http.MethodPost, "/v1/leases", body)
		var l apiv1.Lease
		if code == http.StatusCreated {
			if err := json.Unmarshal(out, &l); err != nil {
				t.Fatal(err)
			}
		}
		return code, l
	}
	cached := func(fleet string, want int) {
		t.Helper()
		testbed.Eventually(t, 20*time.Second, "the cache sees the leases", func() (bool, string) {
			l := &coordv1.LeaseList{}
			if err := ca.List(ctx, l, client.InNamespace(ns), client.MatchingLabels{fleetv1alpha1.LabelFleet: fleet, fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindSlot}); err != nil {
				return false, err.Error()
			}
			return len(l.Items) == want, fmt.Sprintf("%d of %d", len(l.Items), want)
		})
	}
	testbed.Eventually(t, 20*time.Second, "the cache sees the fleets", func() (bool, string) {
		l := &v1alpha1.ProxyList{}
		if err := ca.List(ctx, l, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		return len(l.Items) == 2*n, fmt.Sprint(len(l.Items))
	})

	// Every slot of f, then a refusal. Each acquisition waits for the
	// cache to show the one before, so that its sample sees the fleet
	// filling up and the last ones must rank the whole fleet.
	held := map[string]string{}
	for i := range n {
		code, l := acquire(fmt.Sprintf(`{"fleet": "%s/f", "holder": "h-%d", "ttl": "10m", "maxWait": "0"}`, ns, i))
		if code != http.StatusCreated {
			t.Fatalf("acquisition %d of %d slots: %d", i+1, n, code)
		}
		if _, twice := held[l.Proxy]; twice {
			t.Fatalf("acquisition %d: %s granted twice with maxLeases 1", i+1, l.Proxy)
		}
		held[l.Proxy] = l.LeaseID
		cached("f", i+1)
	}
	sampled := testutil.ToFloat64(m.Rankings.WithLabelValues("sample"))
	whole := testutil.ToFloat64(m.Rankings.WithLabelValues("fleet"))
	if sampled < n/2 || whole < 1 {
		t.Errorf("filling a fleet of %d: %v acquisitions served by a sample, %v by the whole fleet; want most by a sample and the last by the fleet", n, sampled, whole)
	}
	if code, _ := acquire(fmt.Sprintf(`{"fleet": "%s/f", "holder": "late", "ttl": "10m", "maxWait": "0"}`, ns)); code != http.StatusConflict {
		t.Fatalf("a full fleet: want 409, got %d", code)
	}
	if code, _ := acquire(fmt.Sprintf(`{"fleet": "%s/f", "holder": "late", "zone": "nowhere", "ttl": "10m", "maxWait": "0"}`, ns)); code != http.StatusConflict {
		t.Fatalf("a zone the fleet has no proxy in: want 409, got %d", code)
	}
	// One freed slot of a full fleet is found.
	if code, _, _ := call(t, srv, "t", http.MethodDelete, "/v1/leases/"+held["f-77"], ""); code != http.StatusNoContent {
		t.Fatalf("release: %d", code)
	}
	cached("f", n-1)
	if code, l := acquire(fmt.Sprintf(`{"fleet": "%s/f", "holder": "again", "ttl": "10m", "maxWait": "0"}`, ns)); code != http.StatusCreated || l.Proxy != "f-77" {
		t.Fatalf("the one free slot of %d: want f-77, got %d %s", n, code, l.Proxy)
	}

	// g has room everywhere: a sample serves. A sticky key keeps its
	// proxy; a zone, an exclusion and a ban are kept.
	code, first := acquire(fmt.Sprintf(`{"fleet": "%s/g", "holder": "s-0", "stickyKey": "session-1", "ttl": "10m", "maxWait": "0"}`, ns))
	if code != http.StatusCreated {
		t.Fatalf("g: %d", code)
	}
	cached("g", 1)
	ids := []string{first.LeaseID}
	for i := 1; i < 3; i++ {
		code, l := acquire(fmt.Sprintf(`{"fleet": "%s/g", "holder": "s-%d", "stickyKey": "session-1", "ttl": "10m", "maxWait": "0"}`, ns, i))
		if code != http.StatusCreated || l.Proxy != first.Proxy {
			t.Fatalf("sticky key, acquisition %d: want %s, got %d %s", i+1, first.Proxy, code, l.Proxy)
		}
		ids = append(ids, l.LeaseID)
		cached("g", i+1)
	}
	// The sticky proxy is full: a holder releasing one of its leases and
	// acquiring again at once, before the cache saw the release, keeps
	// it.
	for round := range 10 {
		if code, _, _ := call(t, srv, "t", http.MethodDelete, "/v1/leases/"+ids[round%3], ""); code != http.StatusNoContent {
			t.Fatalf("round %d: release: %d", round, code)
		}
		code, l := acquire(fmt.Sprintf(`{"fleet": "%s/g", "holder": "r-%d", "stickyKey": "session-1", "ttl": "10m", "maxWait": "0"}`, ns, round))
		if code != http.StatusCreated || l.Proxy != first.Proxy {
			t.Fatalf("round %d: a sticky key re-acquiring its full proxy's slot just released: want %s, got %d %s", round, first.Proxy, code, l.Proxy)
		}
		ids[round%3] = l.LeaseID
	}
	cached("g", 3)
	// A sticky key's acquisitions back to back (the next may come before
	// the cache shows the last: TestStickyRemembersOwnGrants): one proxy.
	var burst string
	for i := range 3 {
		code, l := acquire(fmt.Sprintf(`{"fleet": "%s/g", "holder": "b-%d", "stickyKey": "burst", "ttl": "10m", "maxWait": "0"}`, ns, i))
		if code != http.StatusCreated || (burst != "" && l.Proxy != burst) {
			t.Fatalf("sticky key, back-to-back acquisition %d: want %q, got %d %s", i+1, burst, code, l.Proxy)
		}
		burst = l.Proxy
	}
	cached("g", 6)
	for i := range 20 {
		code, l := acquire(fmt.Sprintf(`{"fleet": "%s/g", "holder": "z-%d", "zone": "zone-b", "ttl": "10m", "maxWait": "0"}`, ns, i))
		var k int
		if _, err := fmt.Sscanf(l.Proxy, "g-%d", &k); code != http.StatusCreated || err != nil || k%2 != 1 {
			t.Fatalf("zone-b: want an odd proxy (zone-b), got %d %s", code, l.Proxy)
		}
	}
	// Every proxy but two banned for a domain: only they serve it,
	// whichever sample is drawn. Two of zone-a (the zone-b acquisitions
	// above took none of their slots), not the sticky key's.
	var open []string
	for _, p := range []string{"g-2", "g-4", "g-6", "g-8"} {
		if p != first.Proxy && p != burst && len(open) < 2 {
			open = append(open, p)
		}
	}
	bans := lease.NewStore(lease.StoreConfig{Client: bed.Client})
	for i := range n {
		if p := fmt.Sprintf("g-%d", i); p != open[0] && p != open[1] {
			if err := bans.Ban(ctx, ns, "g", p, "example.org", time.Hour, "crawler"); err != nil {
				t.Fatal(err)
			}
		}
	}
	testbed.Eventually(t, 20*time.Second, "the cache sees the bans", func() (bool, string) {
		b, err := (lease.NewStore(lease.StoreConfig{Client: c, Cache: ca})).Bans(ctx, ns, "g")
		return err == nil && len(b) == n-2, fmt.Sprint(len(b), err)
	})
	for i := range 4 {
		code, l := acquire(fmt.Sprintf(`{"fleet": "%s/g", "holder": "d-%d", "domain": "example.org", "ttl": "10m", "maxWait": "0"}`, ns, i))
		if code != http.StatusCreated || (l.Proxy != open[0] && l.Proxy != open[1]) {
			t.Fatalf("all but %v banned for example.org: got %d %s", open, code, l.Proxy)
		}
		cached("g", 6+20+i+1)
	}
}

// TestLargeFleetOwnIPsFirst: in a fleet larger than a sample, proxies
// leaving from an egress IP of their own are handed out before those that
// share one, as in a small fleet: 10 of 150 have their own, and the first
// 10 leases go to them.
func TestLargeFleetOwnIPsFirst(t *testing.T) {
	ctx := context.Background()
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	const n = 150
	fleet(t, ns, "h", n, 1, nil)
	for i := 10; i < n; i++ {
		p := &v1alpha1.Proxy{}
		if err := bed.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("h-%d", i)}, p); err != nil {
			t.Fatal(err)
		}
		p.Status.AtProvider.EgressIP = "203.0.113.7"
		if err := bed.Client.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	srv, c, ca, _ := cachedServer(t, ns)
	testbed.Eventually(t, 20*time.Second, "the cache sees the shared IPs", func() (bool, string) {
		l := &v1alpha1.ProxyList{}
		if err := ca.List(ctx, l, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		shared := 0
		for _, p := range l.Items {
			if p.Status.AtProvider.EgressIP == "203.0.113.7" {
				shared++
			}
		}
		return shared == n-10, fmt.Sprint(shared)
	})
	for i := range 10 {
		code, _, out := call(t, srv, "t", http.MethodPost, "/v1/leases", fmt.Sprintf(`{"fleet": "%s/h", "holder": "o-%d", "ttl": "10m", "maxWait": "0"}`, ns, i))
		var l apiv1.Lease
		if code != http.StatusCreated || json.Unmarshal(out, &l) != nil {
			t.Fatalf("acquisition %d: %d %s", i, code, out)
		}
		var k int
		if _, err := fmt.Sscanf(l.Proxy, "h-%d", &k); err != nil || k >= 10 {
			t.Fatalf("acquisition %d of 10 with 10 proxies of an IP of their own free: got %s, which shares its IP", i+1, l.Proxy)
		}
		testbed.Eventually(t, 10*time.Second, "the cache sees the lease", func() (bool, string) {
			v, err := (lease.NewStore(lease.StoreConfig{Client: c, Cache: ca})).Slots(ctx, ns, "h")
			return err == nil && len(v) == i+1, fmt.Sprint(len(v), err)
		})
	}
}
