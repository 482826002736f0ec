package testbed

import (
	"bufio"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
)

// ConnectProxies are minimal in-process forward proxies.
type ConnectProxies struct {
	// Addrs are their host:port addresses.
	Addrs []string
	holes []atomic.Bool
	conns []atomic.Int64
}

// Connections is how many connections proxy i has accepted.
func (c *ConnectProxies) Connections(i int) int64 { return c.conns[i].Load() }

// BlackHole makes proxy i accept connections and never answer on them
// (on), as a proxy behind a broken network path does, or serve again.
func (c *ConnectProxies) BlackHole(i int, on bool) { c.holes[i].Store(on) }

// StartConnectProxies starts n minimal in-process forward proxies that
// accept CONNECT with basic auth, for scale tests where n real Squids would
// not fit on the machine. They stop with the test.
func StartConnectProxies(t testing.TB, n int, username, password string) *ConnectProxies {
	t.Helper()
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte(username+":"+password))
	cp := &ConnectProxies{holes: make([]atomic.Bool, n), conns: make([]atomic.Int64, n)}
	addrs := make([]string, 0, n)
	listeners := make([]net.Listener, 0, n)
	var wg sync.WaitGroup
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, l.Addr().String())
		listeners = append(listeners, l)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				cp.conns[i].Add(1)
				if cp.holes[i].Load() {
					go swallow(c)
					continue
				}
				go serveConnect(c, want)
			}
		}()
	}
	t.Cleanup(func() {
		for _, l := range listeners {
			_ = l.Close()
		}
		wg.Wait()
	})
	cp.Addrs = addrs
	return cp
}

// swallow reads what the client sends and never answers, until the client
// gives up and closes.
func swallow(c net.Conn) {
	defer c.Close() //nolint:errcheck // Best effort.
	_, _ = io.Copy(io.Discard, c)
}

func serveConnect(c net.Conn, wantAuth string) {
	defer c.Close() //nolint:errcheck // Best effort.
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	if req.Header.Get("Proxy-Authorization") != wantAuth {
		_, _ = io.WriteString(c, "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"test\"\r\nContent-Length: 0\r\n\r\n")
		return
	}
	if req.Method != http.MethodConnect {
		_, _ = io.WriteString(c, "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
		return
	}
	up, err := net.Dial("tcp", req.Host)
	if err != nil {
		_, _ = io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
		return
	}
	defer up.Close() //nolint:errcheck // Best effort.
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, br); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}
