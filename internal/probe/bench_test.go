package probe_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// BenchmarkProbeTLS measures one probe (CONNECT through an in-process
// proxy, a TLS handshake with an in-process target, a GET of the echoed
// address) as probes make it, resuming the target's session with X25519,
// against the same probe with a full handshake and Go's default key
// exchange (the post-quantum hybrid), as probes made it before. cpu-ms/op
// is the whole process's CPU: the probe's side, the proxy's and the
// target's, as on a machine that runs them all (make scale).
//
//	go test ./internal/probe -run '^$' -bench BenchmarkProbeTLS -benchtime 300x -count 3
func BenchmarkProbeTLS(b *testing.B) {
	target := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "203.0.113.9\n")
	}))
	b.Cleanup(target.Close)
	roots := x509.NewCertPool()
	roots.AddCert(target.Certificate())
	proxy := testbed.StartConnectProxies(b, 1, "crawler", "s3cret").Addrs[0]
	t := probe.Target{Proxy: proxy, Username: "crawler", Password: "s3cret", URL: target.URL + "/ip", RootCAs: roots, Timeout: 5 * time.Second}
	run := func(b *testing.B, cache tls.ClientSessionCache, curves []tls.CurveID) {
		b.Cleanup(probe.SetProbeTLS(cache, curves))
		if res := (probe.Prober{}).Probe(context.Background(), t); !res.OK {
			b.Fatal(res.Error)
		}
		cpu := testbed.ProcessCPU(b)
		b.ResetTimer()
		for range b.N {
			if res := (probe.Prober{}).Probe(context.Background(), t); !res.OK {
				b.Fatal(res.Error)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(testbed.ProcessCPU(b)-cpu)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
	}
	b.Run("resumed-x25519", func(b *testing.B) { run(b, tls.NewLRUClientSessionCache(8), probe.ProbeCurves()) })
	b.Run("full-handshake-default-curves", func(b *testing.B) { run(b, nil, nil) })
}
