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
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// spread fetches target n times in a row through c, each a connection of
// its own, and counts the proxies that served (by the address the target
// saw); every fetch must succeed.
func spread(t *testing.T, b *gatewayBed, c *http.Client, target string, n int) map[string]int {
	t.Helper()
	out := map[string]int{}
	for i := range n {
		seen, rsp := fetch(t, c, target)
		if rsp == nil || rsp.StatusCode != http.StatusOK {
			t.Fatalf("fetch %d: %v", i, status(rsp))
		}
		proxy := ""
		for p, a := range b.egress {
			if a == seen {
				proxy = p
			}
		}
		if proxy == "" {
			t.Fatalf("fetch %d left from %q, no proxy's address", i, seen)
		}
		out[proxy]++
		assertWithinBounds(t, b, 2, 0)
	}
	return out
}

// withinBounds checks the slot leases of a fleet: none at a slot index at
// or past maxLeases, none of a proxy the fleet does not have, at most one
// seat per proxy for each replica, and, with a quota above zero, at most
// quota leases granted to one identity (API leases and sessions; seats
// are the replica's, and the connections on them count in its memory).
// It returns what is wrong.
func withinBounds(items []coordv1.Lease, proxies map[string]bool, maxLeases, quota int) []string {
	var bad []string
	seats, granted := map[string]int{}, map[string]int{}
	for i := range items {
		l := &items[i]
		if l.Labels[fleetv1alpha1.LabelLeaseKind] != fleetv1alpha1.LeaseKindSlot || lease.Expired(l, time.Now()) {
			continue
		}
		proxy, ok := lease.ProxyOf(l.Name)
		if !ok || !proxies[proxy] {
			bad = append(bad, fmt.Sprintf("%s: a slot of no proxy of the fleet", l.Name))
			continue
		}
		slot := strings.TrimPrefix(l.Name, proxy+"-slot-")
		n := 0
		if _, err := fmt.Sscanf(slot, "%d", &n); err != nil || n >= maxLeases {
			bad = append(bad, fmt.Sprintf("%s: slot %q of a proxy of %d", l.Name, slot, maxLeases))
		}
		if h := ptr.Deref(l.Spec.HolderIdentity, ""); strings.HasPrefix(h, "gateway-seats:") {
			if seats[h+"/"+proxy]++; seats[h+"/"+proxy] > 1 {
				bad = append(bad, fmt.Sprintf("%s holds %d seats on %s", h, seats[h+"/"+proxy], proxy))
			}
		} else if who := l.Annotations[lease.AnnotationIdentity]; quota > 0 && who != "" {
			if granted[who]++; granted[who] > quota {
				bad = append(bad, fmt.Sprintf("%s holds %d leases over its quota of %d", who, granted[who], quota))
			}
		}
	}
	return bad
}

// assertWithinBounds fails the test when the bed's fleet holds a lease
// out of bounds (withinBounds).
func assertWithinBounds(t *testing.T, b *gatewayBed, maxLeases, quota int) {
	t.Helper()
	l := &coordv1.LeaseList{}
	if err := sharedBed.Env(t).Client.List(context.Background(), l, client.InNamespace(b.ns)); err != nil {
		t.Fatal(err)
	}
	proxies := map[string]bool{}
	for p := range b.egress {
		proxies[p] = true
	}
	if bad := withinBounds(l.Items, proxies, maxLeases, quota); len(bad) > 0 {
		t.Fatalf("leases out of bounds: %v", bad)
	}
}

