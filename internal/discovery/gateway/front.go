package gateway

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
)

// Reasons of the gateway's own refusals.
const (
	reasonUpstreamUnavailable = "UpstreamUnavailable"
	reasonUpstreamRefused     = "UpstreamRefused"
	reasonShuttingDown        = "ShuttingDown"
	// reasonSessionProxyGone: a strict session's proxy serves it no more.
	reasonSessionProxyGone = "SessionProxyGone"
	// reasonUpstreamAddressRefused: the proxy is published at an address
	// its kind does not justify.
	reasonUpstreamAddressRefused = "UpstreamAddressRefused"
)

// gwError is a refusal of the gateway: a status, a reason and words, and
// for 407 the challenge.
type gwError struct {
	code       int
	reason     string
	msg        string
	retryAfter int
	// dial marks an upstream that could not be reached, which another
	// proxy may serve.
	dial bool
}

// ProblemReason is the reason code the gateway's refusal is counted by
// (problem.ReasonOf).
func (e *gwError) ProblemReason() string { return e.reason }

// retriable reports whether a failed CONNECT may be tried on another
// proxy: the upstream was not reached, or answered other than 403 (its
// destination policy, the same on every proxy).
func retriable(err error) bool {
	var ge *gwError
	return errors.As(err, &ge) && (ge.dial || ge.reason == reasonUpstreamUnavailable || ge.code == http.StatusBadGateway)
}

// upstreamFailed reports whether the upstream itself failed (not
// reached, or broke off its handshake), rather than answering about the
// target: only then is it retired.
func upstreamFailed(err error) bool {
	var ge *gwError
	return errors.As(err, &ge) && (ge.dial || ge.reason == reasonUpstreamUnavailable)
}

// rather is the refusal to answer when a connection's first upstream
// failed with first and no other could be chosen (retry): the first, when
// it says the upstream is published where the gateway does not dial,
// which is what the caller (or the platform) must fix.
func rather(first, retry error) error {
	var ge *gwError
	if errors.As(first, &ge) && ge.reason == reasonUpstreamAddressRefused {
		return first
	}
	return retry
}

// unreached reports whether a plain request failed before reaching the
// upstream: dialling it, or its CONNECT for the transport.
func unreached(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && (op.Op == "dial" || op.Op == "proxyconnect")
}

func (e *gwError) Error() string { return e.msg }

func proxyAuthRequired(msg string) *gwError {
	return &gwError{code: http.StatusProxyAuthRequired, reason: apiv1.ReasonUnauthenticated, msg: msg}
}

// refuse answers a refusal, with Proxy-Status (RFC 9209) naming the
// gateway and the error.
func (gw *Gateway[S]) refuse(w http.ResponseWriter, err error) {
	var ge *gwError
	if !errors.As(err, &ge) {
		ae := problem.ToAPIError(err)
		ge = &gwError{code: ae.Code, reason: ae.Reason, msg: ae.Msg, retryAfter: ae.RetryAfter}
		switch {
		case ae.Code == http.StatusUnauthorized:
			ge.code = http.StatusProxyAuthRequired
		case ae.Reason == apiv1.ReasonNoFreeSlot || ae.Reason == apiv1.ReasonTooFewHealthy:
			// A proxy client knows 503 with Retry-After, not the API's 409.
			ge.code = http.StatusServiceUnavailable
		}
	}
	if ge.code == http.StatusProxyAuthRequired {
		w.Header().Set("Proxy-Authenticate", `Basic realm="egress-discovery gateway"`)
	}
	if ge.retryAfter > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(ge.retryAfter))
	}
	w.Header().Set("Proxy-Status", fmt.Sprintf("egress-discovery; error=%s; details=%q", proxyStatusError(ge.code), ge.reason))
	problem.WriteJSON(w, ge.code, apiv1.Error{Error: apiv1.ErrorDetail{Code: ge.code, Reason: ge.reason, Message: ge.msg}})
}

// proxyStatusError is RFC 9209's error type for a refusal.
func proxyStatusError(code int) string {
	switch code {
	case http.StatusProxyAuthRequired, http.StatusForbidden:
		return "http_request_denied"
	case http.StatusBadGateway:
		return "proxy_internal_response"
	case http.StatusGatewayTimeout:
		return "connection_timeout"
	case http.StatusBadRequest:
		return "http_request_error"
	default:
		return "proxy_internal_error"
	}
}

// ServeHTTP serves CONNECT and absolute-URI requests.
func (gw *Gateway[S]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	caller, user, err := gw.authenticate(r)
	if err != nil {
		gw.refuse(w, err)
		return
	}
	target, domain, err := destination(r)
	if err != nil {
		gw.refuse(w, err)
		return
	}
	leave, err := gw.admit(caller, user.Namespace)
	if err != nil {
		gw.refuse(w, err)
		return
	}
	defer leave()
	fleet := user.Namespace + "/" + user.Fleet
	up, done, moved, err := gw.choose(r.Context(), caller, user, domain, nil)
	if err != nil {
		gw.Server.Allocator().Metrics.Denials.WithLabelValues(problem.ReasonOf(err)).Inc()
		gw.refuse(w, err)
		return
	}
	gw.Metrics.ChooseLatency.Observe(time.Since(start).Seconds())
	gw.Metrics.Connections.WithLabelValues(fleet).Inc()
	gw.Metrics.ConnectionsTotal.WithLabelValues(fleet).Inc()
	defer gw.Metrics.Connections.WithLabelValues(fleet).Dec()
	if r.Method == http.MethodConnect {
		gw.tunnel(w, r, caller, user, target, domain, up, done, moved)
		return
	}
	gw.forward(w, r, caller, user, domain, up, done, moved)
}

