package local

import (
	"net"
	"testing"
)

// TestHostAddresses: a proxy bound to every address denies each of the
// host's own, and one bound to a single address leaves that to the config.
func TestHostAddresses(t *testing.T) {
	if got := hostAddresses("127.0.0.1"); got != nil {
		t.Errorf("bound to one address: want none, got %v", got)
	}
	got := hostAddresses("0.0.0.0")
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() {
			want++
		}
	}
	if len(got) != want {
		t.Errorf("bound to all: want the host's %d non-loopback addresses, got %v", want, got)
	}
	for _, a := range got {
		if ip := net.ParseIP(a); ip == nil || ip.IsLoopback() {
			t.Errorf("bound to all: %q is not a non-loopback address", a)
		}
	}
}
