package discovery_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	coordv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

func TestParseGatewayUser(t *testing.T) {
	for _, c := range []struct {
		in   string
		want discovery.GatewayUser
		err  string
	}{
		{in: "crawl-team_crawlers", want: discovery.GatewayUser{Namespace: "crawl-team", Fleet: "crawlers"}},
		{in: "crawl-team_crawlers_session_s1", want: discovery.GatewayUser{Namespace: "crawl-team", Fleet: "crawlers", Session: "s1"}},
		{in: "crawl-team_crawlers_zone_local-a_session_s1", want: discovery.GatewayUser{Namespace: "crawl-team", Fleet: "crawlers", Zone: "local-a", Session: "s1"}},
		{in: "crawlers", err: "must be <namespace>_<fleet>"},
		{in: "Crawl_crawlers", err: "namespace"},
		{in: "crawl-team_crawlers_session", err: "has no value"},
		{in: "crawl-team_crawlers_session_a_session_b", err: "given twice"},
		{in: "crawl-team_crawlers_country_de", err: "unknown option"},
		{in: "crawl-team_crawlers_session_a:b", err: "session key"},
		{in: "crawl-team_crawlers_session_" + strings.Repeat("k", 65), err: "session key"},
		{in: "crawl-team__crawlers", err: "fleet"},
		{in: "crawl-team_crawlers_rotate_roundrobin", want: discovery.GatewayUser{Namespace: "crawl-team", Fleet: "crawlers", Rotate: "roundRobin"}},
		{in: "crawl-team_crawlers_rotate_random_session_s1", want: discovery.GatewayUser{Namespace: "crawl-team", Fleet: "crawlers", Session: "s1", Rotate: "random"}},
		{in: "crawl-team_crawlers_rotate_fastest", err: "the strategies are leastRecentlyUsed, roundRobin, random, leastConnections"},
		{in: "crawl-team_crawlers_rotate_random_rotate_random", err: "given twice"},
	} {
		got, err := discovery.ParseGatewayUser(c.in)
		if c.err != "" {
			// The API's parser words the refusal (TestGatewayUserRefusals
			// there compares each whole); the gateway's is that one.
			_, want := apiv1.ParseGatewayUser(c.in)
			if err == nil || want == nil || err.Error() != want.Error() || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: got %+v, %v; want the API's refusal %v, saying %q", c.in, got, err, want, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: got %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
}

func (b *gatewayBed) user(opts string) string { return b.ns + "_" + b.fleet + opts }

// token2 is a second identity's token for the bed's namespace.
func (b *gatewayBed) token2() string { return b.token + "-2" }

// TestGatewayChains: CONNECT (an HTTPS target) and plain GET (an HTTP
// target) through the gateway reach the targets through a fleet's Squid,
// with only the gateway URL and a token; the plain answer names the proxy;
// the connection's lease is given back when it ends.
func TestGatewayChains(t *testing.T) {
	b := newGatewayBed(t, 2, 2)
	tls := testbed.StartEchoTarget(t)
	plain := testbed.StartPlainEchoTarget(t)
	seen, rsp := fetch(t, b.client(b.user(""), b.token, tls), tls.URL)
	if rsp == nil || rsp.StatusCode != http.StatusOK || !isEgress(b, seen) {
		t.Fatalf("CONNECT through the gateway: %v, the target saw %q; want 200 from one of %v", status(rsp), seen, b.egress)
	}
	seen, rsp = fetch(t, b.client(b.user(""), b.token, plain), plain.URL)
	if rsp == nil || rsp.StatusCode != http.StatusOK || !isEgress(b, seen) {
		t.Fatalf("plain GET through the gateway: %v, the target saw %q", status(rsp), seen)
	}
	if p := rsp.Header.Get("X-Egress-Proxy"); b.egress[p] != seen || rsp.Header.Get("X-Egress-IP") != seen {
		t.Errorf("X-Egress-Proxy %q and X-Egress-IP %q, want the proxy that served (egress %s)", p, rsp.Header.Get("X-Egress-IP"), seen)
	}
	// Connections without a session hold their lease only while open.
	testbed.Eventually(t, 5*time.Second, "no lease left of closed connections", func() (bool, string) {
		n := heldSlots(t, b)
		return n == 0, fmt.Sprintf("%d slots held", n)
	})
}

// TestGatewaySessions: a session keeps one upstream across 20 connections;
// sessions beyond maxLeases × proxies are refused 503 with Retry-After;
// two callers' sessions of the same key do not share; a banned domain
// moves a session off its proxy; an upstream that stops answering moves it
// on; an idle session gives its lease back.
func TestGatewaySessions(t *testing.T) {
	b := newGatewayBed(t, 2, 1)
	target := testbed.StartEchoTarget(t)
	first := ""
	c := b.client(b.user("_session_s1"), b.token, target)
	for i := range 20 {
		seen, rsp := fetch(t, c, target.URL)
		if rsp == nil || rsp.StatusCode != http.StatusOK {
			t.Fatalf("connection %d of the session: %v", i, status(rsp))
		}
		if first == "" {
			first = seen
		}
		if seen != first {
			t.Fatalf("connection %d of session s1 left from %s, the first from %s: not sticky", i, seen, first)
		}
	}
	// The second proxy's one slot goes to a second session; a third finds
	// none.
	seen2, rsp := fetch(t, b.client(b.user("_session_s2"), b.token, target), target.URL)
	if rsp == nil || rsp.StatusCode != http.StatusOK || seen2 == first {
		t.Fatalf("session s2: %v from %q; want 200 from the other proxy than s1's %s", status(rsp), seen2, first)
	}
	plain := testbed.StartPlainEchoTarget(t)
	_, rsp = fetch(t, b.client(b.user("_session_s3"), b.token, plain), plain.URL)
	if rsp == nil || rsp.StatusCode != http.StatusServiceUnavailable || rsp.Header.Get("Retry-After") == "" {
		t.Fatalf("a third session over maxLeases × proxies: %v, Retry-After %q; want 503 with Retry-After", status(rsp), header(rsp, "Retry-After"))
	}

	// Banning s1's proxy for the target's domain moves s1 to the other
	// proxy, once s2 has let it go.
	var s1Proxy string
	for p, a := range b.egress {
		if a == first {
			s1Proxy = p
		}
	}
	testbed.Eventually(t, 10*time.Second, "session s2 idle and released", func() (bool, string) {
		n := heldSlots(t, b)
		return n <= 1, fmt.Sprintf("%d slots held", n)
	})
	host, _, _ := net.SplitHostPort(strings.TrimPrefix(strings.TrimSuffix(target.URL, "/ip"), "https://"))
	if err := b.store.Ban(context.Background(), b.ns, b.fleet, s1Proxy, host, time.Minute, "static:test"); err != nil {
		t.Fatal(err)
	}
	// Written to the store directly, not reported through this replica:
	// the gateway sees it once its cache does.
	testbed.Eventually(t, 10*time.Second, "the ban in the cache", func() (bool, string) {
		banned, err := b.store.BannedFor(context.Background(), b.ns, b.fleet, host)
		return err == nil && banned[s1Proxy], fmt.Sprintf("banned %v, %v", banned, err)
	})
	seen, rsp := fetch(t, c, target.URL)
	if rsp == nil || rsp.StatusCode != http.StatusOK || seen == first {
		t.Fatalf("session s1 after its proxy was banned for %s: %v from %q; want 200 from the other proxy", host, status(rsp), seen)
	}
}

// TestGatewayUpstreamDies: when the session's Squid is killed, the next
// connection is retried once on another proxy, the session stays there,
// and no lease of the dead proxy is left held.
func TestGatewayUpstreamDies(t *testing.T) {
	b := newGatewayBed(t, 2, 2)
	target := testbed.StartEchoTarget(t)
	c, first, dead := b.session(t, "die", target)
	_ = b.squids[dead].Process.Kill()
	for i := range 5 {
		seen, rsp := fetch(t, c, target.URL)
		if rsp == nil || rsp.StatusCode != http.StatusOK || seen == first || !isEgress(b, seen) {
			t.Fatalf("connection %d after %s died: %v from %q; want 200 from the other proxy", i, dead, status(rsp), seen)
		}
	}
	slots, err := b.store.Slots(context.Background(), b.ns, b.fleet)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range slots[dead] {
		if !lease.Expired(l, time.Now()) {
			t.Errorf("a lease of the dead proxy %s is still held: %s", dead, l.Name)
		}
	}
}

// TestGatewayRefusals: no credentials, a bad token and a malformed
// username get 407 with a challenge and a reason; a token without use of
// the fleet gets 403; a request that is not a proxy request gets 400.
func TestGatewayRefusals(t *testing.T) {
	b := newGatewayBed(t, 1, 1)
	target := testbed.StartEchoTarget(t)
	plain := testbed.StartPlainEchoTarget(t)
	for _, c := range []struct {
		name, user, token string
		want              int
		says              string
	}{
		{"bad token", b.user(""), "nope", http.StatusProxyAuthRequired, "Unauthenticated"},
		{"malformed username", b.ns + "-" + b.fleet, b.token, http.StatusProxyAuthRequired, "must be <namespace>_<fleet>"},
		{"unknown option", b.user("_country_de"), b.token, http.StatusProxyAuthRequired, "unknown option"},
		{"no use of the fleet", b.user(""), "other-token", http.StatusForbidden, "Forbidden"},
	} {
		_, rsp := fetch(t, b.client(c.user, c.token, plain), plain.URL)
		if rsp == nil || rsp.StatusCode != c.want {
			t.Errorf("%s: %v, want %d", c.name, status(rsp), c.want)
			continue
		}
		if c.want == http.StatusProxyAuthRequired && !strings.HasPrefix(rsp.Header.Get("Proxy-Authenticate"), "Basic") {
			t.Errorf("%s: no Basic Proxy-Authenticate challenge", c.name)
		}
		if !strings.Contains(rsp.Header.Get("Proxy-Status"), "egress-discovery") {
			t.Errorf("%s: Proxy-Status %q names no proxy", c.name, rsp.Header.Get("Proxy-Status"))
		}
	}
	// A CONNECT with a bad token: the client sees 407.
	if _, err := b.client(b.user(""), "nope", target).Get(target.URL); err == nil || !strings.Contains(err.Error(), "Proxy Authentication Required") {
		t.Errorf("CONNECT with a bad token: %v, want 407", err)
	}
	// No Proxy-Authorization at all.
	req, _ := http.NewRequest(http.MethodGet, plain.URL, nil)
	rsp, err := (&http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: b.url})}).RoundTrip(req)
	if err != nil || rsp.StatusCode != http.StatusProxyAuthRequired {
		t.Errorf("no credentials: %v, %v; want 407", status(rsp), err)
	}
	// An origin-form request is not for a proxy.
	req, _ = http.NewRequest(http.MethodGet, "http://"+b.url+"/", nil)
	req.Header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(b.user("")+":"+b.token)))
	if rsp, err := http.DefaultClient.Do(req); err != nil || rsp.StatusCode != http.StatusBadRequest {
		t.Errorf("origin-form request: %v, %v; want 400", status(rsp), err)
	}
}

