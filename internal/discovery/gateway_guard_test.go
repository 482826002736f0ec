package discovery_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/reach"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// publishedProxy creates a one-proxy fleet named fleet whose Proxy has the
// parameters given and is published, Ready and healthy, at addr, as a
// provider (or whoever may write its status) would publish it.
func publishedProxy(t *testing.T, ns, fleet string, params v1alpha1.ProxyParameters, addr string) {
	t.Helper()
	publishedProxyOf(t, ns, fleet, v1alpha1.ClusterProviderConfigKind, params, addr)
}

// publishedProxyOf is publishedProxy on a ProviderConfig of the kind
// given.
func publishedProxyOf(t *testing.T, ns, fleet, kind string, params v1alpha1.ProxyParameters, addr string) {
	t.Helper()
	bed := sharedBed.Env(t)
	ctx := context.Background()
	if err := bed.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fleet + "-auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}},
		StringData: map[string]string{"username": "crawler", "password": "s3cret"}}); err != nil {
		t.Fatal(err)
	}
	params.AuthSecretRef = &v1alpha1.AuthSecretReference{Name: fleet + "-auth"}
	params.HealthCheck = v1alpha1.HealthCheck{URL: "https://example.com/ip"}
	params.MaxLeases = 8
	p := &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fleet + "-0", Labels: map[string]string{fleetv1alpha1.LabelFleet: fleet, fleetv1alpha1.LabelZone: "zone-a"}},
		Spec: v1alpha1.ProxySpec{ForProvider: params, ManagedResourceSpec: xpv2.ManagedResourceSpec{
			ProviderConfigReference: &xpv2.ProviderConfigReference{Kind: kind, Name: "default"}}},
	}
	if err := bed.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p.Status.AtProvider = v1alpha1.ProxyObservation{Host: ap.Addr().String(), Port: int32(ap.Port()), Healthy: true, EgressIP: "198.51.100.99"}
	p.SetConditions(xpv2.Available())
	if err := bed.Client.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
}

