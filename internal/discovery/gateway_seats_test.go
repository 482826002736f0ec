package discovery_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestGatewaySeats: connections without a session run on the replica's
// seats, one Lease per proxy it uses: three tunnels open at once take
// three proxies, five share them least loaded first (2, 2, 1) with no
// fourth Lease; a seat's proxy banned for the target's domain serves no
// connection to it; a caller's sessionless connections count against its
// lease quota (429 QuotaExceeded over it); and the seats go back once
// idle.
func TestGatewaySeats(t *testing.T) {
	b := newGatewayBed(t, 3, 2)
	fleetXR(t, b.ns, b.fleet, 3, map[string]any{"maxLeasesPerProxy": int64(2), "quotas": map[string]any{"maxLeasesPerIdentity": int64(5)}})
	target := testbed.StartEchoTarget(t)
	host := strings.TrimSuffix(strings.TrimPrefix(target.URL, "https://"), "/ip")
	load := map[string]int{}
	var tunnels []net.Conn
	for i := range 5 {
		conn, code, proxy := openTunnel(t, b, b.user(""), host)
		if code != http.StatusOK || b.egress[proxy] == "" {
			t.Fatalf("tunnel %d: %d through %q", i, code, proxy)
		}
		tunnels = append(tunnels, conn)
		load[proxy]++
		if i == 2 && len(load) != 3 {
			t.Fatalf("three tunnels at once took %v: want one each on three proxies", load)
		}
	}
	for p, n := range load {
		if n < 1 || n > 2 {
			t.Errorf("five tunnels on three seats: %v; want the least loaded chosen (2, 2, 1), %s has %d", load, p, n)
		}
	}
	if seats := seatLeases(t, b); len(seats) != 3 || seats[b.fleet+"-0"] != 1 || seats[b.fleet+"-1"] != 1 || seats[b.fleet+"-2"] != 1 {
		t.Errorf("seat Leases %v: want one per proxy in use, three in all", seats)
	}
	testbed.Eventually(t, 5*time.Second, "the seats gauge shows three seats", func() (bool, string) {
		v := testutil.ToFloat64(b.gw.Metrics.Seats)
		return v == 3, fmt.Sprint(v)
	})
	// The quota of 5 counts each connection: a sixth is refused, and so
	// is a lease of the API to the same caller, which shares the quota.
	if _, code, _ := openTunnel(t, b, b.user(""), host); code != http.StatusTooManyRequests {
		t.Errorf("a sixth connection over the caller's quota of 5: %d, want 429", code)
	}
	api := httptest.NewServer(b.gw.Server.Handler())
	t.Cleanup(api.Close)
	code, _, body := call(t, api, b.token, http.MethodPost, "/v1/leases", `{"fleet":"`+b.ns+"/"+b.fleet+`","holder":"h"}`)
	if code != http.StatusTooManyRequests || !strings.Contains(string(body), "QuotaExceeded") {
		t.Errorf("an API lease by a caller whose gateway connections fill its quota: %d %s, want 429 QuotaExceeded", code, body)
	}
	for _, c := range tunnels {
		_ = c.Close()
	}
	// A proxy banned for the target's domain keeps its seat but serves
	// no connection to that domain.
	h, _, _ := net.SplitHostPort(host)
	banned := b.fleet + "-0"
	if err := b.store.Ban(context.Background(), b.ns, b.fleet, banned, h, time.Minute, "static:test"); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, "the ban seen and the tunnels closed", func() (bool, string) {
		conn, code, proxy := openTunnel(t, b, b.user(""), host)
		_ = conn.Close()
		return code == http.StatusOK && proxy != banned, fmt.Sprintf("%d through %s", code, proxy)
	})
	for i := range 6 {
		conn, code, proxy := openTunnel(t, b, b.user(""), host)
		if code != http.StatusOK || proxy == banned {
			t.Fatalf("tunnel %d to %s: %d through %s, banned for it", i, h, code, proxy)
		}
		_ = conn.Close()
	}
	// Once gw-1 leaves from gw-0's egress IP, the ban holds for it too:
	// its seat (held from the tunnels above) serves no connection to the
	// domain, and none goes to it anew.
	sharing := b.fleet + "-1"
	p := &v1alpha1.Proxy{}
	if err := b.gw.Server.Catalog.Cache.Get(context.Background(), types.NamespacedName{Namespace: b.ns, Name: sharing}, p); err != nil {
		t.Fatal(err)
	}
	p.Status.AtProvider.EgressIP = b.egress[banned]
	if err := sharedBed.Env(t).Client.Status().Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, "the replica's cache sees "+sharing+" leave from "+banned+"'s IP", func() (bool, string) {
		got := &v1alpha1.Proxy{}
		err := b.gw.Server.Catalog.Cache.Get(context.Background(), types.NamespacedName{Namespace: b.ns, Name: sharing}, got)
		return err == nil && got.Status.AtProvider.EgressIP == b.egress[banned], fmt.Sprint(got.Status.AtProvider.EgressIP, err)
	})
	for i := range 6 {
		conn, code, proxy := openTunnel(t, b, b.user(""), host)
		if code != http.StatusOK || proxy != b.fleet+"-2" {
			t.Fatalf("tunnel %d to %s: %d through %s; want %s-2, the one proxy whose IP %s has not banned", i, h, code, proxy, b.fleet, h)
		}
		_ = conn.Close()
	}
	testbed.Eventually(t, 10*time.Second, "idle seats given back", func() (bool, string) {
		seats := seatLeases(t, b)
		return len(seats) == 0, fmt.Sprintf("%v", seats)
	})
}

