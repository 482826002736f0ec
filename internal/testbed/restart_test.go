package testbed

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// flakyServer listens on argv[1] unless the counter in file argv[2] is
// above zero, when it counts down and exits first: a server that fails its
// first starts, as kube-apiserver does while etcd is not back yet.
const flakyServer = `import socket,sys,time
n=int(open(sys.argv[2]).read())
if n>0:
    open(sys.argv[2],'w').write(str(n-1))
    print('not yet: failing this start',flush=True)
    sys.exit(3)
s=socket.socket()
s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)
s.bind(('127.0.0.1',int(sys.argv[1])))
s.listen()
time.sleep(120)
`

// TestRestartChildStartsAgainUntilItServes: RestartChild returns once the
// restarted child listens on its ports again, starting it again when it
// ends first, and says how it ended when it never stays up.
func TestRestartChildStartsAgainUntilItServes(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is not installed: apt-get install -y python3")
	}
	dir := t.TempDir()
	RestartLogs = dir
	t.Cleanup(func() { RestartLogs = ""; StopRestarted() })
	for _, tc := range []struct {
		name     string
		failures int
		wantErr  bool
	}{
		{"FailsTwiceThenServes", 2, false},
		{"NeverStaysUp", restartAttempts, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			port := ln.Addr().(*net.TCPAddr).Port
			_ = ln.Close()
			counter := filepath.Join(dir, tc.name)
			if err := os.WriteFile(counter, []byte("0"), 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(py, "-c", flakyServer, strconv.Itoa(port), counter)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			go func() { _ = cmd.Wait() }()
			// Each case's servers stop with it: RestartChild picks the
			// one child of that name.
			t.Cleanup(func() { _ = cmd.Process.Kill(); StopRestarted() })
			for deadline := time.Now().Add(10 * time.Second); !slices.Contains(listeningPorts(cmd.Process.Pid), port); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the first server never listened")
				}
			}
			if err := os.WriteFile(counter, []byte(strconv.Itoa(tc.failures)), 0o600); err != nil {
				t.Fatal(err)
			}
			err = RestartChild("python3", 0)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), "not yet: failing this start") || !strings.Contains(err.Error(), "exit status 3") {
					t.Fatalf("want an error saying how the last start ended, with its output; got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !listening(port) {
				t.Errorf("RestartChild returned with nothing listening on %d", port)
			}
			if b, _ := os.ReadFile(counter); string(b) != "0" {
				t.Errorf("the server was not started until it served: counter %q", b)
			}
			if ended, how := RestartedEnded("python3"); ended {
				t.Errorf("the serving restart is reported ended: %s", how)
			}
		})
	}
}
