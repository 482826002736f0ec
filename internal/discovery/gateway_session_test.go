package discovery_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// plainFetch fetches a plain-HTTP target through c: the status, the proxy
// the gateway names, the proxy a session left (X-Egress-Session-Moved)
// and the body.
func plainFetch(t *testing.T, c *http.Client, target string) (code int, proxy, moved, body string) {
	t.Helper()
	rsp, err := c.Get(target)
	if err != nil {
		t.Fatalf("GET %s: %v", target, err)
	}
	defer rsp.Body.Close() //nolint:errcheck // A test.
	b, _ := io.ReadAll(rsp.Body)
	return rsp.StatusCode, rsp.Header.Get("X-Egress-Proxy"), rsp.Header.Get("X-Egress-Session-Moved"), string(b)
}

// TestGatewaySessionLifetime: a session with _lifetime_ keeps its proxy
// until the lifetime is over, then starts again on another proxy, though
// it never went idle; one without keeps its proxy; a lifetime past the
// fleet's maxTTL is refused naming it.
func TestGatewaySessionLifetime(t *testing.T) {
	var skew atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	// The replica's clock, its lease store's too (a lease's acquireTime
	// times a lifetime), runs ahead when the test says: the server is
	// built again on it, as its allocator takes its clock when built.
	b := newGatewayBed(t, 3, 2, func(gw *discovery.GatewayConfig) {
		cfg := gw.Server.ServerConfig
		cfg.Now = clock
		withStore(&cfg, func(l *lease.StoreConfig) { l.Now = clock })
		gw.Server = discovery.NewServer(cfg)
	})
	plain := testbed.StartPlainEchoTarget(t)
	host := strings.TrimSuffix(strings.TrimPrefix(plain.URL, "http://"), "/ip")
	start := func(opts string) (*http.Client, string) {
		c := b.client(b.user(opts), b.token, plain)
		code, p, _, body := plainFetch(t, c, plain.URL)
		if code != http.StatusOK || p == "" {
			t.Fatalf("%s: %d from %q: %s", opts, code, p, body)
		}
		// A tunnel held open keeps the session from going idle.
		if conn, code, tp := openTunnel(t, b, b.user(opts), host); code != http.StatusOK || tp != p {
			t.Fatalf("%s: a tunnel got %d through %q; want 200 through the session's %s", opts, code, tp, p)
		} else {
			t.Cleanup(func() { _ = conn.Close() })
		}
		return c, p
	}
	timed, first := start("_session_timed_lifetime_1m")
	kept, keptOn := start("_session_kept")
	if _, p, _, _ := plainFetch(t, timed, plain.URL); p != first {
		t.Fatalf("within its lifetime the session moved from %s to %s", first, p)
	}
	skew.Store(int64(61 * time.Second))
	_, second, _, _ := plainFetch(t, timed, plain.URL)
	if second == first || second == "" {
		t.Fatalf("the session's lifetime of 1m is over: it stayed on %s", first)
	}
	if _, p, _, _ := plainFetch(t, timed, plain.URL); p != second {
		t.Errorf("the session started again on %s, then moved to %s", second, p)
	}
	if _, p, _, _ := plainFetch(t, kept, plain.URL); p != keptOn {
		t.Errorf("a session without a lifetime moved from %s to %s while it had connections", keptOn, p)
	}
	if v := testutil.ToFloat64(b.gw.Metrics.SessionsEnded); v != 1 {
		t.Errorf("egress_discovery_gateway_sessions_ended_total %g, want 1", v)
	}
	code, _, _, body := plainFetch(t, b.client(b.user("_session_long_lifetime_2h"), b.token, plain), plain.URL)
	if code != http.StatusProxyAuthRequired || !strings.Contains(body, "lifetime_2h0m0s is longer than the fleet's spec.leases.maxTTL (1h0m0s)") {
		t.Errorf("a lifetime past the fleet's maxTTL: %d %s; want 407 naming lifetime and maxTTL", code, body)
	}
}

