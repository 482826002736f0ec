package testbed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/netns"
)

// Addresses of a NetLab: the proxy's side and the stand-in public host, in
// the benchmark range 198.18.0.0/15, which the product never denies.
const (
	LabProxyAddr  = "198.18.0.1"
	LabPublicAddr = "198.18.0.2"
)

// NetLab is a pair of network namespaces the test made: Proxy holds only
// loopback and one end of a veth pair; Public holds the other end, the
// test's stand-in for the public internet. Neither has a default route, so
// nothing sent inside can leave the machine: a request to any other address
// fails to connect instead.
type NetLab struct {
	Proxy, Public string
}

// NewNetLab makes the namespaces and removes them with the test. It needs
// root (ip netns); without it the test fails saying so.
func NewNetLab(t testing.TB) *NetLab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test builds network namespaces with `ip netns`, which needs root: run it as root (CI does)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatal("ip is not installed: run `apt-get install -y iproute2` (.ci/run does this)")
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	l := &NetLab{Proxy: "egt-p-" + id, Public: "egt-q-" + id}
	vp, vq := "vp"+id, "vq"+id // interface names have at most 15 characters
	t.Cleanup(func() {
		for _, ns := range []string{l.Proxy, l.Public} {
			_ = exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	for _, cmd := range []string{
		"netns add " + l.Proxy,
		"netns add " + l.Public,
		"link add " + vp + " type veth peer name " + vq,
		"link set " + vp + " netns " + l.Proxy,
		"link set " + vq + " netns " + l.Public,
		"-n " + l.Proxy + " addr add " + LabProxyAddr + "/24 dev " + vp,
		"-n " + l.Public + " addr add " + LabPublicAddr + "/24 dev " + vq,
		"-n " + l.Proxy + " link set lo up",
		"-n " + l.Proxy + " link set " + vp + " up",
		"-n " + l.Public + " link set lo up",
		"-n " + l.Public + " link set " + vq + " up",
	} {
		if out, err := exec.Command("ip", strings.Fields(cmd)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", cmd, err, out)
		}
	}
	return l
}

// IP runs `ip -n ns args...`, failing the test on error.
func (l *NetLab) IP(t testing.TB, ns string, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("ip -n %s %s: %v\n%s", ns, strings.Join(args, " "), err, out)
	}
}

// Command runs name inside namespace ns.
func (l *NetLab) Command(ns, name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", ns, name}, args...)...)
}

// Listen listens on addr inside namespace ns.
func (l *NetLab) Listen(t testing.TB, ns, addr string) net.Listener {
	t.Helper()
	ln, err := netns.Listen(ns, addr)
	if err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// DialContext dials from inside namespace ns.
func (l *NetLab) DialContext(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := netns.Do(ns, func() (err error) {
			c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}
