package gcp_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
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

	args := make([]string, 0, len(execStart))
	for _, a := range execStart[1:] {
		args = append(args, moved.Replace(a))
	}

	// The failure the unit's logs avoid, shown first: the same Squid with
	// its logs on /dev/stdout and /dev/stderr, which under systemd are a
	// socket that open(2) refuses (ENXIO), stops at start.
	stdio := strings.NewReplacer("access_log stdio:"+dir+"/log-access.log", "access_log stdio:/dev/stdout", "cache_log "+dir+"/log-cache.log", "cache_log /dev/stderr").Replace(files["etc-egress-proxy.conf"])
	if stdio == files["etc-egress-proxy.conf"] {
		t.Fatalf("the config's logs are not where the test expects them:\n%s", stdio)
	}
	if err := os.WriteFile(filepath.Join(dir, "etc-stdio.conf"), []byte(stdio), 0o644); err != nil {
		t.Fatal(err)
	}
	stdioArgs := slices.Clone(args)
	for i, a := range stdioArgs {
		stdioArgs[i] = strings.Replace(a, "etc-egress-proxy.conf", "etc-stdio.conf", 1)
	}
	exited, _, logged := underJournal(t, stdioArgs)
	select {
	case <-exited:
		if !strings.Contains(logged(), "FATAL") || !strings.Contains(logged(), "/dev/std") {
			t.Errorf("Squid with logs on stdio stopped, but not for them:\n%s", logged())
		}
		t.Logf("with logs on stdio, as the unit once had them: %s", strings.TrimSpace(logged()))
	case <-time.After(15 * time.Second):
		t.Fatalf("Squid with logs on /dev/stdout kept running under a socket stdout: the test no longer shows why the unit logs to files\n%s", logged())
	}

	exited, waitErr, logged := underJournal(t, args)

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	target := testbed.StartEchoTarget(t)
	deadline := time.Now().Add(15 * time.Second)
	var res probe.Result
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			cacheLog, _ := os.ReadFile(filepath.Join(dir, "log-cache.log"))
			t.Fatalf("Squid exited under a systemd-like stdout: %v\nstdout/stderr:\n%s\ncache.log:\n%s", waitErr(), logged(), cacheLog)
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
		t.Fatalf("Squid exited after serving: %v", waitErr())
	case <-time.After(2 * time.Second):
	}
	if b, err := os.ReadFile(filepath.Join(dir, "log-access.log")); err != nil || !strings.Contains(string(b), "CONNECT") {
		t.Errorf("the access log is a file under Squid's log folder: %q %v", b, err)
	}
}

// underJournal starts Squid with args, its stdout and stderr one end of a
// socket pair as systemd's journal stream is (the test drains the other
// end), and returns when it exited, why, and what it wrote there.
func underJournal(t *testing.T, args []string) (<-chan struct{}, func() error, func() string) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	journal, stream := os.NewFile(uintptr(fds[0]), "journal"), os.NewFile(uintptr(fds[1]), "stdout")
	var mu sync.Mutex
	var logged strings.Builder
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		b := make([]byte, 4096)
		for {
			n, err := journal.Read(b)
			mu.Lock()
			logged.Write(b[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
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
		_ = journal.Close()
		<-drained
	})
	return exited, func() error { <-exited; return waitErr }, func() string {
		mu.Lock()
		defer mu.Unlock()
		return logged.String()
	}
}