// TestGatewayStrictSession: when a session's proxy stops serving, a
// strict session is answered 502 with Proxy-Status naming the reason, and
// stays so rather than move; a loose one moves, and the answer says from
// which proxy.
func TestGatewayStrictSession(t *testing.T) {
	b := newGatewayBed(t, 3, 2)
	plain := testbed.StartPlainEchoTarget(t)
	strict := b.client(b.user("_session_st_strict"), b.token, plain)
	loose := b.client(b.user("_session_lo"), b.token, plain)
	_, ps, _, _ := plainFetch(t, strict, plain.URL)
	_, pl, _, _ := plainFetch(t, loose, plain.URL)
	if ps == "" || pl == "" {
		t.Fatalf("sessions: strict on %q, loose on %q", ps, pl)
	}
	// A ban of the strict session's proxy for one name refuses that
	// name's requests only: the session keeps its proxy for the others.
	byName := strings.Replace(plain.URL, "127.0.0.1", "localhost", 1)
	if err := b.store.Ban(context.Background(), b.ns, b.fleet, ps, "localhost", time.Minute, "static:test"); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, "the strict session refused for the banned name", func() (bool, string) {
		code, p, _, body := plainFetch(t, strict, byName)
		return code == http.StatusBadGateway && strings.Contains(body, "does not serve localhost"), fmt.Sprintf("%d through %q: %s", code, p, body)
	})
	if code, p, _, body := plainFetch(t, strict, plain.URL); code != http.StatusOK || p != ps {
		t.Fatalf("the strict session for another name, after a ban for localhost: %d through %q (%s); want 200 through %s still", code, p, body, ps)
	}
	setHealthy(t, b.ns, ps, false)
	if pl != ps {
		setHealthy(t, b.ns, pl, false)
	}
	testbed.Eventually(t, 10*time.Second, "the strict session refused", func() (bool, string) {
		rsp, err := strict.Get(plain.URL)
		if err != nil {
			return false, err.Error()
		}
		defer rsp.Body.Close() //nolint:errcheck // A test.
		body, _ := io.ReadAll(rsp.Body)
		return rsp.StatusCode == http.StatusBadGateway && strings.Contains(rsp.Header.Get("Proxy-Status"), "SessionProxyGone") &&
				strings.Contains(string(body), "is strict and its proxy "+ps+" no longer serves it"),
			fmt.Sprintf("%d %q %s", rsp.StatusCode, rsp.Header.Get("Proxy-Status"), body)
	})
	for i := range 3 {
		if code, p, _, _ := plainFetch(t, strict, plain.URL); code != http.StatusBadGateway {
			t.Fatalf("strict session, request %d after its proxy failed: %d through %q; want 502 every time", i, code, p)
		}
	}
	code, p, moved, body := plainFetch(t, loose, plain.URL)
	if code != http.StatusOK || p == pl || moved != pl {
		t.Errorf("the loose session after %s failed: %d through %q, moved from %q (%s); want 200 through another, moved from %s", pl, code, p, moved, body, pl)
	}
	if code, p2, moved, _ := plainFetch(t, loose, plain.URL); code != http.StatusOK || p2 != p || moved != "" {
		t.Errorf("the loose session, once moved: %d through %q (moved %q); want it to stay on %s", code, p2, moved, p)
	}
	if moved, refused := testutil.ToFloat64(b.gw.Metrics.SessionsMoved), testutil.ToFloat64(b.gw.Metrics.StrictRefusals); moved != 1 || refused < 4 {
		t.Errorf("sessions moved %g (want 1), strict refusals %g (want at least 4)", moved, refused)
	}

	// A strict session whose Proxy is deleted is refused as well, and
	// does not move to the proxy still serving.
	gone := b.client(b.user("_session_gone_strict"), b.token, plain)
	code, pg, _, body := plainFetch(t, gone, plain.URL)
	if code != http.StatusOK || pg == "" {
		t.Fatalf("a strict session on the proxy left: %d through %q (%s)", code, pg, body)
	}
	if err := sharedBed.Env(t).Client.Delete(context.Background(), &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: b.ns, Name: pg}}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, "the strict session of a deleted proxy refused", func() (bool, string) {
		code, p, _, body := plainFetch(t, gone, plain.URL)
		return code == http.StatusBadGateway && p == "" && strings.Contains(body, "is strict and its proxy "+pg+" no longer serves it"), fmt.Sprintf("%d through %q: %s", code, p, body)
	})
}