// TestWithinBoundsCatches proves the checker: a slot past maxLeases, a
// slot of a proxy the fleet does not have, a second seat of one replica on
// one proxy and an identity's lease over its quota are each caught; the
// fleet's own leases are not.
func TestWithinBoundsCatches(t *testing.T) {
	slot := func(name, holder string) coordv1.Lease {
		l := coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindSlot}},
			Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](60),
				RenewTime: &metav1.MicroTime{Time: time.Now()}},
		}
		if !strings.HasPrefix(holder, "gateway-seats:") {
			l.Annotations = map[string]string{lease.AnnotationIdentity: "static:crawler"}
		}
		return l
	}
	proxies := map[string]bool{"gw-0": true, "gw-1": true}
	good := []coordv1.Lease{slot("gw-0-slot-0", "gateway-seats:a"), slot("gw-0-slot-1", "gateway-seats:b"), slot("gw-1-slot-0", "crawler"), slot("gw-1-slot-1", "gateway-session:k")}
	if bad := withinBounds(good, proxies, 2, 2); len(bad) > 0 {
		t.Fatalf("the fleet's own leases flagged: %v", bad)
	}
	for name, broken := range map[string]coordv1.Lease{
		"slot past maxLeases":      slot("gw-1-slot-2", "crawler"),
		"slot of another proxy":    slot("gw-9-slot-0", "crawler"),
		"second seat of a replica": slot("gw-0-slot-1", "gateway-seats:a"),
		"lease over the quota":     slot("gw-0-slot-1", "other"),
	} {
		items := append(append([]coordv1.Lease{}, good[0], good[2], good[3]), broken)
		if bad := withinBounds(items, proxies, 2, 2); len(bad) == 0 {
			t.Errorf("%s: not caught", name)
		}
	}
}

// TestGatewayRotatesWithinQuota: a caller with a quota of 3 that holds an
// API lease and a session rotates its sessionless connections over the
// whole fleet one at a time (its third lease-worth), each fetch's
// connection opening however soon after the last one closed, is refused a
// second one at once (429, once allocator.ConnQuotaGrace has passed with
// the first still open), and neither its leases nor any proxy's slots
// ever pass their bounds (withinBounds, quota included).
func TestGatewayRotatesWithinQuota(t *testing.T) {
	b := newGatewayBed(t, 3, 2)
	fleetXR(t, b.ns, b.fleet, 3, map[string]any{"maxLeasesPerProxy": int64(2), "quotas": map[string]any{"maxLeasesPerIdentity": int64(3)}})
	target := testbed.StartEchoTarget(t)
	host := strings.TrimSuffix(strings.TrimPrefix(target.URL, "https://"), "/ip")
	api := httptest.NewServer(b.gw.Server.Handler())
	t.Cleanup(api.Close)
	if code, _, body := call(t, api, b.token, http.MethodPost, "/v1/leases", `{"fleet":"`+b.ns+"/"+b.fleet+`","holder":"h"}`); code != http.StatusOK && code != http.StatusCreated {
		t.Fatalf("an API lease: %d %s", code, body)
	}
	session, code, _ := openTunnel(t, b, b.user("_session_q"), host)
	if code != http.StatusOK {
		t.Fatalf("a session: %d", code)
	}
	defer session.Close() //nolint:errcheck // A test.
	assertWithinBounds(t, b, 2, 3)
	got := spread(t, b, b.client(b.user(""), b.token, target), target.URL, 9)
	if len(got) != 3 {
		t.Errorf("9 sequential fetches within the quota went %v; want all 3 proxies", got)
	}
	assertWithinBounds(t, b, 2, 3)
	held, code, _ := openTunnel(t, b, b.user(""), host)
	if code != http.StatusOK {
		t.Fatalf("the connection that fills the quota: %d", code)
	}
	defer held.Close() //nolint:errcheck // A test.
	if _, code, _ := openTunnel(t, b, b.user(""), host); code != http.StatusTooManyRequests {
		t.Errorf("a fourth lease-worth at once over a quota of 3: %d, want 429", code)
	}
	assertWithinBounds(t, b, 2, 3)
}

