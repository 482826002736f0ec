package probe_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/local"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// startSquid runs a real Squid with credentials through the local backend.
func startSquid(t *testing.T) string {
	t.Helper()
	return startSquidFor(t, nil)
}

// startSquidFor runs a real Squid with credentials that admits clients
// from ranges only (any client when empty).
func startSquidFor(t *testing.T, ranges []string) string {
	t.Helper()
	dir := testbed.SquidStateDir(t)
	b, err := local.New(local.Config{SquidPath: testbed.SquidBinary(t), StateDir: dir, ClusterID: "probe-test",
		PortRange: &v1alpha1.PortRange{From: 32200, To: 32299}})
	if err != nil {
		t.Fatal(err)
	}
	s := backend.Spec{
		Ref: backend.Ref{Name: ownership.InstanceName(types.UID("probe-test" + strings.Join(ranges, ",")))}, Owner: ownership.Owner{UID: types.UID("probe-test" + strings.Join(ranges, ","))},
		Credentials:         &backend.Credentials{Username: "crawler", Password: "p@ss word"},
		Local:               &v1alpha1.LocalPlacement{BindAddress: "127.0.0.1"},
		AllowedSourceRanges: ranges,
		// The probe targets live on this host.
		AllowLoopbackDestinations: true,
	}
	inst, err := b.Create(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Delete(context.Background(), s.Ref) })
	addr := net.JoinHostPort(inst.Host, strconv.Itoa(int(inst.Port)))
	testbed.Eventually(t, 10*time.Second, "squid listening on "+addr, func() (bool, string) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false, err.Error()
		}
		_ = c.Close()
		return true, ""
	})
	return addr
}

func TestProbeThroughRealSquid(t *testing.T) {
	proxy := startSquid(t)
	// A local proxy reaches loopback targets from an address of its own.
	_, port, _ := net.SplitHostPort(proxy)
	pn, _ := strconv.Atoi(port)
	egress := local.EgressAddress(int32(pn))
	tls := testbed.StartEchoTarget(t)
	plain := testbed.StartPlainEchoTarget(t)
	teapot := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	t.Cleanup(teapot.Close)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { time.Sleep(2 * time.Second) }))
	t.Cleanup(slow.Close)
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := dead.Addr().String()
	_ = dead.Close()

	cases := map[string]struct {
		reason   string
		target   probe.Target
		wantOK   bool
		wantIP   string
		wantErr  string
		hidePass bool
	}{
		"HTTPSConnect": {
			reason: "An https URL is fetched through a CONNECT tunnel, and the echoed IP is the egress IP.",
			target: probe.Target{Proxy: proxy, Username: "crawler", Password: "p@ss word", URL: tls.URL, RootCAs: tls.RootCAs},
			wantOK: true, wantIP: egress,
		},
		"HTTPGet": {
			reason: "An http URL is fetched with a proxied GET.",
			target: probe.Target{Proxy: proxy, Username: "crawler", Password: "p@ss word", URL: plain.URL},
			wantOK: true, wantIP: egress,
		},
		"WrongPasswordConnect": {
			reason:  "Squid answers CONNECT with 407; the message says to check the credentials and hides them.",
			target:  probe.Target{Proxy: proxy, Username: "crawler", Password: "hunter2", URL: tls.URL, RootCAs: tls.RootCAs},
			wantErr: "rejected the credentials", hidePass: true,
		},
		"WrongPasswordGet": {
			reason:  "A proxied GET gets the same clear message.",
			target:  probe.Target{Proxy: proxy, Username: "crawler", Password: "hunter2", URL: plain.URL},
			wantErr: "rejected the credentials", hidePass: true,
		},
		"NoCredentials": {
			reason:  "A probe without credentials is refused by an authenticated proxy.",
			target:  probe.Target{Proxy: proxy, URL: plain.URL},
			wantErr: "407",
		},
		"UnexpectedStatus": {
			reason:  "A target answering another status fails the probe.",
			target:  probe.Target{Proxy: proxy, Username: "crawler", Password: "p@ss word", URL: teapot.URL},
			wantErr: "target answered 418",
		},
		"ExpectedOtherStatus": {
			reason: "The expected status is configurable.",
			target: probe.Target{Proxy: proxy, Username: "crawler", Password: "p@ss word", URL: teapot.URL, ExpectedStatus: 418},
			wantOK: true,
		},
		"Timeout": {
			reason:  "A slow target fails within the timeout.",
			target:  probe.Target{Proxy: proxy, Username: "crawler", Password: "p@ss word", URL: slow.URL, Timeout: 300 * time.Millisecond},
			wantErr: "timed out",
		},
		"ProxyDown": {
			reason:  "A proxy that does not listen is reported as such.",
			target:  probe.Target{Proxy: deadAddr, Username: "crawler", Password: "p@ss word", URL: plain.URL},
			wantErr: "refused the connection",
		},
		"UntrustedTarget": {
			reason:  "An https target with an unknown CA fails TLS verification.",
			target:  probe.Target{Proxy: proxy, Username: "crawler", Password: "p@ss word", URL: tls.URL},
			wantErr: "certificate",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := probe.Prober{}.Probe(context.Background(), tc.target)
			if got.OK != tc.wantOK {
				t.Fatalf("%s\nOK: want %v, got %+v", tc.reason, tc.wantOK, got)
			}
			if diff := cmp.Diff(tc.wantIP, got.EgressIP); diff != "" {
				t.Errorf("%s\negress IP: -want, +got:\n%s", tc.reason, diff)
			}
			if !strings.Contains(got.Error, tc.wantErr) {
				t.Errorf("%s\nerror %q must contain %q", tc.reason, got.Error, tc.wantErr)
			}
			if tc.hidePass && strings.Contains(got.Error, tc.target.Password) {
				t.Errorf("%s\nthe error leaks the password: %q", tc.reason, got.Error)
			}
			if got.Latency <= 0 {
				t.Errorf("%s\nlatency must be measured, got %s", tc.reason, got.Latency)
			}
		})
	}
}

