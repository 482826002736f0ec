package discovery_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	coordv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	dmetrics "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// gatewayBed is a fleet of real Squids on loopback, each leaving from an
// address of its own (127.0.0.2, 127.0.0.3, ...), so that an IP echo
// target names the upstream that served; and a gateway on top.
type gatewayBed struct {
	ns, fleet string
	gw        *discovery.Gateway
	url       string // the gateway's address
	token     string
	egress    map[string]string // proxy name -> the address targets see
	squids    map[string]*exec.Cmd
	addrs     map[string]string // proxy name -> its Squid's host:port
	store     *lease.Store
}

func newGatewayBed(t testing.TB, n, maxLeases int, mods ...func(*discovery.GatewayConfig)) *gatewayBed {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("127.0.0.%d", i+2)
	}
	return newGatewayBedAt(t, addrs, maxLeases, mods...)
}

// newGatewayBedAt is newGatewayBed with proxy i's Squid bound to, and
// leaving from, addrs[i] (loopback addresses: 127.0.1.2 is in another
// /24 than 127.0.0.2).
func newGatewayBedAt(t testing.TB, addrs []string, maxLeases int, mods ...func(*discovery.GatewayConfig)) *gatewayBed {
	t.Helper()
	n := len(addrs)
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	b := &gatewayBed{ns: ns, fleet: "gw", token: "gw-token", egress: map[string]string{}, squids: map[string]*exec.Cmd{}, addrs: map[string]string{}}
	fleet(t, ns, b.fleet, n, maxLeases, nil)
	htpasswd, err := squid.HtpasswdWithSalt("crawler", "s3cret", "saltsalt")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, addr := range addrs {
		l, err := net.Listen("tcp", addr+":0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		conf, err := squid.Render(squid.Config{
			Port: int32(port), BindAddress: addr, OutgoingAddress: addr, AllowLoopbackDestinations: true,
			HtpasswdPath: "/etc/egress-proxy/htpasswd",
		})
		if err != nil {
			t.Fatal(err)
		}
		cmd := testbed.StartSquid(t, conf, "/etc/egress-proxy", map[string][]byte{"htpasswd": htpasswd}, fmt.Sprintf("%s:%d", addr, port))
		p := &v1alpha1.Proxy{}
		name := fmt.Sprintf("%s-%d", b.fleet, i)
		b.squids[name] = cmd
		b.addrs[name] = fmt.Sprintf("%s:%d", addr, port)
		if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, p); err != nil {
			t.Fatal(err)
		}
		p.Status.AtProvider.Host, p.Status.AtProvider.Port, p.Status.AtProvider.EgressIP = addr, int32(port), addr
		if err := bed.Client.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		b.egress[name] = addr
	}
	b.gw, b.url, b.store = b.replica(t, mods...)
	// The cache shows the upstreams' addresses before the first test.
	testbed.Eventually(t, 10*time.Second, "the replica's cache sees the upstreams", func() (bool, string) {
		l := &v1alpha1.ProxyList{}
		if err := b.gw.Server.Catalog.Cache.List(ctx, l); err != nil {
			return false, err.Error()
		}
		seen := 0
		for _, p := range l.Items {
			if p.Namespace == ns && b.egress[p.Name] == p.Status.AtProvider.Host {
				seen++
			}
		}
		return seen == n, fmt.Sprintf("%d of %d", seen, n)
	})
	return b
}

// replica starts one more egress-discovery replica's gateway on the bed's
// fleet, with a cache and a lease store of its own: its gateway, address
// and store.
func (b *gatewayBed) replica(t testing.TB, mods ...func(*discovery.GatewayConfig)) (*discovery.Gateway, string, *lease.Store) {
	t.Helper()
	bed := sharedBed.Env(t)
	c, ca := bed.Replica(t, b.ns, &coordv1.Lease{}, &v1alpha1.Proxy{})
	rctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	version, err := discovery.WatchVersion(rctx, ca)
	if err != nil {
		t.Fatal(err)
	}
	store := lease.NewStore(lease.StoreConfig{Client: c, Cache: ca})
	st := staticTokens(t, b.token+" "+b.ns+"\n"+b.token2()+" "+b.ns+"\nother-token some-other-namespace\n")
	srv := discovery.NewServer(discovery.ServerConfig{
		Catalog: discovery.NewCatalog(discovery.CatalogConfig{Cache: ca, Direct: c}), Leases: store,
		Auth: discovery.NewKubernetes(discovery.KubernetesConfig{Client: c, Static: st}), Metrics: dmetrics.NewDiscovery(), Log: logging.NewNopLogger(), Version: version,
	})
	cfg := discovery.GatewayConfig{Server: srv, Idle: 2 * time.Second, DialTimeout: 2 * time.Second}
	for _, m := range mods {
		m(&cfg)
	}
	gw := discovery.NewGateway(cfg)
	go gw.Run(rctx)
	hs := httptest.NewServer(gw)
	t.Cleanup(hs.Close)
	// The server's own store: a mod may have built it again.
	return gw, hs.Listener.Addr().String(), gw.Server.Leases
}