// TestGatewayRotates: connections without a session spread over the whole
// fleet, not over the replica's seats. 30 fetches in a row, each its own
// connection, through a fleet of 3 use each proxy 10 times, by the
// default (least recently used) and by round robin; random and least
// connections use each; a proxy banned for the target's domain serves
// none of them; requests of one kept-alive client connection (plain HTTP)
// rotate too; and leases stay within maxLeasesPerProxy throughout.
func TestGatewayRotates(t *testing.T) {
	b := newGatewayBed(t, 3, 2)
	target := testbed.StartEchoTarget(t)
	for _, strategy := range []string{"", "_rotate_leastRecentlyUsed", "_rotate_roundRobin", "_rotate_random", "_rotate_leastConnections"} {
		got := spread(t, b, b.client(b.user(strategy), b.token, target), target.URL, 30)
		for p := range b.egress {
			if got[p] == 0 || (strategy != "_rotate_random" && got[p] != 10) {
				t.Errorf("%q: 30 sequential fetches through 3 proxies went %v; want each proxy %s", strategy, got, map[bool]string{true: "used", false: "10 times"}[strategy == "_rotate_random"])
				break
			}
		}
	}

	// Plain HTTP on one kept-alive connection: each request rotates.
	plain := testbed.StartPlainEchoTarget(t)
	u := &url.URL{Scheme: "http", Host: b.url, User: url.UserPassword(b.user(""), b.token)}
	keep := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(u)}}
	reused := 0
	got := map[string]int{}
	for i := range 9 {
		trace := &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) {
			if ci.Reused {
				reused++
			}
		}}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, plain.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		rsp, err := keep.Do(req)
		if err != nil || rsp.StatusCode != http.StatusOK {
			t.Fatalf("plain request %d: %v %v", i, err, status(rsp))
		}
		got[rsp.Header.Get("X-Egress-Proxy")]++
		_, _ = io.Copy(io.Discard, rsp.Body) // read whole, or the connection is not kept
		_ = rsp.Body.Close()
	}
	if reused < 8 || len(got) != 3 {
		t.Errorf("9 plain requests, %d on a reused connection, went %v; want all 3 proxies, 3 each", reused, got)
	}

	// Banned for the target's domain, gw-0 serves none of them.
	host, _, _ := net.SplitHostPort(strings.TrimSuffix(strings.TrimPrefix(target.URL, "https://"), "/ip"))
	if err := b.store.Ban(context.Background(), b.ns, b.fleet, b.fleet+"-0", host, time.Minute, "static:test"); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, "the ban seen", func() (bool, string) {
		got := spread(t, b, b.client(b.user(""), b.token, target), target.URL, 3)
		return got[b.fleet+"-0"] == 0, fmt.Sprint(got)
	})
	got = spread(t, b, b.client(b.user(""), b.token, target), target.URL, 20)
	if got[b.fleet+"-0"] != 0 || got[b.fleet+"-1"] != 10 || got[b.fleet+"-2"] != 10 {
		t.Errorf("20 fetches with %s-0 banned for %s went %v; want 10 each on the two others", b.fleet, host, got)
	}
}

// TestGatewayRotationOfTheFleet: the fleet's spec.gateway.rotation is the
// default its callers get, and a username's option overrides it. With
// leastConnections, a tunnel held open on one proxy keeps sequential
// connections off it; a caller asking for leastRecentlyUsed still uses it.
func TestGatewayRotationOfTheFleet(t *testing.T) {
	b := newGatewayBed(t, 3, 3)
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyFleet",
		"metadata": map[string]any{"name": b.fleet, "namespace": b.ns},
		"spec": map[string]any{
			"replicas": int64(3), "zones": []any{"zone-a"}, "placement": map[string]any{"local": map[string]any{}},
			"proxy":       map[string]any{"authSecretRef": map[string]any{"name": "auth"}},
			"healthCheck": map[string]any{"url": "https://example.com/ip"},
			"leases":      map[string]any{"maxLeasesPerProxy": int64(3)},
			"gateway":     map[string]any{"rotation": "leastConnections"},
		},
	}}
	if err := sharedBed.Env(t).Client.Create(context.Background(), u); err != nil {
		t.Fatal(err)
	}
	target := testbed.StartEchoTarget(t)
	host := strings.TrimSuffix(strings.TrimPrefix(target.URL, "https://"), "/ip")
	conn, code, held := openTunnel(t, b, b.user(""), host)
	if code != http.StatusOK {
		t.Fatalf("a tunnel: %d", code)
	}
	defer conn.Close() //nolint:errcheck // A test.
	got := spread(t, b, b.client(b.user(""), b.token, target), target.URL, 20)
	if got[held] != 0 || len(got) != 2 {
		t.Errorf("the fleet's leastConnections, a tunnel open on %s: 20 fetches went %v; want none on it, both others used", held, got)
	}
	got = spread(t, b, b.client(b.user("_rotate_leastRecentlyUsed"), b.token, target), target.URL, 9)
	if got[held] != 3 {
		t.Errorf("leastRecentlyUsed asked for, a tunnel open on %s: 9 fetches went %v; want 3 on each", held, got)
	}
}