// TestGatewayConnectionBound: a caller holding its bound of open
// connections gets 429 for one more, and may connect again once one
// closes.
func TestGatewayConnectionBound(t *testing.T) {
	b := newGatewayBed(t, 1, 4, func(g *discovery.GatewayConfig) { g.MaxConnsPerIdentity = 1 })
	target := testbed.StartEchoTarget(t)
	plain := testbed.StartPlainEchoTarget(t)
	host := strings.TrimSuffix(strings.TrimPrefix(target.URL, "https://"), "/ip")
	held, err := net.Dial("tcp", b.url)
	if err != nil {
		t.Fatal(err)
	}
	auth := base64.StdEncoding.EncodeToString([]byte(b.user("") + ":" + b.token))
	if _, err := fmt.Fprintf(held, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", host, host, auth); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 12)
	if _, err := io.ReadFull(held, line); err != nil || string(line) != "HTTP/1.1 200" {
		t.Fatalf("the held tunnel: %q, %v", line, err)
	}
	_, rsp := fetch(t, b.client(b.user(""), b.token, plain), plain.URL)
	if rsp == nil || rsp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a second connection over the caller's bound: %v, want 429", status(rsp))
	}
	_ = held.Close()
	testbed.Eventually(t, 5*time.Second, "a connection admitted once the tunnel closed", func() (bool, string) {
		_, rsp := fetch(t, b.client(b.user(""), b.token, plain), plain.URL)
		return rsp != nil && rsp.StatusCode == http.StatusOK, status(rsp)
	})
}

