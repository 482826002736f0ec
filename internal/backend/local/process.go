package local

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
)

// livePid returns the pid of the instance's Squid if that process lives and
// runs this instance's config, else 0. Checking the command line keeps a
// recycled pid from passing for our Squid.
//
// A Squid that has not written its pid file yet is found by its command
// line: one started by a provider killed a moment later would otherwise
// pass unseen, and the next provider would start a second Squid for the
// instance, which fails to bind the port for ever after.
func (b *Backend) livePid(name string) int {
	raw, err := readOwned(filepath.Join(b.dir(name), filePid))
	if err != nil {
		return b.runningConfig(name)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || pid <= 0 {
		return b.runningConfig(name)
	}
	if !b.runs(pid, name) {
		return b.runningConfig(name)
	}
	return pid
}

// runningConfig returns the pid of a live Squid running the instance's
// config, found through /proc; 0 when there is none.
func (b *Backend) runningConfig(name string) int {
	for _, pid := range Processes(b.dir(name)) {
		if b.runs(pid, name) {
			return pid
		}
	}
	return 0
}

// runs says whether pid is a live Squid running the instance's config.
func (b *Backend) runs(pid int, name string) bool {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !slices.Contains(strings.Split(string(cmdline), "\x00"), filepath.Join(b.dir(name), fileConf)) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err == nil {
		// A zombie has exited; it only waits to be reaped.
		if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) > 0 && f[0] == "Z" {
			return false
		}
	}
	// The Squid binary, not any process that names the config (an
	// editor, a tail of it): Delete would kill it, and no Squid would
	// be started. A binary replaced by an upgrade reads "(deleted)".
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return false
	}
	exe = strings.TrimSuffix(exe, " (deleted)")
	ours := false
	b.squids.Range(func(path, _ any) bool {
		want, err := filepath.EvalSymlinks(path.(string)) //nolint:forcetypeassert // Only paths are stored.
		ours = err == nil && exe == want
		return !ours
	})
	return ours
}

// Processes lists the live Squid processes running a config under stateDir.
// It looks through /proc rather than the pid files, so it also finds a Squid
// whose instance record is gone; auth helpers, which name the folder too,
// zombies, and a Squid's forks that have not yet exec'd their helper are
// left out.
func Processes(stateDir string) []int {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	parents := map[int]int{}
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), stateDir) || !strings.Contains(string(b), fileConf) {
			continue
		}
		stat, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "stat"))
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(stat[i+1:])) // state, ppid, ...
		if len(fields) < 2 || fields[0] == "Z" {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		parents[pid], _ = strconv.Atoi(fields[1])
	}
	var pids []int
	for pid, ppid := range parents {
		// A Squid forks to start its helpers; until the fork execs, it
		// has its parent's command line, and it is not another Squid.
		if _, forked := parents[ppid]; !forked {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids
}

// StopAll terminates every Squid running under stateDir and returns how many
// it stopped. A provider shutting down leaves its Squids running for the next
// one to re-adopt, so whoever ends the whole environment (make run on Ctrl-C)
// stops them with this.
func StopAll(stateDir string) int {
	pids := Processes(stateDir)
	var wg sync.WaitGroup
	for _, pid := range pids {
		wg.Add(1)
		go func() { defer wg.Done(); terminate(pid) }()
	}
	wg.Wait()
	return len(pids)
}

// terminate stops a Squid quickly: SIGTERM, then SIGKILL after 3s.
func terminate(pid int) {
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// chownToSquidUser gives the instance dir to Squid's effective user when the
// provider runs as root, because Squid then drops to that user and must
// write its logs and pid file and read the htpasswd file.
func chownToSquidUser(dir string) error {
	uid, gid, err := squidIDs()
	if err != nil || uid < 0 {
		return err
	}
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chown(p, uid, gid)
	})
}

// squidIDs are the uid and gid Squid drops to when the provider runs as
// root; -1 when it does not, and nothing needs to be given away.
func squidIDs() (int, int, error) {
	if os.Geteuid() != 0 {
		return -1, -1, nil
	}
	u, err := user.Lookup("proxy")
	if err != nil {
		return -1, -1, backend.Errorf(backend.ClassPermanent, "squid's user 'proxy' does not exist: install squid (apt-get install squid)")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return uid, gid, nil
}

// reachableBySquid checks, when the provider runs as root and Squid will
// drop to its own user, that every folder above the state dir lets that user
// through; otherwise Squid would die at start-up unable to open its logs.
func reachableBySquid(dir string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return errors.Wrap(err, "cannot resolve state dir")
	}
	for d := abs; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return errors.Wrapf(err, "cannot stat %s", d)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return backend.Errorf(backend.ClassPermanent, "squid's user cannot reach state dir %s: %s has mode %o; run chmod o+x %s or choose another stateDir", abs, d, fi.Mode().Perm(), d)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}
