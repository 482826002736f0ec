// Package local runs each proxy as a Squid process on the provider's own
// host, so the whole product runs on one machine with no cluster nodes.
//
// Each instance owns a directory under the state dir holding its squid.conf,
// htpasswd, instance record, pid file and logs. The directory, not process
// memory, is the record of what exists: after a provider restart, live
// processes are re-adopted through their pid files and dead ones restarted.
package local

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
)

// File names inside an instance directory.
const (
	fileConf     = "squid.conf"
	fileHtpasswd = "htpasswd"
	fileRecord   = "instance.json"
	filePid      = "squid.pid"
	fileStarted  = "started"
	dirPorts     = ".ports"
	dirStaging   = ".staging"
)

// Config configures a local backend.
type Config struct {
	// SquidPath is the Squid binary.
	SquidPath string
	// StateDir holds one directory per instance.
	StateDir string
	// PortRange, when set, gives each proxy a free port from it instead of
	// its spec port.
	PortRange *v1alpha1.PortRange
	// ClusterID is stamped on every instance.
	ClusterID string
	// RestartDelay is how long the supervisor waits before restarting a
	// Squid that died; zero means 2s.
	RestartDelay time.Duration
	// Logger for supervision events.
	Logger logging.Logger
}

// record is what an instance directory says about its instance.
type record struct {
	Owner     ownership.Owner `json:"owner"`
	Port      int32           `json:"port"`
	Host      string          `json:"host"`
	SpecHash  string          `json:"specHash"`
	CreatedAt time.Time       `json:"createdAt"`
}

// Backend supervises local Squid processes.
type Backend struct {
	cfg Config
	log logging.Logger

	mu    sync.Mutex
	procs map[string]*supervisor
}

var _ backend.Backend = &Backend{}

// New returns a local backend and re-adopts, or restarts, the instances its
// state dir already records.
func New(cfg Config) (*Backend, error) {
	if cfg.SquidPath == "" {
		cfg.SquidPath = "/usr/sbin/squid"
	}
	if cfg.RestartDelay == 0 {
		cfg.RestartDelay = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = logging.NewNopLogger()
	}
	if _, err := os.Stat(cfg.SquidPath); err != nil {
		return nil, backend.Errorf(backend.ClassPermanent, "squid binary %s not found: install squid (apt-get install squid) or set spec.local.squidPath", cfg.SquidPath)
	}
	for _, d := range []string{cfg.StateDir, filepath.Join(cfg.StateDir, dirPorts), filepath.Join(cfg.StateDir, dirStaging)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, errors.Wrapf(err, "cannot create state dir %s", d)
		}
	}
	if err := reachableBySquid(cfg.StateDir); err != nil {
		return nil, err
	}
	b := &Backend{cfg: cfg, log: cfg.Logger, procs: map[string]*supervisor{}}
	entries, err := os.ReadDir(cfg.StateDir)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read state dir")
	}
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if _, err := b.readRecord(e.Name()); err != nil {
			continue
		}
		b.supervise(e.Name())
	}
	return b, nil
}

func (b *Backend) dir(name string) string { return filepath.Join(b.cfg.StateDir, name) }

func (b *Backend) readRecord(name string) (*record, error) {
	raw, err := os.ReadFile(filepath.Join(b.dir(name), fileRecord))
	if errors.Is(err, os.ErrNotExist) {
		return nil, backend.Errorf(backend.ClassNotFound, "local instance %s not found", name)
	}
	if err != nil {
		return nil, errors.Wrapf(err, "cannot read instance %s", name)
	}
	r := &record{}
	if err := json.Unmarshal(raw, r); err != nil {
		return nil, errors.Wrapf(err, "cannot parse instance %s", name)
	}
	return r, nil
}

