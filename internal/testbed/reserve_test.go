package testbed

import (
	"bufio"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestHoldPorts: the ports a child listens on are found from /proc, held
// out of the kernel's local-port choice while it is down, and released once
// they listen again.
func TestHoldPorts(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is not installed: apt-get install -y python3")
	}
	cmd := exec.Command(py, "-c", "import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',0))\ns.listen()\nprint(s.getsockname()[1],flush=True)\ntime.sleep(60)")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(strings.TrimSpace(line))
	if got := listeningPorts(cmd.Process.Pid); !slices.Contains(got, port) {
		t.Fatalf("listeningPorts = %v, want %d among them", got, port)
	}
	f, err := os.OpenFile(reservedPorts, os.O_WRONLY, 0)
	if err != nil {
		t.Logf("%s is not writable here (%v): holding is best effort, only the lookup is checked", reservedPorts, err)
		return
	}
	_ = f.Close()
	reserved := func() bool {
		b, _ := os.ReadFile(reservedPorts)
		for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
			if lo, hi, ok := strings.Cut(r, "-"); ok {
				l, _ := strconv.Atoi(lo)
				h, _ := strconv.Atoi(hi)
				if port >= l && port <= h {
					return true
				}
			} else if p, _ := strconv.Atoi(r); p == port {
				return true
			}
		}
		return false
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	// A neighbour reserved already: the kernel prints both as one range,
	// which must survive the hold and its release.
	neighbour := port + 1
	if !changeReserved([]int{neighbour}, true) {
		t.Fatal("cannot reserve a neighbour port")
	}
	t.Cleanup(func() { changeReserved([]int{neighbour}, false) })
	holdPorts([]int{port})
	if !reserved() {
		t.Fatalf("port %d not reserved while its listener is down", port)
	}
	again := exec.Command(py, "-c", "import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',"+strconv.Itoa(port)+"))\ns.listen()\ntime.sleep(30)")
	if err := again.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = again.Process.Kill(); _ = again.Wait() })
	Eventually(t, 10*time.Second, "the reservation released once the port listens again", func() (bool, string) {
		return !reserved(), "still reserved"
	})
	if b, _ := os.ReadFile(reservedPorts); !strings.Contains(","+strings.TrimSpace(string(b))+",", ","+strconv.Itoa(neighbour)+",") &&
		!strings.Contains(string(b), "-"+strconv.Itoa(neighbour)) && !strings.Contains(string(b), strconv.Itoa(neighbour)+"-") {
		t.Errorf("the neighbour's reservation was lost: %q", b)
	}
}
