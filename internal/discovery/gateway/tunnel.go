package gateway

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"strings"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/reach"
)

// tunnel serves CONNECT: it opens a tunnel through the upstream (retried
// once on another proxy when the upstream fails before any byte reached
// the crawler), answers 200, and splices both ways.
func (gw *Gateway[S]) tunnel(w http.ResponseWriter, r *http.Request, id *auth.Identity, u User, target, domain string, up *upstream, done func(), moved string) {
	conn, up, done, moved, err := gw.open(r.Context(), id, u, target, domain, up, done, moved)
	if err != nil {
		gw.refuse(w, err)
		return
	}
	gw.Server.Allocator().RecordSpread(u.Namespace+"/"+u.Fleet, up.g.Member.Name, gw.Server.Allocator().Time())
	defer done()
	defer conn.Close() //nolint:errcheck // Closing a tunnel.
	hj, ok := w.(http.Hijacker)
	if !ok {
		gw.refuse(w, &gwError{code: http.StatusHTTPVersionNotSupported, reason: apiv1.ReasonInvalid, msg: "CONNECT needs HTTP/1.1"})
		return
	}
	client, rw, err := hj.Hijack()
	if err != nil {
		return
	}
	defer client.Close() //nolint:errcheck // Closing a tunnel.
	_ = client.SetDeadline(time.Time{})
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n"+egressHeaders(up, moved)+"\r\n"); err != nil {
		return
	}
	// Bytes the crawler sent after its CONNECT, already buffered.
	if n := rw.Reader.Buffered(); n > 0 {
		b, _ := rw.Peek(n)
		if _, err := conn.Write(b); err != nil {
			return
		}
		gw.Metrics.Bytes.WithLabelValues("up").Add(float64(n))
	}
	splice(client, conn, gw.TunnelIdle, gw.Metrics)
}

// open connects a tunnel to target through up, tried once more on another
// proxy when up failed before the target was reached (a session moves
// with it): the connection, the upstream and done that carry it, and the
// proxy a session left (moved). On an error done has been called.
func (gw *Gateway[S]) open(ctx context.Context, id *auth.Identity, u User, target, domain string, up *upstream, done func(), moved string) (net.Conn, *upstream, func(), string, error) {
	conn, err := gw.connect(ctx, up, target)
	if err != nil && retriable(err) && (!u.Strict || upstreamFailed(err)) {
		// A strict session moves for nothing: its proxy failing ends it
		// (choose answers SessionProxyGone), the target failing is the
		// target's answer.
		failed := up.g.Member.Name
		if upstreamFailed(err) {
			gw.abandon(up)
		}
		done()
		first := err
		var left string
		up, done, left, err = gw.choose(ctx, id, u, domain, map[string]bool{failed: true})
		if left != "" {
			moved = left
		}
		if err != nil {
			return nil, nil, nil, "", rather(first, err)
		}
		if conn, err = gw.connect(ctx, up, target); err != nil {
			done()
			return nil, nil, nil, "", err
		}
	} else if err != nil {
		done()
		return nil, nil, nil, "", err
	}
	return conn, up, done, moved, nil
}

// connect opens a CONNECT tunnel to target through the upstream, with its
// credentials.
func (gw *Gateway[S]) connect(ctx context.Context, up *upstream, target string) (net.Conn, error) {
	conn, err := gw.reach(up).Dial(ctx, "tcp", up.url.Load().Host, gw.DialTimeout)
	if errors.Is(err, reach.ErrRefused) {
		return nil, gw.refusedAddress(up, err)
	}
	if err != nil {
		gw.Metrics.UpstreamErrors.WithLabelValues("dial").Inc()
		return nil, &gwError{code: http.StatusBadGateway, reason: reasonUpstreamUnavailable, msg: fmt.Sprintf("upstream proxy %s does not answer", up.g.Member.Name), dial: true}
	}
	_ = conn.SetDeadline(time.Now().Add(gw.DialTimeout))
	u := up.url.Load()
	pass, _ := u.User.Password()
	auth := base64.StdEncoding.EncodeToString([]byte(u.User.Username() + ":" + pass))
	if _, err := fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", target, target, auth); err != nil {
		_ = conn.Close()
		gw.Metrics.UpstreamErrors.WithLabelValues("handshake").Inc()
		return nil, &gwError{code: http.StatusBadGateway, reason: reasonUpstreamUnavailable, msg: fmt.Sprintf("upstream proxy %s broke off the CONNECT handshake", up.g.Member.Name)}
	}
	br := bufio.NewReader(conn)
	rsp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		_ = conn.Close()
		gw.Metrics.UpstreamErrors.WithLabelValues("handshake").Inc()
		return nil, &gwError{code: http.StatusBadGateway, reason: reasonUpstreamUnavailable, msg: fmt.Sprintf("upstream proxy %s broke off the CONNECT handshake", up.g.Member.Name)}
	}
	_ = rsp.Body.Close()
	if rsp.StatusCode != http.StatusOK {
		_ = conn.Close()
		gw.Metrics.UpstreamErrors.WithLabelValues("status").Inc()
		code := http.StatusBadGateway
		if rsp.StatusCode == http.StatusForbidden {
			// The upstream's destination policy refused the target.
			code = http.StatusForbidden
		}
		return nil, &gwError{code: code, reason: reasonUpstreamRefused, msg: fmt.Sprintf("upstream proxy %s answered %s to CONNECT %s", up.g.Member.Name, rsp.Status, target)}
	}
	_ = conn.SetDeadline(time.Time{})
	if br.Buffered() > 0 {
		return &bufferedConn{Conn: conn, r: br}, nil
	}
	return conn, nil
}

