package discovery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// pacedFleet writes the bed's ProxyFleet with spec.gateway.pacing.
func pacedFleet(t *testing.T, b *gatewayBed, pacing []any) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyFleet",
		"metadata": map[string]any{"name": b.fleet, "namespace": b.ns},
		"spec": map[string]any{
			"replicas": int64(len(b.egress)), "zones": []any{"zone-a"}, "placement": map[string]any{"local": map[string]any{}},
			"proxy":       map[string]any{"authSecretRef": map[string]any{"name": "auth"}},
			"healthCheck": map[string]any{"url": "https://example.com/ip"},
			"leases":      map[string]any{"maxLeasesPerProxy": int64(4)},
			"gateway":     map[string]any{"pacing": pacing},
		},
	}}
	if err := sharedBed.Env(t).Client.Create(context.Background(), u); err != nil {
		t.Fatal(err)
	}
}

// TestGatewayPacing: with localhost paced at one connection an IP every
// 1.5 s, two fetches of it in a row leave from the fleet's two IPs, and a
// third waits for the first IP to be free; with 127.0.0.1 paced every
// 10 s, the fetch after both IPs were used is answered 429 with
// Retry-After, and a session's second fetch too (a session does not move
// for pacing); a domain no rule covers is not paced; an API lease for a
// paced domain says when its proxy's IP may next be used.
func TestGatewayPacing(t *testing.T) {
	b := newGatewayBed(t, 2, 4)
	pacedFleet(t, b, []any{
		map[string]any{"domains": []any{"localhost"}, "interval": "1500ms"},
		map[string]any{"domains": []any{"127.0.0.1"}, "interval": "10s", "burst": int64(1)},
	})
	plain := testbed.StartPlainEchoTarget(t)
	byName := strings.Replace(plain.URL, "127.0.0.1", "localhost", 1)
	c := b.client(b.user(""), b.token, plain)
	_, first, _, _ := plainFetch(t, c, byName)
	_, second, _, _ := plainFetch(t, c, byName)
	if first == "" || second == "" || first == second {
		t.Fatalf("two fetches of a paced domain in a row left through %q and %q: want the fleet's two proxies", first, second)
	}
	if n := testutil.ToFloat64(b.gw.Metrics.Paced.WithLabelValues(b.ns+"/"+b.fleet, "diverted")); n < 1 {
		t.Errorf("the second fetch passed over the first's paced IP: diverted %g, want at least 1", n)
	}
	// It waits what is left of 1.5 s since the first took its IP's token
	// (at least 200 ms however slow the first two were); without pacing
	// it would not wait at all.
	start := time.Now()
	code, third, _, body := plainFetch(t, c, byName)
	if waited := time.Since(start); code != http.StatusOK || waited < 200*time.Millisecond {
		t.Errorf("the third fetch, both IPs paced for 1.5 s: %d through %q after %s (%s); want 200 after waiting for the first IP", code, third, waited, body)
	}
	if n := testutil.ToFloat64(b.gw.Metrics.Paced.WithLabelValues(b.ns+"/"+b.fleet, "waited")); n != 1 {
		t.Errorf("paced connections that waited: %g, want 1", n)
	}
	// The connection's cost is counted once, on the proxy it went through.

	// A session waits for its own IP, though the other is free: it never
	// moves for pacing.
	time.Sleep(1600 * time.Millisecond) // both IPs' buckets full again
	sess1 := b.client(b.user("_session_waits"), b.token, plain)
	_, on, _, _ := plainFetch(t, sess1, byName)
	start = time.Now()
	code, again, _, _ := plainFetch(t, sess1, byName)
	if waited := time.Since(start); code != http.StatusOK || again != on || waited < 200*time.Millisecond {
		t.Errorf("the session's second fetch of a paced domain: %d through %q after %s; want 200 through its own %s after waiting", code, again, waited, on)
	}

	// 127.0.0.1 every 10 s: two IPs, two fetches, then 429.
	for i := range 2 {
		if code, _, _, body := plainFetch(t, c, plain.URL); code != http.StatusOK {
			t.Fatalf("fetch %d of 127.0.0.1: %d %s", i, code, body)
		}
	}
	rsp, err := c.Get(plain.URL)
	if err != nil {
		t.Fatal(err)
	}
	_ = rsp.Body.Close()
	if ra, _ := strconv.Atoi(rsp.Header.Get("Retry-After")); rsp.StatusCode != http.StatusTooManyRequests || ra < 5 || ra > 10 || !strings.Contains(rsp.Header.Get("Proxy-Status"), "Paced") {
		t.Errorf("both IPs paced for 10 s: %s, Retry-After %q, Proxy-Status %q; want 429 with Retry-After of about 10", rsp.Status, rsp.Header.Get("Retry-After"), rsp.Header.Get("Proxy-Status"))
	}
	// A session waits or is refused on its own proxy; it never moves.
	sess := b.client(b.user("_session_paced"), b.token, plain)
	if code, _, _, _ := plainFetch(t, sess, plain.URL); code != http.StatusTooManyRequests {
		t.Errorf("a session on a proxy paced for 10 s: %d, want 429", code)
	}
	// Not paced: another name for the same target is no rule's.
	other := b.client(b.user(""), b.token, plain)
	if code, _, _, body := plainFetch(t, other, strings.Replace(plain.URL, "127.0.0.1", "127.0.0.2", 1)); code == http.StatusTooManyRequests {
		t.Errorf("a domain no rule covers was paced: %s", body)
	}

	// An API lease for 127.0.0.1 says when its IP may next be used.
	srv := httptest.NewServer(b.gw.Server.Handler())
	t.Cleanup(srv.Close)
	code, _, raw := call(t, srv, b.token, http.MethodPost, "/v1/leases", `{"fleet":"`+b.ns+"/"+b.fleet+`","holder":"h","domain":"127.0.0.1"}`)
	var l apiv1.Lease
	if code != http.StatusCreated || json.Unmarshal(raw, &l) != nil || l.Pacing == nil {
		t.Fatalf("an API lease for a paced domain: %d %s; want 201 with pacing", code, raw)
	}
	if l.Pacing.IntervalSeconds != 10 || l.Pacing.Burst != 1 || !l.Pacing.NextUseAt.After(time.Now()) {
		t.Errorf("the lease's pacing %+v: want interval 10 s, burst 1, next use ahead", *l.Pacing)
	}
}

