package gateway

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
)

// SOCKS5 (RFC 1928) with username and password (RFC 1929): the same
// username grammar and tokens as the HTTP gateway, CONNECT only (no BIND,
// no UDP ASSOCIATE). Each connection is chained to the chosen Squid over
// HTTP CONNECT, as a tunnel of the HTTP gateway is, with the same
// rotation, sessions, bounds, quotas and bans; refusals get the
// protocol's reply codes and a log line with the reason.

// SOCKS5 reply codes (RFC 1928, section 6).
const (
	socksSucceeded           = 0x00
	socksGeneralFailure      = 0x01
	socksNotAllowed          = 0x02
	socksHostUnreachable     = 0x04
	socksCommandNotSupported = 0x07
	socksAddressNotSupported = 0x08
)

// socksHandshakeTimeout bounds the negotiation, the sign-in and the
// request: a client that sends nothing holds no connection for long.
const socksHandshakeTimeout = 10 * time.Second

// ServeSOCKS5 serves SOCKS5 on l until ctx ends (l is then closed).
func (gw *Gateway[S]) ServeSOCKS5(ctx context.Context, l net.Listener) error {
	go func() {
		<-ctx.Done()
		_ = l.Close()
	}()
	// Handshakes in progress are bounded before anyone signs in: past
	// the bound a new connection is closed at once.
	handshakes := make(chan struct{}, maxSOCKSHandshakes)
	backoff := time.Duration(0)
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of file descriptors, say: the listener stays, as
			// net/http's does, and tries again after a pause.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			gw.Server.Allocator().Log.Debug("Cannot accept a SOCKS5 connection", "error", err, "retry", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		select {
		case handshakes <- struct{}{}:
			go gw.socks(ctx, c, func() { <-handshakes })
		default:
			gw.Metrics.SOCKSRefusals.WithLabelValues("busy").Inc()
			_ = c.Close()
		}
	}
}

// socksRefusal is a SOCKS5 refusal: its reply code and why.
type socksRefusal struct {
	reply byte
	err   error
}

// maxSOCKSHandshakes bounds the SOCKS5 connections signing in at once.
const maxSOCKSHandshakes = 1024

// socks serves one SOCKS5 connection; shaken is called once its
// handshake is over.
func (gw *Gateway[S]) socks(ctx context.Context, c net.Conn, shaken func()) {
	defer c.Close() //nolint:errcheck // Closing a tunnel.
	once := sync.OnceFunc(shaken)
	defer once()
	_ = c.SetDeadline(time.Now().Add(socksHandshakeTimeout))
	br := bufio.NewReader(c)
	id, user, err := gw.socksSignIn(ctx, c, br)
	if err != nil {
		// Anyone who reaches the port can fail to sign in: counted, and
		// logged at debug level only.
		gw.Metrics.SOCKSRefusals.WithLabelValues("auth").Inc()
		gw.Server.Allocator().Log.Debug("Refusing a SOCKS5 client", "client", c.RemoteAddr().String(), "reason", err.Error())
		return
	}
	target, domain, ref := socksRequest(br)
	if ref == nil {
		// The handshake is done: what follows (a wait for a slot, for a
		// paced IP, the dial) has its own bounds.
		_ = c.SetDeadline(time.Time{})
		once()
		ref = gw.socksConnect(ctx, c, br, id, user, target, domain)
	}
	if ref != nil {
		gw.Metrics.SOCKSRefusals.WithLabelValues(strconv.Itoa(int(ref.reply))).Inc()
		gw.Server.Allocator().Log.Info("Refusing a SOCKS5 request", "client", c.RemoteAddr().String(), "user", id.User, "target", target, "reply", ref.reply, "reason", ref.err.Error())
		_, _ = c.Write(socksReply(ref.reply))
	}
}

// socksSignIn negotiates username and password authentication and signs
// the caller in as the HTTP gateway does; a refused caller is told so.
func (gw *Gateway[S]) socksSignIn(ctx context.Context, c net.Conn, br *bufio.Reader) (*auth.Identity, User, error) {
	head := make([]byte, 2)
	if _, err := io.ReadFull(br, head); err != nil || head[0] != 5 {
		return nil, User{}, errors.New("not a SOCKS5 greeting")
	}
	methods := make([]byte, head[1])
	if _, err := io.ReadFull(br, methods); err != nil {
		return nil, User{}, errors.New("a SOCKS5 greeting cut short")
	}
	if !strings.ContainsRune(string(methods), 2) {
		_, _ = c.Write([]byte{5, 0xff})
		return nil, User{}, errors.New("the client offers no username and password authentication (RFC 1929), which the gateway requires")
	}
	if _, err := c.Write([]byte{5, 2}); err != nil {
		return nil, User{}, err
	}
	// RFC 1929: VER 1, ULEN, UNAME, PLEN, PASSWD.
	name, token, err := readUserPass(br)
	if err != nil {
		_, _ = c.Write([]byte{1, 1})
		return nil, User{}, err
	}
	id, user, err := gw.signIn(ctx, c.RemoteAddr().String(), name, token)
	if err != nil {
		_, _ = c.Write([]byte{1, 1})
		return nil, User{}, errors.Wrapf(err, "user %q", name)
	}
	if _, err := c.Write([]byte{1, 0}); err != nil {
		return nil, User{}, err
	}
	return id, user, nil
}

