package testbed

import (
	"os"
	"os/exec"
	"testing"
)

// SquidBinary returns the real Squid's path. Tests that need it fail, rather
// than skip, when it is missing.
func SquidBinary(t testing.TB) string {
	t.Helper()
	for _, p := range []string{os.Getenv("SQUID"), "/usr/sbin/squid"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("squid"); err == nil {
		return p
	}
	t.Fatal("squid is not installed: run `apt-get install -y squid` (.ci/run does this)")
	return ""
}