// TestProbeRefused: a probe the network or the proxy's client ACL refuses
// says so (probe.Refused), and names where to let the provider in: a real
// Squid that admits 10.0.0.0/8 only answers the loopback probe 403, and
// admits it once the probe's range is added, as the provider adds a
// ProviderConfig's spec.probe.sourceRanges; a proxy whose network drops
// the connection (a listener whose accept queue is full, so the kernel
// drops the SYN as a firewall would) times the probe's dial out. A proxy
// that is down, or a slow target, is not a refusal.
func TestProbeRefused(t *testing.T) {
	plain := testbed.StartPlainEchoTarget(t)
	creds := func(proxy string) probe.Target {
		return probe.Target{Proxy: proxy, Username: "crawler", Password: "p@ss word", URL: plain.URL, Timeout: time.Second}
	}

	tlsTarget := testbed.StartEchoTarget(t)
	narrow, merged := startSquidFor(t, []string{"10.0.0.0/8"}), startSquidFor(t, []string{"10.0.0.0/8", "127.0.0.1/32"})
	for _, how := range []string{"plain", "CONNECT"} {
		for _, proxy := range []string{narrow, merged} {
			target := creds(proxy)
			if how == "CONNECT" {
				target.URL, target.RootCAs = tlsTarget.URL, tlsTarget.RootCAs
			}
			got := probe.Prober{}.Probe(context.Background(), target)
			switch {
			case proxy == narrow && (got.OK || !probe.Refused(got.Error) || !strings.Contains(got.Error, "spec.probe.sourceRanges")):
				t.Errorf("%s: a Squid admitting 10.0.0.0/8 only must refuse the loopback probe, saying where to let it in; got %+v", how, got)
			case proxy == merged && !got.OK:
				t.Errorf("%s: with the probe's range added the probe must pass; got %+v", how, got)
			}
		}
	}

	dropping := testbed.DroppingAddress(t)
	drop := probe.Prober{}.Probe(context.Background(), creds(dropping))
	if drop.OK || !probe.Refused(drop.Error) || !strings.Contains(drop.Error, "timed out") {
		t.Errorf("a proxy whose network drops the connection must be reported as refusing the probe; got %+v", drop)
	}
	if c, detail := (probe.Prober{}).Closed(context.Background(), creds(dropping)); c != probe.ClosureUnknown || !probe.Refused(detail) {
		t.Errorf("the closure check of such a proxy must say the same; got %s %q", c, detail)
	}

	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := dead.Addr().String()
	_ = dead.Close()
	if got := (probe.Prober{}).Probe(context.Background(), creds(deadAddr)); probe.Refused(got.Error) {
		t.Errorf("a proxy that is down is not a refusal: %q", got.Error)
	}
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { time.Sleep(2 * time.Second) }))
	t.Cleanup(slow.Close)
	target := creds(startSquid(t))
	target.URL = slow.URL
	if got := (probe.Prober{}).Probe(context.Background(), target); got.OK || probe.Refused(got.Error) {
		t.Errorf("a slow target is not a refusal: %+v", got)
	}
}

