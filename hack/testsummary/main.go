// Command testsummary reads `go test -json` on stdin and prints what a person
// wants from a long run: each package's result, the full output of failed
// tests only, and a last line counting tests ("N passed, N failed, N
// skipped") followed by the failed tests' names. It exits non-zero when any
// test or package failed, so a pipeline can rely on it. With -v it also
// prints what passed tests logged (make e2e: its timings are the point).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// event is the subset of test2json's output this command reads.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// summary accumulates a run.
type summary struct {
	passed, failed, skipped int
	failures                []string
	packageFailed           bool
	// output buffers each running test's lines until its verdict.
	output map[string]*strings.Builder
	// verbose prints passed tests' output too.
	verbose bool
}

func (s *summary) add(w io.Writer, e event) {
	if e.Test == "" {
		// Package-level lines (ok/FAIL, TestMain output) are short; keep them.
		if e.Action == "fail" {
			s.packageFailed = true
			s.unfinished(w, e.Package)
		}
		if e.Output != "" && !strings.HasPrefix(e.Output, "=== ") && e.Output != "PASS\n" {
			fmt.Fprint(w, e.Output)
		}
		return
	}
	key := e.Package + " " + e.Test
	switch e.Action {
	case "output":
		b, ok := s.output[key]
		if !ok {
			b = &strings.Builder{}
			s.output[key] = b
		}
		b.WriteString(e.Output)
	case "pass":
		s.passed++
		if b, ok := s.output[key]; ok && s.verbose {
			fmt.Fprint(w, b.String())
		}
		delete(s.output, key)
	case "skip":
		s.skipped++
		delete(s.output, key)
	case "fail":
		s.failed++
		s.failures = append(s.failures, key)
		if b, ok := s.output[key]; ok {
			fmt.Fprint(w, b.String())
		}
		delete(s.output, key)
	}
}

// unfinished prints what the tests of pkg that never got a verdict
// logged: a test binary that exited or was killed mid-test (os.Exit, a
// fatal error, a signal) fails its package without failing a test, and
// what it said before is the only clue.
func (s *summary) unfinished(w io.Writer, pkg string) {
	var keys []string
	for key := range s.output {
		if strings.HasPrefix(key, pkg+" ") {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	for _, key := range keys {
		fmt.Fprintf(w, "--- NO VERDICT: %s (its package ended while it ran); it logged:\n%s", key, s.output[key].String())
		delete(s.output, key)
	}
}

func (s *summary) close(w io.Writer) {
	sort.Strings(s.failures)
	fmt.Fprintf(w, "\n%d passed, %d failed, %d skipped\n", s.passed, s.failed, s.skipped)
	for _, f := range s.failures {
		fmt.Fprintln(w, "FAILED:", f)
	}
}

func main() {
	verbose := flag.Bool("v", false, "Print the output of passed tests too.")
	flag.Parse()
	s := &summary{output: map[string]*strings.Builder{}, verbose: *verbose}
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// Build errors and other non-JSON lines pass through as they are.
			fmt.Println(sc.Text())
			continue
		}
		s.add(os.Stdout, e)
	}
	s.close(os.Stdout)
	if s.failed > 0 || s.packageFailed {
		os.Exit(1)
	}
}