// TestGatewaySeatsSurviveBadTargets: CONNECTs to a target no proxy can
// reach (the upstream answers, about the target) do not retire the seats
// other callers' tunnels share: the replica never holds two seat Leases
// on one proxy, and a new tunnel still lands on a seat.
func TestGatewaySeatsSurviveBadTargets(t *testing.T) {
	b := newGatewayBed(t, 2, 4)
	target := testbed.StartEchoTarget(t)
	host := strings.TrimSuffix(strings.TrimPrefix(target.URL, "https://"), "/ip")
	_, code, first := openTunnel(t, b, b.user(""), host)
	if code != http.StatusOK {
		t.Fatalf("tunnel: %d", code)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	_ = l.Close()
	for i := range 6 {
		conn, code, _ := openTunnel(t, b, b.user(""), closed)
		_ = conn.Close()
		if code == http.StatusOK {
			t.Fatalf("CONNECT %d to a closed port answered 200", i)
		}
	}
	for p, n := range seatLeases(t, b) {
		if n > 1 {
			t.Errorf("%d seat Leases on %s after CONNECTs to a bad target: the shared seats were retired and taken again", n, p)
		}
	}
	_, code, proxy := openTunnel(t, b, b.user(""), host)
	if code != http.StatusOK || b.egress[proxy] == "" {
		t.Errorf("a tunnel after the bad targets: %d through %q (the first went through %s)", code, proxy, first)
	}
}

// TestGatewaySeatWaitersShareRefusal: on a full fleet, connections without
// a session that find no seat wait for the one being leased and share its
// refusal: five at once are all refused 503 within about the fleet's
// maxWait, not one maxWait after another.
func TestGatewaySeatWaitersShareRefusal(t *testing.T) {
	b := newGatewayBed(t, 1, 1)
	fleetXR(t, b.ns, b.fleet, 1, map[string]any{"maxLeasesPerProxy": int64(1), "admission": map[string]any{"maxWait": "2s"}})
	api := httptest.NewServer(b.gw.Server.Handler())
	t.Cleanup(api.Close)
	testbed.Eventually(t, 10*time.Second, "the fleet's one slot leased by the API", func() (bool, string) {
		code, _, body := call(t, api, b.token, http.MethodPost, "/v1/leases", `{"fleet":"`+b.ns+"/"+b.fleet+`","holder":"squatter","ttl":"5m"}`)
		return code == http.StatusCreated, fmt.Sprintf("%d %s", code, body)
	})
	target := testbed.StartEchoTarget(t)
	host := strings.TrimSuffix(strings.TrimPrefix(target.URL, "https://"), "/ip")
	start := time.Now()
	codes := make(chan int, 5)
	for range 5 {
		go func() {
			conn, code, _ := openTunnel(t, b, b.user(""), host)
			_ = conn.Close()
			codes <- code
		}()
	}
	for range 5 {
		if code := <-codes; code != http.StatusServiceUnavailable {
			t.Errorf("a connection on a full fleet: %d, want 503", code)
		}
	}
	if took := time.Since(start); took > 6*time.Second {
		t.Errorf("five connections waiting on a full fleet with maxWait 2s were all answered after %s: they waited in turn", took)
	}
}

// TestGatewaySeatWaiterOutlivesGoneTaker: on a full fleet, a connection
// waiting for the seat another connection is leasing keeps waiting when
// that connection goes (its client hung up: its wait was cut short, not
// this one's), and gets the slot that frees within the fleet's maxWait.
// Sharing the gone taker's refusal answered it 503 at once.
func TestGatewaySeatWaiterOutlivesGoneTaker(t *testing.T) {
	b := newGatewayBed(t, 1, 1)
	fleetXR(t, b.ns, b.fleet, 1, map[string]any{"maxLeasesPerProxy": int64(1), "admission": map[string]any{"maxWait": "5s"}})
	api := httptest.NewServer(b.gw.Server.Handler())
	t.Cleanup(api.Close)
	var squatter string
	testbed.Eventually(t, 10*time.Second, "the fleet's one slot leased by the API", func() (bool, string) {
		code, _, body := call(t, api, b.token, http.MethodPost, "/v1/leases", `{"fleet":"`+b.ns+"/"+b.fleet+`","holder":"squatter","ttl":"5m"}`)
		var l struct {
			LeaseID string `json:"leaseID"`
		}
		_ = json.Unmarshal([]byte(body), &l)
		squatter = l.LeaseID
		return code == http.StatusCreated && squatter != "", fmt.Sprintf("%d %s", code, body)
	})
	target := testbed.StartEchoTarget(t)
	host := strings.TrimSuffix(strings.TrimPrefix(target.URL, "https://"), "/ip")

	// The taker: a CONNECT whose client hangs up while it waits.
	taker, err := net.Dial("tcp", b.url)
	if err != nil {
		t.Fatal(err)
	}
	auth := base64.StdEncoding.EncodeToString([]byte(b.user("") + ":" + b.token))
	if _, err := fmt.Fprintf(taker, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", host, host, auth); err != nil {
		t.Fatal(err)
	}
	// The taker waits in the fleet's queue (and holds the seat's take)
	// before the waiter comes.
	testbed.Eventually(t, 10*time.Second, "the taker waiting for a slot", func() (bool, string) {
		n := testutil.ToFloat64(b.gw.Server.Metrics.QueueDepth)
		return n == 1, fmt.Sprint(n)
	})
	type answer struct {
		code  int
		after time.Duration
	}
	waiter := make(chan answer, 1)
	start := time.Now()
	go func() {
		conn, code, _ := openTunnelQuiet(b, b.user(""), host)
		if conn != nil {
			_ = conn.Close()
		}
		waiter <- answer{code, time.Since(start)}
	}()
	time.Sleep(300 * time.Millisecond)
	_ = taker.Close()
	select {
	case a := <-waiter:
		t.Fatalf("the waiter was answered %d %s after it came, when the taker's client hung up; want it to wait on", a.code, a.after)
	case <-time.After(time.Second):
	}
	if code, _, body := call(t, api, b.token, http.MethodDelete, "/v1/leases/"+squatter, ""); code != http.StatusNoContent {
		t.Fatalf("release the squatter: %d %s", code, body)
	}
	if a := <-waiter; a.code != http.StatusOK {
		t.Errorf("the waiter once the slot freed: %d after %s, want 200", a.code, a.after)
	}
}
