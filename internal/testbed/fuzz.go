package testbed

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// FuzzMain is TestMain for a package whose fuzz targets use the test bed.
// A fuzzing coordinator starts one test bed for all its workers, which
// attach to it: the coordinator may kill a worker at any moment (at the end
// of -fuzztime, say), which would leave an apiserver of the worker's own
// behind and hold the coordinator up on its output. Everything else runs as
// Lazy.Main does.
func (l *Lazy) FuzzMain(m *testing.M) {
	flag.Parse()
	fuzz, worker := flag.Lookup("test.fuzz"), flag.Lookup("test.fuzzworker")
	if fuzz == nil || fuzz.Value.String() == "" || (worker != nil && worker.Value.String() == "true") || os.Getenv(SharedKubeconfig) != "" {
		l.Main(m)
		return
	}
	os.Exit(coordinate(m))
}

func coordinate(m *testing.M) int {
	env, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer env.Stop() //nolint:errcheck // Best effort, at exit.
	dir, err := os.MkdirTemp("", "fuzz-testbed-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir) //nolint:errcheck // Best effort, at exit.
	kc := filepath.Join(dir, "kubeconfig")
	if err := env.WriteKubeconfig(kc); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_ = os.Setenv(SharedKubeconfig, kc)
	return m.Run()
}
