package devenv

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// process is a child program of the environment, logging to its own file.
type process struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
	err  error
}

// inherited are the variables a child takes from this process. The product's
// binaries read their settings from the environment too, so a developer's
// DEBUG or ADDRESS must not reach them: each gets what start says and these.
var inherited = []string{"PATH", "HOME", "USER", "TMPDIR", "LANG", "LC_ALL", "TZ", "SSL_CERT_FILE", "SSL_CERT_DIR", "GOCOVERDIR"}

func baseEnv() []string {
	var env []string
	for _, k := range inherited {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// start runs bin with args and the extra environment, its output going to
// logs/<name>.log. The child gets its own process group, so stopping it also
// stops anything it runs, and is killed if this process dies first.
func (s *core) start(name, bin string, args []string, env ...string) (*process, error) {
	logPath := filepath.Join(s.opts.StateDir, "logs", name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, errors.Wrapf(err, "cannot open the log of %s", name)
	}
	fmt.Fprintf(f, "\n==> %s %s %v\n", time.Now().Format(time.RFC3339), bin, args)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(baseEnv(), "KUBECONFIG="+s.Kubeconfig), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, errors.Wrapf(err, "cannot start %s", name)
	}
	p := &process{name: name, cmd: cmd, log: f, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.cleanups = append(s.cleanups, cleanup{name: name, fn: p.stop})
	s.procs = append(s.procs, p)
	return p, nil
}

// Processes are the environment's programs still running, by name, with
// their process IDs (the latest of a name that was restarted).
func (s *core) Processes() map[string]int {
	out := map[string]int{}
	for _, p := range s.procs {
		if ok, _ := p.exited(); !ok {
			out[p.name] = p.cmd.Process.Pid
		}
	}
	return out
}

// exited reports whether the process has ended, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the process group and SIGKILL after 10 seconds.
func (p *process) stop() error {
	defer p.log.Close() //nolint:errcheck // Only its log.
	if ok, _ := p.exited(); ok {
		return nil
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	return nil
}

// run runs a short-lived command to completion, its output going to
// logs/<name>.log, and returns the output's tail in the error when it fails.
func (s *core) run(ctx context.Context, name, bin string, args ...string) error {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+s.Kubeconfig, "POD_NAMESPACE="+crossplaneNamespace)
	out, err := cmd.CombinedOutput()
	logPath := filepath.Join(s.opts.StateDir, "logs", name+".log")
	if f, ferr := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); ferr == nil {
		fmt.Fprintf(f, "\n==> %s %s %v\n%s", time.Now().Format(time.RFC3339), bin, args, out)
		_ = f.Close()
	}
	if err != nil {
		return errors.Errorf("%s %s: %v: %s", filepath.Base(bin), strings.Join(args[:min(2, len(args))], " "), err, why(out))
	}
	return nil
}

// why picks the line of a failed command's output that says why: the last
// one naming an error, else the last line.
func why(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(strings.ToLower(lines[i]), "error") {
			return strings.TrimSpace(lines[i])
		}
	}
	return lines[len(lines)-1]
}

// waitHTTP waits until url answers 200, or the process exits, or ctx ends.
func waitHTTP(ctx context.Context, p *process, url string, timeout time.Duration) error {
	return wait(ctx, timeout, p.name+" answering "+url, func() (bool, string, error) {
		if ok, err := p.exited(); ok {
			return false, "", errors.Errorf("%s exited (%v); see its log", p.name, err)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		rsp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, err.Error(), nil
		}
		_ = rsp.Body.Close()
		return rsp.StatusCode == http.StatusOK, rsp.Status, nil
	})
}

// waitTCP waits until addr accepts connections.
func waitTCP(ctx context.Context, p *process, addr string, timeout time.Duration) error {
	return wait(ctx, timeout, p.name+" listening on "+addr, func() (bool, string, error) {
		if ok, err := p.exited(); ok {
			return false, "", errors.Errorf("%s exited (%v); see its log", p.name, err)
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false, err.Error(), nil
		}
		_ = c.Close()
		return true, "", nil
	})
}