// TestClosed asks real Squid with credentials, without them, for the
// host of an https and of an http URL: both are closed, since Squid
// answers 407. Stand-ins for hand-written configurations: a proxy that
// tunnels for anybody is open, even when its target itself answers 407
// (which a check of the target's answer would take for the proxy's); one
// that refuses with 403, or answers oddly, is not shown closed.
func TestClosed(t *testing.T) {
	squid := startSquid(t)
	tls := testbed.StartEchoTarget(t)
	plain := testbed.StartPlainEchoTarget(t)
	answering := func(code int) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(code) }))
		t.Cleanup(s.Close)
		return strings.TrimPrefix(s.URL, "http://")
	}
	forger := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Proxy-Authenticate", `Basic realm="x"`)
		w.WriteHeader(http.StatusProxyAuthRequired)
	}))
	t.Cleanup(forger.Close)
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := dead.Addr().String()
	_ = dead.Close()
	for _, tc := range []struct {
		name, proxy, url string
		want             probe.Closure
		detail           string
	}{
		{"SquidHTTPS", squid, tls.URL, probe.ClosureClosed, "demanded credentials"},
		{"SquidHTTP", squid, plain.URL, probe.ClosureClosed, "demanded credentials"},
		{"TunnelsForAnybody", openTunnel(t), plain.URL, probe.ClosureOpen, "opened a tunnel without credentials"},
		{"TunnelsForAnybodyToA407Target", openTunnel(t), forger.URL, probe.ClosureOpen, "opened a tunnel without credentials"},
		{"AnswersAnybody", answering(http.StatusOK), plain.URL, probe.ClosureOpen, "without credentials (200)"},
		{"RefusesWithout407", answering(http.StatusForbidden), plain.URL, probe.ClosureUnknown, "instead of demanding them (407)"},
		{"AnswersOddly", answering(http.StatusNotFound), tls.URL, probe.ClosureUnknown, "with 404 instead of demanding them (407)"},
		{"Down", deadAddr, plain.URL, probe.ClosureUnknown, "refused the connection"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, detail := probe.Prober{}.Closed(context.Background(), probe.Target{
				Proxy: tc.proxy, URL: tc.url, RootCAs: tls.RootCAs, Username: "crawler", Password: "p@ss word", Timeout: 3 * time.Second,
			})
			if got != tc.want || !strings.Contains(detail, tc.detail) {
				t.Errorf("want %s (%q), got %s (%q)", tc.want, tc.detail, got, detail)
			}
		})
	}
}

// openTunnel is a proxy that opens a CONNECT tunnel for anybody, as an
// open hand-written configuration would.
func openTunnel(t *testing.T) string {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		up, err := net.Dial("tcp", r.Host)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusOK)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			_ = up.Close()
			return
		}
		_ = buf.Flush()
		// What the prober sent after its CONNECT may already sit in buf:
		// copying from conn alone lost it now and then (a handshake the
		// target read from its middle: "EOF", "first record does not look
		// like a TLS handshake").
		go func() { _, _ = io.Copy(up, buf); _ = up.Close() }()
		_, _ = io.Copy(conn, up)
		_ = conn.Close()
	}))
	t.Cleanup(s.Close)
	return strings.TrimPrefix(s.URL, "http://")
}