// Create writes the instance directory and starts Squid. The directory is
// assembled under a staging name and renamed into place, so an instance
// either exists whole or not at all.
func (b *Backend) Create(ctx context.Context, s backend.Spec) (*backend.Instance, error) {
	if s.Local == nil {
		return nil, backend.Errorf(backend.ClassPermanent, "the local backend needs spec.forProvider.local")
	}
	if _, err := b.readRecord(s.Name); err == nil {
		return b.Get(ctx, s.Ref)
	}

	port, err := b.claimPort(s)
	if err != nil {
		return nil, err
	}
	release := true
	defer func() {
		if release {
			b.releasePort(port, s.Name)
		}
	}()

	host := string(s.Local.BindAddress)
	if host == "" {
		host = "127.0.0.1"
	}
	final := b.dir(s.Name)
	cfg := squid.Config{
		Port:                       port,
		BindAddress:                host,
		OutgoingAddress:            string(s.Local.OutgoingAddress),
		AllowedSourceRanges:        s.AllowedSourceRanges,
		AllowedPrivateDestinations: s.AllowedPrivateDestinations,
		PidFile:                    filepath.Join(final, filePid),
		AccessLog:                  "stdio:" + filepath.Join(final, "access.log"),
		CacheLog:                   filepath.Join(final, "cache.log"),
		CoreDumpDir:                final,
		AllowLoopbackDestinations:  s.AllowLoopbackDestinations,
		OwnAddresses:               hostAddresses(host),
	}
	files := map[string][]byte{}
	if s.Credentials != nil {
		cfg.HtpasswdPath = filepath.Join(final, fileHtpasswd)
		h, err := squid.Htpasswd(s.Credentials.Username, s.Credentials.Password)
		if err != nil {
			return nil, backend.Wrap(backend.ClassPermanent, errors.Wrap(err, "cannot write htpasswd"))
		}
		files[fileHtpasswd] = h
	}
	conf, err := squid.Render(cfg)
	if err != nil {
		return nil, backend.Wrap(backend.ClassPermanent, err)
	}
	files[fileConf] = conf
	rec, err := json.Marshal(record{Owner: s.Owner, Port: port, Host: host, SpecHash: s.Hash, CreatedAt: time.Now().UTC()})
	if err != nil {
		return nil, errors.Wrap(err, "cannot encode instance record")
	}
	files[fileRecord] = rec

	staging, err := os.MkdirTemp(filepath.Join(b.cfg.StateDir, dirStaging), s.Name+"-")
	if err != nil {
		return nil, errors.Wrap(err, "cannot create staging dir")
	}
	defer os.RemoveAll(staging) //nolint:errcheck // Gone after the rename; cleanup on failure.
	for f, content := range files {
		if err := os.WriteFile(filepath.Join(staging, f), content, 0o600); err != nil {
			return nil, errors.Wrapf(err, "cannot write %s", f)
		}
	}
	if err := chownToSquidUser(staging); err != nil {
		return nil, err
	}
	if err := os.Rename(staging, final); err != nil {
		return nil, errors.Wrap(err, "cannot move instance dir into place")
	}
	release = false
	b.supervise(s.Name)
	return b.Get(ctx, s.Ref)
}

// Get reports an instance. It is Provisioning until its Squid is first
// launched and Running after that, also while the supervisor restarts a
// Squid that died: like a pod whose container restarts, the instance stays,
// and the probe (through thresholds) says whether it serves.
func (b *Backend) Get(_ context.Context, r backend.Ref) (*backend.Instance, error) {
	rec, err := b.readRecord(r.Name)
	if err != nil {
		return nil, err
	}
	phase := v1alpha1.InstancePhaseProvisioning
	if _, err := os.Stat(filepath.Join(b.dir(r.Name), fileStarted)); err == nil || b.livePid(r.Name) > 0 {
		phase = v1alpha1.InstancePhaseRunning
	}
	return &backend.Instance{
		Ref:        backend.Ref{Name: r.Name},
		ProviderID: fmt.Sprintf("local/%d", rec.Port),
		Host:       rec.Host,
		Port:       rec.Port,
		Phase:      phase,
		CreatedAt:  rec.CreatedAt,
		SpecHash:   rec.SpecHash,
		Owner:      rec.Owner,
	}, nil
}

// Delete stops the process and removes every file of the instance.
func (b *Backend) Delete(_ context.Context, r backend.Ref) error {
	b.mu.Lock()
	sv := b.procs[r.Name]
	delete(b.procs, r.Name)
	b.mu.Unlock()
	if sv != nil {
		sv.stop()
	}
	// A process this provider never supervised (a stray) goes too.
	if pid := b.livePid(r.Name); pid > 0 {
		terminate(pid)
	}
	rec, err := b.readRecord(r.Name)
	if backend.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := os.RemoveAll(b.dir(r.Name)); err != nil {
		return errors.Wrapf(err, "cannot remove instance dir of %s", r.Name)
	}
	b.releasePort(rec.Port, r.Name)
	return nil
}

// ListOwned lists the instances of this cluster in the state dir.
func (b *Backend) ListOwned(ctx context.Context) ([]backend.Instance, error) {
	entries, err := os.ReadDir(b.cfg.StateDir)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read state dir")
	}
	var out []backend.Instance
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		i, err := b.Get(ctx, backend.Ref{Name: e.Name()})
		if err != nil || i.Owner.ClusterID != b.cfg.ClusterID {
			continue
		}
		out = append(out, *i)
	}
	return out, nil
}

// Close stops supervising without stopping the processes, as a provider
// shutting down does: the next provider re-adopts them.
func (b *Backend) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, sv := range b.procs {
		sv.detach()
	}
	b.procs = map[string]*supervisor{}
}

