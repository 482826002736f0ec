package discovery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	coordv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	dmetrics "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// fleetXR creates the ProxyFleet XR of a fleet, with its spec.leases.
func fleetXR(t testing.TB, ns, name string, replicas int, leases map[string]any) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyFleet",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"replicas": int64(replicas), "zones": []any{"zone-a"}, "placement": map[string]any{"local": map[string]any{}},
			"proxy":       map[string]any{"authSecretRef": map[string]any{"name": name + "-auth"}},
			"healthCheck": map[string]any{"url": "https://example.com/ip"},
			"leases":      leases,
		},
	}}
	if err := sharedBed.Env(t).Client.Create(context.Background(), u); err != nil {
		t.Fatal(err)
	}
}

// setHealthy marks a proxy healthy or not, as the provider's probe does.
func setHealthy(t *testing.T, ns, name string, ok bool) {
	t.Helper()
	bed := sharedBed.Env(t)
	p := &v1alpha1.Proxy{}
	if err := bed.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, p); err != nil {
		t.Fatal(err)
	}
	p.Status.AtProvider.Healthy = ok
	c := xpv2.Available()
	if !ok {
		c = xpv2.Unavailable()
	}
	p.SetConditions(c)
	if err := bed.Client.Status().Update(context.Background(), p); err != nil {
		t.Error(err)
	}
}

// replicaServer is a discovery replica with its own cache and watch, as
// cmd/discovery runs it: waiting acquisitions wake on the watch.
func replicaServer(t *testing.T, ns, static string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(replicaHandler(t, ns, static))
	t.Cleanup(srv.Close)
	return srv
}

// replicaHandler is replicaServer's handler, with mods applied to the
// server.
func replicaHandler(t *testing.T, ns, static string, mods ...func(*discovery.ServerConfig)) http.Handler {
	t.Helper()
	bed := sharedBed.Env(t)
	st := staticTokens(t, static)
	c, ca := bed.Replica(t, ns, &coordv1.Lease{}, &v1alpha1.Proxy{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	version, err := discovery.WatchVersion(ctx, ca)
	if err != nil {
		t.Fatal(err)
	}
	cfg := discovery.ServerConfig{
		Catalog: discovery.NewCatalog(discovery.CatalogConfig{Cache: ca, Direct: c}), Leases: lease.NewStore(lease.StoreConfig{Client: c, Cache: ca}),
		Auth: discovery.NewKubernetes(discovery.KubernetesConfig{Client: c, Static: st}), Metrics: dmetrics.NewDiscovery(), Log: logging.NewNopLogger(), Version: version,
	}
	for _, m := range mods {
		m(&cfg)
	}
	return discovery.NewServer(cfg).Handler()
}

func apiErr(err error) *apiv1.APIError {
	var ae *apiv1.APIError
	if errors.As(err, &ae) {
		return ae
	}
	return nil
}

// TestQuotas: an identity holds at most its quota of a fleet's leases,
// concurrent acquisitions included; over it, the answer is 429
// QuotaExceeded naming the field the quota comes from; an override for a
// static token wins over the default; a release frees quota at once; and
// GET /v1/fleets/{ns}/{name} shows the caller its usage and quota.
func TestQuotas(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "crawlers", 4, 3, nil)
	fleetXR(t, ns, "crawlers", 4, map[string]any{"maxLeasesPerProxy": int64(3), "quotas": map[string]any{
		"maxLeasesPerIdentity": int64(2),
		"overrides": []any{
			map[string]any{"staticToken": "vip", "maxLeases": int64(5)},
			map[string]any{"staticToken": "banned", "maxLeases": int64(0)},
		},
	}})
	srv := replicaServer(t, ns, fmt.Sprintf("alice-token %[1]s alice\nvip-token %[1]s vip\nbanned-token %[1]s banned\n", ns))
	ctx := context.Background()
	alice := &apiv1.Client{BaseURL: srv.URL, Token: "alice-token"}
	req := apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "h", TTL: "5m"}

	// Ten at once: exactly two are granted.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var got []*apiv1.Lease
	var refused []*apiv1.APIError
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := alice.Acquire(ctx, req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				refused = append(refused, apiErr(err))
				return
			}
			got = append(got, l)
		}()
	}
	wg.Wait()
	if len(got) != 2 {
		t.Fatalf("10 concurrent acquisitions with a quota of 2: %d granted", len(got))
	}
	for _, ae := range refused {
		if ae == nil || ae.Status != http.StatusTooManyRequests || ae.Detail.Reason != apiv1.ReasonQuotaExceeded ||
			!strings.Contains(ae.Detail.Message, "spec.leases.quotas.maxLeasesPerIdentity") || ae.RetryAfter == "" {
			t.Fatalf("over quota: want 429 QuotaExceeded naming the field, with Retry-After; got %+v", ae)
		}
	}
	var f apiv1.Fleet
	code, _, body := call(t, srv, "alice-token", "GET", "/v1/fleets/"+ns+"/crawlers", "")
	if err := json.Unmarshal(body, &f); code != 200 || err != nil || f.Usage == nil || f.Usage.Leases != 2 || f.Usage.Quota == nil || *f.Usage.Quota != 2 ||
		f.Usage.Identity != "static:alice" || f.Usage.QuotaFrom != "spec.leases.quotas.maxLeasesPerIdentity" {
		t.Errorf("the fleet shows the caller its usage and quota: %d %s", code, body)
	}
	// A release frees quota at once, whatever the cache shows yet.
	if err := alice.Release(ctx, got[0].LeaseID); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Acquire(ctx, req); err != nil {
		t.Errorf("after a release, an identity at its quota may take another at once: %v", err)
	}

	vip := &apiv1.Client{BaseURL: srv.URL, Token: "vip-token"}
	for i := range 5 {
		if _, err := vip.Acquire(ctx, req); err != nil {
			t.Fatalf("vip's override allows 5: lease %d refused: %v", i+1, err)
		}
	}
	if ae := apiErr(func() error { _, err := vip.Acquire(ctx, req); return err }()); ae == nil || ae.Detail.Reason != apiv1.ReasonQuotaExceeded ||
		!strings.Contains(ae.Detail.Message, "spec.leases.quotas.overrides[0] (staticToken vip)") {
		t.Errorf("vip's sixth: want QuotaExceeded naming its override, got %+v", ae)
	}
	banned := &apiv1.Client{BaseURL: srv.URL, Token: "banned-token"}
	if ae := apiErr(func() error { _, err := banned.Acquire(ctx, req); return err }()); ae == nil || ae.Detail.Reason != apiv1.ReasonQuotaExceeded {
		t.Errorf("an override of 0 forbids leases: got %+v", ae)
	}
}