func TestEgressIP(t *testing.T) {
	cases := map[string]struct {
		reason string
		body   string
		want   string
	}{
		"Plain":     {reason: "ifconfig.me/ip answers a bare IP.", body: "203.0.113.7\n", want: "203.0.113.7"},
		"IPv6":      {reason: "IPv6 is an IP too.", body: "2001:db8::1", want: "2001:db8::1"},
		"JSONIP":    {reason: "ipify answers {\"ip\": ...}.", body: `{"ip":"198.51.100.2"}`, want: "198.51.100.2"},
		"JSONChain": {reason: "httpbin's origin may list a chain; the caller comes first.", body: `{"origin":"198.51.100.2, 10.0.0.1"}`, want: "198.51.100.2"},
		"HTML":      {reason: "A page that is not an IP reveals nothing.", body: "<html>hello</html>", want: ""},
		"Empty":     {reason: "No body, no IP.", body: "", want: ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, probe.EgressIP([]byte(tc.body))); diff != "" {
				t.Errorf("%s\n-want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}

func TestVerdict(t *testing.T) {
	cases := map[string]struct {
		reason   string
		start    probe.Verdict
		outcomes []bool
		succ     int32
		fail     int32
		want     probe.Verdict
	}{
		"NeverProbed": {
			reason: "No verdict yet is not healthy.",
			want:   probe.Verdict{},
		},
		"FirstPass": {
			reason:   "With successThreshold 1 the first pass makes a proxy healthy.",
			outcomes: []bool{true}, succ: 1, fail: 3,
			want: probe.Verdict{Healthy: true, ConsecutiveSuccesses: 1},
		},
		"NeedsTwo": {
			reason:   "With successThreshold 2 one pass is not enough.",
			outcomes: []bool{true}, succ: 2, fail: 3,
			want: probe.Verdict{ConsecutiveSuccesses: 1},
		},
		"OneBlip": {
			reason:   "One failure does not flip a healthy proxy when failureThreshold is 3.",
			start:    probe.Verdict{Healthy: true, ConsecutiveSuccesses: 5},
			outcomes: []bool{false}, succ: 1, fail: 3,
			want: probe.Verdict{Healthy: true, ConsecutiveFailures: 1},
		},
		"Flips": {
			reason:   "failureThreshold failures in a row flip it.",
			start:    probe.Verdict{Healthy: true},
			outcomes: []bool{false, false, false}, succ: 1, fail: 3,
			want: probe.Verdict{ConsecutiveFailures: 3},
		},
		"SteadyStops": {
			reason:   "Counters stop at their thresholds, so a steady proxy's status stops changing.",
			outcomes: []bool{true, true, true, true, true, false, false, false, false}, succ: 2, fail: 3,
			want: probe.Verdict{ConsecutiveFailures: 3},
		},
		"SteadyHealthy": {
			reason:   "A proxy passing every probe keeps the same verdict after the threshold.",
			outcomes: []bool{true, true, true, true, true}, succ: 2, fail: 3,
			want: probe.Verdict{Healthy: true, ConsecutiveSuccesses: 2},
		},
		"Interrupted": {
			reason:   "A pass in between resets the failure count.",
			start:    probe.Verdict{Healthy: true},
			outcomes: []bool{false, false, true, false, false}, succ: 1, fail: 3,
			want: probe.Verdict{Healthy: true, ConsecutiveFailures: 2},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			v := tc.start
			for _, ok := range tc.outcomes {
				v = v.Next(ok, tc.succ, tc.fail)
			}
			if diff := cmp.Diff(tc.want, v); diff != "" {
				t.Errorf("%s\n-want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}

// TestProbesResumeTLS: a probe resumes an earlier probe's TLS session with
// the target, through another proxy too, and key exchange is X25519, not
// the post-quantum hybrid (both spare each probe's handshake CPU); a probe
// still verifies the target when it cannot resume.
func TestProbesResumeTLS(t *testing.T) {
	type seen struct {
		resumed bool
		curve   tls.CurveID
	}
	var mu sync.Mutex
	var got []seen
	target := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, seen{r.TLS.DidResume, r.TLS.CurveID})
		mu.Unlock()
		_, _ = io.WriteString(w, "203.0.113.9\n")
	}))
	target.StartTLS()
	t.Cleanup(target.Close)
	seenSoFar := func() []seen {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
	roots := x509.NewCertPool()
	roots.AddCert(target.Certificate())
	probeWith := func(url string, pool *x509.CertPool) probe.Result {
		return probe.Prober{}.Probe(context.Background(), probe.Target{Proxy: openTunnel(t), URL: url, RootCAs: pool, Timeout: 5 * time.Second})
	}
	for i := range 3 {
		if res := probeWith(target.URL+"/ip", roots); !res.OK || res.EgressIP != "203.0.113.9" {
			t.Fatalf("probe %d: %+v", i, res)
		}
	}
	s := seenSoFar()
	if len(s) != 3 {
		t.Fatalf("the target saw %d probes, want 3", len(s))
	}
	if s[0].curve != tls.X25519 {
		t.Errorf("the first probe's key exchange was %v, want X25519", s[0].curve)
	}
	for i, p := range s[1:] {
		if !p.resumed {
			t.Errorf("probe %d through another proxy did not resume the first probe's session", i+2)
		}
	}

	// A session never stands in for trust: with a pool that no longer
	// trusts the target's certificate the probe fails and the target
	// answers nothing; a server with a certificate nobody trusts does not
	// get through on the cached session either.
	if res := probeWith(target.URL+"/ip", x509.NewCertPool()); res.OK || !strings.Contains(res.Error, "certificate") {
		t.Errorf("with an empty pool the probe passed on the cached session: %+v", res)
	}
	if n := len(seenSoFar()); n != 3 {
		t.Errorf("with an empty pool the target answered %d more requests", n-3)
	}
	other := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "203.0.113.9\n") }))
	other.TLS = &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}, MinVersion: tls.VersionTLS12}
	other.StartTLS()
	t.Cleanup(other.Close)
	if res := probeWith(other.URL+"/ip", roots); res.OK || !strings.Contains(res.Error, "certificate") {
		t.Errorf("a target whose certificate is not trusted passed the probe: %+v", res)
	}
}

// selfSigned is a certificate for 127.0.0.1 that nothing trusts.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "untrusted"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
