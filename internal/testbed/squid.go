package testbed

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// SquidBinary returns the real Squid's path. Tests that need it fail, rather
// than skip, when it is missing.
func SquidBinary(t testing.TB) string {
	t.Helper()
	for _, p := range []string{os.Getenv("SQUID"), "/usr/sbin/squid"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("squid"); err == nil {
		return p
	}
	t.Fatal("squid is not installed: run `apt-get install -y squid` (.ci/run does this)")
	return ""
}

// RunSquid plays a node: it runs a real Squid with conf, rewriting the
// in-pod config folder to a scratch folder holding files, and waits until it
// listens on addr. The process is stopped with the test.
func RunSquid(t testing.TB, conf []byte, podDir string, files map[string][]byte, addr string) {
	t.Helper()
	StartSquid(t, conf, podDir, files, addr)
}

// StartSquid is RunSquid, returning the process, for a test that kills it.
func StartSquid(t testing.TB, conf []byte, podDir string, files map[string][]byte, addr string) *exec.Cmd {
	t.Helper()
	cmd, _ := startSquid(t, []string{SquidBinary(t)}, conf, podDir, files, addr)
	return cmd
}

// startSquid is StartSquid with the command that runs Squid (argv, to
// which -N -f and the configuration's path are added), returning its
// scratch folder too.
func startSquid(t testing.TB, argv []string, conf []byte, podDir string, files map[string][]byte, addr string) (*exec.Cmd, string) {
	t.Helper()
	path, dir := squidDir(t, conf, podDir, files)
	cmd := exec.Command(argv[0], append(argv[1:len(argv):len(argv)], "-N", "-f", path)...) //nolint:gosec // the tests' own Squid
	StartListening(t, cmd, addr)
	return cmd, dir
}

// squidDir writes conf and files into a scratch folder Squid's own user
// owns, with the in-pod folder and the log streams rewritten to it, and
// returns the config's path and the folder (access.log is in it).
func squidDir(t testing.TB, conf []byte, podDir string, files map[string][]byte) (string, string) {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := string(conf)
	if podDir != "" {
		c = strings.ReplaceAll(c, podDir, dir)
	}
	c = strings.ReplaceAll(c, "stdio:/dev/stdout", "stdio:"+filepath.Join(dir, "access.log"))
	c = strings.ReplaceAll(c, "cache_log /dev/stderr", "cache_log "+filepath.Join(dir, "cache.log"))
	path := filepath.Join(dir, "squid.conf")
	if err := os.WriteFile(path, []byte(c), 0o644); err != nil {
		t.Fatal(err)
	}
	OwnByProxy(dir)
	return path, dir
}

// OwnByProxy gives dir and everything in it to Squid's own user, which
// Squid drops to when started as root, so that it may write its logs.
func OwnByProxy(dir string) {
	if os.Geteuid() != 0 {
		return
	}
	if u, err := user.Lookup("proxy"); err == nil {
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		_ = filepath.Walk(dir, func(p string, _ os.FileInfo, _ error) error { return os.Chown(p, uid, gid) })
	}
}

// Heredoc returns what a generated shell script writes to path with
// cat > path <<'EGRESS_PROXY_EOF'.
func Heredoc(t testing.TB, script, path string) string {
	t.Helper()
	start := "cat > " + path + " <<'EGRESS_PROXY_EOF'\n"
	i := strings.Index(script, start)
	if i < 0 {
		t.Fatalf("the script writes no %s:\n%s", path, script)
	}
	rest := script[i+len(start):]
	return rest[:strings.Index(rest, "EGRESS_PROXY_EOF")]
}

// RunSquid runs a real Squid with conf inside the lab's proxy namespace,
// files beside its config (podDir in conf is rewritten to their folder),
// and waits until it listens on addr there. It returns the folder, which
// holds access.log. The process is stopped with the test.
func (l *NetLab) RunSquid(t testing.TB, conf []byte, podDir string, files map[string][]byte, addr string) string {
	t.Helper()
	path, dir := squidDir(t, conf, podDir, files)
	cmd := l.Command(l.Proxy, SquidBinary(t), "-N", "-f", path)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	dial := l.DialContext(l.Proxy)
	Eventually(t, 10*time.Second, "squid listening on "+addr+" in "+l.Proxy, func() (bool, string) {
		c, err := dial(context.Background(), "tcp", addr)
		if err != nil {
			return false, err.Error()
		}
		_ = c.Close()
		return true, ""
	})
	return dir
}

// StartListening starts cmd, stops it with the test, and waits up to 10s
// until it accepts connections on addr.
func StartListening(t testing.TB, cmd *exec.Cmd, addr string) {
	t.Helper()
	// What the program says is kept for the failure message: a program
	// that exits (a config error, a port taken) is reported at once, with
	// its words, rather than waited for.
	out := &lockedBuffer{}
	if cmd.Stdout == nil && cmd.Stderr == nil {
		cmd.Stdout, cmd.Stderr = out, out
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	// Generous: under the race detector with every test package running
	// at once on two cores, a Squid has taken over ten seconds to listen.
	Eventually(t, 30*time.Second, filepath.Base(cmd.Path)+" listening on "+addr, func() (bool, string) {
		select {
		case <-done:
			hint := ""
			if strings.Contains(out.String(), "Address already in use") {
				// Tests' fixed ports lie in Linux's default ephemeral range.
				hint = " (another socket holds the port: .ci/run moves the ephemeral port range, net.ipv4.ip_local_port_range, above 35000, above the tests' fixed ports)"
			}
			t.Fatalf("%s exited before listening on %s (%v)%s: %s", filepath.Base(cmd.Path), addr, waitErr, hint, out.String())
		default:
		}
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			return false, err.Error()
		}
		_ = conn.Close()
		return true, ""
	})
}

// lockedBuffer is a buffer a child process's output goes to while a test
// may read it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// SquidStateDir returns a fresh folder that Squid's own user can reach:
// t.TempDir makes folders only their owner may enter, and Squid drops root.
func SquidStateDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// StartScriptSquid runs, listening on addr, the Squid a cloud VM's
// generated start-up script would: the configuration and the password
// file it writes, with the VM's paths moved to a scratch folder, and
// loopback destinations let through (a VM's loopback is its own; on this
// shared host the tests' targets live there). edit, when not nil, changes
// the configuration further (a test that runs several such VMs side by
// side binds each to an address of its own). The process is stopped with
// the test.
func StartScriptSquid(t testing.TB, script, addr string, edit func(conf string) string) *exec.Cmd {
	t.Helper()
	cmd, _ := StartScriptSquidWith(t, []string{SquidBinary(t)}, script, addr, edit)
	return cmd
}

// StartScriptSquidWith is StartScriptSquid with the command that runs
// Squid (argv, to which -N -f and the configuration's path are added): a
// Squid of another release, run through its own loader. It returns the
// scratch folder too, which holds Squid's logs.
func StartScriptSquidWith(t testing.TB, argv []string, script, addr string, edit func(conf string) string) (*exec.Cmd, string) {
	t.Helper()
	conf := Heredoc(t, script, "/etc/squid/egress-proxy.conf")
	conf = strings.NewReplacer("http_access deny egress_loopback\n", "", "/var/log/squid/", "/etc/squid/",
		"/run/squid.pid", "/etc/squid/squid.pid", "/var/spool/squid", "/etc/squid").Replace(conf)
	if edit != nil {
		conf = edit(conf)
	}
	return startSquid(t, argv, []byte(conf), "/etc/squid", map[string][]byte{
		"egress-proxy.htpasswd": []byte(Heredoc(t, script, "/etc/squid/egress-proxy.htpasswd")),
		"egress-proxy.self":     []byte("255.255.255.255\n"),
	}, addr)
}