// TestGatewayDialsOnlyWhatTheKindJustifies: whoever may create a Proxy, or
// write its status, cannot make the gateway a way around the destination
// policy. An External proxy published at loopback (where a service of the
// host, or the metadata server, would be) and a pod's proxy published
// there are refused with 502 UpstreamAddressRefused, by CONNECT and plain
// HTTP alike, and the address is never dialed; once the platform permits
// loopback for External proxies, the same proxy serves; PlatformLoopback
// (make scale's) lets only a platform VM at a stand-in VM's address
// (127.1.0.0/16) serve: not a pod's proxy, not a platform VM elsewhere on
// loopback, not a VM of a tenant's own ProviderConfig, not an External
// proxy.
func TestGatewayDialsOnlyWhatTheKindJustifies(t *testing.T) {
	b := newGatewayBed(t, 1, 4)
	target := testbed.StartEchoTarget(t)
	plain := testbed.StartPlainEchoTarget(t)
	cp := testbed.StartConnectProxies(t, 1, "crawler", "s3cret")
	publishedProxy(t, b.ns, "ext", v1alpha1.ProxyParameters{Mode: v1alpha1.ProxyModeExternal, Endpoint: &v1alpha1.Endpoint{Host: "localhost", Port: 1}}, cp.Addrs[0])
	publishedProxy(t, b.ns, "pod", v1alpha1.ProxyParameters{Kubernetes: &v1alpha1.KubernetesPlacement{}}, cp.Addrs[0])
	waitCached(t, b.gw, b.ns, "ext-0", "pod-0")

	for _, fleet := range []string{"ext", "pod"} {
		user := b.ns + "_" + fleet
		for name, tgt := range map[string]testbed.Target{"CONNECT": target, "plain HTTP": plain} {
			rsp := proxied(t, b.url, user, b.token, tgt)
			if rsp.StatusCode != http.StatusBadGateway || !strings.Contains(rsp.Header.Get("Proxy-Status"), "UpstreamAddressRefused") {
				t.Errorf("%s through fleet %s published at %s: %d, Proxy-Status %q; want 502 UpstreamAddressRefused", name, fleet, cp.Addrs[0], rsp.StatusCode, rsp.Header.Get("Proxy-Status"))
			}
		}
	}
	if n := cp.Connections(0); n != 0 {
		t.Fatalf("the refused address was dialed %d times", n)
	}

	permitted, url, _ := b.replica(t, func(g *discovery.GatewayConfig) {
		g.TenantPrivateNetworks = &reach.Networks{netip.MustParsePrefix("127.0.0.0/8")}
	})
	waitCached(t, permitted, b.ns, "ext-0")
	if rsp := proxied(t, url, b.ns+"_ext", b.token, target); rsp.StatusCode != http.StatusOK {
		t.Errorf("CONNECT through the External proxy once loopback is permitted: %d, want 200", rsp.StatusCode)
	}
	if rsp := proxied(t, url, b.ns+"_pod", b.token, target); rsp.StatusCode != http.StatusBadGateway {
		t.Errorf("the pod's proxy at loopback, whatever External proxies are permitted: %d, want 502", rsp.StatusCode)
	}

	// make scale's setting (its stand-in VMs listen at 127.1.0.0/16): a
	// platform VM there serves; nothing else on loopback does.
	vms := testbed.StartEgressProxies(t, "crawler", "s3cret")
	standIn := freeStandInAddr(t)
	if err := vms.Add(standIn); err != nil {
		t.Fatal(err)
	}
	gcp := func() v1alpha1.ProxyParameters {
		return v1alpha1.ProxyParameters{GCP: &v1alpha1.GCPPlacement{Zone: "europe-west1-b"}}
	}
	publishedProxy(t, b.ns, "vm", gcp(), standIn)
	publishedProxy(t, b.ns, "vmlo", gcp(), cp.Addrs[0])
	publishedProxyOf(t, b.ns, "tenantvm", v1alpha1.ProviderConfigKind, gcp(), standIn)
	dialed := cp.Connections(0)
	scale, url, _ := b.replica(t, func(g *discovery.GatewayConfig) { g.PlatformLoopback = true })
	waitCached(t, scale, b.ns, "ext-0", "pod-0", "vm-0", "vmlo-0", "tenantvm-0")
	if rsp := proxied(t, url, b.ns+"_vm", b.token, target); rsp.StatusCode != http.StatusOK {
		t.Errorf("a platform VM at a stand-in VM's address with PlatformLoopback: %d, want 200", rsp.StatusCode)
	}
	for fleet, why := range map[string]string{
		"pod":      "a pod's proxy at loopback",
		"vmlo":     "a platform VM at loopback outside 127.1.0.0/16",
		"tenantvm": "a VM of a tenant's own ProviderConfig at a stand-in VM's address",
		"ext":      "an External proxy at loopback",
	} {
		if rsp := proxied(t, url, b.ns+"_"+fleet, b.token, target); rsp.StatusCode != http.StatusBadGateway || !strings.Contains(rsp.Header.Get("Proxy-Status"), "UpstreamAddressRefused") {
			t.Errorf("%s with PlatformLoopback: %d, Proxy-Status %q; want 502 UpstreamAddressRefused", why, rsp.StatusCode, rsp.Header.Get("Proxy-Status"))
		}
	}
	if n := cp.Connections(0) - dialed; n != 0 {
		t.Fatalf("a refused address was dialed %d times", n)
	}
}

// freeStandInAddr is a free port at a loopback address in
// reach.StandInVMs.
func freeStandInAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.1.0.7:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// proxied sends one request for target through the gateway at addr, as
// user, and returns the gateway's answer: the CONNECT's for an https
// target, the response for a plain one.
func proxied(t *testing.T, addr, user, token string, target testbed.Target) *http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close() //nolint:errcheck // A test connection.
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + token))
	host := strings.TrimPrefix(strings.TrimPrefix(target.URL, "https://"), "http://")
	host, _, _ = strings.Cut(host, "/")
	req := fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", host, host, auth)
	method := http.MethodConnect
	if strings.HasPrefix(target.URL, "http://") {
		req = fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\nConnection: close\r\n\r\n", target.URL, host, auth)
		method = http.MethodGet
	}
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	rsp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: method})
	if err != nil {
		t.Fatal(err)
	}
	_ = rsp.Body.Close()
	return rsp
}

// waitCached waits until gw's cache shows the named proxies of ns.
func waitCached(t *testing.T, gw *discovery.Gateway, ns string, names ...string) {
	t.Helper()
	testbed.Eventually(t, 10*time.Second, "the replica's cache sees "+strings.Join(names, ", "), func() (bool, string) {
		l := &v1alpha1.ProxyList{}
		if err := gw.Server.Catalog.Cache.List(context.Background(), l); err != nil {
			return false, err.Error()
		}
		seen := 0
		for _, p := range l.Items {
			for _, n := range names {
				if p.Namespace == ns && p.Name == n && p.Status.AtProvider.Host != "" {
					seen++
				}
			}
		}
		return seen == len(names), fmt.Sprintf("%d of %d", seen, len(names))
	})
}

// mustTunnel opens a CONNECT tunnel to target through the gateway as user,
// and fails the test unless it is established.
func mustTunnel(t *testing.T, b *gatewayBed, user, token, target string) net.Conn {
	t.Helper()
	conn, rsp := tunnelWith(t, b, user, token, target)
	if rsp.StatusCode != http.StatusOK {
		t.Fatalf("a tunnel to %s as %s: %d, want 200", target, user, rsp.StatusCode)
	}
	return conn
}

