package main

import (
	"strings"
	"testing"
)

// TestUnfinishedPrinted: a package that fails with a test still running
// (its binary exited or was killed) prints what that test logged, and
// not what tests of other packages are logging meanwhile.
func TestUnfinishedPrinted(t *testing.T) {
	s := &summary{output: map[string]*strings.Builder{}}
	var out strings.Builder
	for _, e := range []event{
		{Action: "output", Package: "p", Test: "TestA", Output: "=== RUN   TestA\n"},
		{Action: "output", Package: "p", Test: "TestA", Output: "fatal error: concurrent map writes\n"},
		{Action: "output", Package: "q", Test: "TestB", Output: "still running\n"},
		{Action: "output", Package: "p", Output: "FAIL\tp\t1.0s\n"},
		{Action: "fail", Package: "p"},
	} {
		s.add(&out, e)
	}
	if got := out.String(); !strings.Contains(got, "NO VERDICT: p TestA") || !strings.Contains(got, "concurrent map writes") || strings.Contains(got, "still running") {
		t.Errorf("printed:\n%s", got)
	}
	if !s.packageFailed {
		t.Error("the package failed")
	}
}