// TestGatewaySeatBound: with --gateway-max-seats 2 on a fleet of 3, the
// replica never holds more than 2 seats, even under 12 connections at
// once (and never 2 on one proxy); sequential connections still reach
// the third proxy over time, an idle seat giving way at most every
// SeatTurnover / MaxSeats; and a proxy whose slots API crawlers hold is
// passed over.
func TestGatewaySeatBound(t *testing.T) {
	b := newGatewayBed(t, 3, 2, func(gw *discovery.GatewayConfig) { gw.MaxSeats, gw.SeatTurnover = 2, 400*time.Millisecond })
	target := testbed.StartEchoTarget(t)
	host := strings.TrimSuffix(strings.TrimPrefix(target.URL, "https://"), "/ip")
	seats := func() int {
		n := 0
		for _, c := range seatLeases(t, b) {
			n += c
		}
		return n
	}
	var wg sync.WaitGroup
	conns := make(chan net.Conn, 12)
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, code, _ := openTunnelQuiet(b, b.user(""), host)
			if code == http.StatusOK {
				conns <- conn
			}
		}()
	}
	wg.Wait()
	close(conns)
	if n := seats(); n > 2 {
		t.Errorf("12 connections at once: %d seats, over the bound of 2: %v", n, seatLeases(t, b))
	}
	assertWithinBounds(t, b, 2, 0)
	for c := range conns {
		_ = c.Close()
	}
	c := b.client(b.user(""), b.token, target)
	used := map[string]int{}
	for range 12 {
		for p, n := range spread(t, b, c, target.URL, 1) {
			used[p] += n
		}
		if n := seats(); n > 2 {
			t.Fatalf("%d seats, over the bound of 2: %v", n, seatLeases(t, b))
		}
		time.Sleep(250 * time.Millisecond) // past SeatTurnover / MaxSeats
	}
	if len(used) != 3 {
		t.Errorf("12 fetches over 3 s with 2 seats turning over every 200 ms: %v; want all 3 proxies reached", used)
	}

	// gw-0's two slots held by API crawlers: rotation passes it over.
	testbed.Eventually(t, 10*time.Second, "idle seats given back", func() (bool, string) { return seats() == 0, fmt.Sprint(seatLeases(t, b)) })
	for i := range 2 {
		if _, err := b.store.Acquire(context.Background(), []lease.Candidate{{Namespace: b.ns, Fleet: b.fleet, Proxy: b.fleet + "-0", MaxLeases: 2}},
			lease.Request{Holder: fmt.Sprintf("api-%d", i), TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	got := spread(t, b, b.client(b.user("_rotate_roundRobin"), b.token, target), target.URL, 9)
	if got[b.fleet+"-0"] != 0 || len(got) != 2 {
		t.Errorf("9 fetches with %s-0's slots all held: %v; want the two others only", b.fleet, got)
	}
}

// openTunnelQuiet is openTunnel for any goroutine: it reports failures
// as a status of 0 instead of failing the test.
func openTunnelQuiet(b *gatewayBed, user, target string) (net.Conn, int, string) {
	conn, err := net.Dial("tcp", b.url)
	if err != nil {
		return nil, 0, ""
	}
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + b.token))
	if _, err := fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", target, target, auth); err != nil {
		_ = conn.Close()
		return nil, 0, ""
	}
	rsp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodConnect})
	if err != nil {
		_ = conn.Close()
		return nil, 0, ""
	}
	return conn, rsp.StatusCode, rsp.Header.Get("X-Egress-Proxy")
}

