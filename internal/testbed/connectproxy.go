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
				go serveConnect(c, want, nil)
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

// serveConnect answers one CONNECT on c; from, when set, is the address
// the proxy dials its targets from (its egress IP).
func serveConnect(c net.Conn, wantAuth string, from net.Addr) {
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
	d := net.Dialer{LocalAddr: from}
	up, err := d.Dial("tcp", req.Host)
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

// EgressProxies are in-process forward proxies that stand in for VMs in
// scale tests: one listener per loopback address (127.0.0.0/8 has room for
// millions), each accepting CONNECT with basic auth and dialing its targets
// from its own address, so that every proxy has an egress IP of its own.
type EgressProxies struct {
	want string
	mu   sync.Mutex
	ls   map[string]net.Listener
	wg   sync.WaitGroup
}

// StartEgressProxies returns an empty set of stand-in proxies that take
// username and password; they stop with the test.
func StartEgressProxies(t testing.TB, username, password string) *EgressProxies {
	t.Helper()
	e := &EgressProxies{want: "Basic " + base64.StdEncoding.EncodeToString([]byte(username+":"+password)), ls: map[string]net.Listener{}}
	t.Cleanup(func() {
		e.mu.Lock()
		for a, l := range e.ls {
			_ = l.Close()
			delete(e.ls, a)
		}
		e.mu.Unlock()
		e.wg.Wait()
	})
	return e
}

// Add starts a proxy on addr, a loopback host:port; one already there is
// kept.
func (e *EgressProxies) Add(addr string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.ls[addr]; ok {
		return nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	e.ls[addr] = l
	from := &net.TCPAddr{IP: l.Addr().(*net.TCPAddr).IP}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go serveConnect(c, e.want, from)
		}
	}()
	return nil
}

// Remove stops the proxy on addr, if there is one.
func (e *EgressProxies) Remove(addr string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if l, ok := e.ls[addr]; ok {
		_ = l.Close()
		delete(e.ls, addr)
	}
}

// Len is how many proxies run.
func (e *EgressProxies) Len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.ls)
}
