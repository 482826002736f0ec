package testbed

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestEgressProxies: each stand-in proxy demands its credentials and
// reaches its targets from its own loopback address, its egress IP; one
// removed takes no connection.
func TestEgressProxies(t *testing.T) {
	target := StartEchoTarget(t)
	e := StartEgressProxies(t, "crawler", "pw")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	_ = l.Close()
	fetch := func(ip, user string) (string, error) {
		proxy := &url.URL{Scheme: "http", Host: net.JoinHostPort(ip, port), User: url.UserPassword(user, "pw")}
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxy), TLSClientConfig: &tls.Config{RootCAs: target.RootCAs, MinVersion: tls.VersionTLS12}}}
		rsp, err := c.Get(target.URL)
		if err != nil {
			return "", err
		}
		defer rsp.Body.Close() //nolint:errcheck // A test's read.
		b, err := io.ReadAll(rsp.Body)
		return strings.TrimSpace(string(b)), err
	}
	for _, ip := range []string{"127.1.0.7", "127.1.0.8"} {
		if err := e.Add(net.JoinHostPort(ip, port)); err != nil {
			t.Fatal(err)
		}
		if got, err := fetch(ip, "crawler"); err != nil || got != ip {
			t.Errorf("through the proxy at %s: egress IP %q (%v), want %s", ip, got, err, ip)
		}
		if _, err := fetch(ip, "stranger"); err == nil {
			t.Errorf("the proxy at %s served wrong credentials", ip)
		}
	}
	e.Remove(net.JoinHostPort("127.1.0.7", port))
	if _, err := fetch("127.1.0.7", "crawler"); err == nil || e.Len() != 1 {
		t.Errorf("a removed proxy still serves (%v), or the count is wrong: %d", err, e.Len())
	}
}