// refusedAddress is the refusal of an upstream published at an address its
// kind does not justify (an External proxy pointed at the metadata server
// or an internal service): never dialed, and logged for the platform.
func (gw *Gateway[S]) refusedAddress(up *upstream, err error) *gwError {
	gw.Metrics.UpstreamErrors.WithLabelValues("address").Inc()
	gw.Server.Allocator().Log.Info("Refusing to dial a proxy at an address its kind does not justify", "proxy", up.g.Member.Namespace+"/"+up.g.Member.Name, "error", err)
	return &gwError{code: http.StatusBadGateway, reason: reasonUpstreamAddressRefused, dial: true,
		msg: fmt.Sprintf("upstream proxy %s is published at an address the gateway does not dial for its kind (link-local or metadata, loopback, or private where its tenant chose it); the gateway's log names it", up.g.Member.Name)}
}

// bufferedConn reads what the handshake's reader buffered first.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the connection beneath, as splice expects.
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// setEgressHeaders names, on a plain answer, the proxy and egress IP it
// came through, and the proxy a loose session left for it.
func setEgressHeaders(h http.Header, up *upstream, moved string) {
	h.Set("X-Egress-Proxy", up.g.Member.Name)
	if up.g.Member.EgressIP != "" {
		h.Set("X-Egress-IP", up.g.Member.EgressIP)
	}
	if moved != "" {
		h.Set("X-Egress-Session-Moved", moved)
	}
}

// egressHeaders are the CONNECT answer's headers that name the proxy and
// egress IP a tunnel leaves through, and the proxy a loose session left
// for it; each line ends with CRLF.
func egressHeaders(up *upstream, moved string) string {
	h := "X-Egress-Proxy: " + up.g.Member.Name + "\r\n"
	// Written raw: only an address, never what a status could smuggle in.
	if ip, err := netip.ParseAddr(up.g.Member.EgressIP); err == nil && ip.Zone() == "" {
		h += "X-Egress-IP: " + ip.String() + "\r\n"
	}
	if moved != "" {
		h += "X-Egress-Session-Moved: " + moved + "\r\n"
	}
	return h
}

// splice copies both ways between the raw connections (TCP to TCP, the
// kernel's splice(2) moves the bytes), half-closing each direction as it
// ends. A tunnel that moves no data either way for idle is closed, one
// whose reader stopped reading too; any data either way starts the wait
// again, so a long download with a silent upload, or a slow event stream,
// stays open. What moved is read from the kernel's own account of each
// socket (TCP_INFO), which costs the copy nothing.
func splice(a, b net.Conn, idle time.Duration, m *metrics.Gateway) {
	done := make(chan struct{})
	go watchIdle(a, b, idle, done, m)
	var wg sync.WaitGroup
	cp := func(dst, src net.Conn, dir string) {
		defer wg.Done()
		n, _ := io.Copy(dst, src)
		m.Bytes.WithLabelValues(dir).Add(float64(n))
		if c, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = c.CloseWrite()
		} else {
			_ = dst.Close()
		}
	}
	wg.Add(2)
	go cp(b, a, "up")
	go cp(a, b, "down")
	wg.Wait()
	close(done)
}

