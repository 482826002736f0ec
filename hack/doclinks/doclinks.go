// Package doclinks checks the repository's Markdown, the README and the
// pages under docs/ above all: every relative link names a file that
// exists and, with a #fragment into a Markdown file, a heading of that file
// (by GitHub's anchor rule); and every `make <target>` written as code, in
// a code span or a fenced block, names a target the Makefile has. Its test
// runs the checks on the repository, so `make test` fails on a broken link
// or a stale target.
//
// doclinks.go holds the checks: which files are read, each link and
// anchor resolved against the tree, and the docs/ pages nothing links to;
// markdown.go parses Markdown (links, headings and their GitHub anchors,
// the make commands in code) and reads the Makefile's targets.
package doclinks

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// Problem is one broken reference, at the line of the file it starts on.
type Problem struct {
	File string // relative to the repository root, with forward slashes
	Line int
	Msg  string
}

func (p Problem) String() string { return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Msg) }

// Files lists the Markdown the checks read under root: every *.md at the
// root and every *.md under docs/, relative to root, sorted.
func Files(root string) ([]string, error) {
	top, err := filepath.Glob(filepath.Join(root, "*.md"))
	if err != nil {
		return nil, errors.Wrap(err, "cannot list the root's Markdown")
	}
	var out []string
	for _, f := range top {
		out = append(out, filepath.Base(f))
	}
	docs := filepath.Join(root, "docs")
	err = filepath.WalkDir(docs, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, errors.Wrap(err, "cannot list docs/")
	}
	sort.Strings(out)
	return out, nil
}

// Check reads files (relative to root) and root's Makefile and returns
// every broken link, anchor and make target, in file and line order.
func Check(root string, files []string) ([]Problem, error) {
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		return nil, errors.Wrap(err, "cannot read the Makefile")
	}
	c := &checker{root: root, targets: MakeTargets(string(mk)), docs: map[string]*doc{}}
	var out []Problem
	for _, f := range files {
		d, err := c.load(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			return nil, err
		}
		out = append(out, c.check(f, d)...)
	}
	return out, nil
}

// Unlinked lists the pages of files under docs/ that no link of index
// (relative to root) leads to: the README's table is the index of docs/.
func Unlinked(root, index string, files []string) ([]string, error) {
	path := filepath.Join(root, filepath.FromSlash(index))
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, errors.Wrapf(err, "cannot read %s", index)
	}
	linked := map[string]bool{}
	for _, l := range Parse(string(b)).Links {
		file, _ := splitTarget(l.Target)
		if file != "" && !external(l.Target) {
			linked[filepath.Clean(filepath.Join(filepath.Dir(path), filepath.FromSlash(file)))] = true
		}
	}
	var out []string
	for _, f := range files {
		if strings.HasPrefix(f, "docs/") && !linked[filepath.Join(root, filepath.FromSlash(f))] {
			out = append(out, f)
		}
	}
	return out, nil
}

type checker struct {
	root    string
	targets map[string]bool
	docs    map[string]*doc // by absolute path
}

// doc is what the checks need of a Markdown file.
type doc struct {
	Links   []Ref
	Makes   []Ref // the target each `make` names
	Anchors map[string]bool
}

// Ref is a link target, or a make target, and the line it is on.
type Ref struct {
	Target string
	Line   int
}

func (c *checker) load(path string) (*doc, error) {
	if d, ok := c.docs[path]; ok {
		return d, nil
	}
	b, err := os.ReadFile(path) //nolint:gosec // The files are the repository's own Markdown.
	if err != nil {
		return nil, errors.Wrapf(err, "cannot read %s", path)
	}
	d := Parse(string(b))
	c.docs[path] = d
	return d, nil
}

func (c *checker) check(file string, d *doc) []Problem {
	var out []Problem
	for _, l := range d.Links {
		if msg := c.link(file, l.Target); msg != "" {
			out = append(out, Problem{File: file, Line: l.Line, Msg: msg})
		}
	}
	for _, m := range d.Makes {
		if !c.targets[m.Target] {
			out = append(out, Problem{File: file, Line: m.Line, Msg: fmt.Sprintf("`make %s`: the Makefile has no target %q", m.Target, m.Target)})
		}
	}
	return out
}

// link says what is wrong with target, a link of file, or "".
func (c *checker) link(file, target string) string {
	if external(target) {
		return ""
	}
	name, fragment := splitTarget(target)
	from := filepath.Join(c.root, filepath.FromSlash(file))
	path := from
	if name != "" {
		if strings.HasPrefix(name, "/") {
			path = filepath.Join(c.root, filepath.FromSlash(name))
		} else {
			path = filepath.Join(filepath.Dir(from), filepath.FromSlash(name))
		}
		if _, err := os.Stat(path); err != nil {
			return fmt.Sprintf("link to %s: no such file or directory", target)
		}
	}
	if fragment == "" || !strings.HasSuffix(path, ".md") {
		return ""
	}
	d, err := c.load(path)
	if err != nil {
		return fmt.Sprintf("link to %s: %v", target, err)
	}
	if !d.Anchors[fragment] {
		rel, _ := filepath.Rel(c.root, path)
		return fmt.Sprintf("link to %s: %s has no heading with the anchor #%s", target, filepath.ToSlash(rel), fragment)
	}
	return ""
}

var scheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)

// external is true of a target this checker cannot follow: a URL with a
// scheme (https:, mailto:, ...) or a protocol-relative one.
func external(target string) bool {
	return scheme.MatchString(target) || strings.HasPrefix(target, "//")
}

// splitTarget splits a link target into its path and its fragment, both
// unescaped, dropping any query.
func splitTarget(target string) (name, fragment string) {
	name, fragment, _ = strings.Cut(target, "#")
	name, _, _ = strings.Cut(name, "?")
	if u, err := url.PathUnescape(name); err == nil {
		name = u
	}
	if u, err := url.PathUnescape(fragment); err == nil {
		fragment = u
	}
	return name, fragment
}