// claimPort reserves a port with a file created O_EXCL under .ports, which
// is atomic between concurrent creates in this and any other provider
// process sharing the state dir, so two proxies never get the same port.
// With a port range, ports another program already listens on are skipped.
func (b *Backend) claimPort(s backend.Spec) (int32, error) {
	candidates := []int32{s.Port}
	if pr := b.cfg.PortRange; pr != nil {
		candidates = candidates[:0]
		for p := pr.From; p <= pr.To; p++ {
			candidates = append(candidates, p)
		}
	}
	host := string(s.Local.BindAddress)
	for _, p := range candidates {
		f, err := os.OpenFile(b.portFile(p), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			if !errors.Is(err, os.ErrExist) {
				return 0, errors.Wrap(err, "cannot claim port")
			}
			if owner, _ := os.ReadFile(b.portFile(p)); string(owner) == s.Name {
				return p, nil
			}
			continue
		}
		_, _ = f.WriteString(s.Name)
		_ = f.Close()
		if b.cfg.PortRange != nil && !bindable(host, p) {
			// Someone outside this provider holds it; keep our claim file
			// out of the way and try the next.
			_ = os.Remove(b.portFile(p))
			continue
		}
		return p, nil
	}
	if b.cfg.PortRange != nil {
		return 0, backend.Errorf(backend.ClassQuota, "no free port in %d-%d: widen spec.local.portRange of the ProviderConfig", b.cfg.PortRange.From, b.cfg.PortRange.To)
	}
	owner, _ := os.ReadFile(b.portFile(s.Port))
	return 0, backend.Errorf(backend.ClassPermanent, "port %d is taken by local proxy %s: choose another spec.forProvider.port or give the ProviderConfig a portRange", s.Port, owner)
}

func (b *Backend) portFile(p int32) string {
	return filepath.Join(b.cfg.StateDir, dirPorts, strconv.Itoa(int(p)))
}

func (b *Backend) releasePort(p int32, name string) {
	if owner, err := os.ReadFile(b.portFile(p)); err == nil && string(owner) == name {
		_ = os.Remove(b.portFile(p))
	}
}

func bindable(host string, p int32) bool {
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(int(p))))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// livePid returns the pid of the instance's Squid if that process lives and
// runs this instance's config, else 0. Checking the command line keeps a
// recycled pid from passing for our Squid.
func (b *Backend) livePid(name string) int {
	raw, err := os.ReadFile(filepath.Join(b.dir(name), filePid))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), filepath.Join(b.dir(name), fileConf)) {
		return 0
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err == nil {
		// A zombie has exited; it only waits to be reaped.
		if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) > 0 && f[0] == "Z" {
			return 0
		}
	}
	return pid
}

// Processes lists the live Squid processes running a config under stateDir.
// It looks through /proc rather than the pid files, so it also finds a Squid
// whose instance record is gone; auth helpers, which name the folder too, and
// zombies are left out.
func Processes(stateDir string) []int {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []int
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), stateDir) || !strings.Contains(string(b), fileConf) {
			continue
		}
		stat, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "stat"))
		if i := strings.LastIndexByte(string(stat), ')'); i > 0 && strings.HasPrefix(strings.TrimSpace(string(stat[i+1:])), "Z") {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		pids = append(pids, pid)
	}
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
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("proxy")
	if err != nil {
		return backend.Errorf(backend.ClassPermanent, "squid's user 'proxy' does not exist: install squid (apt-get install squid)")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chown(p, uid, gid)
	})
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
	out, err := os.OpenFile(filepath.Join(dir, "squid.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
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
	return errors.Wrap(os.WriteFile(filepath.Join(dir, fileStarted), nil, 0o644), "cannot record start")
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

// hostAddresses are the host's own addresses a proxy listening on all of
// them (bind 0.0.0.0 or ::) must not reach: every interface address but
// loopback, which the loopback rule governs. A proxy bound to one address
// has that one denied by the config generator already.
func hostAddresses(bind string) []string {
	if a, err := netip.ParseAddr(bind); err != nil || !a.IsUnspecified() {
		return nil
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []string
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if ip = ip.Unmap(); ok && !ip.IsLoopback() {
			out = append(out, ip.String())
		}
	}
	return out
}

// SetRetain rewrites the instance's record with the retain mark, through a
// temporary file renamed into place.
func (b *Backend) SetRetain(_ context.Context, r backend.Ref, retain bool) error {
	rec, err := b.readRecord(r.Name)
	if err != nil {
		return err
	}
	if rec.Owner.Retain == retain {
		return nil
	}
	rec.Owner.Retain = retain
	raw, err := json.Marshal(rec)
	if err != nil {
		return errors.Wrap(err, "cannot encode instance record")
	}
	tmp := filepath.Join(b.dir(r.Name), fileRecord+".tmp")
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return errors.Wrapf(err, "cannot write instance %s", r.Name)
	}
	return errors.Wrapf(os.Rename(tmp, filepath.Join(b.dir(r.Name), fileRecord)), "cannot write instance %s", r.Name)
}