// TestGatewayPythonClient: a real client, Python's urllib, with nothing but
// the gateway URL (a session in the username) fetches a plain and an HTTPS
// target; all its requests leave through one proxy.
func TestGatewayPythonClient(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is not installed: apt-get install -y python3")
	}
	b := newGatewayBed(t, 2, 2)
	tlsTarget := testbed.StartEchoTarget(t)
	plain := testbed.StartPlainEchoTarget(t)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, tlsTarget.CAPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	proxy := (&url.URL{Scheme: "http", Host: b.url, User: url.UserPassword(b.user("_session_py"), b.token)}).String()
	script := `import ssl, sys, urllib.request
proxy, ca, urls = sys.argv[1], sys.argv[2], sys.argv[3:]
opener = urllib.request.build_opener(
    urllib.request.ProxyHandler({"http": proxy, "https": proxy}),
    urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=ca)))
for u in urls:
    print(opener.open(u, timeout=10).read().decode().strip())
`
	args := []string{"-c", script, proxy, ca}
	for range 3 {
		args = append(args, plain.URL, tlsTarget.URL)
	}
	out, err := exec.Command(python, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("python urllib through the gateway: %v\n%s", err, out)
	}
	seen := strings.Fields(string(out))
	if len(seen) != 6 || !isEgress(b, seen[0]) {
		t.Fatalf("want 6 answers from one of %v, got:\n%s", b.egress, out)
	}
	for _, s := range seen {
		if s != seen[0] {
			t.Fatalf("the session's requests left through several proxies: %v", seen)
		}
	}
}

