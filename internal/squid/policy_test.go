package squid_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// destination is one address of a class the proxy must not reach, with a
// host name that resolves to it through the test's hosts file.
type destination struct {
	class, addr string
}

// denied lists every class of TestDestinationPolicy with an address in it.
var denied = []destination{
	{"loopback", "127.0.0.2"},
	{"loopback", "::1"},
	{"this-network", "0.1.2.3"},
	{"unspecified", "0.0.0.0"},
	{"unspecified", "::"},
	{"ipv4-compatible", "::a09:807"},
	{"nat64", "64:ff9b::a00:1"},
	{"6to4", "2002:a00:1::1"},
	{"ipv6-documentation", "2001:db8::1"},
	{"rfc1918", "10.9.8.7"},
	{"rfc1918", "172.16.5.4"},
	{"rfc1918", "192.168.1.1"},
	{"cgnat", "100.64.1.1"},
	{"link-local", "169.254.10.10"},
	{"metadata", "169.254.169.254"},
	{"link-local", "fe80::1"},
	{"ula", "fd20:ce::254"},
	{"multicast", "224.0.0.1"},
	{"multicast", "ff02::1"},
	{"broadcast", "255.255.255.255"},
	{"documentation", "192.0.2.1"},
	{"documentation", "198.51.100.1"},
	{"documentation", "203.0.113.1"},
	{"ietf-protocol-assignments", "192.0.0.8"},
	{"site-local", "fec0::1"},
	{"own-address", testbed.LabProxyAddr},
	// Known only where the proxy starts, as a VM's external IP is: from
	// the own-addresses file. It is served on the public side, so only the
	// rule stands between a request and a 200.
	{"own-address-at-start", startedAddr},
}

// startedAddr is a public address of the proxy that its config does not
// name; the own-addresses file written at start does.
const startedAddr = "198.18.0.3"

// exception is a private address the test allows explicitly and serves
// from the stand-in public host.
const exception = "10.99.0.1"