// readUserPass reads an RFC 1929 username and password.
func readUserPass(br *bufio.Reader) (string, string, error) {
	ver, err := br.ReadByte()
	if err != nil || ver != 1 {
		return "", "", errors.New("not an RFC 1929 username and password")
	}
	var out [2]string
	for i := range out {
		n, err := br.ReadByte()
		if err != nil {
			return "", "", errors.New("RFC 1929 authentication cut short")
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(br, b); err != nil {
			return "", "", errors.New("RFC 1929 authentication cut short")
		}
		out[i] = string(b)
	}
	if out[1] == "" {
		return "", "", errors.New("no password: give a discovery token as the password")
	}
	return out[0], out[1], nil
}

// socksRequest reads a SOCKS5 request: CONNECT to an IPv4 or IPv6
// address or a domain name, which the ban rules are kept for.
func socksRequest(br *bufio.Reader) (target, domain string, ref *socksRefusal) {
	head := make([]byte, 4)
	if _, err := io.ReadFull(br, head); err != nil || head[0] != 5 {
		return "", "", &socksRefusal{socksGeneralFailure, errors.New("not a SOCKS5 request")}
	}
	var host string
	switch head[3] {
	case 1, 4:
		ip := make([]byte, map[byte]int{1: 4, 4: 16}[head[3]])
		if _, err := io.ReadFull(br, ip); err != nil {
			return "", "", &socksRefusal{socksGeneralFailure, errors.New("a SOCKS5 request cut short")}
		}
		host = net.IP(ip).String()
	case 3:
		n, err := br.ReadByte()
		if err != nil || n == 0 {
			return "", "", &socksRefusal{socksGeneralFailure, errors.New("a SOCKS5 request with no host name")}
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(br, b); err != nil {
			return "", "", &socksRefusal{socksGeneralFailure, errors.New("a SOCKS5 request cut short")}
		}
		host = string(b)
		if !validHost(host) {
			return "", "", &socksRefusal{socksAddressNotSupported, errors.Errorf("%.64q is not a host name", host)}
		}
	default:
		return "", "", &socksRefusal{socksAddressNotSupported, errors.Errorf("address type %d", head[3])}
	}
	port := make([]byte, 2)
	if _, err := io.ReadFull(br, port); err != nil {
		return "", "", &socksRefusal{socksGeneralFailure, errors.New("a SOCKS5 request cut short")}
	}
	if head[1] != 1 {
		return "", "", &socksRefusal{socksCommandNotSupported, errors.Errorf("command %d: the gateway serves CONNECT only, no BIND or UDP ASSOCIATE", head[1])}
	}
	target = net.JoinHostPort(host, strconv.Itoa(int(binary.BigEndian.Uint16(port))))
	return target, strings.TrimSuffix(strings.ToLower(host), "."), nil
}

// socksConnect chooses the caller's upstream, opens the tunnel through
// it, answers success and splices both ways.
func (gw *Gateway[S]) socksConnect(ctx context.Context, c net.Conn, br *bufio.Reader, id *auth.Identity, u User, target, domain string) *socksRefusal {
	leave, err := gw.admit(id, u.Namespace)
	if err != nil {
		return &socksRefusal{socksReplyOf(err), err}
	}
	defer leave()
	up, done, moved, err := gw.choose(ctx, id, u, domain, nil)
	if err != nil {
		gw.Server.Allocator().Metrics.Denials.WithLabelValues(problem.ReasonOf(err)).Inc()
		return &socksRefusal{socksReplyOf(err), err}
	}
	conn, up, done, _, err := gw.open(ctx, id, u, target, domain, up, done, moved)
	if err != nil {
		return &socksRefusal{socksReplyOf(err), err}
	}
	defer done()
	defer conn.Close() //nolint:errcheck // Closing a tunnel.
	fleet := u.Namespace + "/" + u.Fleet
	gw.Server.Allocator().RecordSpread(fleet, up.g.Member.Name, gw.Server.Allocator().Time())
	gw.Metrics.Connections.WithLabelValues(fleet).Inc()
	gw.Metrics.ConnectionsTotal.WithLabelValues(fleet).Inc()
	defer gw.Metrics.Connections.WithLabelValues(fleet).Dec()
	if _, err := c.Write(socksReply(socksSucceeded)); err != nil {
		return nil
	}
	// Bytes the client sent after its request, already buffered.
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		if _, err := conn.Write(b); err != nil {
			return nil
		}
		gw.Metrics.Bytes.WithLabelValues("up").Add(float64(n))
	}
	gw.Server.Allocator().Log.Debug("SOCKS5 tunnel", "user", id.User, "target", target, "proxy", up.g.Member.Name)
	splice(c, conn, gw.TunnelIdle, gw.Metrics)
	return nil
}

// socksReplyOf is the reply code for a refusal: one of policy (a quota,
// a bound, a ban, the upstream's destination policy) is "not allowed";
// a target that cannot be reached "host unreachable"; the rest (no free
// slot, too few healthy proxies) a general failure.
func socksReplyOf(err error) byte {
	var ge *gwError
	code := 0
	if errors.As(err, &ge) {
		code = ge.code
	} else {
		code = problem.ToAPIError(err).Code
	}
	switch code {
	case http.StatusForbidden, http.StatusTooManyRequests, http.StatusUnauthorized, http.StatusProxyAuthRequired:
		return socksNotAllowed
	case http.StatusBadGateway, http.StatusGatewayTimeout:
		if ge != nil && ge.reason == reasonUpstreamRefused {
			return socksHostUnreachable
		}
		return socksGeneralFailure
	default:
		return socksGeneralFailure
	}
}

// socksReply is a reply with a zero bound address (IPv4 0.0.0.0:0): the
// tunnel's far end is the chosen proxy's, which the client has no use
// for.
func socksReply(code byte) []byte {
	return []byte{5, code, 0, 1, 0, 0, 0, 0, 0, 0}
}
