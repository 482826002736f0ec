// Package local runs each proxy as a Squid process on the provider's own
// host, so the whole product runs on one machine with no cluster nodes.
//
// Each instance owns a directory under the state dir holding its squid.conf,
// htpasswd, instance record, pid file and logs. The directory, not process
// memory, is the record of what exists: after a provider restart, live
// processes are re-adopted through their pid files and dead ones restarted.
//
// local.go holds the backend (create, observe, delete, list, adopt,
// credential rotation, retention) and the instance directory's files;
// supervisor.go keeps each Squid running, restarting it with a back-off;
// process.go finds live Squids through /proc, stops them and gives their
// folders to Squid's user; ports.go claims a port per instance through a
// file; leftovers.go sweeps what a create cut short left behind.
package local

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
)

// File names inside an instance directory.
const (
	fileConf     = "squid.conf"
	fileHtpasswd = "htpasswd"
	filePrevious = "htpasswd.previous"
	fileAuth     = "auth.sh"
	fileRecord   = "instance.json"
	filePid      = "squid.pid"
	fileStarted  = "started"
	dirPorts     = ".ports"
	dirStaging   = ".staging"
)

// Config configures a local backend.
type Config struct {
	// SquidPath is the Squid binary; empty means DefaultSquidPath.
	SquidPath string
	// StateDir holds one directory per instance.
	StateDir string
	// PortRange, when set, gives each proxy a free port from it instead of
	// its spec port.
	PortRange *v1alpha1.PortRange
	// ClusterID is stamped on every instance.
	ClusterID string
	// RestartDelay is how long the supervisor waits before restarting a
	// Squid that died; zero means DefaultRestartDelay.
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
	// CredentialsSum says which credentials the instance was last given;
	// the htpasswd files themselves are the record of what it accepts.
	CredentialsSum string `json:"credentialsSum,omitempty"`
}

// Backend supervises local Squid processes.
type Backend struct {
	cfg Config
	log logging.Logger

	// live holds the settings a ProviderConfig may change while its
	// processes run (Reconfigure): the Squid binary new processes start
	// from, and the port range new instances take a port from.
	live atomic.Pointer[liveSettings]
	// squids are every binary this backend started Squids from, by which
	// a running process is known for one of its own.
	squids sync.Map

	mu    sync.Mutex
	procs map[string]*supervisor
	// records serialises rewrites of instance records.
	records sync.Mutex
}

var _ backend.Backend = &Backend{}

// DefaultSquidPath is where Debian's squid package puts the binary.
const DefaultSquidPath = "/usr/sbin/squid"

// DefaultRestartDelay is how long a Squid that died stays down before it is
// restarted, the first time (Config.RestartDelay).
const DefaultRestartDelay = 2 * time.Second

