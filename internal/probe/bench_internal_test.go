package probe

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"
)

// BenchmarkProbeTLS measures one probe (CONNECT through an in-process
// proxy, a TLS handshake with an in-process target, a GET of the echoed
// address) as probes make it, resuming the target's session with X25519,
// against the same probe with a full handshake and Go's default key
// exchange (the post-quantum hybrid), as probes made it before. cpu-ms/op
// is the whole process's CPU: the probe's side, the proxy's and the
// target's, as on a machine that runs them all (make scale).
//
//	go test ./internal/probe -run '^$' -bench BenchmarkProbeTLS -benchtime 500x -count 3
func BenchmarkProbeTLS(b *testing.B) {
	target := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "203.0.113.9\n")
	}))
	b.Cleanup(target.Close)
	roots := x509.NewCertPool()
	roots.AddCert(target.Certificate())
	proxy := tunnel(b)
	t := Target{Proxy: proxy, URL: target.URL + "/ip", RootCAs: roots, Timeout: 5 * time.Second}
	run := func(b *testing.B, cache tls.ClientSessionCache, curves []tls.CurveID) {
		was, wasCurves := sessions, probeCurves
		sessions, probeCurves = cache, curves
		b.Cleanup(func() { sessions, probeCurves = was, wasCurves })
		if res := (Prober{}).Probe(context.Background(), t); !res.OK {
			b.Fatal(res.Error)
		}
		cpu := processCPU()
		b.ResetTimer()
		for range b.N {
			if res := (Prober{}).Probe(context.Background(), t); !res.OK {
				b.Fatal(res.Error)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(processCPU()-cpu)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
	}
	b.Run("resumed-x25519", func(b *testing.B) { run(b, tls.NewLRUClientSessionCache(8), probeCurves) })
	b.Run("full-handshake-default-curves", func(b *testing.B) { run(b, nil, nil) })
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tunnel is a bare CONNECT proxy on loopback: it reads the request, answers
// 200 and splices the connection to the address asked for.
func tunnel(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close() //nolint:errcheck // Either side ends the tunnel.
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil || req.Method != http.MethodConnect {
					return
				}
				up, err := net.Dial("tcp", req.Host)
				if err != nil {
					return
				}
				defer up.Close() //nolint:errcheck // Either side ends the tunnel.
				if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
					return
				}
				go func() { _, _ = io.Copy(up, br); _ = up.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	return l.Addr().String()
}
