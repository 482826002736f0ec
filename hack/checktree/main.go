// Command checktree fails when git tracks a build output: a file over 1 MiB
// or a compiled binary (recognised by its magic bytes), outside testdata/.
// Scripts with a run bit are fine; ignoring a file does not untrack it, so
// CI runs this on every clone.
package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/pkg/errors"
)

// maxSize is the largest file git may track outside testdata/.
const maxSize = 1 << 20

const machO = "a Mach-O binary"

// magics are the first bytes of compiled executables and objects.
var magics = []struct {
	name  string
	bytes []byte
}{
	{"an ELF binary", []byte{0x7f, 'E', 'L', 'F'}},
	{machO, []byte{0xfe, 0xed, 0xfa, 0xce}},
	{machO, []byte{0xfe, 0xed, 0xfa, 0xcf}},
	{machO, []byte{0xce, 0xfa, 0xed, 0xfe}},
	{machO, []byte{0xcf, 0xfa, 0xed, 0xfe}},
	{"a universal Mach-O binary", []byte{0xca, 0xfe, 0xba, 0xbe}},
	{"a Windows executable", []byte{'M', 'Z'}},
	{"a WebAssembly module", []byte{0x00, 'a', 's', 'm'}},
	{"a static library", []byte("!<arch>\n")},
}

// inTestdata says whether a tracked path lies in a testdata folder, where
// fixtures may be large or binary.
func inTestdata(path string) bool {
	for _, part := range strings.Split(filepath.ToSlash(path), "/") {
		if part == "testdata" {
			return true
		}
	}
	return false
}

// checkFile returns why a tracked file must not be tracked, or "".
func checkFile(root, path string) (string, error) {
	if inTestdata(path) {
		return "", nil
	}
	f, err := os.Open(filepath.Join(root, path))
	if err != nil {
		return "", errors.Wrapf(err, "cannot open %s", path)
	}
	defer f.Close() //nolint:errcheck // read-only
	st, err := f.Stat()
	if err != nil {
		return "", errors.Wrapf(err, "cannot stat %s", path)
	}
	if st.IsDir() { // a submodule
		return "", nil
	}
	if st.Size() > maxSize {
		return fmt.Sprintf("is %d bytes, over the 1 MiB limit (move fixtures to testdata/, build outputs out of git)", st.Size()), nil
	}
	head := make([]byte, 8)
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return "", errors.Wrapf(err, "cannot read %s", path)
	}
	for _, m := range magics {
		if bytes.HasPrefix(head[:n], m.bytes) {
			return "is " + m.name + ": a build output, not a source (git rm --cached it and ignore it)", nil
		}
	}
	return "", nil
}

// check returns one line per tracked file that breaks the rules.
func check(root string, files []string) ([]string, error) {
	var bad []string
	for _, p := range files {
		why, err := checkFile(root, p)
		if err != nil {
			return nil, err
		}
		if why != "" {
			bad = append(bad, p+" "+why)
		}
	}
	return bad, nil
}

// tracked lists the files git tracks under root.
func tracked(root string) ([]string, error) {
	cmd := exec.Command("git", "-C", root, "ls-files", "-z")
	out, err := cmd.Output()
	if err != nil {
		return nil, errors.Wrap(err, "cannot list tracked files with git ls-files")
	}
	var files []string
	for _, p := range strings.Split(string(out), "\x00") {
		if p != "" {
			files = append(files, p)
		}
	}
	return files, nil
}

func run(root string, stdout io.Writer) error {
	files, err := tracked(root)
	if err != nil {
		return err
	}
	bad, err := check(root, files)
	if err != nil {
		return err
	}
	for _, b := range bad {
		fmt.Fprintln(stdout, b)
	}
	if len(bad) > 0 {
		return errors.Errorf("%d tracked file(s) must not be in git", len(bad))
	}
	fmt.Fprintf(stdout, "%d tracked files: none over 1 MiB, no compiled binary\n", len(files))
	return nil
}

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	if err := run(root, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "checktree:", err)
		os.Exit(1)
	}
}
