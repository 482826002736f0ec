package local

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
)

// lockDir takes an exclusive lock on a folder for as long as the process
// holds it open: the kernel drops it when the process dies, SIGKILL
// included, which is how a sweep tells a create under way from one that
// was killed.
func lockDir(dir string) (func(), error) {
	f, err := os.Open(dir) //nolint:gosec // A folder of our own state dir.
	if err != nil {
		return nil, errors.Wrap(err, "cannot open staging dir")
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil { //nolint:gosec // A descriptor fits an int.
		_ = f.Close()
		return nil, errors.Wrap(err, "cannot lock staging dir")
	}
	return func() { _ = f.Close() }, nil
}

// tryLockDir takes the lock if nobody holds it.
func tryLockDir(dir string) (func(), bool) {
	f, err := os.Open(dir) //nolint:gosec // A folder of our own state dir.
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil { //nolint:gosec // A descriptor fits an int.
		_ = f.Close()
		return nil, false
	}
	return func() { _ = f.Close() }, true
}

// sweepLeftovers removes what a provider killed mid-create left behind:
// staging folders no create holds locked, and port claims of instances
// that were never moved into place and have no create under way. Either
// would stay for ever (a claim with no instance keeps its port from every
// Proxy, its own included once deleted). Creates in this or another
// process sharing the state dir are safe: a create locks its staging folder
// before it claims a port, and a claim is judged only after the locks.
func (b *Backend) sweepLeftovers() {
	stagingDir := filepath.Join(b.cfg.StateDir, dirStaging)
	staged, _ := os.ReadDir(stagingDir)
	for _, e := range staged {
		path := filepath.Join(stagingDir, e.Name())
		unlock, ok := tryLockDir(path)
		if !ok {
			continue // a create under way
		}
		if err := os.RemoveAll(path); err == nil {
			b.log.Info("Removed the staging folder of a create that did not finish", "folder", path)
		}
		unlock()
	}
	// Claims are judged under the ports folder's lock, which claimPort
	// takes too: a create cannot take a claim over between the judgment
	// and the removal.
	unlock, err := lockDir(filepath.Join(b.cfg.StateDir, dirPorts))
	if err != nil {
		return
	}
	defer unlock()
	ports, _ := os.ReadDir(filepath.Join(b.cfg.StateDir, dirPorts))
	for _, p := range ports {
		file := filepath.Join(b.cfg.StateDir, dirPorts, p.Name())
		owner, err := os.ReadFile(file) //nolint:gosec // A file of our own state dir.
		if err != nil {
			continue
		}
		if len(owner) == 0 {
			// Claims appear whole: an empty one was left by a provider
			// that created it before writing it, killed between the two.
			if err := os.Remove(file); err == nil {
				b.log.Info("Released an empty port claim", "port", p.Name())
			}
			continue
		}
		// The claim exists, so its create locked its staging folder
		// before making it: either the lock is held still, or the create
		// ended (its record in place, checked next), or it was killed.
		if b.creating(string(owner)) {
			continue
		}
		rec, err := b.readRecord(string(owner))
		switch {
		case err == nil && strconv.Itoa(int(rec.Port)) == p.Name():
			continue
		case err != nil && !backend.IsNotFound(err):
			continue // unreadable now, not absent: judged at the next sweep
		case err != nil:
			if _, serr := os.Lstat(b.dir(string(owner))); serr == nil {
				continue // a folder without its record: Delete finishes it
			}
		}
		if err := os.Remove(file); err == nil {
			b.log.Info("Released the port claim of a create that did not finish", "port", p.Name(), "instance", string(owner))
		}
	}
}

// creating says whether a create of instance name holds its staging
// folder's lock.
func (b *Backend) creating(name string) bool {
	dirs, _ := filepath.Glob(filepath.Join(b.cfg.StateDir, dirStaging, name+"-*"))
	for _, d := range dirs {
		unlock, ok := tryLockDir(d)
		if !ok {
			return true
		}
		unlock()
	}
	return false
}
