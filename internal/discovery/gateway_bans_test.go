package discovery_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	coordv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// limitedTarget is a plain-HTTP origin that answers /limited 429 and
// echoes the caller's IP elsewhere.
func limitedTarget(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/limited" {
			w.Header().Set("Retry-After", "120")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		probe.EchoIP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestGatewayBansOnStatus: an origin answering a plain-HTTP request 429
// (a default ban status code) bans the proxy's egress IP for the domain,
// as a crawler's report would: the crawler gets the 429, the ban and the
// IP's history are recorded (with the answer's Retry-After as cooldown),
// and the next requests for the domain leave through the other proxy,
// whose own 429 bans nothing: an origin's answers ban at most half the
// fleet for a domain. A fleet listing no ban status codes records none.
func TestGatewayBansOnStatus(t *testing.T) {
	b := newGatewayBed(t, 2, 2)
	origin := limitedTarget(t)
	c := b.client(b.user(""), b.token, testbed.Target{URL: origin})
	code, banned, _, _ := plainFetch(t, c, origin+"/limited")
	if code != http.StatusTooManyRequests || banned == "" {
		t.Fatalf("the origin's 429 reaches the crawler, naming the proxy: %d %q", code, banned)
	}
	ctx := context.Background()
	testbed.Eventually(t, 5*time.Second, "one ban of the proxy for 127.0.0.1", func() (bool, string) {
		bans, err := b.store.ActiveBans(ctx, b.ns, b.fleet)
		return err == nil && len(bans) == 1 && bans[0].Proxy == banned && bans[0].Domain == "127.0.0.1", fmt.Sprint(bans, err)
	})
	testbed.Eventually(t, 5*time.Second, "the ban in the history of the proxy's address", func() (bool, string) {
		hist, err := b.store.IPHistories(ctx, b.ns, b.fleet)
		return err == nil && len(hist[b.egress[banned]]) == 1, fmt.Sprint(hist, err)
	})
	testbed.Eventually(t, 5*time.Second, "the ban counted", func() (bool, string) {
		n := testutil.ToFloat64(b.gw.Metrics.Bans.WithLabelValues("recorded"))
		return n == 1, fmt.Sprint(n)
	})
	ban := &coordv1.Lease{}
	if err := sharedBed.Env(t).Client.Get(ctx, types.NamespacedName{Namespace: b.ns, Name: lease.BanName(banned, "127.0.0.1")}, ban); err != nil || ban.Spec.LeaseDurationSeconds == nil || *ban.Spec.LeaseDurationSeconds != 120 {
		t.Errorf("the ban's cooldown is the answer's Retry-After, 120 s: %v, %v", ban.Spec.LeaseDurationSeconds, err)
	}
	// The other proxy's 429 bans nothing: an origin's answers ban at most
	// half of the fleet for a domain.
	if code, other, _, _ := plainFetch(t, c, origin+"/limited"); code != http.StatusTooManyRequests || other == banned {
		t.Fatalf("the next /limited goes through the other proxy, and gets its 429: %d %s", code, other)
	}
	testbed.Eventually(t, 5*time.Second, "the second ban refused", func() (bool, string) {
		n := testutil.ToFloat64(b.gw.Metrics.Bans.WithLabelValues("refused"))
		return n == 1, fmt.Sprint(n)
	})
	if bans, err := (lease.NewStore(lease.StoreConfig{Client: sharedBed.Env(t).Client})).ActiveBans(ctx, b.ns, b.fleet); err != nil || len(bans) != 1 {
		t.Errorf("still one ban: %+v, %v", bans, err)
	}
	for i := range 4 {
		code, proxy, _, _ := plainFetch(t, c, origin+"/ip")
		if code != http.StatusOK || proxy == banned {
			t.Fatalf("request %d for the banned domain: %d through %s; want 200 through the other proxy", i, code, proxy)
		}
	}

	// A fleet that lists none records none.
	quiet := newGatewayBed(t, 2, 2)
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyFleet",
		"metadata": map[string]any{"name": quiet.fleet, "namespace": quiet.ns},
		"spec": map[string]any{
			"replicas": int64(2), "zones": []any{"zone-a"}, "placement": map[string]any{"local": map[string]any{}},
			"proxy": map[string]any{"authSecretRef": map[string]any{"name": "auth"}}, "healthCheck": map[string]any{"url": "https://example.com/ip"},
			"gateway": map[string]any{"banStatusCodes": []any{}},
		},
	}}
	if err := sharedBed.Env(t).Client.Create(ctx, u); err != nil {
		t.Fatal(err)
	}
	qc := quiet.client(quiet.user(""), quiet.token, testbed.Target{URL: origin})
	if code, _, _, _ := plainFetch(t, qc, origin+"/limited"); code != http.StatusTooManyRequests {
		t.Fatalf("the 429 reaches the crawler: %d", code)
	}
	// Read from the API server, not a cache that could lag behind a ban.
	direct := lease.NewStore(lease.StoreConfig{Client: sharedBed.Env(t).Client})
	if bans, err := direct.ActiveBans(ctx, quiet.ns, quiet.fleet); err != nil || len(bans) != 0 {
		t.Errorf("spec.gateway.banStatusCodes: [] records no ban: %+v, %v", bans, err)
	}
}

// TestGatewaySquidRefusalBansNothing: a 403 Squid makes itself (its
// destination policy refused the request: here a port it does not serve)
// is no origin's answer, and bans nothing. Counted as the origin's, a
// caller could ban the fleet's addresses host after host without any
// origin seeing a request. An origin's 429 after them is recorded, and
// alone: the bans are written in the background, and it shows they were.
func TestGatewaySquidRefusalBansNothing(t *testing.T) {
	b := newGatewayBed(t, 2, 2)
	// Another host than the origin's (127.0.0.1), so that their bans differ.
	c := b.client(b.user(""), b.token, testbed.Target{URL: "http://127.0.0.2:25"})
	for range 2 {
		if code, _, _, _ := plainFetch(t, c, "http://127.0.0.2:25/"); code != http.StatusForbidden {
			t.Fatalf("Squid refuses port 25: %d, want 403", code)
		}
	}
	origin := limitedTarget(t)
	if code, _, _, _ := plainFetch(t, b.client(b.user(""), b.token, testbed.Target{URL: origin}), origin+"/limited"); code != http.StatusTooManyRequests {
		t.Fatalf("the origin's 429: %d", code)
	}
	testbed.Eventually(t, 10*time.Second, "the origin's ban recorded", func() (bool, string) {
		n := testutil.ToFloat64(b.gw.Metrics.Bans.WithLabelValues("recorded"))
		return n == 1, fmt.Sprint(n)
	})
	direct := lease.NewStore(lease.StoreConfig{Client: sharedBed.Env(t).Client})
	if bans, err := direct.ActiveBans(context.Background(), b.ns, b.fleet); err != nil || len(bans) != 1 || bans[0].Domain != "127.0.0.1" {
		t.Errorf("only the origin's ban, none of Squid's own 403s: %+v, %v", bans, err)
	}
	if n := testutil.ToFloat64(b.gw.Metrics.Bans.WithLabelValues("recorded")); n != 1 {
		t.Errorf("bans recorded: %v", n)
	}
}
