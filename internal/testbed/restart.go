package testbed

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pkg/errors"
)

// restarted are the processes RestartChild started, stopped by
// StopRestarted.
var restarted struct {
	sync.Mutex
	cmds []*exec.Cmd
}

// RestartChild crashes a child of this process, such as the test bed's
// kube-apiserver or etcd, and starts it again as it was: it SIGKILLs the
// child whose command is name, waits until it is gone and then down more,
// and runs the same command line with the same environment and working
// folder (so the same data, certificates and ports). It returns once the
// new process runs; the caller waits for it to serve. StopRestarted, and
// Env.Stop, stop what it started.
func RestartChild(name string, down time.Duration) error {
	pid, err := childNamed(name)
	if err != nil {
		return err
	}
	argv, err := nulFields(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return err
	}
	env, err := nulFields(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return err
	}
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if err != nil {
		return errors.Wrapf(err, "cannot read the working folder of %s", name)
	}
	// Its ports stay its own while it is down.
	holdPorts(listeningPorts(pid))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return errors.Wrapf(err, "cannot kill %s", name)
	}
	// Whoever started it reaps it; until then it is a zombie.
	for deadline := time.Now().Add(10 * time.Second); alive(pid); {
		if time.Now().After(deadline) {
			return errors.Errorf("%s (pid %d) did not die", name, pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(down)
	cmd := exec.Command(argv[0], argv[1:]...) //nolint:gosec // The command line of our own child.
	cmd.Env, cmd.Dir = env, cwd
	// As the first one: killed with the test process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return errors.Wrapf(err, "cannot start %s again", name)
	}
	go func() { _ = cmd.Wait() }()
	restarted.Lock()
	restarted.cmds = append(restarted.cmds, cmd)
	restarted.Unlock()
	return nil
}

// StopRestarted stops the processes RestartChild started.
func StopRestarted() {
	restarted.Lock()
	defer restarted.Unlock()
	for _, c := range restarted.cmds {
		_ = c.Process.Signal(syscall.SIGTERM)
		for deadline := time.Now().Add(10 * time.Second); alive(c.Process.Pid) && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		_ = c.Process.Kill()
	}
	restarted.cmds = nil
}

// childNamed finds the live child of this process whose command is name.
func childNamed(name string) (int, error) {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	me := strconv.Itoa(os.Getpid())
	for _, s := range stats {
		b, err := os.ReadFile(s)
		if err != nil {
			continue
		}
		open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
		if open < 0 || end < open {
			continue
		}
		f := strings.Fields(string(b[end+1:])) // state, ppid, ...
		if string(b[open+1:end]) == name && len(f) > 1 && f[1] == me && f[0] != "Z" {
			return strconv.Atoi(filepath.Base(filepath.Dir(s)))
		}
	}
	return 0, errors.Errorf("no child process %s of this process", name)
}

// alive says whether pid runs: not gone, nor a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

func nulFields(path string) ([]string, error) {
	b, err := os.ReadFile(path) //nolint:gosec // /proc of our own child.
	if err != nil {
		return nil, errors.Wrapf(err, "cannot read %s", path)
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), nil
}