// TestAdmission: below the fleet's minHealthyFraction, counted against
// spec.replicas, new acquisitions wait up to maxWait and are then refused
// 409 TooFewHealthy, and one asking not to wait is refused at once; a
// lease held is still renewed; and once enough proxies recover, a waiting
// acquisition is granted without the crawler asking again.
func TestAdmission(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "crawlers", 5, 2, nil)
	fleetXR(t, ns, "crawlers", 5, map[string]any{"maxLeasesPerProxy": int64(2), "admission": map[string]any{"minHealthyFraction": 0.6, "maxWait": "3s"}})
	srv := replicaServer(t, ns, "t "+ns+"\n")
	ctx := context.Background()
	c := &apiv1.Client{BaseURL: srv.URL, Token: "t"}
	held, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "early", TTL: "5m"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		setHealthy(t, ns, fmt.Sprintf("crawlers-%d", i), false)
	}
	testbed.Eventually(t, 10*time.Second, "the replica's cache shows 2 of 5 healthy", func() (bool, string) {
		code, _, body := call(t, srv, "t", http.MethodGet, "/v1/fleets/"+ns+"/crawlers", "")
		var f apiv1.Fleet
		return code == http.StatusOK && json.Unmarshal(body, &f) == nil && f.Healthy == 2, fmt.Sprintf("%d %s", code, body)
	})

	start := time.Now()
	_, err = c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "late", TTL: "5m"})
	waited := time.Since(start)
	if ae := apiErr(err); ae == nil || ae.Status != http.StatusConflict || ae.Detail.Reason != apiv1.ReasonTooFewHealthy || ae.RetryAfter == "" {
		t.Fatalf("2 of 5 healthy, under 60%%: want 409 TooFewHealthy with Retry-After, got %v", err)
	}
	if waited < 2500*time.Millisecond || waited > 8*time.Second {
		t.Errorf("the acquisition waits the fleet's maxWait, 3s, before it is refused: it took %s", waited)
	}
	start = time.Now()
	_, err = c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "impatient", TTL: "5m", MaxWait: "0"})
	if ae := apiErr(err); ae == nil || ae.Detail.Reason != apiv1.ReasonTooFewHealthy || time.Since(start) > 2*time.Second {
		t.Errorf("maxWait 0 is refused at once: %v after %s", err, time.Since(start))
	}
	if _, err := c.Renew(ctx, held.LeaseID, "5m"); err != nil {
		t.Errorf("a lease held is renewed, whatever the fleet's health: %v", err)
	}
	// One more healthy makes 3 of 5: a waiting acquisition is granted.
	type result struct {
		l   *apiv1.Lease
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	go func() {
		l, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "patient", TTL: "5m"})
		done <- result{l, err, time.Now()}
	}()
	time.Sleep(time.Second)
	recovered := time.Now()
	setHealthy(t, ns, "crawlers-0", true)
	r := <-done
	if r.err != nil {
		t.Fatalf("a waiting acquisition is granted when enough proxies recover: %v", r.err)
	}
	t.Logf("granted %s after the proxy recovered", r.at.Sub(recovered).Round(time.Millisecond))
	if _, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "x", MaxWait: "2s"}); err != nil {
		t.Errorf("a request may ask to wait less than the fleet allows: %v", err)
	}
	if ae := apiErr(func() error {
		_, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "x", MaxWait: "10s"})
		return err
	}()); ae == nil || ae.Status != http.StatusBadRequest || ae.Detail.Field != "maxWait" {
		t.Errorf("a request may not wait longer than the fleet's maxWait: %+v", ae)
	}
}
