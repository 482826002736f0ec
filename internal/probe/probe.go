// Package probe checks a proxy by fetching a URL through it: CONNECT for
// https URLs, a proxied GET for http ones, with the proxy's credentials and a
// timeout. A target that answers with the caller's IP reveals the proxy's
// egress IP.
//
// probe.go holds the Prober: one probe, the check that a proxy with
// credentials refuses a client without them, the messages that say what
// went wrong, and reading the egress IP from an answer; verdict.go folds
// probe outcomes into a health verdict by thresholds, and holds EchoIP, a
// target that answers with the caller's IP.
package probe

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// maxBody bounds how much of the target's answer is read.
const maxBody = 4 << 10

// Target says what to probe and how.
type Target struct {
	// Proxy is the proxy's host:port.
	Proxy string
	// Username and Password for proxy auth; empty means none.
	Username, Password string
	// URL fetched through the proxy.
	URL string
	// Timeout of the whole probe.
	Timeout time.Duration
	// ExpectedStatus of the target's answer; zero means 200.
	ExpectedStatus int
	// RootCAs verify an https target behind a private CA; nil means the
	// system pool.
	RootCAs *x509.CertPool
	// Reach, when set, checks each address the proxy's name resolves to
	// before it is dialed (a reach.Rule, which compares with ==, as
	// targets do); nil checks none.
	Reach Reach
}

// Reach refuses a dial, before any packet, of an address the proxy may not
// be reached at: net.Dialer's Control.
type Reach interface {
	Control(network, address string, c syscall.RawConn) error
}

// Result of one probe.
type Result struct {
	// OK is true when the target answered with the expected status in time.
	OK bool
	// Latency from start to the end of the answer.
	Latency time.Duration
	// EgressIP is the caller address the target echoed, if it did.
	EgressIP string
	// Error says why the probe failed, without the credentials.
	Error string
}

// Prober probes targets. Its zero value is ready to use.
type Prober struct {
	// Dial overrides how the proxy is reached; nil means a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// timeout is the probe's whole time budget.
func (t Target) timeout() time.Duration {
	if t.Timeout <= 0 {
		return 5 * time.Second
	}
	return t.Timeout
}

// dial reaches the proxy, checking the address dialed with t.Control.
func (p Prober) dial(t Target) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if p.Dial != nil {
		return p.Dial
	}
	d := &net.Dialer{}
	if t.Reach != nil {
		d.Control = t.Reach.Control
	}
	return d.DialContext
}

// sessions lets a probe resume the TLS session of an earlier probe of the
// same target, through whichever proxy: the session is the provider's with
// the target, end to end, and no proxy sees its keys. A resumed handshake
// skips verifying the target's certificate chain and signature, a third of
// each probe's handshake; the probe still dials the proxy, is let through
// and reaches the target anew. A target that refuses the ticket gets a
// full handshake, and Go resumes only while the session's chain still ends
// in a root of the probe's pool (TestProbesResumeTLS).
var sessions = tls.NewLRUClientSessionCache(128)

// probeCurves leave out the post-quantum hybrid key exchange Go offers by
// default, a quarter of each handshake's CPU: what a probe carries inside
// TLS is a GET of the target and the proxy's public egress address.
// Bringing up 10 000 proxies, TLS handshakes were a third of the
// provider's CPU (make scale). The NIST curves stay offered for a target
// that takes no X25519.
var probeCurves = []tls.CurveID{tls.X25519, tls.CurveP256, tls.CurveP384}

// Probe fetches t.URL through t.Proxy once. Each probe builds its own
// transport with keep-alives off, so every probe exercises the proxy
// handshake (and CONNECT) again rather than reusing a tunnel.
func (p Prober) Probe(ctx context.Context, t Target) Result {
	start := time.Now()
	res := p.probe(ctx, t)
	res.Latency = time.Since(start)
	if !res.OK && t.Password != "" {
		res.Error = strings.ReplaceAll(res.Error, t.Password, "<redacted>")
		res.Error = strings.ReplaceAll(res.Error, url.QueryEscape(t.Password), "<redacted>")
	}
	return res
}