// client is a crawler whose only setting is the gateway URL; every request
// opens a new connection.
func (b *gatewayBed) client(user, token string, target testbed.Target) *http.Client {
	return clientAt(b.url, user, token, target)
}

// clientAt is client, through the gateway at addr.
func clientAt(addr, user, token string, target testbed.Target) *http.Client {
	u := &url.URL{Scheme: "http", Host: addr, User: url.UserPassword(user, token)}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(u), DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: target.RootCAs, MinVersion: tls.VersionTLS12},
	}}
}

// session starts a session of key with one fetch of target: its client,
// the address the target saw, and the proxy that served.
func (b *gatewayBed) session(t *testing.T, key string, target testbed.Target) (*http.Client, string, string) {
	t.Helper()
	c := b.client(b.user("_session_"+key), b.token, target)
	seen, rsp := fetch(t, c, target.URL)
	if rsp == nil || rsp.StatusCode != http.StatusOK {
		t.Fatalf("session %s: %v", key, status(rsp))
	}
	for p, a := range b.egress {
		if a == seen {
			return c, seen, p
		}
	}
	t.Fatalf("session %s left from %q, no proxy's address", key, seen)
	return nil, "", ""
}

// fetch gets the target's echo through the gateway: the address the
// upstream left from, and the answer.
func fetch(t *testing.T, c *http.Client, target string) (string, *http.Response) {
	t.Helper()
	rsp, err := c.Get(target)
	if err != nil {
		t.Logf("GET %s: %v", target, err)
		return "", nil
	}
	defer rsp.Body.Close() //nolint:errcheck // A test.
	body, _ := io.ReadAll(rsp.Body)
	return strings.TrimSpace(string(body)), rsp
}

func isEgress(b *gatewayBed, addr string) bool {
	for _, a := range b.egress {
		if a == addr {
			return true
		}
	}
	return false
}

func heldSlots(t *testing.T, b *gatewayBed) int {
	t.Helper()
	slots, err := b.store.Slots(context.Background(), b.ns, b.fleet)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ls := range slots {
		for _, l := range ls {
			if !lease.Expired(l, time.Now()) {
				n++
			}
		}
	}
	return n
}

func status(rsp *http.Response) string {
	if rsp == nil {
		return "no answer"
	}
	return rsp.Status
}

func header(rsp *http.Response, h string) string {
	if rsp == nil {
		return ""
	}
	return rsp.Header.Get(h)
}

// openTunnel sends CONNECT for target through the gateway as user and
// reads the answer's head: its status and the proxy it names. The tunnel
// stays open until the test ends or it is closed.
func openTunnel(t *testing.T, b *gatewayBed, user, target string) (net.Conn, int, string) {
	t.Helper()
	conn, code, proxy := openTunnelQuiet(b, user, target)
	if conn == nil {
		t.Fatalf("CONNECT %s: no answer", target)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn, code, proxy
}

// seatLeases are the live Leases the gateway holds as seats, by proxy.
func seatLeases(t *testing.T, b *gatewayBed) map[string]int {
	t.Helper()
	l := &coordv1.LeaseList{}
	if err := sharedBed.Env(t).Client.List(context.Background(), l, client.InNamespace(b.ns)); err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for i := range l.Items {
		le := &l.Items[i]
		if le.Spec.HolderIdentity != nil && strings.HasPrefix(*le.Spec.HolderIdentity, "gateway-seats:") && !lease.Expired(le, time.Now()) {
			out[le.Labels[fleetv1alpha1.LabelProxy]]++
		}
	}
	return out
}
