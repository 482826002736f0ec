package local

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// crashWindow is how soon after it started a Squid that exits has
// crashed: a run of crashes backs its restarts off, and the instance is
// reported crash-looping until a Squid stays up this long.
var crashWindow = time.Minute

// maxRestartDelay caps the back-off of a crash-looping Squid's restarts,
// as the kubelet's of a container's.
const maxRestartDelay = 5 * time.Minute

// supervisor keeps one instance's Squid running, restarting it when it
// exits: after RestartDelay, doubled for each crash in a row up to
// maxRestartDelay, as the kubelet restarts a container in CrashLoopBackOff.
type supervisor struct {
	name string
	b    *Backend

	mu       sync.Mutex
	stopped  bool
	detached bool
	cmd      *exec.Cmd
	done     chan struct{}
	quitting chan struct{} // closed by stop and detach
	// crashes counts the Squids in a row that exited within crashWindow
	// of starting; up is when the one running now started or was
	// adopted, zero while none runs; lastExit is when the last one exited.
	crashes  int
	up       time.Time
	lastExit time.Time
}

func (b *Backend) supervise(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.procs[name]; ok {
		return
	}
	sv := &supervisor{name: name, b: b, done: make(chan struct{}), quitting: make(chan struct{})}
	b.procs[name] = sv
	go sv.run()
}

func (sv *supervisor) quit() bool {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	return sv.stopped || sv.detached
}

// What a supervisor logs when it takes charge of a Squid: operators see
// which proxies a restarted provider re-adopted and which it had to start.
const (
	msgAdopted = "Adopted running Squid"
	msgStarted = "Started Squid"
)

func (sv *supervisor) run() {
	defer close(sv.done)
	log := sv.b.log.WithValues("instance", sv.name)
	for !sv.quit() {
		if pid := sv.b.livePid(sv.name); pid > 0 {
			// Re-adopted, or started by us before a restart: watch it.
			log.Info(msgAdopted, "pid", pid)
			sv.started()
			for !sv.quit() && sv.b.livePid(sv.name) == pid {
				time.Sleep(200 * time.Millisecond)
			}
		} else if err := sv.start(); err != nil {
			log.Info("Cannot start squid", "error", err)
		} else {
			log.Info(msgStarted, "pid", sv.cmd.Process.Pid)
			sv.started()
			_ = sv.cmd.Wait()
			// Its pid may be anybody's now: stop must not signal it.
			sv.mu.Lock()
			sv.cmd = nil
			sv.mu.Unlock()
		}
		if sv.quit() {
			return
		}
		delay, crashes := sv.exited()
		if crashes > 1 {
			log.Info("Squid keeps exiting soon after it starts; backing off its restarts", "crashes", crashes, "after", delay)
		} else {
			log.Info("Squid exited; restarting", "after", delay)
		}
		select {
		case <-sv.quitting:
		case <-time.After(delay):
		}
	}
}

func (sv *supervisor) started() {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	sv.up = time.Now()
}

// exited records that the Squid exited and returns how long to wait before
// the next one, and how many crashed in a row.
func (sv *supervisor) exited() (time.Duration, int) {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	now := time.Now()
	if !sv.up.IsZero() && now.Sub(sv.up) < crashWindow {
		sv.crashes++
	} else {
		sv.crashes = 1
	}
	sv.up, sv.lastExit = time.Time{}, now
	delay := sv.b.cfg.RestartDelay
	for i := 1; i < sv.crashes && delay < maxRestartDelay; i++ {
		delay *= 2
	}
	return min(delay, maxRestartDelay), sv.crashes
}

// crashLoop says why the instance is crash-looping: its Squid crashed
// more than once in a row, and none has stayed up for crashWindow since.
// Empty when it is not.
func (sv *supervisor) crashLoop() string {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.crashes < 2 || (!sv.up.IsZero() && time.Since(sv.up) >= crashWindow) {
		return ""
	}
	return fmt.Sprintf("Squid exited %d times in a row within %s of starting, the last at %s; its restarts back off up to %s, and it is held out of service until one stays up for %s",
		sv.crashes, crashWindow, sv.lastExit.UTC().Format(time.RFC3339), maxRestartDelay, crashWindow)
}

func (sv *supervisor) start() error {
	dir := sv.b.dir(sv.name)
	// A stale pid file would make Squid refuse to start.
	_ = os.Remove(filepath.Join(dir, filePid))
	cmd := exec.Command(sv.b.squidPath(), "-N", "-f", filepath.Join(dir, fileConf))
	// The folder is Squid's user's: nothing it planted there (a symlink
	// to a file of root's) is written through.
	out, err := os.OpenFile(filepath.Join(dir, "squid.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o644)
	if err != nil {
		return errors.Wrap(err, "cannot open output file")
	}
	defer out.Close() //nolint:errcheck // The child holds its own descriptor.
	cmd.Stdout, cmd.Stderr = out, out
	// Own process group: a Ctrl-C meant for the provider does not reach the
	// proxies, which a restarted provider re-adopts.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.stopped || sv.detached {
		return errors.New("supervisor stopped")
	}
	if err := cmd.Start(); err != nil {
		return errors.Wrap(err, "cannot start squid")
	}
	sv.cmd = cmd
	return errors.Wrap(writeOwned(dir, fileStarted, nil, false), "cannot record start")
}

// stop ends supervision and the process, and waits for both.
func (sv *supervisor) stop() {
	sv.mu.Lock()
	if !sv.stopped && !sv.detached {
		close(sv.quitting)
	}
	sv.stopped = true
	cmd := sv.cmd
	sv.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		terminate(cmd.Process.Pid)
	}
	if pid := sv.b.livePid(sv.name); pid > 0 {
		terminate(pid)
	}
	<-sv.done
}

// detach ends supervision and leaves the process running.
func (sv *supervisor) detach() {
	sv.mu.Lock()
	if !sv.stopped && !sv.detached {
		close(sv.quitting)
	}
	sv.detached = true
	sv.mu.Unlock()
}
