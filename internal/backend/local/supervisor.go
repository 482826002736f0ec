package local

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/pkg/errors"
)

// supervisor keeps one instance's Squid running.
type supervisor struct {
	name string
	b    *Backend

	mu       sync.Mutex
	stopped  bool
	detached bool
	cmd      *exec.Cmd
	done     chan struct{}
}

func (b *Backend) supervise(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.procs[name]; ok {
		return
	}
	sv := &supervisor{name: name, b: b, done: make(chan struct{})}
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
			for !sv.quit() && sv.b.livePid(sv.name) == pid {
				time.Sleep(200 * time.Millisecond)
			}
		} else if err := sv.start(); err != nil {
			log.Info("Cannot start squid", "error", err)
		} else {
			log.Info(msgStarted, "pid", sv.cmd.Process.Pid)
			err := sv.cmd.Wait()
			if !sv.quit() {
				log.Info("Squid exited; restarting", "error", err, "after", sv.b.cfg.RestartDelay)
			}
		}
		if sv.quit() {
			return
		}
		time.Sleep(sv.b.cfg.RestartDelay)
	}
}

func (sv *supervisor) start() error {
	dir := sv.b.dir(sv.name)
	// A stale pid file would make Squid refuse to start.
	_ = os.Remove(filepath.Join(dir, filePid))
	cmd := exec.Command(sv.b.cfg.SquidPath, "-N", "-f", filepath.Join(dir, fileConf))
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
	sv.detached = true
	sv.mu.Unlock()
}