// New returns a local backend and re-adopts, or restarts, the instances its
// state dir already records.
func New(cfg Config) (*Backend, error) {
	if cfg.SquidPath == "" {
		cfg.SquidPath = DefaultSquidPath
	}
	if cfg.RestartDelay == 0 {
		cfg.RestartDelay = DefaultRestartDelay
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
	b.live.Store(&liveSettings{squidPath: cfg.SquidPath, portRange: cfg.PortRange})
	b.squids.Store(cfg.SquidPath, true)
	b.sweepLeftovers()
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

// liveSettings are what Reconfigure changes.
type liveSettings struct {
	squidPath string
	portRange *v1alpha1.PortRange
}

// Reconfigure applies a ProviderConfig's changed Squid binary and port
// range, as the other backends apply a changed configuration: new
// instances take their port from the new range and new processes start
// from the new binary; running ones keep theirs (and stay known as this
// backend's), and a port claimed already stays claimed. An empty
// squidPath means the default.
func (b *Backend) Reconfigure(squidPath string, pr *v1alpha1.PortRange) error {
	if squidPath == "" {
		squidPath = DefaultSquidPath
	}
	cur := b.live.Load()
	if cur.squidPath == squidPath && equalRange(cur.portRange, pr) {
		return nil
	}
	if _, err := os.Stat(squidPath); err != nil {
		return backend.Errorf(backend.ClassPermanent, "squid binary %s not found: install squid (apt-get install squid) or set spec.local.squidPath", squidPath)
	}
	b.squids.Store(squidPath, true)
	b.live.Store(&liveSettings{squidPath: squidPath, portRange: pr})
	b.log.Info("Local backend reconfigured", "stateDir", b.cfg.StateDir, "squidPath", squidPath, "portRange", describeRange(pr))
	return nil
}

// PortRange is the range new instances take a port from; nil when each
// takes its spec port.
func (b *Backend) PortRange() *v1alpha1.PortRange { return b.live.Load().portRange }

func (b *Backend) squidPath() string { return b.live.Load().squidPath }

func equalRange(a, c *v1alpha1.PortRange) bool {
	if a == nil || c == nil {
		return a == c
	}
	return *a == *c
}

func describeRange(pr *v1alpha1.PortRange) string {
	if pr == nil {
		return "none"
	}
	return fmt.Sprintf("%d-%d", pr.From, pr.To)
}

func (b *Backend) readRecord(name string) (*record, error) {
	raw, err := readOwned(filepath.Join(b.dir(name), fileRecord))
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

	// The staging folder comes first, locked for as long as this create
	// runs: a port claim or folder whose create holds no lock is left over
	// from a provider killed mid-create, and sweepLeftovers removes it.
	staging, err := os.MkdirTemp(filepath.Join(b.cfg.StateDir, dirStaging), s.Name+"-")
	if err != nil {
		return nil, errors.Wrap(err, "cannot create staging dir")
	}
	unlock, err := lockDir(staging)
	if err != nil {
		_ = os.RemoveAll(staging)
		return nil, err
	}
	defer unlock()
	defer os.RemoveAll(staging) //nolint:errcheck // Gone after the rename; cleanup on failure.

	port, fresh, err := b.claimPort(s, staging)
	if err != nil {
		return nil, err
	}
	release := fresh
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
	loopbackOut := ""
	if ip, err := netip.ParseAddr(host); err == nil && ip.Is4() && ip.IsLoopback() && s.Local.OutgoingAddress == "" {
		loopbackOut = EgressAddress(port)
	}
	cfg := squid.Config{
		Port:                       port,
		BindAddress:                host,
		OutgoingAddress:            string(s.Local.OutgoingAddress),
		LoopbackOutgoingAddress:    loopbackOut,
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
		// Credentials rotate in place: the helper script accepts the
		// previous file's too, until its deadline.
		cfg.HtpasswdPath = filepath.Join(final, fileHtpasswd)
		cfg.PreviousHtpasswdPath = filepath.Join(final, filePrevious)
		cfg.AuthScriptPath = filepath.Join(final, fileAuth)
		h, err := squid.Htpasswd(s.Credentials.Username, s.Credentials.Password)
		if err != nil {
			return nil, backend.Wrap(backend.ClassPermanent, errors.Wrap(err, "cannot write htpasswd"))
		}
		files[fileHtpasswd] = h
		files[fileAuth] = []byte(squid.AuthScript)
	}
	conf, err := squid.Render(cfg)
	if err != nil {
		return nil, backend.Wrap(backend.ClassPermanent, err)
	}
	files[fileConf] = conf
	rec, err := json.Marshal(record{Owner: s.Owner, Port: port, Host: host, SpecHash: s.Hash, CreatedAt: time.Now().UTC(), CredentialsSum: s.CredentialsSum})
	if err != nil {
		return nil, errors.Wrap(err, "cannot encode instance record")
	}
	files[fileRecord] = rec

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

// EgressAddress is the address a local proxy listening on IPv4 loopback
// on port sends requests to loopback destinations from, unless its spec
// names an outgoing address: 127.1.<port/256>.<port%256>, which its port
// claim makes its own, so that a state folder's proxies show a loopback
// target distinct egress IPs, as a fleet's proxies on distinct hosts show
// the internet. Other destinations go out as routing has them.
func EgressAddress(port int32) string {
	return netip.AddrFrom4([4]byte{127, 1, byte(port >> 8), byte(port)}).String()
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
	// Until when it accepts its previous credentials is what
	// RotateCredentials reads and answers; Get, which the orphan collector
	// calls for every instance, reads no more than the record.
	b.mu.Lock()
	sv := b.procs[r.Name]
	b.mu.Unlock()
	var crashLoop string
	if sv != nil {
		crashLoop = sv.crashLoop()
	}
	return &backend.Instance{
		CrashLoop:      crashLoop,
		Ref:            backend.Ref{Name: r.Name},
		ProviderID:     "local/" + r.Name,
		Host:           rec.Host,
		Port:           rec.Port,
		Phase:          phase,
		CreatedAt:      rec.CreatedAt,
		SpecHash:       rec.SpecHash,
		CredentialsSum: rec.CredentialsSum,
		Owner:          rec.Owner,
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
		// A Delete killed midway may have removed the record and left
		// the rest (its config, logs, credentials' hashes): finished
		// now. Its port claim, if left, goes with the sweep.
		if err := os.RemoveAll(b.dir(r.Name)); err != nil {
			return errors.Wrapf(err, "cannot remove instance dir of %s", r.Name)
		}
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
	// The orphan collector calls this now and then: the time to sweep
	// what killed creates left.
	b.sweepLeftovers()
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

// SetRetain rewrites the instance's record with the retain mark.
func (b *Backend) SetRetain(_ context.Context, r backend.Ref, retain bool) error {
	b.records.Lock()
	defer b.records.Unlock()
	rec, err := b.readRecord(r.Name)
	if err != nil {
		return err
	}
	if rec.Owner.Retain == retain {
		return nil
	}
	rec.Owner.Retain = retain
	return b.writeRecord(r.Name, rec)
}

// Adopt rewrites the instance's record to name the Proxy that imports it,
// if it still belongs to from.
func (b *Backend) Adopt(_ context.Context, r backend.Ref, from types.UID, to ownership.Owner) error {
	b.records.Lock()
	defer b.records.Unlock()
	rec, err := b.readRecord(r.Name)
	if err != nil {
		return err
	}
	if h := rec.Owner.Holder(); h != from && h != to.UID {
		return backend.HeldElsewhere("local instance "+r.Name, h, from)
	}
	rec.Owner = rec.Owner.AdoptedBy(to)
	return b.writeRecord(r.Name, rec)
}

// RotateCredentials compares the instance's htpasswd file, which its
// helper reads afresh for every check, with s.Credentials. To rotate it
// writes the previous file first, holding what the current one held, then
// the current one, so that at no moment neither set is accepted; Squid is
// not restarted. The previous file's header is the record of its
// deadline, so a rotation cut short anywhere completes when called again.
func (b *Backend) RotateCredentials(_ context.Context, s backend.Spec, previousUntil, now time.Time) (backend.Rotation, error) {
	var r backend.Rotation
	if s.Credentials == nil {
		return r, backend.Errorf(backend.ClassPermanent, "no credentials to rotate to")
	}
	b.records.Lock()
	defer b.records.Unlock()
	rec, err := b.readRecord(s.Name)
	if err != nil {
		return r, err
	}
	if h := rec.Owner.Holder(); h != s.Owner.Holder() {
		return r, backend.Errorf(backend.ClassTransient, "local instance %s belongs to Proxy uid %s, not %s", s.Name, h, s.Owner.Holder())
	}
	dir := b.dir(s.Name)
	if _, err := os.Lstat(filepath.Join(dir, fileAuth)); err != nil {
		return r, backend.Wrap(backend.ClassPermanent, errors.Wrapf(backend.ErrNoRotation, "local instance %s", s.Name))
	}
	current, err := readOwned(filepath.Join(dir, fileHtpasswd))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return r, errors.Wrapf(err, "cannot read the credentials of instance %s", s.Name)
	}
	previous, err := readOwned(filepath.Join(dir, filePrevious))
	switch {
	case errors.Is(err, os.ErrNotExist):
		previous = nil
	case err != nil:
		// Not a plain file: replaced, or removed, below.
		previous = []byte{}
	}
	until, held := squid.PreviousDeadline(previous)
	switch {
	case !squid.HtpasswdMatches(current, s.Credentials.Username, s.Credentials.Password):
		h, err := squid.Htpasswd(s.Credentials.Username, s.Credentials.Password)
		if err != nil {
			return r, backend.Wrap(backend.ClassPermanent, errors.Wrap(err, "cannot write htpasswd"))
		}
		if err := b.keepPrevious(dir, current, previousUntil); err != nil {
			return r, err
		}
		if err := writeOwned(dir, fileHtpasswd, h, true); err != nil {
			return r, err
		}
		r.Rotated = true
		until, held = previousUntil, !previousUntil.IsZero()
	case previous != nil && (!held || !now.Before(until)):
		if err := b.keepPrevious(dir, nil, time.Time{}); err != nil {
			return r, err
		}
		r.Retired = true
		held = false
	}
	if held {
		r.PreviousUntil = until
	}
	if rec.CredentialsSum != s.CredentialsSum {
		rec.CredentialsSum = s.CredentialsSum
		if err := b.writeRecord(s.Name, rec); err != nil {
			return r, err
		}
	}
	return r, nil
}

// keepPrevious writes the previous htpasswd file, accepted until until, or
// removes it when until is zero.
func (b *Backend) keepPrevious(dir string, htpasswd []byte, until time.Time) error {
	if until.IsZero() {
		if err := os.Remove(filepath.Join(dir, filePrevious)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return errors.Wrap(err, "cannot remove the previous credentials")
		}
		return nil
	}
	return writeOwned(dir, filePrevious, append(squid.PreviousHeader(until), htpasswd...), true)
}

// writeOwned replaces a file of an instance directory, given to Squid's
// user when squid is set, through a temporary file renamed into place. The
// folder is Squid's user's: a file found there under the temporary name
// (a symlink to one of root's, say) is removed, never written through, and
// the file is created anew and given away by its descriptor.
func writeOwned(dir, name string, content []byte, squid bool) error {
	tmp := filepath.Join(dir, name+".tmp")
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return errors.Wrapf(err, "cannot write %s", name)
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return errors.Wrapf(err, "cannot write %s", name)
	}
	_, err = f.Write(content)
	if uid, gid, idErr := squidIDs(); squid && err == nil {
		if err = idErr; err == nil && uid >= 0 {
			err = f.Chown(uid, gid)
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return errors.Wrapf(err, "cannot write %s", name)
	}
	return errors.Wrapf(os.Rename(tmp, filepath.Join(dir, name)), "cannot write %s", name)
}

// readOwned reads a regular file of an instance directory, which is
// Squid's user's, as root would read nothing that user planted there: no
// symlink is followed, a FIFO does not block the open, a device or a file
// with other links is refused, and no more is read than such a file needs.
func readOwned(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close() //nolint:errcheck // Read only.
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !fi.Mode().IsRegular() || (ok && st.Nlink != 1) {
		return nil, errors.Errorf("%s is not a plain file", path)
	}
	return io.ReadAll(io.LimitReader(f, 64<<10))
}

// writeRecord replaces the instance's record through a temporary file
// renamed into place.
func (b *Backend) writeRecord(name string, rec *record) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return errors.Wrap(err, "cannot encode instance record")
	}
	return errors.Wrapf(writeOwned(b.dir(name), fileRecord, raw, false), "cannot write instance %s", name)
}
