package discovery_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	coordv1 "k8s.io/api/coordination/v1"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease/leasetest"
	dmetrics "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
)

// offsetClock is a clock running off from the machine's by offset: the
// clock-offset option only tests use (Go reads the time through the vDSO,
// so faketime cannot skew it). It keeps the monotonic reading, as a real
// clock set wrong does.
func offsetClock(offset time.Duration) func() time.Time {
	return func() time.Time { return time.Now().Add(offset) }
}

// TestSkewedClocks runs three replicas whose clocks run 30s fast, right and
// 30s slow, under load, with 2s leases that crawlers release or abandon in
// turn, so that slots are taken over after expiring: a replica judges
// expiry from its own observation of a slot's renewal, never by comparing
// the renewing replica's clock with its own, so no slot is granted while a
// crawler may still hold it (until its own clock, started before it asked,
// says the TTL has passed). Comparing clocks, the fast replica would take
// over every slot the slow one granted at once.
func TestSkewedClocks(t *testing.T) {
	const (
		clients  = 12
		proxies  = 3
		ttl      = 2 * time.Second
		duration = 20 * time.Second
	)
	ctx := context.Background()
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "crawlers", proxies, 1, nil)
	st := staticTokens(t, "t "+ns+"\n")
	offsets := []time.Duration{30 * time.Second, 0, -30 * time.Second}
	servers := make([]*httptest.Server, len(offsets))
	for i, off := range offsets {
		c, ca := bed.Replica(t, ns, &coordv1.Lease{}, &v1alpha1.Proxy{})
		now := offsetClock(off)
		servers[i] = httptest.NewServer((discovery.NewServer(discovery.ServerConfig{
			Catalog: discovery.NewCatalog(discovery.CatalogConfig{Cache: ca, Direct: c, Now: now}), Leases: lease.NewStore(lease.StoreConfig{Client: c, Cache: ca, Now: now}),
			Auth: discovery.NewKubernetes(discovery.KubernetesConfig{Client: c, Static: st, Now: now}), Metrics: dmetrics.NewDiscovery(), Log: logging.NewNopLogger(), Now: now,
		})).Handler())
		t.Cleanup(servers[i].Close)
	}
	var (
		mu                  sync.Mutex
		log                 []leasetest.Grant
		grants, abandoned   atomic.Int64
		takenOver, refusals atomic.Int64
		wg                  sync.WaitGroup
	)
	abandonedSlots := sync.Map{} // slot -> when its holder's own clock says it ends
	end := time.Now().Add(duration)
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			holder := fmt.Sprintf("crawler-%d", w)
			for i := 0; time.Now().Before(end); i++ {
				c := &apiv1.Client{BaseURL: servers[(w+i)%len(servers)].URL, Token: "t"}
				asked := time.Now()
				l, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: holder, TTL: ttl.String()})
				var ae *apiv1.APIError
				switch {
				case errors.As(err, &ae) && ae.Status == 409:
					refusals.Add(1)
					time.Sleep(20 * time.Millisecond)
					continue
				case err != nil:
					t.Errorf("acquire: %v", err)
					return
				}
				granted := time.Now()
				grants.Add(1)
				_, slot, _, _ := lease.ParseID(l.LeaseID)
				proxy, _ := lease.ProxyOf(slot)
				if until, ok := abandonedSlots.LoadAndDelete(slot); ok && granted.Before(until.(time.Time).Add(time.Minute)) {
					takenOver.Add(1)
				}
				time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond)
				g := leasetest.Grant{Proxy: proxy, Slot: slot, Holder: holder, Granted: granted}
				if i%2 == 0 {
					// Abandoned: its holder may use it until its own clock,
					// started before it asked, says the TTL has passed.
					g.Released = asked.Add(time.Duration(l.TTLSeconds) * time.Second)
					abandonedSlots.Store(slot, g.Released)
					abandoned.Add(1)
				} else {
					g.Released = time.Now()
					if err := c.Release(ctx, l.LeaseID); err != nil {
						t.Errorf("release: %v", err)
						return
					}
				}
				mu.Lock()
				log = append(log, g)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.Logf("%d grants by replicas with clocks +30s, 0 and -30s; %d abandoned, %d slots taken over after expiring, %d refusals", grants.Load(), abandoned.Load(), takenOver.Load(), refusals.Load())
	if takenOver.Load() < 3 {
		t.Fatalf("only %d expired slots were taken over: the test did not exercise expiry", takenOver.Load())
	}
	leasetest.CheckExclusive(t, log, 1)
}
