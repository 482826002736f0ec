package main

import (
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/cli/clitest"
)

// These tests run egressctl as a process of its own, the test binary run
// again as egressctl (see egressctlProcess), since they signal and kill it; they read
// process states from /proc, so they are Linux's.

// leasedProcess is egressctl lease running sleep 60 as its command.
type leasedProcess struct {
	egressctl *exec.Cmd
	// exited is closed once egressctl has ended and been waited for.
	exited chan struct{}
	// sleep is the command's pid; sh execs sleep, so it is egressctl's
	// child.
	sleep  int
	stderr string // egressctl's stderr, for failure messages
}

// startLeased starts egressctl lease against a fake discovery server, and
// waits for its command to start.
func startLeased(t *testing.T) *leasedProcess {
	t.Helper()
	srv := httptest.NewServer(&fakeDiscovery{ttl: 60})
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	pidFile, stderr := filepath.Join(dir, "pid"), filepath.Join(dir, "stderr")
	// A file rather than a pipe, which the command would hold open.
	errOut, err := os.Create(stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer errOut.Close() //nolint:errcheck // The child has its own.
	clitest.Unsetenv(t, parser(t, &CLI{}))
	cmd := exec.Command(os.Args[0], "-test.run=^$", "--", //nolint:gosec // The test binary itself.
		"lease", "--server", srv.URL, "--fleet", "ns/crawlers", "--",
		"sh", "-c", `echo $$ >"$1.tmp" && mv "$1.tmp" "$1" && exec sleep 60`, "sh", pidFile)
	cmd.Env = append(os.Environ(), "EGRESSCTL_TEST_PROCESS=1")
	cmd.Stdout, cmd.Stderr = errOut, errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &leasedProcess{egressctl: cmd, exited: make(chan struct{}), stderr: stderr}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
		if p.sleep > 0 {
			_ = syscall.Kill(p.sleep, syscall.SIGKILL)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); p.sleep == 0; {
		if b, err := os.ReadFile(pidFile); err == nil {
			if p.sleep, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command did not start within 10s:\n%s", p.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p
}

func (p *leasedProcess) log() string {
	b, _ := os.ReadFile(p.stderr)
	return string(b)
}

// state is the process's state as /proc shows it, such as S (sleeping),
// T (stopped) or Z (ended, not reaped); "gone" once reaped.
func state(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "gone"
	}
	// The state follows the command name, which is in parentheses.
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(fields) == 0 {
		return "gone"
	}
	return fields[0]
}

// waitState waits up to 5s for pid's state to be one of want, and returns
// the last it saw.
func waitState(pid int, want ...string) string {
	var s string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if s = state(pid); slices.Contains(want, s) {
			break
		}
	}
	return s
}

func TestLeaseKillsCommandWhenEgressctlDies(t *testing.T) {
	p := startLeased(t)
	// SIGKILL leaves egressctl no chance to stop the command itself: only
	// the kernel can.
	if err := p.egressctl.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.exited
	// Reparented, the command may stay a zombie if nobody reaps it.
	if s := waitState(p.sleep, "Z", "gone"); s != "Z" && s != "gone" {
		t.Errorf("want the command killed when egressctl dies, got it in state %s:\n%s", s, p.log())
	}
}

func TestLeaseStopsCommandOnCtrlZ(t *testing.T) {
	p := startLeased(t)
	egressctl := p.egressctl.Process.Pid
	// Ctrl-Z sends SIGTSTP to the terminal's foreground group, egressctl's,
	// which the command is not in.
	if err := syscall.Kill(egressctl, syscall.SIGTSTP); err != nil {
		t.Fatal(err)
	}
	if s := waitState(p.sleep, "T"); s != "T" {
		t.Errorf("want SIGTSTP to stop the command, which must not use the proxy while egressctl renews nothing, got state %s", s)
	}
	if s := waitState(egressctl, "T"); s != "T" {
		t.Errorf("want SIGTSTP to stop egressctl, got state %s", s)
	}
	// fg or bg sends SIGCONT to egressctl alone.
	if err := syscall.Kill(egressctl, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if s := waitState(p.sleep, "S"); s != "S" {
		t.Errorf("want SIGCONT to resume the command, got state %s", s)
	}
	if s := waitState(egressctl, "S", "R"); s != "S" && s != "R" {
		t.Errorf("want SIGCONT to resume egressctl, got state %s", s)
	}
	// Resumed, egressctl passes on signals again, and ends with its
	// command.
	if err := syscall.Kill(egressctl, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		t.Errorf("want egressctl to pass SIGTERM on and end with the command:\n%s", p.log())
	}
	if t.Failed() {
		t.Log(p.log())
	}
}