// TestGatewaySpreadShown: the status page and the fleet metrics show how
// the gateway's connections spread over the fleet's proxies: 12 fetches
// rotated over 3 proxies are 4 on each.
func TestGatewaySpreadShown(t *testing.T) {
	b := newGatewayBed(t, 3, 2)
	target := testbed.StartEchoTarget(t)
	spread(t, b, b.client(b.user(""), b.token, target), target.URL, 12)
	srv := httptest.NewServer(b.gw.Server.Handler())
	t.Cleanup(srv.Close)
	code, _, body := call(t, srv, b.token, http.MethodGet, "/", "")
	want := "12 connections through 3 of 3 serving proxies; per proxy least 4, median 4, 90th percentile 4, most 4"
	if code != http.StatusOK || !strings.Contains(string(body), want) {
		t.Errorf("the status page (%d) does not say %q:\n%s", code, want, body)
	}
	expected := fmt.Sprintf(`
# HELP egress_fleet_gateway_proxies_used Proxies of the fleet that carried any of this replica's gateway connections in the last 10 minutes.
# TYPE egress_fleet_gateway_proxies_used gauge
egress_fleet_gateway_proxies_used{fleet=%q,namespace=%q} 3
`, b.fleet, b.ns)
	if err := testutil.CollectAndCompare(discovery.FleetCollector{Server: b.gw.Server}, strings.NewReader(expected), "egress_fleet_gateway_proxies_used"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(discovery.FleetCollector{Server: b.gw.Server}, "egress_fleet_gateway_connections_per_proxy"); n != 4 {
		t.Errorf("%d connections-per-proxy series, want 4 quantiles of one fleet", n)
	}
	// Three addresses, one /24 (127.0.0.2-4): to a target keying clients
	// by /24, one client.
	diversity := fmt.Sprintf(`
# HELP egress_fleet_egress_addresses Distinct egress IPs the fleet's healthy proxies leave from.
# TYPE egress_fleet_egress_addresses gauge
egress_fleet_egress_addresses{fleet=%[1]q,namespace=%[2]q} 3
# HELP egress_fleet_egress_prefixes Distinct prefixes the fleet's healthy proxies leave from, as targets group clients: IPv4 /24s (family ipv4), IPv6 /64s (family ipv6).
# TYPE egress_fleet_egress_prefixes gauge
egress_fleet_egress_prefixes{family="ipv4",fleet=%[1]q,namespace=%[2]q} 1
egress_fleet_egress_prefixes{family="ipv6",fleet=%[1]q,namespace=%[2]q} 0
`, b.fleet, b.ns)
	if err := testutil.CollectAndCompare(discovery.FleetCollector{Server: b.gw.Server}, strings.NewReader(diversity), "egress_fleet_egress_addresses", "egress_fleet_egress_prefixes"); err != nil {
		t.Error(err)
	}
}

// TestGatewaySpreadsOverNetworks: real Squids leaving from 127.0.0.2-4
// (one /24) and 127.0.1.2 (another): sequential fetches without a session
// alternate between the two networks, since a target counts a /24 as one
// client, and spread over the three addresses of the first.
func TestGatewaySpreadsOverNetworks(t *testing.T) {
	b := newGatewayBedAt(t, []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.1.2"}, 2)
	target := testbed.StartEchoTarget(t)
	c := b.client(b.user(""), b.token, target)
	var order []string
	got := map[string]int{}
	for i := range 12 {
		seen, rsp := fetch(t, c, target.URL)
		if rsp == nil || rsp.StatusCode != http.StatusOK {
			t.Fatalf("fetch %d: %v", i, status(rsp))
		}
		order = append(order, seen)
		got[seen]++
	}
	for i := 1; i < len(order); i++ {
		if (order[i] == "127.0.1.2") == (order[i-1] == "127.0.1.2") {
			t.Fatalf("fetches %d and %d left from one /24: %v", i-1, i, order)
		}
	}
	if got["127.0.1.2"] != 6 || got["127.0.0.2"] != 2 || got["127.0.0.3"] != 2 || got["127.0.0.4"] != 2 {
		t.Errorf("12 fetches: %v; want 6 from 127.0.1.2, alone in its /24, and 2 from each address of 127.0.0.0/24", got)
	}
}
