package local

import (
	"os"
	"path/filepath"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestSweepLeftovers: what a create killed midway left (a staging folder,
// a port claim) is removed; what a create under way holds is not, nor the
// claim of an instance in place.
func TestSweepLeftovers(t *testing.T) {
	dir := testbed.SquidStateDir(t)
	b := newBackend(t, dir, nil)
	write := func(path, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	staging := filepath.Join(dir, dirStaging)
	// Killed: its staging folder and port claim, with no lock held.
	write(filepath.Join(staging, "egress-killed-123", fileConf), "")
	write(b.portFile(32001), "egress-killed")
	// Under way: its staging folder locked, its port claimed.
	busy := filepath.Join(staging, "egress-busy-456")
	write(filepath.Join(busy, fileConf), "")
	unlock, err := lockDir(busy)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	write(b.portFile(32002), "egress-busy")
	// In place: its record names its port; a stale claim of another.
	write(filepath.Join(dir, "egress-done", fileRecord), `{"port": 32003}`)
	write(b.portFile(32003), "egress-done")
	write(b.portFile(32004), "egress-done")
	// Empty: left by an older provider killed between creating a claim
	// and writing it.
	write(b.portFile(32005), "")

	b.sweepLeftovers()

	for path, want := range map[string]bool{
		filepath.Join(staging, "egress-killed-123"): false,
		b.portFile(32001): false,
		busy:              true,
		b.portFile(32002): true,
		b.portFile(32003): true,
		b.portFile(32004): false,
		b.portFile(32005): false,
	} {
		_, err := os.Stat(path)
		if got := err == nil; got != want {
			t.Errorf("%s: want kept=%t, got %t", path, want, got)
		}
	}
}