// TestDestinationPolicy runs real Squid with the generated config inside a
// network namespace with no default route, and asks it, with valid
// credentials, for every denied destination class by IP literal and by host
// name, with CONNECT and with GET. Each must be refused by Squid (403,
// TCP_DENIED in its access log); without the deny a request fails to
// connect instead (503), so a missing rule shows and no packet leaves the
// machine. The stand-in public host and an explicit exception answer.
func TestDestinationPolicy(t *testing.T) {
	lab := testbed.NewNetLab(t)
	// The exception lives on the public side, routed from the proxy's.
	lab.IP(t, lab.Public, "addr", "add", exception+"/32", "dev", "lo")
	lab.IP(t, lab.Proxy, "route", "add", exception+"/32", "via", testbed.LabPublicAddr)
	lab.IP(t, lab.Public, "addr", "add", startedAddr+"/32", "dev", "lo")
	lab.IP(t, lab.Proxy, "route", "add", startedAddr+"/32", "via", testbed.LabPublicAddr)
	for _, addr := range []string{testbed.LabPublicAddr, exception, startedAddr} {
		for _, port := range []string{"80", "443", "8443"} {
			serve(t, lab.Listen(t, lab.Public, net.JoinHostPort(addr, port)))
		}
	}

	hosts := "198.18.0.2 public.test\n" + exception + " exception.test\n"
	for i, d := range denied {
		hosts += fmt.Sprintf("%s %s\n", d.addr, hostName(i))
	}
	htpasswd, err := squid.HtpasswdWithSalt("crawler", "s3cret", "saltsalt")
	if err != nil {
		t.Fatal(err)
	}
	const podDir = "/etc/egress-proxy"
	conf, err := squid.Render(squid.Config{
		Port: 3128, BindAddress: "127.0.0.1", OutgoingAddress: testbed.LabProxyAddr,
		HtpasswdPath: podDir + "/htpasswd", HostsFile: podDir + "/hosts",
		OwnAddressesFile:           podDir + "/self",
		AllowedPrivateDestinations: []string{"10.99.0.0/16"},
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := lab.RunSquid(t, conf, podDir, map[string][]byte{"htpasswd": htpasswd, "hosts": []byte(hosts), "self": []byte(startedAddr + "\n")}, "127.0.0.1:3128")

	proxy := &url.URL{Scheme: "http", Host: "127.0.0.1:3128", User: url.UserPassword("crawler", "s3cret")}
	dial := lab.DialContext(lab.Proxy)
	ask := func(method, target, path string) int {
		t.Helper()
		code, err := request(dial, proxy, method, target, path)
		if err != nil {
			t.Fatalf("%s %s through the proxy: %v", method, target, err)
		}
		return code
	}

	n := 0
	for i, d := range denied {
		for _, host := range []string{d.addr, hostName(i)} {
			for _, m := range []struct{ method, port string }{{http.MethodConnect, "443"}, {http.MethodGet, "80"}} {
				n++
				target := net.JoinHostPort(host, m.port)
				// Requests go one at a time, so the log line Squid writes
				// next is this request's (Squid rewrites IPv6 literals).
				offset := logSize(t, dir)
				if got := ask(m.method, target, fmt.Sprintf("/check-%d", n)); got != http.StatusForbidden {
					t.Errorf("%s %s (%s): want 403 from the destination policy, got %d", m.method, target, d.class, got)
				}
				deniedInLog(t, dir, offset, m.method)
			}
		}
	}
	t.Logf("%d denied requests over %d addresses", n, len(denied))

	// Without credentials nobody learns anything about destinations: a
	// private one gets the same 407 as a public one.
	anonymous := &url.URL{Scheme: "http", Host: proxy.Host, User: url.UserPassword("", "")}
	for _, target := range []string{"10.9.8.7:80", "198.18.0.2:80", hostName(3) + ":80"} {
		code, err := request(dial, anonymous, http.MethodGet, target, "/")
		if err != nil || code != http.StatusProxyAuthRequired {
			t.Errorf("GET %s without credentials: want 407 before any destination rule, got %d (%v)", target, code, err)
		}
	}

	for _, tc := range []struct {
		reason, method, target string
		want                   int
	}{
		{"The stand-in public host answers a plain GET.", http.MethodGet, "198.18.0.2:80", http.StatusOK},
		{"The stand-in public host answers by name.", http.MethodGet, "public.test:80", http.StatusOK},
		{"A tunnel to 443 of a public host opens.", http.MethodConnect, "198.18.0.2:443", http.StatusOK},
		{"A tunnel to an unprivileged port opens.", http.MethodConnect, "public.test:8443", http.StatusOK},
		{"An explicit exception is reachable.", http.MethodGet, exception + ":80", http.StatusOK},
		{"An exception by name is reachable.", http.MethodConnect, "exception.test:443", http.StatusOK},
		{"Plain HTTP to a privileged port other than 80 and 443 is refused.", http.MethodGet, "198.18.0.2:25", http.StatusForbidden},
		{"A tunnel to a port other than 443 and the unprivileged ones is refused.", http.MethodConnect, "198.18.0.2:22", http.StatusForbidden},
		{"A tunnel to port 80 is refused.", http.MethodConnect, "198.18.0.2:80", http.StatusForbidden},
		{"Outside the exception a private network stays denied.", http.MethodGet, "10.98.0.1:80", http.StatusForbidden},
	} {
		if got := ask(tc.method, tc.target, "/"); got != tc.want {
			t.Errorf("%s\n%s %s: want %d, got %d", tc.reason, tc.method, tc.target, tc.want, got)
		}
	}
}

func hostName(i int) string { return fmt.Sprintf("denied-%d.test", i) }

// serve answers every connection on ln: plain HTTP 200, so that both a GET
// and a tunnel through CONNECT reach something.
func serve(t *testing.T, ln net.Listener) {
	t.Helper()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("public\n"))
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// request sends one request through the proxy over a connection made by
// dial, and returns the proxy's status code: for CONNECT, the answer to the
// tunnel request itself.
func request(dial func(context.Context, string, string) (net.Conn, error), proxy *url.URL, method, target, path string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := dial(ctx, "tcp", proxy.Host)
	if err != nil {
		return 0, err
	}
	defer c.Close() //nolint:errcheck // the test is done with it
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	pw, _ := proxy.User.Password()
	req := &http.Request{Method: method, Header: http.Header{}, Host: target}
	if method == http.MethodConnect {
		req.URL = &url.URL{Opaque: target}
	} else {
		req.URL = &url.URL{Scheme: "http", Host: target, Path: path}
	}
	if proxy.User.Username() != "" {
		req.SetBasicAuth(proxy.User.Username(), pw)
		req.Header.Set("Proxy-Authorization", req.Header.Get("Authorization"))
		req.Header.Del("Authorization")
	}
	if method == http.MethodConnect {
		err = req.Write(c)
	} else {
		err = req.WriteProxy(c)
	}
	if err != nil {
		return 0, err
	}
	rsp, err := http.ReadResponse(bufio.NewReader(c), req)
	if err != nil {
		return 0, err
	}
	_ = rsp.Body.Close()
	return rsp.StatusCode, nil
}

func logSize(t *testing.T, dir string) int64 {
	t.Helper()
	fi, err := os.Stat(filepath.Join(dir, "access.log"))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// deniedInLog waits for the line Squid logs after offset, and fails the
// test unless it is a TCP_DENIED for method.
func deniedInLog(t *testing.T, dir string, offset int64, method string) {
	t.Helper()
	var line string
	testbed.Eventually(t, 5*time.Second, "Squid to log the request", func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(dir, "access.log"))
		if err != nil {
			return false, err.Error()
		}
		rest := string(b[min(offset, int64(len(b))):])
		for {
			l, after, complete := strings.Cut(rest, "\n")
			if !complete {
				return false, "no new line after byte " + fmt.Sprint(offset)
			}
			// A connection closed without a request (the readiness
			// check's) is logged late; it is no request of the test's.
			if !strings.Contains(l, "error:transaction-end-before-headers") {
				line = l
				return true, ""
			}
			rest = after
		}
	})
	if !strings.Contains(line, "TCP_DENIED") || !strings.Contains(line, " "+method+" ") {
		t.Errorf("Squid did not deny the %s: %s", method, line)
	}
}
