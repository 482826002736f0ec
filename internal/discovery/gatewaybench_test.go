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
	"strconv"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// BenchmarkGateway measures, in one run on loopback, the gateway against
// the same Squid used directly: bulk download throughput through a CONNECT
// tunnel, the time to first byte of a fresh CONNECT on an established
// session (p99) and of one without a session, which the rotation sends
// through the next of three Squids, and the memory 1000 tunnels held open
// at once cost.
// Ratios, not times, are the figures (BENCHMARKS.md):
//
//	go test ./internal/discovery -run '^$' -bench BenchmarkGateway -benchtime 1x
func BenchmarkGateway(b *testing.B) {
	for range b.N {
		benchGateway(b)
	}
}

func benchGateway(b *testing.B) {
	gb := newGatewayBed(b, 3, 4, func(g *discovery.GatewayConfig) { g.MaxConnsPerIdentity, g.MaxConns = 5000, 5000 })
	target := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	defer target.Close()
	host := strings.TrimPrefix(target.URL, "https://")
	squidAddr := gb.addrs[gb.fleet+"-0"]
	user := gb.user("_session_bench")
	via := map[string]func(string) (net.Conn, error){
		"direct":   func(to string) (net.Conn, error) { return tunnel(squidAddr, to, "crawler", "s3cret") },
		"gateway":  func(to string) (net.Conn, error) { return tunnel(gb.url, to, user, gb.token) },
		"rotating": func(to string) (net.Conn, error) { return tunnel(gb.url, to, gb.user(""), gb.token) },
	}
	socks := socksAt(b, gb)
	via["socks5"] = func(to string) (net.Conn, error) { return socksTunnel(socks, to, gb.user(""), gb.token) }
	paths := []string{"direct", "gateway", "rotating", "socks5"}
	cfg := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // The benchmark's own target, on loopback.

	// Throughput: 256 MiB of opaque bytes through a CONNECT tunnel, direct
	// and through the gateway in turn, in 11 rounds, each starting on
	// another path (the path that ran right after direct, on the Squid
	// direct had just used, measured 0.1 lower than the same path later).
	// The figure is the median over the rounds of each path's rate divided
	// by direct's in the same round: one transfer's rate swings by a
	// quarter either way on this machine, more than the gateway costs, and
	// the best of each path compared one lucky direct transfer with the
	// gateway's.
	// Plain HTTP inside the tunnel, read into a 1 MiB buffer: the crawler's
	// and the target's own work (TLS, small reads) share this machine's two
	// cores with Squid and the gateway, and are kept as small as they can
	// be, so that the figure is the proxies'.
	const bulk = 256 << 20
	chunk := make([]byte, 1<<20)
	_, _ = rand.Read(chunk)
	bulkTarget := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(bulk))
		for sent := 0; sent < bulk; sent += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	defer bulkTarget.Close()
	bulkAddr := strings.TrimPrefix(bulkTarget.URL, "http://")
	rates := map[string][]float64{}
	buf := make([]byte, 1<<20)
	for round := range 11 {
		for i := range paths {
			how := paths[(round+i)%len(paths)]
			c, err := via[how](bulkAddr)
			if err != nil {
				b.Fatal(how, err)
			}
			start := time.Now()
			if _, err := io.WriteString(c, "GET /bulk HTTP/1.1\r\nHost: bulk\r\nConnection: close\r\n\r\n"); err != nil {
				b.Fatal(err)
			}
			var n int64
			for {
				k, err := c.Read(buf)
				n += int64(k)
				if err != nil {
					break
				}
			}
			if n < bulk {
				b.Fatalf("%s: %d bytes, fewer than %d", how, n, bulk)
			}
			rates[how] = append(rates[how], float64(n)/time.Since(start).Seconds())
			_ = c.Close()
		}
	}

	// Time to first byte of a fresh tunnel, TLS handshake and request,
	// 2000 of each, interleaved (with 200, p99 was one of the two worst samples
	// and swung from 0.9 to 1.5 between runs; with 1000, from 1.02 to 1.35).
	ttfb := map[string][]time.Duration{}
	for range 2000 {
		for _, how := range paths {
			start := time.Now()
			c, err := via[how](host)
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

	// 1000 tunnels held open at once, through one session.
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	goBefore := runtime.NumGoroutine()
	held := make([]net.Conn, 0, 1000)
	for range 1000 {
		c, err := via["gateway"](host)
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

	rate, ratio := map[string]float64{}, map[string]float64{}
	for how, r := range rates {
		rate[how] = testbed.Median(r)
		per := make([]float64, len(r))
		for i := range r {
			per[i] = r[i] / rates["direct"][i]
		}
		ratio[how] = testbed.Median(per)
	}
	b.ReportMetric(ratio["gateway"], "throughput-ratio")
	b.ReportMetric(ratio["rotating"], "throughput-ratio-rotating")
	b.ReportMetric(ratio["socks5"], "throughput-ratio-socks5")
	b.ReportMetric(float64(testbed.P99(ttfb["gateway"]))/float64(testbed.P99(ttfb["direct"])), "ttfb-p99-ratio")
	b.ReportMetric(float64(testbed.P99(ttfb["rotating"]))/float64(testbed.P99(ttfb["direct"])), "ttfb-p99-ratio-rotating")
	b.ReportMetric(float64(testbed.P99(ttfb["socks5"]))/float64(testbed.P99(ttfb["direct"])), "ttfb-p99-ratio-socks5")
	b.ReportMetric(perTunnel, "bytes/tunnel")
	b.ReportMetric(float64(goAfter-goBefore)/1000, "goroutines/tunnel")
	b.Logf("bulk MB/s (median): %.0f direct, %.0f through a session, %.0f rotating, %.0f SOCKS5; TTFB p50 %s direct, %s session, %s rotating, %s SOCKS5; p99 %s direct, %s session, %s rotating, %s SOCKS5; 1000 tunnels: %.0f bytes and %.1f goroutines each (both ends in this process)",
		rate["direct"]/1e6, rate["gateway"]/1e6, rate["rotating"]/1e6, rate["socks5"]/1e6,
		testbed.Median(ttfb["direct"]), testbed.Median(ttfb["gateway"]), testbed.Median(ttfb["rotating"]), testbed.Median(ttfb["socks5"]),
		testbed.P99(ttfb["direct"]), testbed.P99(ttfb["gateway"]), testbed.P99(ttfb["rotating"]), testbed.P99(ttfb["socks5"]), perTunnel, float64(goAfter-goBefore)/1000)
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