// authenticate reads Proxy-Authorization: Basic, the username in the
// gateway's grammar and the password a bearer token, and authorises the
// caller's use of the fleet.
func (gw *Gateway[S]) authenticate(r *http.Request) (*auth.Identity, User, error) {
	h := r.Header.Get("Proxy-Authorization")
	scheme, enc, _ := strings.Cut(strings.TrimSpace(h), " ")
	if !strings.EqualFold(scheme, "Basic") {
		return nil, User{}, proxyAuthRequired("the gateway needs Proxy-Authorization: Basic, with <namespace>_<fleet>[_session_<key>][_zone_<zone>] as the username and a discovery token as the password")
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return nil, User{}, proxyAuthRequired("Proxy-Authorization is not valid base64")
	}
	name, token, ok := strings.Cut(string(b), ":")
	if !ok || token == "" {
		return nil, User{}, proxyAuthRequired("Proxy-Authorization has no password: give a discovery token as the password")
	}
	return gw.signIn(r.Context(), r.RemoteAddr, name, token)
}

// signIn authenticates a gateway caller, HTTP's or SOCKS5's, by its
// username (the grammar) and its password (a discovery token), bounds its
// rate and authorises its use of the fleet.
func (gw *Gateway[S]) signIn(ctx context.Context, remote, name, token string) (*auth.Identity, User, error) {
	user, err := ParseUser(name)
	if err != nil {
		return nil, User{}, &gwError{code: http.StatusProxyAuthRequired, reason: apiv1.ReasonInvalid, msg: err.Error()}
	}
	ctx = auth.WithClientAddress(ctx, remote)
	id, err := gw.Server.Authenticator().AuthenticateToken(ctx, token)
	if err != nil {
		return nil, User{}, err
	}
	if err := gw.Server.IdentityLimits().Check(id, gw.Server.Allocator().Time()); err != nil {
		return nil, User{}, err
	}
	if err := gw.Server.Allocator().AuthorizeFleet(ctx, id, user.Namespace, user.Fleet); err != nil {
		return nil, User{}, err
	}
	return id, user, nil
}

// destination is where a request goes (host:port) and the domain bans are
// kept for.
func destination(r *http.Request) (string, string, error) {
	var host string
	switch {
	case r.Method == http.MethodConnect:
		host = r.Host
	case r.URL.IsAbs() && (r.URL.Scheme == "http" || r.URL.Scheme == "https"):
		host = r.URL.Host
	default:
		return "", "", &gwError{code: http.StatusBadRequest, reason: apiv1.ReasonInvalid,
			msg: "the gateway is a forward proxy: send CONNECT host:port, or a request with an absolute http:// URL"}
	}
	h, port, err := net.SplitHostPort(host)
	if err != nil {
		h, port = host, "80"
		if r.URL.Scheme == "https" {
			port = "443"
		}
	}
	if h == "" || port == "" {
		return "", "", &gwError{code: http.StatusBadRequest, reason: apiv1.ReasonInvalid, msg: fmt.Sprintf("no host in %q", host)}
	}
	if !validHost(h) {
		return "", "", &gwError{code: http.StatusBadRequest, reason: apiv1.ReasonInvalid, msg: fmt.Sprintf("%.64q is not a host name or address", h)}
	}
	// A ban on example.com holds for example.com. too.
	return net.JoinHostPort(h, port), strings.TrimSuffix(strings.ToLower(strings.Trim(h, "[]")), "."), nil
}

// validHost says whether h (a CONNECT's or SOCKS5 request's host, IPv6
// brackets off) may be dialed and key bans and the rotation's memory: a
// host name of at most 253 characters, or an address without a zone; no
// spaces, separators or control bytes.
func validHost(h string) bool {
	if h == "" || len(h) > 253 || strings.ContainsAny(h, "/@\\%") {
		return false
	}
	for _, r := range h {
		if r <= ' ' || r == 0x7f {
			return false
		}
	}
	return true
}

// choose gives a connection its upstream: the session's (moved off a
// proxy banned for domain, excluded, of another zone, or no longer
// serving, unless the session is strict; and started again on another
// proxy once its lifetime is over), or for a connection without a session
// a seat. done ends the connection's use of it; moved names the proxy a
// loose session just left.
func (gw *Gateway[S]) choose(ctx context.Context, id *auth.Identity, u User, domain string, exclude map[string]bool) (up *upstream, done func(), moved string, err error) {
	gw.mu.Lock()
	closed := gw.closed
	gw.mu.Unlock()
	if closed {
		return nil, nil, "", &gwError{code: http.StatusServiceUnavailable, reason: reasonShuttingDown, retryAfter: 1, msg: "this gateway replica is shutting down; retry"}
	}
	if u.Session == "" {
		up, done, err := gw.seat(ctx, id, u, domain, exclude)
		return up, done, "", err
	}
	if u.Lifetime > 0 {
		_, maxTTL, err := gw.Server.Allocator().Catalog.TTLs(ctx, u.Namespace, u.Fleet)
		if err != nil {
			return nil, nil, "", err
		}
		if u.Lifetime > maxTTL {
			return nil, nil, "", &gwError{code: http.StatusProxyAuthRequired, reason: apiv1.ReasonInvalid,
				msg: fmt.Sprintf("username: lifetime_%s is longer than the fleet's spec.leases.maxTTL (%s)", u.Lifetime, maxTTL)}
		}
	}
	return gw.session(ctx, id, u, domain, exclude)
}
