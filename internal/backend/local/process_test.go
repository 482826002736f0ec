package local

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestProcessesLeavesOutForks: a Squid forks to start its helpers, and
// until the fork execs it has its parent's command line. It is counted once.
func TestProcessesLeavesOutForks(t *testing.T) {
	dir := t.TempDir()
	// A shell whose command line names a config under dir, with a
	// subshell: a fork that never execs, as a Squid's is for a moment.
	cmd := exec.Command("bash", "-c", "( while :; do sleep 1; done ) & wait", "squid", filepath.Join(dir, "egress-x", fileConf))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = exec.Command("pkill", "-P", strconv.Itoa(cmd.Process.Pid)).Run()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if n := forks(t, cmd.Process.Pid); n > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := forks(t, cmd.Process.Pid); n == 0 {
		t.Fatal("the shell did not fork")
	}
	if got := Processes(dir); len(got) != 1 || got[0] != cmd.Process.Pid {
		t.Errorf("want only the parent %d, got %v", cmd.Process.Pid, got)
	}
}

// forks counts the children of pid that have its command line.
func forks(t *testing.T, pid int) int {
	t.Helper()
	want, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	n := 0
	for _, s := range stats {
		b, err := os.ReadFile(s)
		i := strings.LastIndexByte(string(b), ')')
		if err != nil || i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(pid) {
			continue
		}
		if cl, _ := os.ReadFile(filepath.Join(filepath.Dir(s), "cmdline")); string(cl) == string(want) {
			n++
		}
	}
	return n
}
