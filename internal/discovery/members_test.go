package discovery_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestFleetMembersRemembered: the catalog lists a fleet's proxies once
// while none of them changes (an acquisition asks at every try), and a
// change of any Proxy is seen at the next call after the cache saw it.
func TestFleetMembersRemembered(t *testing.T) {
	ctx := context.Background()
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "f", 3, 1, nil)
	c, ca := bed.Replica(t, ns, &coordv1.Lease{}, &v1alpha1.Proxy{})
	cat := discovery.NewCatalog(discovery.CatalogConfig{Cache: ca, Direct: c})
	healthy := func() (int, *string) {
		ms, err := cat.Fleet(ctx, ns, "f")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, m := range ms {
			if m.Healthy {
				n++
			}
		}
		if len(ms) == 0 {
			return 0, nil
		}
		return n, &ms[0].Name
	}
	testbed.Eventually(t, 10*time.Second, "the cache sees the fleet", func() (bool, string) {
		n, _ := healthy()
		return n == 3, "healthy proxies: " + string(rune('0'+n))
	})
	// Nothing changed: the same members, not a new list.
	_, a := healthy()
	_, b := healthy()
	if a != b {
		t.Error("the catalog listed an unchanged fleet again: nothing is remembered")
	}
	setHealthy(t, ns, "f-1", false)
	testbed.Eventually(t, 10*time.Second, "a proxy turned unhealthy is seen", func() (bool, string) {
		n, _ := healthy()
		return n == 2, "healthy proxies: " + string(rune('0'+n))
	})
}

// TestAllMembersRemembered: Catalog.All, which the summary publisher asks
// each second, lists the proxies once while none changes, and shows a
// change of any at the next call after the cache saw it: a proxy turned
// unhealthy, a new fleet's proxies.
func TestAllMembersRemembered(t *testing.T) {
	ctx := context.Background()
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "f", 3, 1, nil)
	c, ca := bed.Replica(t, ns, &coordv1.Lease{}, &v1alpha1.Proxy{})
	cat := discovery.NewCatalog(discovery.CatalogConfig{Cache: ca, Direct: c})
	// healthy counts each fleet's healthy members, and names the first
	// member of f as All keeps it.
	healthy := func() (map[string]int, *string) {
		all, err := cat.All(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := map[string]int{}
		for key, ms := range all {
			for _, m := range ms {
				if m.Healthy {
					n[key]++
				}
			}
		}
		if ms := all[ns+"/f"]; len(ms) > 0 {
			return n, &ms[0].Name
		}
		return n, nil
	}
	testbed.Eventually(t, 10*time.Second, "the cache sees the fleet", func() (bool, string) {
		n, _ := healthy()
		return n[ns+"/f"] == 3, fmt.Sprint(n)
	})
	_, a := healthy()
	_, b := healthy()
	if a == nil || a != b {
		t.Error("All listed unchanged proxies again: nothing is remembered")
	}
	setHealthy(t, ns, "f-1", false)
	testbed.Eventually(t, 10*time.Second, "a proxy turned unhealthy is seen", func() (bool, string) {
		n, _ := healthy()
		return n[ns+"/f"] == 2, fmt.Sprint(n)
	})
	fleet(t, ns, "g", 2, 1, nil)
	testbed.Eventually(t, 10*time.Second, "another fleet's new proxies are seen", func() (bool, string) {
		n, _ := healthy()
		return n[ns+"/f"] == 2 && n[ns+"/g"] == 2, fmt.Sprint(n)
	})
}

// TestTakeRechecksFleetAndMaxLeases: a take asks the cache's Proxy, not the
// ranked candidate, whether its slot is below maxLeases and the proxy still
// the fleet's. Candidates ranked before maxLeasesPerProxy was lowered (the
// remembered members lag the cache) get no holder beyond the new maximum.
func TestTakeRechecksFleetAndMaxLeases(t *testing.T) {
	ctx := context.Background()
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "f", 1, 2, nil)
	c, ca := bed.Replica(t, ns, &coordv1.Lease{}, &v1alpha1.Proxy{})
	s := lease.NewStore(lease.StoreConfig{Client: c, Cache: ca, Serving: discovery.ProxyServing(ca)})
	testbed.Eventually(t, 10*time.Second, "the cache sees the proxy", func() (bool, string) {
		return discovery.ProxyServing(ca)(ctx, ns, "f", "f-0", 0), "not serving yet"
	})
	// Ranked as if it still took 4 holders: only its 2 slots are granted.
	stale := []lease.Candidate{{Namespace: ns, Fleet: "f", Proxy: "f-0", MaxLeases: 4}}
	for i := range 4 {
		_, err := s.Acquire(ctx, stale, lease.Request{Holder: fmt.Sprintf("h-%d", i), TTL: time.Minute})
		switch {
		case i < 2 && err != nil:
			t.Fatalf("holder %d of 2: %v", i, err)
		case i >= 2 && !errors.Is(err, lease.ErrUnavailable):
			t.Fatalf("holder %d of a proxy of maxLeases 2: want ErrUnavailable, got %v", i, err)
		}
	}
	l := &coordv1.LeaseList{}
	if err := c.List(ctx, l, client.InNamespace(ns)); err != nil || len(l.Items) != 2 {
		t.Fatalf("want 2 slot Leases, got %d (%v)", len(l.Items), err)
	}
	// A candidate of another fleet (a label moved, a stale memory) is
	// not the proxy's fleet: refused.
	if _, err := s.Acquire(ctx, []lease.Candidate{{Namespace: ns, Fleet: "g", Proxy: "f-0", MaxLeases: 4}}, lease.Request{Holder: "x", TTL: time.Minute}); !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("a take for fleet g of a proxy of fleet f: want ErrUnavailable, got %v", err)
	}
}
