package discovery_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	coordv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease/leasetest"
	dmetrics "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
)

// TestServersConcurrency runs 4 discovery servers (each with its own client
// and cache, as 4 replicas) against one real apiserver, with 64 crawlers
// making at least 10 000 acquisitions through the HTTP API. Server 0 is
// killed half-way, connections and all; its crawlers move to the others and
// release through them what it granted. Neither the API objects nor the
// grant log may ever show more than maxLeases holders on a proxy or two on a
// slot.
func TestServersConcurrency(t *testing.T) {
	const (
		replicas  = 4
		clients   = 64
		target    = 10000
		maxLeases = 2
		proxies   = 32
	)
	ctx := context.Background()
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "crawlers", proxies, maxLeases, nil)
	st := staticTokens(t, "t "+ns+"\n")

	servers := make([]*httptest.Server, replicas)
	for i := range replicas {
		c, ca := bed.Replica(t, ns, &coordv1.Lease{}, &v1alpha1.Proxy{})
		servers[i] = httptest.NewServer((discovery.NewServer(discovery.ServerConfig{
			Catalog: discovery.NewCatalog(discovery.CatalogConfig{Cache: ca, Direct: c}), Leases: lease.NewStore(lease.StoreConfig{Client: c, Cache: ca}),
			Auth: discovery.NewKubernetes(discovery.KubernetesConfig{Client: c, Static: st}), Metrics: dmetrics.NewDiscovery(), Log: logging.NewNopLogger(),
		})).Handler())
		t.Cleanup(servers[i].Close)
	}

	type event struct {
		slot, holder      string
		granted, released time.Time
	}
	var (
		mu                       sync.Mutex
		log                      []event
		grants, refused, aborted atomic.Int64
		dead                     atomic.Bool
	)
	watchHolders := leasetest.WatchHolders(ctx, bed.Client, ns)

	server := func(w int, attempt int) *apiv1.Client {
		r := (w + attempt) % replicas
		if r == 0 && dead.Load() {
			r = 1 + (w+attempt)%(replicas-1)
		}
		return &apiv1.Client{BaseURL: servers[r].URL, Token: "t"}
	}
	start := time.Now()
	var wg sync.WaitGroup
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			holder := fmt.Sprintf("crawler-%d", w)
			for grants.Load() < target {
				l, err := server(w, 0).Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: holder, TTL: "30s"})
				var ae *apiv1.APIError
				switch {
				case errors.As(err, &ae) && ae.Status == 409:
					refused.Add(1)
					continue
				case err != nil:
					// The server died mid-request; a lease it granted is
					// in the API server and runs out with its TTL.
					aborted.Add(1)
					continue
				}
				granted := time.Now()
				if grants.Add(1) == target/2 {
					dead.Store(true)
					servers[0].CloseClientConnections()
					servers[0].Close()
				}
				released := time.Now()
				// Any live replica can release what another granted.
				var rerr error
				for attempt := range replicas {
					rerr = server(w, attempt).Release(ctx, l.LeaseID)
					var re *apiv1.APIError
					if attempt > 0 && errors.As(rerr, &re) && re.Status == 404 {
						// The killed server did release it; only its answer
						// was lost.
						rerr = nil
					}
					if rerr == nil {
						break
					}
				}
				if rerr != nil {
					t.Errorf("release %s: %v", l.LeaseID, rerr)
					return
				}
				_, name, _, _ := lease.ParseID(l.LeaseID)
				mu.Lock()
				log = append(log, event{slot: name, holder: holder, granted: granted, released: released})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	maxSeen := watchHolders()
	elapsed := time.Since(start)
	t.Logf("%d acquisitions through %d HTTP servers (one killed half-way; %d requests aborted, %d refused as full) by %d crawlers in %s: %.0f/s; max live holders seen on one proxy: %d",
		grants.Load(), replicas, aborted.Load(), refused.Load(), clients, elapsed.Round(time.Millisecond), float64(grants.Load())/elapsed.Seconds(), maxSeen)
	if grants.Load() < target {
		t.Fatalf("want %d acquisitions, got %d", target, grants.Load())
	}
	if m := maxSeen; m > maxLeases {
		t.Errorf("the API objects showed %d live holders on one proxy, more than maxLeases %d", m, maxLeases)
	}
	grantLog := make([]leasetest.Grant, 0, len(log))
	for _, e := range log {
		proxy, _ := lease.ProxyOf(e.slot)
		grantLog = append(grantLog, leasetest.Grant{Proxy: proxy, Slot: e.slot, Holder: e.holder, Granted: e.granted, Released: e.released})
	}
	leasetest.CheckExclusive(t, grantLog, maxLeases)
	l := &coordv1.LeaseList{}
	if err := bed.Client.List(ctx, l, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	left := 0
	for i := range l.Items {
		if strings.Contains(l.Items[i].Name, "-slot-") {
			left++
		}
	}
	if int64(left) > aborted.Load() {
		t.Errorf("only leases granted by the killed server with their answer lost may remain (until their TTL): %d remain, %d requests were aborted", left, aborted.Load())
	}
}