func (p Prober) probe(ctx context.Context, t Target) Result {
	status, body, denied, err := p.fetch(ctx, t)
	if err != nil {
		return Result{Error: err.Error()}
	}
	want := t.ExpectedStatus
	if want == 0 {
		want = http.StatusOK
	}
	if status == http.StatusProxyAuthRequired {
		return Result{Error: fmt.Sprintf("proxy %s rejected the credentials (407 Proxy Authentication Required): check authSecretRef", t.Proxy)}
	}
	if status != want && status == http.StatusForbidden && denied {
		// Squid's own refusal of a plain request (its error page names
		// ERR_ACCESS_DENIED), not the target's answer.
		return Result{Error: fmt.Sprintf("proxy %s %s (403 Forbidden, %s): the provider's own address may be outside the proxy's allowed source ranges (add it to the ProviderConfig's spec.probe.sourceRanges), or the target is denied", t.Proxy, refusedMark, squidDenied)}
	}
	if status != want {
		return Result{Error: fmt.Sprintf("target answered %d through %s, want %d", status, t.Proxy, want)}
	}
	return Result{OK: true, EgressIP: EgressIP(body)}
}

// squidDenied is how Squid marks its own refusal of a request, in its
// X-Squid-Error header.
const squidDenied = "ERR_ACCESS_DENIED"

// fetch gets t.URL through t.Proxy and returns the answer's status, the
// start of its body, and whether the answer is Squid's own refusal. A
// CONNECT the proxy refuses comes back as an error.
func (p Prober) fetch(ctx context.Context, t Target) (int, []byte, bool, error) {
	timeout := t.timeout()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	proxyURL := &url.URL{Scheme: "http", Host: t.Proxy}
	if t.Username != "" {
		proxyURL.User = url.UserPassword(t.Username, t.Password)
	}
	// Whether the proxy was reached at all: a probe that times out before
	// its connection to the proxy is made was dropped on the way.
	var reached atomic.Bool
	dial := p.dial(t)
	tr := &http.Transport{
		Proxy: http.ProxyURL(proxyURL),
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			reached.Store(reached.Load() || err == nil)
			return c, err
		},
		DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: t.RootCAs, MinVersion: tls.VersionTLS12,
			ClientSessionCache: sessions, CurvePreferences: probeCurves},
		TLSHandshakeTimeout: timeout,
		// Probes must see the proxy's answer, not follow it elsewhere.
		MaxResponseHeaderBytes: 64 << 10,
	}
	defer tr.CloseIdleConnections()
	c := &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.URL, nil)
	if err != nil {
		return 0, nil, false, errors.Errorf("invalid probe URL: %v", err)
	}
	req.Header.Set("User-Agent", "egress-proxy-probe/1")
	resp, err := c.Do(req)
	if err != nil {
		if !reached.Load() && (errors.Is(err, context.DeadlineExceeded) || dialTimedOut(err)) {
			return 0, nil, false, errors.New(dropped(err, t.Proxy))
		}
		return 0, nil, false, errors.New(explain(err, t.Proxy))
	}
	defer resp.Body.Close() //nolint:errcheck // Read-only body.
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return 0, nil, false, errors.Errorf("reading the answer through %s: %v", t.Proxy, err)
	}
	return resp.StatusCode, body, strings.HasPrefix(resp.Header.Get("X-Squid-Error"), squidDenied), nil
}

// Closure is what a request without credentials got from a proxy.
type Closure string

// Closures.
const (
	// ClosureClosed means the proxy demanded credentials: 407.
	ClosureClosed Closure = "Closed"
	// ClosureOpen means the proxy served the request without credentials.
	ClosureOpen Closure = "Open"
	// ClosureUnknown means the check could not tell: the proxy or the
	// target could not be reached, or the proxy refused the request (403)
	// without asking for credentials, which shows nothing about requests
	// it might serve.
	ClosureUnknown Closure = "Unknown"
)

// Closed asks the proxy, without credentials, for a tunnel to the health
// URL's host and port: a proxy that has credentials must answer 407, and
// only that counts as closed. The answer to a CONNECT comes from the proxy
// itself, never from the target, so a target cannot fake it; and a proxy
// that opens the tunnel is open whatever happens inside it. It is the
// check that holds even where the provider did not write the proxy's
// configuration (a user's cloud-init). detail says what the proxy did.
func (p Prober) Closed(ctx context.Context, t Target) (Closure, string) {
	status, err := p.connect(ctx, t)
	switch {
	case err != nil:
		return ClosureUnknown, err.Error()
	case status == http.StatusProxyAuthRequired:
		return ClosureClosed, "the proxy demanded credentials"
	case status >= 200 && status < 300:
		return ClosureOpen, fmt.Sprintf("proxy %s opened a tunnel without credentials (%d)", t.Proxy, status)
	case status == http.StatusForbidden:
		return ClosureUnknown, "the proxy refused a request without credentials (403) instead of demanding them (407), so it is not shown to be closed"
	}
	return ClosureUnknown, fmt.Sprintf("the proxy answered a request without credentials with %d instead of demanding them (407), so it is not shown to be closed", status)
}

