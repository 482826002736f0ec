package gcp_test

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestSquidUnderSystemd runs the VM's Squid the way its systemd unit does:
// the unit's own ExecStart, with the generated config and htpasswd, and
// stdout and stderr a Unix socket, as systemd connects them to the
// journal. Squid cannot open /dev/stdout on a socket (ENXIO), and a log it
// cannot open is fatal to it; so the config must log to files. Squid must
// start, keep running and serve a request with the proxy's credentials.
// The host paths (/etc/squid, /var/log/squid, /run, /var/spool/squid) are
// moved into a scratch folder; nothing else changes.
func TestSquidUnderSystemd(t *testing.T) {
	const port = 32340
	script, err := gcp.StartupScript(backend.Spec{
		Owner: ownership.Owner{UID: "systemd-test"}, Port: port,
		Credentials:         &backend.Credentials{Username: "crawler", Password: "pw"},
		AllowedSourceRanges: []string{"127.0.0.0/8"},
		GCP:                 &v1alpha1.GCPPlacement{Zone: "europe-west1-b"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("sh", "-n", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("the startup script does not parse: %v\n%s", err, out)
	}
	unit := testbed.Heredoc(t, script, "/etc/systemd/system/egress-proxy.service")
	var execStart []string
	for _, l := range strings.Split(unit, "\n") {
		if v, ok := strings.CutPrefix(l, "ExecStart="); ok {
			execStart = strings.Fields(v)
		}
	}
	if len(execStart) == 0 || execStart[0] != "/usr/sbin/squid" {
		t.Fatalf("the unit must start /usr/sbin/squid: %q", execStart)
	}

	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	moved := strings.NewReplacer("/etc/squid/", dir+"/etc-", "/var/log/squid/", dir+"/log-", "/run/squid.pid", dir+"/squid.pid", "/var/spool/squid", dir)
	conf := testbed.Heredoc(t, script, "/etc/squid/egress-proxy.conf")
	if strings.Contains(conf, "/dev/stdout") || strings.Contains(conf, "/dev/stderr") {
		t.Errorf("under systemd Squid cannot open /dev/stdout or /dev/stderr; the config names one:\n%s", conf)
	}
	// A VM's loopback is its own; on this shared host the test's target
	// lives on loopback.
	conf = strings.Replace(conf, "http_access deny egress_loopback\n", "", 1)
	files := map[string]string{
		"etc-egress-proxy.conf":     moved.Replace(conf),
		"etc-egress-proxy.htpasswd": testbed.Heredoc(t, script, "/etc/squid/egress-proxy.htpasswd"),
		"etc-egress-proxy.self":     "255.255.255.255\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	testbed.OwnByProxy(dir)

	// stdout and stderr: one end of a socket pair, as systemd's journal
	// stream is; the test drains the other end.
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	journal, stream := os.NewFile(uintptr(fds[0]), "journal"), os.NewFile(uintptr(fds[1]), "stdout")
	defer journal.Close() //nolint:errcheck // Test cleanup.
	var logged strings.Builder
	go func() { _, _ = io.Copy(&logged, journal) }()

	args := make([]string, 0, len(execStart))
	for _, a := range execStart[1:] {
		args = append(args, moved.Replace(a))
	}
	cmd := exec.Command(testbed.SquidBinary(t), args...)
	cmd.Stdout, cmd.Stderr = stream, stream
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = stream.Close()
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	target := testbed.StartEchoTarget(t)
	deadline := time.Now().Add(15 * time.Second)
	var res probe.Result
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			cacheLog, _ := os.ReadFile(filepath.Join(dir, "log-cache.log"))
			t.Fatalf("Squid exited under a systemd-like stdout: %v\nstdout/stderr:\n%s\ncache.log:\n%s", waitErr, logged.String(), cacheLog)
		default:
		}
		res = probe.Prober{}.Probe(context.Background(), probe.Target{Proxy: addr, Username: "crawler", Password: "pw", URL: target.URL, RootCAs: target.RootCAs, Timeout: time.Second})
		if res.OK {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !res.OK {
		t.Fatalf("Squid does not serve under a systemd-like stdout: %s", res.Error)
	}
	// Still running a while later: a log it could not open would have
	// stopped it by now.
	select {
	case <-exited:
		t.Fatalf("Squid exited after serving: %v", waitErr)
	case <-time.After(2 * time.Second):
	}
	if b, err := os.ReadFile(filepath.Join(dir, "log-access.log")); err != nil || !strings.Contains(string(b), "CONNECT") {
		t.Errorf("the access log is a file under Squid's log folder: %q %v", b, err)
	}
}
