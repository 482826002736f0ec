package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestCrashLoopBacksOff kills a real Squid each time it comes up: its
// restarts back off (1s, 2s, 4s), the instance says it is crash-looping
// from the second crash in a row, a Delete does not wait the back-off out,
// and a Squid that stays up for the crash window ends the loop.
func TestCrashLoopBacksOff(t *testing.T) {
	defer func(w time.Duration) { crashWindow = w }(crashWindow)
	crashWindow = 6 * time.Second
	dir := testbed.SquidStateDir(t)
	b, err := New(Config{SquidPath: testbed.SquidBinary(t), StateDir: dir, ClusterID: "test", RestartDelay: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	s := spec("crash", 32470)
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	pid := waitPid(t, b, s.Name, 0)
	crashLoop := func() string {
		inst, err := b.Get(ctx, s.Ref)
		if err != nil {
			t.Fatal(err)
		}
		return inst.CrashLoop
	}
	var gaps []time.Duration
	for i := range 3 {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		if i == 1 {
			// The second crash in a row: crash-looping at once.
			testbed.Eventually(t, 2*time.Second, "the instance reported crash-looping", func() (bool, string) {
				return crashLoop() != "", "not yet"
			})
			if msg := crashLoop(); !strings.Contains(msg, "exited 2 times in a row") {
				t.Errorf("crash-loop message: %s", msg)
			}
		}
		pid = waitPid(t, b, s.Name, pid)
		gaps = append(gaps, time.Since(killed))
	}
	t.Logf("restarted %v after each kill", gaps)
	if gaps[2] < 3*time.Second || gaps[2] < 2*gaps[0] {
		t.Errorf("the third restart in a row must wait 4s, twice as long as the second and four times the first; waited %v", gaps)
	}
	if crashLoop() == "" {
		t.Error("crash-looping while the Squid has been up for less than the crash window")
	}

	t.Run("StaysUp", func(t *testing.T) {
		// A restart can fail to bind while the killed Squid's forks
		// still hold its port, and count as one more crash: the
		// back-off may have grown to 16s.
		testbed.Eventually(t, 40*time.Second, "the loop over once the Squid stays up", func() (bool, string) {
			return crashLoop() == "", crashLoop()
		})
	})

	t.Run("DeleteDoesNotWaitOutBackOff", func(t *testing.T) {
		// Three crashes in a row again (the one that stayed up counts
		// as the first): the next restart is 4s off.
		// A Squid already gone (it could not bind) crashed too.
		for range 2 {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
				t.Fatal(err)
			}
			pid = waitPid(t, b, s.Name, pid)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
			t.Fatal(err)
		}
		testbed.Eventually(t, 2*time.Second, "the Squid gone", func() (bool, string) { return b.livePid(s.Name) == 0, "" })
		done := make(chan error, 1)
		go func() { done <- b.Delete(ctx, s.Ref) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("Delete waited out the restart back-off (4s) instead of ending the supervisor")
		}
		if pids := Processes(dir); len(pids) != 0 {
			t.Errorf("Squid processes left: %v", pids)
		}
	})
}

// waitPid waits for a Squid of instance name other than old, and returns
// its pid.
func waitPid(t *testing.T, b *Backend, name string, old int) int {
	t.Helper()
	var pid int
	// The new Squid has written its pid file: a fork of the killed one,
	// orphaned on its way to exec a helper, has not.
	testbed.Eventually(t, 40*time.Second, "a new Squid", func() (bool, string) {
		pid = b.livePid(name)
		raw, _ := os.ReadFile(filepath.Join(b.dir(name), filePid))
		return pid > 0 && pid != old && strings.TrimSpace(string(raw)) == strconv.Itoa(pid), ""
	})
	return pid
}

// TestAdoptsSquidWithoutPidFile: a provider killed right after it started
// a Squid leaves one that has not written its pid file yet. The next
// provider finds it by its command line and adopts it, rather than
// starting a second Squid that can never bind the port (found by the
// provider-kill fault test, where it crash-looped).
func TestAdoptsSquidWithoutPidFile(t *testing.T) {
	dir := testbed.SquidStateDir(t)
	first := newBackend(t, dir, nil)
	ctx := context.Background()
	s := spec("nopid", 32471)
	if _, err := first.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	pid := waitPid(t, first, s.Name, 0)
	first.Close()
	defer StopAll(dir)
	pidFile := filepath.Join(dir, s.Name, filePid)
	testbed.Eventually(t, 10*time.Second, "Squid writing its pid file", func() (bool, string) {
		_, err := os.Stat(pidFile)
		return err == nil, fmt.Sprint(err)
	})
	if err := os.Remove(pidFile); err != nil {
		t.Fatal(err)
	}

	log := newRecorder()
	next := newLoggedBackend(t, dir, nil, log)
	defer next.Close()
	if got := next.livePid(s.Name); got != pid {
		t.Fatalf("the running Squid %d must be found without its pid file, got %d", pid, got)
	}
	// The supervisor decides once, adopting or starting.
	testbed.Eventually(t, 5*time.Second, "the supervisor taking the Squid in charge", func() (bool, string) {
		adopted, lines := log.count(msgAdopted)
		started, _ := log.count(msgStarted)
		return adopted+started > 0, lines
	})
	if n, lines := log.count(msgAdopted); n != 1 {
		t.Errorf("the Squid must be adopted, not another started:\n%s", lines)
	}
	if pids := Processes(dir); len(pids) != 1 || pids[0] != pid {
		t.Errorf("want only the adopted Squid %d, got %v", pid, pids)
	}
	if inst, err := next.Get(ctx, s.Ref); err != nil || inst.CrashLoop != "" {
		t.Errorf("the adopted instance: %+v, %v", inst, err)
	}
}
