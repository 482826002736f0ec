package testbed

import (
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
)

// Target is an IP-echo probe target running in the test.
type Target struct {
	// URL of the /ip endpoint.
	URL string
	// RootCAs trusts the target's certificate (nil for http targets).
	RootCAs *x509.CertPool
	// CAPEM is that certificate in PEM, for a provider process's
	// --probe-ca-bundle.
	CAPEM []byte
}

// StartEchoTarget starts an https IP-echo target, stopped with the test.
func StartEchoTarget(t testing.TB) Target {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(probe.EchoIP))
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	return Target{URL: srv.URL + "/ip", RootCAs: pool, CAPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})}
}

// StartPlainEchoTarget starts an http IP-echo target, stopped with the test.
func StartPlainEchoTarget(t testing.TB) Target {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(probe.EchoIP))
	t.Cleanup(srv.Close)
	return Target{URL: srv.URL + "/ip"}
}