// watchIdle closes a and b once neither has moved data for idle, until
// done; it judges by the connections whose socket can say (TCP), and
// closes nothing when neither can.
func watchIdle(a, b net.Conn, idle time.Duration, done <-chan struct{}, m *metrics.Gateway) {
	every := min(max(idle/4, 10*time.Millisecond), 15*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		quiet, known := time.Duration(1<<63-1), false
		for _, c := range []net.Conn{a, b} {
			if q, ok := quietFor(c); ok {
				quiet, known = min(quiet, q), true
			}
		}
		if known && quiet >= idle {
			m.IdleTunnels.Inc()
			_ = a.Close()
			_ = b.Close()
			return
		}
	}
}

// hopHeaders are not forwarded (RFC 9110 7.6.1), nor the gateway's own
// Proxy-Authorization.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// dropHopHeaders removes the hop-by-hop headers, and those the
// Connection header names (RFC 9110 7.6.1).
func dropHopHeaders(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			if name = textproto.TrimString(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// forward serves a plain HTTP request through the upstream's absolute-URI
// mode (retried once on another proxy when the upstream cannot be
// reached), and names the proxy in X-Egress-Proxy and X-Egress-IP.
func (gw *Gateway[S]) forward(w http.ResponseWriter, r *http.Request, id *auth.Identity, u User, domain string, up *upstream, done func(), moved string) {
	out := r.Clone(r.Context())
	out.RequestURI = ""
	dropHopHeaders(out.Header)
	if r.Body != nil && r.ContentLength == 0 {
		out.Body = nil
	}
	send := func(up *upstream) (*http.Response, error) {
		ctx := context.WithValue(context.WithValue(r.Context(), upstreamKey{}, up.url.Load()), reachKey{}, gw.reach(up))
		rsp, err := gw.transport.RoundTrip(out.WithContext(ctx))
		if errors.Is(err, reach.ErrRefused) {
			return nil, gw.refusedAddress(up, err)
		}
		if err != nil {
			gw.Metrics.UpstreamErrors.WithLabelValues("dial").Inc()
		}
		return rsp, err
	}
	name := up.g.Member.Name
	rsp, err := send(up)
	// Retried only when the upstream could not be reached: the request
	// never left, so no origin sees it twice; and only without a body,
	// which the first try has consumed.
	if err != nil && (unreached(err) || upstreamFailed(err)) && out.Body == nil {
		var op *net.OpError
		if (errors.As(err, &op) && op.Op == "dial") || upstreamFailed(err) {
			gw.abandon(up)
		}
		done()
		first := err
		var left string
		up, done, left, err = gw.choose(r.Context(), id, u, domain, map[string]bool{name: true})
		if left != "" {
			moved = left
		}
		if err != nil {
			gw.refuse(w, rather(first, err))
			return
		}
		name = up.g.Member.Name
		rsp, err = send(up)
	}
	defer done()
	var ge *gwError
	if errors.As(err, &ge) {
		gw.refuse(w, ge)
		return
	}
	if err != nil {
		gw.refuse(w, &gwError{code: http.StatusBadGateway, reason: reasonUpstreamUnavailable, msg: fmt.Sprintf("upstream proxy %s did not answer", name)})
		return
	}
	if rsp.StatusCode == http.StatusProxyAuthRequired {
		// The fleet's credentials, not the crawler's, were refused.
		_ = rsp.Body.Close()
		gw.Metrics.UpstreamErrors.WithLabelValues("status").Inc()
		gw.refuse(w, &gwError{code: http.StatusBadGateway, reason: reasonUpstreamRefused, msg: fmt.Sprintf("upstream proxy %s refused the fleet's credentials", name)})
		return
	}
	defer rsp.Body.Close() //nolint:errcheck // A response body.
	gw.banOnStatus(r.Context(), id, u, domain, up, rsp)
	gw.Server.Allocator().RecordSpread(u.Namespace+"/"+u.Fleet, up.g.Member.Name, gw.Server.Allocator().Time())
	dropHopHeaders(rsp.Header)
	for k, vs := range rsp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	setEgressHeaders(w.Header(), up, moved)
	w.WriteHeader(rsp.StatusCode)
	// Each read is passed on at once: a stream (server-sent events, a
	// long poll) reaches the crawler as the origin sends it.
	n, _ := io.Copy(flushWriter{w: w, rc: http.NewResponseController(w)}, rsp.Body)
	gw.Metrics.Bytes.WithLabelValues("down").Add(float64(n))
}

// flushWriter flushes after every write.
type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}
