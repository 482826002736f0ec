package discovery_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// socksAt serves the bed's gateway over SOCKS5 on loopback: its address.
func socksAt(t testing.TB, b *gatewayBed) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.gw.ServeSOCKS5(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeSOCKS5: %v", err)
		}
	})
	return l.Addr().String()
}

// curlSOCKS fetches target with curl through the SOCKS5 gateway at addr
// (the host name resolved by the gateway: socks5h), trusting ca.
func curlSOCKS(t *testing.T, addr, user, pass, ca, target string) (string, error) {
	t.Helper()
	proxy := (&url.URL{Scheme: "socks5h", Host: addr, User: url.UserPassword(user, pass)}).String()
	out, err := exec.Command("curl", "-sS", "--fail", "--max-time", "10", "--proxy", proxy, "--cacert", ca, target).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// TestGatewaySOCKS5: curl fetches through the SOCKS5 listener with the
// gateway's username and a token, rotating over the fleet like the HTTP
// gateway; a wrong password, a token without use of the fleet and a
// malformed username are refused at authentication; BIND and UDP
// ASSOCIATE get "command not supported", a client offering no
// username/password method "no acceptable methods", a domain the proxy is
// banned for is not sent through it; Python requests with PySocks
// fetches through it too.
func TestGatewaySOCKS5(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is not installed: apt-get install -y curl (.ci/run does this)")
	}
	b := newGatewayBed(t, 3, 2)
	addr := socksAt(t, b)
	target := testbed.StartEchoTarget(t)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, target.CAPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	// socks5h: the gateway resolves the host, and keeps bans for it.
	byName := target.URL
	seen := map[string]int{}
	for i := range 6 {
		out, err := curlSOCKS(t, addr, b.user(""), b.token, ca, byName)
		if err != nil || !isEgress(b, out) {
			t.Fatalf("curl %d through SOCKS5: %v: %s", i, err, out)
		}
		seen[out]++
	}
	if len(seen) != 3 {
		t.Errorf("6 fetches through SOCKS5 left from %v: want all 3 proxies (the default rotation)", seen)
	}
	for name, c := range map[string]struct{ user, pass string }{
		"a wrong password":                 {b.user(""), "not-a-token"},
		"a token without use of the fleet": {b.user(""), "other-token"},
		"a malformed username":             {b.ns + "_" + b.fleet + "_country_de", b.token},
	} {
		if out, err := curlSOCKS(t, addr, c.user, c.pass, ca, byName); err == nil || !strings.Contains(out, "rejected by the SOCKS5 server") {
			t.Errorf("%s: %v: %s; want curl told the user was rejected", name, err, out)
		}
	}
	if n := testutil.ToFloat64(b.gw.Metrics.SOCKSRefusals.WithLabelValues("auth")); n != 3 {
		t.Errorf("SOCKS5 sign-in refusals counted %g, want 3", n)
	}

	raw := func(greeting []byte, request []byte) []byte {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close() //nolint:errcheck // A test.
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(greeting); err != nil {
			t.Fatal(err)
		}
		method := make([]byte, 2)
		if _, err := io.ReadFull(c, method); err != nil {
			t.Fatal(err)
		}
		if method[1] != 2 {
			return method
		}
		user, pass := b.user(""), b.token
		auth := append(append(append([]byte{1, byte(len(user))}, user...), byte(len(pass))), pass...)
		if _, err := c.Write(auth); err != nil {
			t.Fatal(err)
		}
		status := make([]byte, 2)
		if _, err := io.ReadFull(c, status); err != nil || status[1] != 0 {
			t.Fatalf("sign-in: %v %v", status, err)
		}
		if _, err := c.Write(request); err != nil {
			t.Fatal(err)
		}
		reply := make([]byte, 10)
		if _, err := io.ReadFull(c, reply); err != nil {
			t.Fatal(err)
		}
		return reply
	}
	if m := raw([]byte{5, 1, 0}, nil); m[0] != 5 || m[1] != 0xff {
		t.Errorf("a client offering no authentication only: %v, want [5 255] (no acceptable methods)", m)
	}
	_, port, _ := net.SplitHostPort(strings.TrimSuffix(strings.TrimPrefix(target.URL, "https://"), "/ip"))
	p := []byte{0, 0}
	var pn int
	_, _ = fmt.Sscanf(port, "%d", &pn)
	p[0], p[1] = byte(pn>>8), byte(pn)
	for cmd, name := range map[byte]string{2: "BIND", 3: "UDP ASSOCIATE"} {
		req := append([]byte{5, cmd, 0, 1, 127, 0, 0, 1}, p...)
		if r := raw([]byte{5, 1, 2}, req); r[1] != 0x07 {
			t.Errorf("%s: reply %d, want 7 (command not supported)", name, r[1])
		}
	}
	if r := raw([]byte{5, 1, 2}, append([]byte{5, 1, 0, 9, 1, 2, 3, 4}, p...)); r[1] != 0x08 {
		t.Errorf("address type 9: reply %d, want 8 (address type not supported)", r[1])
	}
	if r := raw([]byte{5, 1, 2}, append(append([]byte{5, 1, 0, 3, byte(len("fe80::1%eth0"))}, "fe80::1%eth0"...), p...)); r[1] != 0x08 {
		t.Errorf("a host name with a zone: reply %d, want 8 (the HTTP gateway refuses it too)", r[1])
	}
	if r := raw([]byte{5, 1, 2}, append(append([]byte{5, 1, 0, 3, byte(len("localhost"))}, "localhost"...), p...)); r[1] != 0 {
		t.Errorf("CONNECT localhost by name: reply %d, want 0", r[1])
	}

	// Banned for the target's host, gw-0 carries none of its tunnels.
	if err := b.store.Ban(context.Background(), b.ns, b.fleet, b.fleet+"-0", "127.0.0.1", time.Minute, "static:test"); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, "the ban seen through SOCKS5", func() (bool, string) {
		got := map[string]int{}
		for range 6 {
			out, err := curlSOCKS(t, addr, b.user(""), b.token, ca, byName)
			if err != nil {
				return false, fmt.Sprintf("%v: %s", err, out)
			}
			got[out]++
		}
		return got[b.egress[b.fleet+"-0"]] == 0, fmt.Sprint(got)
	})

	script := `import sys, requests
proxy, ca, url = sys.argv[1], sys.argv[2], sys.argv[3]
for _ in range(3):
    print(requests.get(url, proxies={"https": proxy}, verify=ca, timeout=10).text.strip())
`
	python := "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import requests, socks").Run(); err != nil {
		t.Fatal("Python requests and PySocks are not installed: apt-get install -y python3-requests python3-socks (.ci/run does this)")
	}
	proxy := (&url.URL{Scheme: "socks5h", Host: addr, User: url.UserPassword(b.user(""), b.token)}).String()
	out, err := exec.Command(python, "-c", script, proxy, ca, byName).CombinedOutput()
	if err != nil {
		t.Fatalf("Python requests through SOCKS5: %v\n%s", err, out)
	}
	for _, s := range strings.Fields(string(out)) {
		if !isEgress(b, s) || s == b.egress[b.fleet+"-0"] {
			t.Errorf("Python requests through SOCKS5 left from %q: want one of the fleet's proxies but the banned %s-0", s, b.fleet)
		}
	}
}

// socksTunnel opens a tunnel to target (host:port) through the SOCKS5
// gateway at addr, signing in as user with pass.
func socksTunnel(addr, target, user, pass string) (net.Conn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (net.Conn, error) {
		_ = c.Close()
		return nil, err
	}
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		return fail(err)
	}
	var pn int
	if _, err := fmt.Sscanf(port, "%d", &pn); err != nil {
		return fail(err)
	}
	msg := []byte{5, 1, 2, 1, byte(len(user))}
	msg = append(append(append(msg, user...), byte(len(pass))), pass...)
	msg = append(append(append(msg, 5, 1, 0, 3, byte(len(host))), host...), byte(pn>>8), byte(pn))
	if _, err := c.Write(msg); err != nil {
		return fail(err)
	}
	reply := make([]byte, 2+2+10)
	if _, err := io.ReadFull(c, reply); err != nil {
		return fail(err)
	}
	if reply[1] != 2 || reply[3] != 0 || reply[5] != 0 {
		return fail(fmt.Errorf("SOCKS5 through %s: %v", addr, reply))
	}
	return c, nil
}
