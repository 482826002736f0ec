package squid

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// authHelper returns Squid's basic_ncsa_auth, failing when it is missing.
func authHelper(t *testing.T) string {
	t.Helper()
	testbed.SquidBinary(t)
	if _, err := os.Stat(DefaultAuthHelper); err != nil {
		t.Fatalf("%s is missing: run `apt-get install -y squid`", DefaultAuthHelper)
	}
	return DefaultAuthHelper
}

func writeFile(t *testing.T, path string, parts ...[]byte) {
	t.Helper()
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func htpasswd(t *testing.T, user, pass string) []byte {
	t.Helper()
	h, err := Htpasswd(user, pass)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestAuthScript runs the rotation helper as Squid does, with /bin/sh and
// the real basic_ncsa_auth, one request per line, and checks each answer:
// the current credentials always, the previous ones only before their
// deadline, nothing when the previous file is missing or its header is
// not a time, and a client's text is never run as a command.
func TestAuthScript(t *testing.T) {
	helper := authHelper(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "auth.sh")
	writeFile(t, script, []byte(AuthScript))
	current, previous := filepath.Join(dir, "htpasswd"), filepath.Join(dir, "htpasswd.previous")
	writeFile(t, current, htpasswd(t, "crawler", "new pass"))
	marker := filepath.Join(dir, "pwned")
	ask := func(lines ...string) []string {
		t.Helper()
		cmd := exec.Command("/bin/sh", script, helper, current, previous)
		cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("the helper failed: %v", err)
		}
		return strings.Fields(string(out))
	}
	injection := "crawler $(touch%20" + marker + ")"
	for _, tc := range []struct {
		name     string
		previous []byte // nil: no file
		lines    []string
		want     string
	}{
		{"NoPrevious", nil, []string{"crawler new%20pass", "crawler old", "other new%20pass", injection}, "OK ERR ERR ERR"},
		{"PreviousInGrace", append(PreviousHeader(time.Now().Add(time.Hour)), htpasswd(t, "crawler", "old")...),
			[]string{"crawler new%20pass", "crawler old", "crawler wrong", injection}, "OK OK ERR ERR"},
		{"PreviousLapsed", append(PreviousHeader(time.Now().Add(-time.Second)), htpasswd(t, "crawler", "old")...),
			[]string{"crawler new%20pass", "crawler old"}, "OK ERR"},
		{"HeaderNotATime", append([]byte("# until $(touch "+marker+")\n"), htpasswd(t, "crawler", "old")...),
			[]string{"crawler old"}, "ERR"},
		{"NoHeader", htpasswd(t, "crawler", "old"), []string{"crawler old"}, "ERR"},
		{"AnotherUserInGrace", append(PreviousHeader(time.Now().Add(time.Hour)), htpasswd(t, "former", "old")...),
			[]string{"former old", "crawler old", "former new%20pass"}, "OK ERR ERR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_ = os.Remove(previous)
			if tc.previous != nil {
				writeFile(t, previous, tc.previous)
			}
			if got := strings.Join(ask(tc.lines...), " "); got != tc.want {
				t.Errorf("answers to %q: got %q, want %q", tc.lines, got, tc.want)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Fatal("the helper ran a command a client sent")
			}
		})
	}
}

// TestRotateInPlace runs real Squid with the rotation helper and changes
// its credentials by rewriting the files only, as the local and pod
// backends do: the new password works at once, the previous one keeps
// working during its grace, a lapsed one never does, and Squid is never
// restarted.
func TestRotateInPlace(t *testing.T) {
	helper := authHelper(t)
	target := testbed.StartPlainEchoTarget(t)
	dir := testbed.SquidStateDir(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	current, previous := filepath.Join(dir, "htpasswd"), filepath.Join(dir, "htpasswd.previous")
	conf, err := Render(Config{
		Port: int32(port), BindAddress: "127.0.0.1", AllowLoopbackDestinations: true,
		HtpasswdPath: current, PreviousHtpasswdPath: previous, AuthScriptPath: filepath.Join(dir, "auth.sh"), AuthHelper: helper,
		PidFile: filepath.Join(dir, "squid.pid"), AccessLog: "stdio:" + filepath.Join(dir, "access.log"),
		CacheLog: filepath.Join(dir, "cache.log"), CoreDumpDir: dir,
	})
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"htpasswd": htpasswd(t, "crawler", "first"),
		// Lapsed before Squid starts, so no cached answer hides it.
		"htpasswd.previous": append(PreviousHeader(time.Now().Add(-time.Second)), htpasswd(t, "crawler", "lapsed")...),
		"auth.sh":           []byte(AuthScript),
	}
	for name, b := range files {
		writeFile(t, filepath.Join(dir, name), b)
	}
	writeFile(t, filepath.Join(dir, "squid.conf"), conf)
	testbed.OwnByProxy(dir)
	cmd := exec.Command(testbed.SquidBinary(t), "-N", "-f", filepath.Join(dir, "squid.conf"))
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	testbed.StartListening(t, cmd, addr)

	status := func(pass string) int {
		t.Helper()
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: addr, User: url.UserPassword("crawler", pass)}), DisableKeepAlives: true,
		}}
		rsp, err := c.Get(target.URL)
		if err != nil {
			t.Fatalf("fetch through the proxy with password %q: %v", pass, err)
		}
		_ = rsp.Body.Close()
		return rsp.StatusCode
	}
	expect := func(step string, want map[string]int) {
		t.Helper()
		for pass, code := range want {
			if got := status(pass); got != code {
				t.Errorf("%s: password %q got %d, want %d", step, pass, got, code)
			}
		}
	}
	expect("before the rotation", map[string]int{"first": 200, "second": 407, "lapsed": 407})

	// Rotate: the previous file first, then the current one, as the
	// backends do, so that no moment accepts neither.
	writeFile(t, previous, PreviousHeader(time.Now().Add(time.Hour)), htpasswd(t, "crawler", "first"))
	writeFile(t, current, htpasswd(t, "crawler", "second"))
	testbed.OwnByProxy(dir)
	expect("during the grace period", map[string]int{"second": 200, "first": 200, "lapsed": 407, "third": 407})
	// Alternating passwords make Squid ask the helper each time.
	expect("alternating", map[string]int{"first": 200, "second": 200})
	if pid := cmd.Process.Pid; cmd.ProcessState != nil {
		t.Fatalf("squid (pid %d) exited during the rotation", pid)
	}
}

func TestHtpasswdMatches(t *testing.T) {
	line := htpasswd(t, "crawler", "pass word")
	for _, tc := range []struct {
		file       []byte
		user, pass string
		want       bool
	}{
		{line, "crawler", "pass word", true},
		{line, "crawler", "pass", false},
		{line, "other", "pass word", false},
		{[]byte("crawler:{SHA}x\n"), "crawler", "pass word", false},
		{nil, "crawler", "pass word", false},
		{append(PreviousHeader(time.Now()), line...), "crawler", "pass word", false},
	} {
		if got := HtpasswdMatches(tc.file, tc.user, tc.pass); got != tc.want {
			t.Errorf("HtpasswdMatches(%q, %q, %q) = %v, want %v", tc.file, tc.user, tc.pass, got, tc.want)
		}
	}
}
