package discovery_test

import (
	"bufio"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
)

// BenchmarkGateway measures, in one run on loopback, the gateway against
// the same Squid used directly: bulk download throughput through a CONNECT
// tunnel, the time to first byte of a fresh CONNECT on an established
// session (p99), and the memory 1000 tunnels held open at once cost.
// Ratios, not times, are the figures (BENCHMARKS.md):
//
//	go test ./internal/discovery -run '^$' -bench BenchmarkGateway -benchtime 1x
func BenchmarkGateway(b *testing.B) {
	for range b.N {
		benchGateway(b)
	}
}

func benchGateway(b *testing.B) {
	gb := newGatewayBed(b, 1, 4, func(g *discovery.Gateway) { g.MaxConnsPerIdentity, g.MaxConns = 5000, 5000 })
	const bulk = 256 << 20
	chunk := make([]byte, 1<<20)
	_, _ = rand.Read(chunk)
	target := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/bulk" {
			for sent := 0; sent < bulk; sent += len(chunk) {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer target.Close()
	host := strings.TrimPrefix(target.URL, "https://")
	var squidAddr string
	for _, a := range gb.addrs {
		squidAddr = a
	}
	user := gb.user("_session_bench")
	via := map[string]func() (net.Conn, error){
		"direct":  func() (net.Conn, error) { return tunnel(squidAddr, host, "crawler", "s3cret") },
		"gateway": func() (net.Conn, error) { return tunnel(gb.url, host, user, gb.token) },
	}
	cfg := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // The benchmark's own target, on loopback.

	// Throughput: direct, gateway, direct, gateway; the best of each.
	rate := map[string]float64{}
	for range 2 {
		for _, how := range []string{"direct", "gateway"} {
			c, err := via[how]()
			if err != nil {
				b.Fatal(how, err)
			}
			tc := tls.Client(c, cfg)
			start := time.Now()
			if _, err := fmt.Fprintf(tc, "GET /bulk HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host); err != nil {
				b.Fatal(err)
			}
			n, err := io.Copy(io.Discard, tc)
			if err != nil || n < bulk {
				b.Fatalf("%s: %d bytes, %v", how, n, err)
			}
			rate[how] = max(rate[how], float64(n)/time.Since(start).Seconds())
			_ = tc.Close()
		}
	}

	// Time to first byte of a fresh tunnel and request, 200 of each,
	// interleaved.
	ttfb := map[string][]time.Duration{}
	for range 200 {
		for _, how := range []string{"direct", "gateway"} {
			start := time.Now()
			c, err := via[how]()
			if err != nil {
				b.Fatal(how, err)
			}
			tc := tls.Client(c, cfg)
			if _, err := fmt.Fprintf(tc, "GET /ok HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host); err != nil {
				b.Fatal(err)
			}
			one := make([]byte, 1)
			if _, err := tc.Read(one); err != nil {
				b.Fatal(err)
			}
			ttfb[how] = append(ttfb[how], time.Since(start))
			_ = tc.Close()
		}
	}
	p99 := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)*99/100]
	}

	// 1000 tunnels held open at once, through one session.
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	goBefore := runtime.NumGoroutine()
	held := make([]net.Conn, 0, 1000)
	for range 1000 {
		c, err := via["gateway"]()
		if err != nil {
			b.Fatalf("tunnel %d: %v", len(held), err)
		}
		held = append(held, c)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	goAfter := runtime.NumGoroutine()
	for _, c := range held {
		_ = c.Close()
	}
	perTunnel := float64(after.HeapInuse+after.StackInuse-before.HeapInuse-before.StackInuse) / 1000

	b.ReportMetric(rate["gateway"]/rate["direct"], "throughput-ratio")
	b.ReportMetric(float64(p99(ttfb["gateway"]))/float64(p99(ttfb["direct"])), "ttfb-p99-ratio")
	b.ReportMetric(perTunnel, "bytes/tunnel")
	b.ReportMetric(float64(goAfter-goBefore)/1000, "goroutines/tunnel")
	b.Logf("bulk %.0f MB/s direct, %.0f MB/s through the gateway; TTFB p99 %s direct, %s through the gateway; 1000 tunnels: %.0f bytes and %.1f goroutines each (both ends in this process)",
		rate["direct"]/1e6, rate["gateway"]/1e6, p99(ttfb["direct"]), p99(ttfb["gateway"]), perTunnel, float64(goAfter-goBefore)/1000)
}

// tunnel opens a CONNECT tunnel to target through the proxy at addr.
func tunnel(addr, target, user, pass string) (net.Conn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", target, target, auth); err != nil {
		_ = c.Close()
		return nil, err
	}
	br := bufio.NewReader(c)
	rsp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	if rsp.StatusCode != http.StatusOK {
		_ = c.Close()
		return nil, fmt.Errorf("CONNECT through %s: %s", addr, rsp.Status)
	}
	if br.Buffered() > 0 {
		return nil, fmt.Errorf("bytes after the CONNECT answer")
	}
	return c, nil
}
