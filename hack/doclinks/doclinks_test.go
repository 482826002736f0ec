package doclinks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// repoRoot is the folder of the module's go.mod, above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's folder")
		}
		dir = parent
	}
}

// TestRepository checks the repository's own Markdown: the README, the
// other pages at the root and docs/.
func TestRepository(t *testing.T) {
	root := repoRoot(t)
	files, err := Files(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"README.md", "BENCHMARKS.md", "docs/development.md"} {
		if !contains(files, want) {
			t.Errorf("Files(%s) = %v, without %s", root, files, want)
		}
	}
	problems, err := Check(root, files)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}

	links, makes := 0, 0
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			t.Fatal(err)
		}
		d := Parse(string(b))
		links += len(d.Links)
		makes += len(d.Makes)
	}
	// A parser that found nothing would pass everything.
	if links < 50 || makes < 50 {
		t.Errorf("found %d links and %d make commands in %v: the parser has lost them", links, makes, files)
	}
}

// TestEveryPageIsInTheREADME: the README's table of links is the index of
// docs/, so every page there must be linked from it.
func TestEveryPageIsInTheREADME(t *testing.T) {
	root := repoRoot(t)
	files, err := Files(root)
	if err != nil {
		t.Fatal(err)
	}
	unlinked, err := Unlinked(root, "README.md", files)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range unlinked {
		t.Errorf("README.md links to no %s: add it to the table of documentation", f)
	}
}

// TestCatchesBreakage feeds the checker a tree with one broken reference
// of each kind beside sound ones, and checks it reports exactly the broken.
func TestCatchesBreakage(t *testing.T) {
	root := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		path := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("Makefile", strings.Join([]string{
		"SHELL := /usr/bin/env bash",
		"TARGETS ?= ./a:B ./c:D",
		"export ASSETS := $(BIN)",
		".PHONY: help declared-only",
		"help: ## Show the targets.",
		"\t@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST)",
		"build test: deps",
		"\tgo test ./...",
		"deps:: ; @true",
		"define recipe",
		"in-define: nothing",
		"endef",
		"%.o: %.c",
		"",
	}, "\n"))
	write("README.md", strings.Join([]string{
		"# Title", // 1
		"",        // 2
		"[ok](docs/page.md) [ok](docs/page.md#a-b)",                  // 3
		"[missing page](docs/gone.md)",                               // 4
		"[missing anchor](docs/page.md#nowhere)",                     // 5
		"[here](#title) [not here](#absent)",                         // 6
		"[web](https://example.com/x#y) [mail](mailto:a@b)",          // 7
		"`[not a link](gone.md)` and `make build` and `make nosuch`", // 8
		"",                                       // 9
		"```sh",                                  // 10
		"make test && make FOO=bar -j 4 unknown", // 11
		"make -C elsewhere anything   # make notchecked", // 12
		"sudo make help; make declared-only | cat",       // 13
		"make in-define",   // 14
		"## Not a heading", // 15
		"```",              // 16
		"[split",           // 17
		"link](docs/gone-too.md) and make notcode", // 18
		"",                                // 19
		"```go",                           // 20
		"m := make(map[string]bool)",      // 21
		"```",                             // 22
		"[not a heading](#not-a-heading)", // 23
		"[dir](docs) [dup](docs/page.md#a-b-1) [dup2](docs/page.md#a-b-2)", // 24
		"",
	}, "\n"))
	write("docs/page.md", strings.Join([]string{
		"# Page",
		"",
		"## A `b`",
		"",
		"### A: b",
		"",
		"[back](../README.md#title) [up](../Makefile)",
		"",
	}, "\n"))

	files, err := Files(root)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"README.md", "docs/page.md"}, files); diff != "" {
		t.Errorf("Files: -want, +got:\n%s", diff)
	}
	problems, err := Check(root, files)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range problems {
		got = append(got, p.String())
	}
	want := []string{
		"README.md:4: link to docs/gone.md: no such file or directory",
		"README.md:5: link to docs/page.md#nowhere: docs/page.md has no heading with the anchor #nowhere",
		"README.md:6: link to #absent: README.md has no heading with the anchor #absent",
		"README.md:17: link to docs/gone-too.md: no such file or directory",
		"README.md:23: link to #not-a-heading: README.md has no heading with the anchor #not-a-heading",
		"README.md:24: link to docs/page.md#a-b-2: docs/page.md has no heading with the anchor #a-b-2",
		"README.md:8: `make nosuch`: the Makefile has no target \"nosuch\"",
		"README.md:11: `make unknown`: the Makefile has no target \"unknown\"",
		"README.md:14: `make in-define`: the Makefile has no target \"in-define\"",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("problems: -want, +got:\n%s", diff)
	}

	unlinked, err := Unlinked(root, "README.md", files)
	if err != nil {
		t.Fatal(err)
	}
	if len(unlinked) != 0 {
		t.Errorf("Unlinked = %v, want none", unlinked)
	}
	write("docs/orphan.md", "# Orphan\n")
	if files, err = Files(root); err != nil {
		t.Fatal(err)
	}
	unlinked, err = Unlinked(root, "README.md", files)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"docs/orphan.md"}, unlinked); diff != "" {
		t.Errorf("Unlinked: -want, +got:\n%s", diff)
	}
}

func TestSlug(t *testing.T) {
	cases := map[string]string{
		"The gateway: one proxy URL for every crawler tool": "the-gateway-one-proxy-url-for-every-crawler-tool",
		"Fleets past 242 proxies: pools":                    "fleets-past-242-proxies-pools",
		"Where proxies may go, and who may use them":        "where-proxies-may-go-and-who-may-use-them",
		"`make run` and make e2e":                           "make-run-and-make-e2e",
		"What the function knows of leases: LeaseSummaries": "what-the-function-knows-of-leases-leasesummaries",
		"XR → function":                                     "xr--function",
		"A [linked](other.md#x) *word* and snake_case":      "a-linked-word-and-snake_case",
	}
	for heading, want := range cases {
		if got := Slug(heading); got != want {
			t.Errorf("Slug(%q) = %q, want %q", heading, got, want)
		}
	}
}

func TestMakeTargets(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(repoRoot(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	got := MakeTargets(string(mk))
	for _, want := range []string{"help", "test", "e2e", "e2e-cluster", "run-deps", "cluster-deps", "faults"} {
		if !got[want] {
			t.Errorf("MakeTargets(Makefile) has no %q: %v", want, got)
		}
	}
	for _, not := range []string{"SHELL", "BIN", ".PHONY", "FUZZ_TARGETS", "export"} {
		if got[not] {
			t.Errorf("MakeTargets(Makefile) has %q, not a target", not)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
