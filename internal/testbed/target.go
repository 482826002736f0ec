package testbed

import (
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
)

// EchoIP answers with the caller's IP as plain text, as ifconfig.me/ip does.
// Reached through a proxy, the caller is the proxy, so the answer is the
// proxy's egress IP.
func EchoIP(w http.ResponseWriter, r *http.Request) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprintln(w, host)
}

// Target is an IP-echo probe target running in the test.
type Target struct {
	// URL of the /ip endpoint.
	URL string
	// RootCAs trusts the target's certificate (nil for http targets).
	RootCAs *x509.CertPool
}

// StartEchoTarget starts an https IP-echo target, stopped with the test.
func StartEchoTarget(t testing.TB) Target {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(EchoIP))
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	return Target{URL: srv.URL + "/ip", RootCAs: pool}
}

// StartPlainEchoTarget starts an http IP-echo target, stopped with the test.
func StartPlainEchoTarget(t testing.TB) Target {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(EchoIP))
	t.Cleanup(srv.Close)
	return Target{URL: srv.URL + "/ip"}
}