// tunnelWith asks for a CONNECT tunnel to target through the gateway as
// user: the connection, and the gateway's answer.
func tunnelWith(t *testing.T, b *gatewayBed, user, token, target string) (net.Conn, *http.Response) {
	t.Helper()
	conn, err := net.Dial("tcp", b.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + token))
	if _, err := fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", target, target, auth); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	rsp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	if rsp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, rsp.Body)
	}
	_ = conn.SetReadDeadline(time.Time{})
	return conn, rsp
}

// TestGatewayNamespaceBound: the connections to one namespace's fleets are
// bounded together, sessions' included, so that one tenant's callers
// cannot fill the gateway; a caller of another namespace is not held up by
// that bound, and a connection is admitted again once one closes.
func TestGatewayNamespaceBound(t *testing.T) {
	b := newGatewayBed(t, 1, 8, func(g *discovery.GatewayConfig) { g.MaxConnsPerNamespace, g.MaxConnsPerIdentity = 2, 10 })
	echo := tcpEcho(t, 0)
	mustTunnel(t, b, b.user(""), b.token, echo)
	held := mustTunnel(t, b, b.user("_session_s1"), b.token2(), echo)
	_, rsp := tunnelWith(t, b, b.user("_session_s2"), b.token2(), echo)
	if rsp.StatusCode != http.StatusTooManyRequests || !strings.Contains(rsp.Header.Get("Proxy-Status"), "RateLimited") {
		t.Fatalf("a third connection to the namespace's fleets, from a second identity, in a session: %d %q; want 429", rsp.StatusCode, rsp.Header.Get("Proxy-Status"))
	}
	_, rsp = tunnelWith(t, b, "some-other-namespace_fleet", "other-token", echo)
	if rsp.StatusCode == http.StatusTooManyRequests {
		t.Errorf("a caller of another namespace was held up by this namespace's bound: %d", rsp.StatusCode)
	}
	_ = held.Close()
	testbed.Eventually(t, 5*time.Second, "a connection admitted once one closed", func() (bool, string) {
		c, rsp := tunnelWith(t, b, b.user("_session_s2"), b.token2(), echo)
		_ = c.Close()
		return rsp.StatusCode == http.StatusOK, rsp.Status
	})
}

// TestGatewayTunnelIdle: a tunnel that moves nothing either way for the
// idle timeout is closed by the gateway; one whose crawler talks, or whose
// target streams slowly to a silent crawler, stays open however long.
func TestGatewayTunnelIdle(t *testing.T) {
	const idle = 600 * time.Millisecond
	b := newGatewayBed(t, 1, 8, func(g *discovery.GatewayConfig) { g.TunnelIdle = idle })

	echo := mustTunnel(t, b, b.user(""), b.token, tcpEcho(t, 0))
	for i := range 12 {
		_ = echo.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := echo.Write([]byte{'x'}); err != nil {
			t.Fatalf("write %d on a tunnel in use: %v", i, err)
		}
		if _, err := io.ReadFull(echo, make([]byte, 1)); err != nil {
			t.Fatalf("echo %d on a tunnel in use: %v", i, err)
		}
		time.Sleep(idle / 3)
	}
	start := time.Now()
	_ = echo.SetReadDeadline(time.Now().Add(10 * idle))
	_, err := echo.Read(make([]byte, 1))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("an idle tunnel stayed open %s, past %s", time.Since(start).Round(time.Millisecond), idle)
	}
	if quiet := time.Since(start); quiet < idle/2 {
		t.Errorf("the tunnel closed %s into its quiet, before %s", quiet, idle)
	}
	t.Logf("an idle tunnel closed %s after its last byte (idle %s): %v", time.Since(start).Round(time.Millisecond), idle, err)

	// A download at a byte per idle/3, the crawler sending nothing.
	stream := mustTunnel(t, b, b.user(""), b.token, tcpEcho(t, idle/3))
	_ = stream.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(stream, make([]byte, 12)); err != nil {
		t.Fatalf("a slow stream to a silent crawler, over %s: %v", 4*idle, err)
	}
}

// tcpEcho starts a TCP server on loopback that echoes what it reads or,
// with every > 0, sends a byte every so often: its host:port.
func tcpEcho(t *testing.T, every time.Duration) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close() //nolint:errcheck // A test server.
				if every <= 0 {
					_, _ = io.Copy(c, c)
					return
				}
				for {
					time.Sleep(every)
					if _, err := c.Write([]byte{'.'}); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}