// TestGatewaySessionReport: a crawler reports its session's proxy banned
// for a domain through the API, on a replica other than the gateway's: the
// session moves to another proxy; another caller cannot report it (404),
// and a bad key is a 400.
func TestGatewaySessionReport(t *testing.T) {
	b := newGatewayBed(t, 2, 2)
	target := testbed.StartEchoTarget(t)
	c, first, _ := b.session(t, "rep", target)
	host, _, _ := net.SplitHostPort(strings.TrimSuffix(strings.TrimPrefix(target.URL, "https://"), "/ip"))
	// Another replica of the API, with its own cache, answers the report.
	other := replicaServer(t, b.ns, b.token+" "+b.ns+"\nother-token "+b.ns+"\n")
	path := "/v1/gateway/sessions/" + b.ns + "/" + b.fleet
	body := `{"domain":"` + host + `","outcome":"banned"}`
	testbed.Eventually(t, 10*time.Second, "the report accepted by another replica", func() (bool, string) {
		code, _, out := call(t, other, b.token, http.MethodPost, path+"/rep/report", body)
		return code == http.StatusNoContent, fmt.Sprintf("%d %s", code, out)
	})
	if code, _, out := call(t, other, "other-token", http.MethodPost, path+"/rep/report", body); code != http.StatusNotFound {
		t.Errorf("another caller's report of the session: %d %s, want 404", code, out)
	}
	if code, _, out := call(t, other, b.token, http.MethodPost, path+"/bad:key/report", body); code != http.StatusBadRequest {
		t.Errorf("a bad session key: %d %s, want 400", code, out)
	}
	testbed.Eventually(t, 10*time.Second, "the session moved off the proxy reported banned", func() (bool, string) {
		seen, rsp := fetch(t, c, target.URL)
		return rsp != nil && rsp.StatusCode == http.StatusOK && seen != first && isEgress(b, seen), fmt.Sprintf("%v from %q", status(rsp), seen)
	})
}