// TestGatewayPacedInTurn: connections waiting for a paced IP are served
// in turn, one an interval, each with a token of its own: none is refused
// while its turn comes within the wait bound. Without a session they used
// to wake together for one token, and all but one got 429; a session's
// connections wait one after the other.
func TestGatewayPacedInTurn(t *testing.T) {
	for _, user := range []string{"", "_session_turns"} {
		t.Run("user="+user, func(t *testing.T) { pacedInTurn(t, user) })
	}
}

func pacedInTurn(t *testing.T, user string) {
	b := newGatewayBed(t, 1, 4)
	pacedFleet(t, b, []any{map[string]any{"domains": []any{"localhost"}, "interval": "400ms", "burst": int64(1)}})
	plain := testbed.StartPlainEchoTarget(t)
	byName := strings.Replace(plain.URL, "127.0.0.1", "localhost", 1)
	warm := b.client(b.user(user), b.token, plain)
	// Timed from before the first fetch, whose turn is the first: the
	// three after it take theirs 0.4, 0.8 and 1.2 s after that one, however
	// long the first took to come back on a loaded machine (232 ms once,
	// which a clock started after it counted against the bound).
	start := time.Now()
	if code, _, _, body := plainFetch(t, warm, byName); code != http.StatusOK {
		t.Fatalf("the first fetch: %d %s", code, body)
	}
	codes := make(chan int, 3)
	for range 3 {
		go func() {
			c := b.client(b.user(user), b.token, plain)
			rsp, err := c.Get(byName)
			if err != nil {
				codes <- 0
				return
			}
			_ = rsp.Body.Close()
			codes <- rsp.StatusCode
		}()
	}
	for range 3 {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("a connection waiting its turn on a paced IP: %d, want 200 (turns at 0.4, 0.8, 1.2 s, within the 2 s bound)", code)
		}
	}
	if d := time.Since(start); d < 1150*time.Millisecond {
		t.Errorf("the first and three paced connections after it left within %s; want one every 400 ms (at least 1.2 s)", d)
	}
}

// TestGatewayPacedTurnKeepsItsIP: a connection waiting for its turn on a
// paced IP leaves through that IP, not through a proxy that joined the
// fleet while it waited, whose IP it holds no turn on (and whose bucket it
// would leave untouched): the new proxy is for the next connection.
func TestGatewayPacedTurnKeepsItsIP(t *testing.T) {
	b := newGatewayBed(t, 2, 4)
	pacedFleet(t, b, []any{map[string]any{"domains": []any{"localhost"}, "interval": "1500ms", "burst": int64(1)}})
	late := b.fleet + "-1"
	relabel := func(fleet string) {
		t.Helper()
		ctx := context.Background()
		p := &v1alpha1.Proxy{}
		if err := sharedBed.Env(t).Client.Get(ctx, types.NamespacedName{Namespace: b.ns, Name: late}, p); err != nil {
			t.Fatal(err)
		}
		p.Labels[fleetv1alpha1.LabelFleet] = fleet
		if err := sharedBed.Env(t).Client.Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		testbed.Eventually(t, 5*time.Second, "the cache sees "+late+" in fleet "+fleet, func() (bool, string) {
			err := b.gw.Server.Catalog.Cache.Get(ctx, types.NamespacedName{Namespace: b.ns, Name: late}, p)
			return err == nil && p.Labels[fleetv1alpha1.LabelFleet] == fleet, fmt.Sprint(err)
		})
	}
	relabel("elsewhere")
	plain := testbed.StartPlainEchoTarget(t)
	byName := strings.Replace(plain.URL, "127.0.0.1", "localhost", 1)
	if code, p, _, body := plainFetch(t, b.client(b.user(""), b.token, plain), byName); code != http.StatusOK || p != b.fleet+"-0" {
		t.Fatalf("the first fetch through the fleet's one proxy: %d through %q: %s", code, p, body)
	}
	type answer struct {
		code  int
		proxy string
	}
	got := make(chan answer, 1)
	go func() {
		rsp, err := b.client(b.user(""), b.token, plain).Get(byName)
		if err != nil {
			got <- answer{}
			return
		}
		_ = rsp.Body.Close()
		got <- answer{rsp.StatusCode, rsp.Header.Get("X-Egress-Proxy")}
	}()
	time.Sleep(200 * time.Millisecond)
	relabel(b.fleet)
	if a := <-got; a.code != http.StatusOK || a.proxy != b.fleet+"-0" {
		t.Errorf("the waiting connection: %d through %q; want 200 through %s-0, whose turn it held", a.code, a.proxy, b.fleet)
	}
}
