package testbed

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// restarted are the processes RestartChild started, stopped by
// StopRestarted.
var restarted struct {
	sync.Mutex
	cmds []*exec.Cmd
	// ended holds, by name, how the last process started for it ended
	// (closed when it has).
	ended map[string]*ending
}

// ending is how a restarted process ended, once done is closed.
type ending struct {
	pid  int
	done chan struct{}
	err  error
	log  string
}

// RestartLogs is the folder where RestartChild writes each restarted
// process's output, as <name>-restarted.log; empty discards it.
var RestartLogs string

// RestartChild crashes a child of this process, such as the test bed's
// kube-apiserver or etcd, and starts it again as it was: it SIGKILLs the
// child whose command is name, waits until it is gone and then down more,
// and runs the same command line with the same environment and working
// folder (so the same data, certificates and ports). It returns once the
// new process listens on every port the old one did (a server may need
// more before it answers: the caller waits for that). StopRestarted, and
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
	ports := listeningPorts(pid)
	holdPorts(ports)
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
	// A process that ends before it serves again (kube-apiserver gives
	// up on an etcd still replaying its log) is started again, as a
	// kubelet would, up to restartAttempts times.
	var how string
	for range restartAttempts {
		e, err := startAgain(name, argv, env, cwd)
		if err != nil {
			return err
		}
		served, ended := waitServing(e, ports, restartServeTimeout)
		if served {
			return nil
		}
		if !ended {
			return errors.Errorf("%s, started again, did not listen on %v within %s", name, ports, restartServeTimeout)
		}
		_, how = RestartedEnded(name)
	}
	return errors.Errorf("%s did not stay up in %d starts: %s", name, restartAttempts, how)
}

// restartAttempts is how often RestartChild starts a child that ends
// before serving; restartServeTimeout how long it waits for one to listen.
const (
	restartAttempts     = 3
	restartServeTimeout = 2 * time.Minute
)

// startAgain runs the command line a child ran, as it ran it.
func startAgain(name string, argv, env []string, cwd string) (*ending, error) {
	cmd := exec.Command(argv[0], argv[1:]...) //nolint:gosec // The command line of our own child.
	cmd.Env, cmd.Dir = env, cwd
	// As the first one: killed with the test process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	e := &ending{done: make(chan struct{})}
	if RestartLogs != "" {
		e.log = filepath.Join(RestartLogs, name+"-restarted.log")
		f, err := os.OpenFile(e.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600) //nolint:gosec // The caller's log folder.
		if err != nil {
			return nil, errors.Wrapf(err, "cannot open the log of %s", name)
		}
		defer f.Close() //nolint:errcheck // The child holds its own copy.
		fmt.Fprintf(f, "\n==> %s started again\n", time.Now().Format(time.RFC3339))
		cmd.Stdout, cmd.Stderr = f, f
	}
	if err := cmd.Start(); err != nil {
		return nil, errors.Wrapf(err, "cannot start %s again", name)
	}
	e.pid = cmd.Process.Pid
	go func() {
		e.err = cmd.Wait()
		close(e.done)
	}()
	restarted.Lock()
	restarted.cmds = append(restarted.cmds, cmd)
	if restarted.ended == nil {
		restarted.ended = map[string]*ending{}
	}
	restarted.ended[name] = e
	restarted.Unlock()
	return e, nil
}

// waitServing waits until the process listens on every one of ports
// (served), or ends (ended), or timeout passes (neither).
func waitServing(e *ending, ports []int, timeout time.Duration) (served, ended bool) {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); {
		select {
		case <-e.done:
			return false, true
		case <-time.After(100 * time.Millisecond):
		}
		have := listeningPorts(e.pid)
		if !slices.ContainsFunc(ports, func(p int) bool { return !slices.Contains(have, p) }) {
			return true, false
		}
	}
	return false, false
}

// RestartedEnded says whether the process RestartChild last started for
// name has ended, and if so how, with the end of its output when
// RestartLogs keeps it: what a test waiting for it to serve reports
// instead of waiting on.
func RestartedEnded(name string) (bool, string) {
	restarted.Lock()
	e := restarted.ended[name]
	restarted.Unlock()
	if e == nil {
		return false, ""
	}
	select {
	case <-e.done:
	default:
		return false, ""
	}
	msg := fmt.Sprintf("%s, started again, ended: %v", name, e.err)
	if b, err := os.ReadFile(e.log); err == nil && len(b) > 0 {
		if len(b) > 2000 {
			b = b[len(b)-2000:]
		}
		msg += "; its output ends:\n" + string(b)
	}
	return true, msg
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
