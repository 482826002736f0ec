package discovery_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	coordv1 "k8s.io/api/coordination/v1"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease/leasetest"
	dmetrics "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// faultReplica is one discovery replica that can be killed: its server
// closed with its connections, its cache stopped, its memory gone.
type faultReplica struct {
	srv    *httptest.Server
	cancel context.CancelFunc
}

// TestFaultsCombined is egress-discovery with everything going wrong at
// once: 4 replicas and 64 crawlers; one replica killed (connections and
// all, mid-request) and replaced by a fresh one every few seconds; one
// replica's clock 30 s fast and one's 30 s slow; crawlers holding each
// lease 10-200 ms, renewing it, releasing it or (one in ten) abandoning it to expire
// and be taken over. FAULTS_ACQUISITIONS sets how many acquisitions
// (make faults: 100000; by default a short run). Checked: no double grant
// (by grant UID, from real holds), no lost lease (a renewal within the
// TTL fails only with the replica it was sent to, and succeeds on
// another), and every request answered or retried within its deadline.
func TestFaultsCombined(t *testing.T) {
	target := 1500
	if n, err := strconv.Atoi(os.Getenv("FAULTS_ACQUISITIONS")); err == nil && n > 0 {
		target = n
	}
	killEvery := 5 * time.Second
	if target >= 50000 {
		killEvery = 20 * time.Second
	}
	const (
		replicas  = 4
		crawlers  = 64
		proxies   = 64
		maxLeases = 2
	)
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "crawlers", proxies, maxLeases, nil)
	st := staticTokens(t, "t "+ns+"\n")
	offsets := []time.Duration{0, 30 * time.Second, -30 * time.Second, 0}
	start := func(i int) *faultReplica {
		c, ca := bed.Replica(t, ns, &coordv1.Lease{}, &v1alpha1.Proxy{})
		ctx, cancel := context.WithCancel(context.Background())
		version, err := discovery.WatchVersion(ctx, ca)
		if err != nil {
			t.Fatal(err)
		}
		now := offsetClock(offsets[i])
		return &faultReplica{cancel: cancel, srv: httptest.NewServer((discovery.NewServer(discovery.ServerConfig{
			Catalog: discovery.NewCatalog(discovery.CatalogConfig{Cache: ca, Direct: c, Now: now}), Leases: lease.NewStore(lease.StoreConfig{Client: c, Cache: ca, Now: now}),
			Auth: discovery.NewKubernetes(discovery.KubernetesConfig{Client: c, Static: st, Now: now}), Metrics: dmetrics.NewDiscovery(), Log: logging.NewNopLogger(), Now: now, Version: version,
		})).Handler())}
	}
	var mu sync.RWMutex
	live := make([]*faultReplica, replicas)
	for i := range live {
		live[i] = start(i)
	}
	client := func() *apiv1.Client {
		mu.RLock()
		defer mu.RUnlock()
		return &apiv1.Client{BaseURL: live[rand.IntN(replicas)].srv.URL, Token: "t", HTTP: &http.Client{Timeout: 5 * time.Second}}
	}
	var (
		logMu                                  sync.Mutex
		log                                    []leasetest.Grant
		grants, kills, retried, lost, takeover atomic.Int64
		unavailable, expired, stray503         atomic.Int64
		restartedAt, recoveredAt               atomic.Int64
		outage                                 sync.Mutex // held while the apiserver is down
		done                                   = make(chan struct{})
	)
	// The killer: every killEvery, one replica dies at once, in the middle
	// of whatever it serves, and a fresh one takes its place.
	go func() {
		tick := time.NewTicker(killEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				// A replacement starts once the apiserver serves: its
				// cache needs it (as a pod would crash-loop until then).
				outage.Lock()
				i := rand.IntN(replicas)
				mu.Lock()
				old := live[i]
				live[i] = start(i)
				mu.Unlock()
				outage.Unlock()
				old.srv.CloseClientConnections()
				old.srv.Close()
				old.cancel()
				kills.Add(1)
			}
		}
	}()
	// retry sends one request until a replica answers it, within the
	// crawler's deadline; an answer other than a transport failure is
	// final.
	// A 503 (the API server is down) is retried too, as a crawler would
	// after its Retry-After.
	retry := func(deadline time.Time, op func(c *apiv1.Client) error) error {
		for {
			err := op(client())
			var ae *apiv1.APIError
			if err == nil || errors.As(err, &ae) && ae.Status != http.StatusServiceUnavailable {
				return err
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("no replica answered before the deadline: %w", err)
			}
			if ae != nil {
				unavailable.Add(1)
				// Only the apiserver's outage, and the caches'
				// resync after it, excuse a 503.
				if r := restartedAt.Load(); r == 0 || time.Since(time.Unix(0, r)) > time.Minute {
					stray503.Add(1)
				}
			} else {
				retried.Add(1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// The apiserver restarts once, a third of the way through: crashed,
	// down a second, and started again as it was.
	go func() {
		for grants.Load() < int64(target/3) {
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		outage.Lock()
		defer outage.Unlock()
		restartedAt.Store(time.Now().UnixNano())
		if err := testbed.RestartChild("kube-apiserver", time.Second); err != nil {
			t.Errorf("cannot restart the apiserver: %v", err)
			return
		}
		testbed.Eventually(t, time.Minute, "the apiserver serving again", func() (bool, string) {
			err := bed.Client.List(context.Background(), &coordv1.LeaseList{}, crclient.InNamespace(ns), crclient.Limit(1))
			return err == nil, fmt.Sprint(err)
		})
		recoveredAt.Store(time.Now().UnixNano())
	}()
	const ttl = 2 * time.Second
	abandoned := sync.Map{}
	var wg sync.WaitGroup
	began := time.Now()
	for w := range crawlers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			holder := fmt.Sprintf("crawler-%d", w)
			for grants.Load() < int64(target) {
				asked := time.Now()
				var l *apiv1.Lease
				err := retry(asked.Add(30*time.Second), func(c *apiv1.Client) error {
					var err error
					l, err = c.Acquire(context.Background(), apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: holder, TTL: ttl.String(), MaxWait: "0"})
					return err
				})
				var ae *apiv1.APIError
				if errors.As(err, &ae) && ae.Status == http.StatusConflict {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				if err != nil {
					t.Errorf("acquire: %v", err)
					return
				}
				grants.Add(1)
				_, slot, _, _ := lease.ParseID(l.LeaseID)
				proxy, _ := lease.ProxyOf(slot)
				h := leasetest.Grant{Proxy: proxy, Slot: slot, Holder: holder, Granted: time.Now(), UID: l.LeaseID}
				until := asked.Add(time.Duration(l.TTLSeconds) * time.Second)
				if _, was := abandoned.LoadAndDelete(slot); was {
					takeover.Add(1)
				}
				hold := time.Duration(10+rand.IntN(190)) * time.Millisecond
				// One in ten abandoned, three renewed, the rest released.
				switch mode := rand.IntN(10); {
				case mode == 0:
					h.Released = until
					abandoned.Store(slot, true)
				case mode <= 3:
					time.Sleep(hold / 2)
					renewAsked := time.Now()
					err := retry(until.Add(-200*time.Millisecond), func(c *apiv1.Client) error {
						_, err := c.Renew(context.Background(), l.LeaseID, ttl.String())
						return err
					})
					var ae *apiv1.APIError
					switch {
					case err == nil:
						until = renewAsked.Add(ttl)
					case errors.As(err, &ae) && ae.Status == http.StatusServiceUnavailable:
						// Unanswered until it expired: the API server
						// was down all along.
						expired.Add(1)
					case time.Now().Before(until.Add(-200 * time.Millisecond)):
						lost.Add(1)
						t.Errorf("lease %s lost: renewal within its TTL refused: %v", l.LeaseID, err)
					}
					time.Sleep(hold / 2)
					h.Released = minT(time.Now(), until)
					_ = retry(time.Now().Add(5*time.Second), func(c *apiv1.Client) error { return c.Release(context.Background(), l.LeaseID) })
				default:
					time.Sleep(hold)
					h.Released = minT(time.Now(), until)
					_ = retry(time.Now().Add(5*time.Second), func(c *apiv1.Client) error { return c.Release(context.Background(), l.LeaseID) })
				}
				logMu.Lock()
				log = append(log, h)
				logMu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(done)
	elapsed := time.Since(began)
	t.Logf("combined faults: %d acquisitions by %d crawlers in %s (%.0f/s) through %d replicas (clocks 0, +30s, -30s, 0); %d replicas killed mid-request and replaced; %d requests retried on another replica; %d expired slots taken over; %d leases lost",
		grants.Load(), crawlers, elapsed.Round(time.Second), float64(grants.Load())/elapsed.Seconds(), replicas, kills.Load(), retried.Load(), takeover.Load(), lost.Load())
	t.Logf("the apiserver restarted %.1fs in and served again %.1fs later: %d requests answered 503 and retried, %d renewals unanswered until their lease expired",
		time.Duration(restartedAt.Load()-began.UnixNano()).Seconds(), time.Duration(recoveredAt.Load()-restartedAt.Load()).Seconds(), unavailable.Load(), expired.Load())
	if n := stray503.Load(); n > 0 {
		t.Errorf("%d requests were answered 503 outside the apiserver's outage", n)
	}
	if kills.Load() == 0 || takeover.Load() == 0 || recoveredAt.Load() == 0 || unavailable.Load() == 0 {
		t.Errorf("the faults did not happen: %d kills, %d takeovers, apiserver restarted %t, %d requests answered 503", kills.Load(), takeover.Load(), recoveredAt.Load() != 0, unavailable.Load())
	}
	leasetest.CheckExclusive(t, log, maxLeases)
}

func minT(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