// connect sends CONNECT for t.URL's host and port to t.Proxy, without
// credentials, and returns the status of the proxy's answer.
func (p Prober) connect(ctx context.Context, t Target) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, t.timeout())
	defer cancel()
	u, err := url.Parse(t.URL)
	if err != nil || u.Hostname() == "" {
		return 0, errors.Errorf("invalid probe URL %q", t.URL)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	target := net.JoinHostPort(u.Hostname(), port)
	conn, err := p.dial(t)(ctx, "tcp", t.Proxy)
	if err != nil {
		return 0, errors.New(explain(err, t.Proxy))
	}
	defer conn.Close() //nolint:errcheck // Nothing was written through it.
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: target}, Host: target, Header: http.Header{"User-Agent": {"egress-proxy-probe/1"}}}
	if err := req.Write(conn); err != nil {
		return 0, errors.New(explain(err, t.Proxy))
	}
	resp, err := http.ReadResponse(bufio.NewReader(io.LimitReader(conn, 64<<10)), req)
	if err != nil {
		return 0, errors.New(explain(err, t.Proxy))
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// refusedMark is in the message of a probe the proxy's network or client
// ACL refused: the provider's own address is not let in.
const refusedMark = "refused the probe"

// Refused reports whether a probe's error says that the probe was refused
// at the network: its connection to the proxy timed out (a firewall
// dropping its packets), or the proxy answered 403 to its CONNECT (a
// client ACL, or a denied target port).
func Refused(msg string) bool { return strings.Contains(msg, refusedMark) }

// dialTimedOut reports whether err is, or wraps, a dial that timed out
// (the transport wraps it in a proxyconnect error of the same type).
func dialTimedOut(err error) bool {
	for e := err; e != nil; {
		var op *net.OpError
		if !errors.As(e, &op) {
			return false
		}
		if op.Op == "dial" && op.Timeout() {
			return true
		}
		e = op.Err
	}
	return false
}

// dropped is the message of a probe whose connection to the proxy timed
// out before it was made.
func dropped(err error, proxy string) string {
	return fmt.Sprintf("the network in front of proxy %s %s: the connection to it timed out (%v), as when a firewall drops the provider's packets; let the provider's own address in (the ProviderConfig's spec.probe.sourceRanges)", proxy, refusedMark, err)
}

// explain turns transport errors into messages that say what to check.
func explain(err error, proxy string) string {
	msg := err.Error()
	switch {
	case dialTimedOut(err):
		return dropped(err, proxy)
	case strings.Contains(msg, "Proxy Authentication Required"):
		return fmt.Sprintf("proxy %s rejected the credentials (407 Proxy Authentication Required): check authSecretRef", proxy)
	case strings.Contains(msg, "connection refused"):
		return fmt.Sprintf("proxy %s refused the connection: is it running and listening?", proxy)
	case strings.Contains(msg, "context deadline exceeded"), strings.Contains(msg, "Client.Timeout"):
		return fmt.Sprintf("probe through %s timed out: %v", proxy, err)
	case strings.Contains(msg, "Forbidden"):
		return fmt.Sprintf("proxy %s %s (403 Forbidden to its CONNECT): the provider's own address may be outside the proxy's allowed source ranges (add it to the ProviderConfig's spec.probe.sourceRanges), or the target port is denied", proxy, refusedMark)
	}
	return fmt.Sprintf("probe through %s failed: %v", proxy, err)
}

// EgressIP finds the caller address in a target's answer: a bare IP (as
// ifconfig.me/ip answers) or JSON with an "ip" or "origin" field (as
// ipify and httpbin do). It returns "" when there is none.
func EgressIP(body []byte) string {
	s := strings.TrimSpace(string(body))
	if ip := net.ParseIP(s); ip != nil {
		return ip.String()
	}
	var j map[string]any
	if json.Unmarshal(body, &j) == nil {
		for _, k := range []string{"ip", "origin"} {
			if v, ok := j[k].(string); ok {
				// httpbin's origin may list a chain; the first is the caller.
				first := strings.TrimSpace(strings.Split(v, ",")[0])
				if ip := net.ParseIP(first); ip != nil {
					return ip.String()
				}
			}
		}
	}
	return ""
}