// TestGatewayStreams: a plain HTTP answer the origin sends in parts (a
// stream) reaches the crawler part by part: the first line arrives while
// the origin still holds the rest back.
func TestGatewayStreams(t *testing.T) {
	b := newGatewayBed(t, 1, 2)
	more := make(chan struct{})
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "first\n")
		http.NewResponseController(w).Flush() //nolint:errcheck // A test's origin.
		select {
		case <-more:
		case <-r.Context().Done():
		}
		_, _ = io.WriteString(w, "second\n")
	}))
	t.Cleanup(origin.Close)
	t.Cleanup(func() {
		select {
		case <-more:
		default:
			close(more)
		}
	})
	c := b.client(b.user(""), b.token, testbed.Target{})
	rsp, err := c.Get(origin.URL + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer rsp.Body.Close() //nolint:errcheck // A test.
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(rsp.Body).ReadString('\n')
		line <- l
	}()
	select {
	case l := <-line:
		if l != "first\n" {
			t.Errorf("first part: %q", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first part of a stream did not reach the crawler while the origin held the rest back")
	}
	close(more)
}

// TestGatewaySessionLeavesDrainingProxy: a session whose proxy the fleet
// begins to replace (draining) takes its next connection elsewhere, as a
// new API lease would.
func TestGatewaySessionLeavesDrainingProxy(t *testing.T) {
	b := newGatewayBed(t, 2, 2)
	target := testbed.StartEchoTarget(t)
	c, first, draining := b.session(t, "dr", target)
	ctx := context.Background()
	p := &v1alpha1.Proxy{}
	if err := sharedBed.Env(t).Client.Get(ctx, types.NamespacedName{Namespace: b.ns, Name: draining}, p); err != nil {
		t.Fatal(err)
	}
	p.Labels[fleetv1alpha1.LabelDrainingSince] = fmt.Sprint(time.Now().Unix())
	if err := sharedBed.Env(t).Client.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, "the session moved off the draining proxy", func() (bool, string) {
		seen, rsp := fetch(t, c, target.URL)
		return rsp != nil && rsp.StatusCode == http.StatusOK && seen != first && isEgress(b, seen), fmt.Sprintf("%v from %q", status(rsp), seen)
	})
}

// TestGatewaySessionAcrossReplicas: a session whose connections reach two
// replicas keeps one proxy and one lease. The second replica takes up the
// lease the first granted (with one slot per proxy it could not have taken
// another on that proxy) and names itself on it; the first, idle, takes
// itself off rather than deleting the lease under the second; and the
// second, idle in turn, the last, gives the lease back.
func TestGatewaySessionAcrossReplicas(t *testing.T) {
	b := newGatewayBed(t, 2, 1)
	gw2, second, _ := b.replica(t, func(g *discovery.GatewayConfig) { g.Replica = "second" })
	target := testbed.StartEchoTarget(t)
	_, first, proxy := b.session(t, "across", target)
	c2 := clientAt(second, b.user("_session_across"), b.token, target)
	sessionLeases := func() []coordv1.Lease {
		l := &coordv1.LeaseList{}
		if err := sharedBed.Env(t).Client.List(context.Background(), l, client.InNamespace(b.ns)); err != nil {
			t.Fatal(err)
		}
		var out []coordv1.Lease
		for _, le := range l.Items {
			if le.Spec.HolderIdentity != nil && *le.Spec.HolderIdentity == discovery.GatewaySessionHolder("across") {
				out = append(out, le)
			}
		}
		return out
	}
	// Through the second replica, past the first replica's idle timeout
	// (2 s), until the first has let the session go (and at most 20 s).
	var ls []coordv1.Lease
	for i, start := 0, time.Now(); ; i++ {
		seen, rsp := fetch(t, c2, target.URL)
		if rsp == nil || rsp.StatusCode != http.StatusOK || seen != first {
			t.Fatalf("connection %d of the session through the second replica: %v from %q; want 200 from %s (%s), the first replica's", i, status(rsp), seen, first, proxy)
		}
		ls = sessionLeases()
		if len(ls) != 1 || fleetv1alpha1.ProxyName(&ls[0]) != proxy {
			t.Fatalf("connection %d: %d leases of the session (%v); want its one lease on %s", i, len(ls), ls, proxy)
		}
		if time.Since(start) > 3*time.Second && ls[0].Annotations[lease.AnnotationReplicas] == "second" {
			break
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("the first replica, idle for 20 s, is still named on the session's lease: %q; want the second alone", ls[0].Annotations[lease.AnnotationReplicas])
		}
		time.Sleep(250 * time.Millisecond)
	}
	if n := testutil.ToFloat64(gw2.Metrics.SessionsAdopted); n != 1 {
		t.Errorf("sessions the second replica adopted: %v, want 1", n)
	}
	testbed.Eventually(t, 10*time.Second, "the session's lease given back by the last replica to go idle", func() (bool, string) {
		n := len(sessionLeases())
		return n == 0, fmt.Sprintf("%d leases", n)
	})
}
