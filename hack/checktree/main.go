// Command checktree fails when git tracks a build output: a file over 1 MiB
// or a compiled binary (known by its magic bytes: executables, objects, archives), outside testdata/.
// Scripts with a run bit are fine; ignoring a file does not untrack it, so
// CI runs this on every clone.
package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// maxSize is the largest file git may track outside testdata/.
const maxSize = 1 << 20

const (
	machO   = "a Mach-O binary"
	archive = "a compressed file or archive"
)

// magics are the first bytes of compiled executables, objects and archives.
var magics = []struct {
	name  string
	bytes []byte
}{
	{"an ELF binary", []byte{0x7f, 'E', 'L', 'F'}},
	{machO, []byte{0xfe, 0xed, 0xfa, 0xce}},
	{machO, []byte{0xfe, 0xed, 0xfa, 0xcf}},
	{machO, []byte{0xce, 0xfa, 0xed, 0xfe}},
	{machO, []byte{0xcf, 0xfa, 0xed, 0xfe}},
	{"a universal Mach-O binary or a Java class", []byte{0xca, 0xfe, 0xba, 0xbe}},
	{"a WebAssembly module", []byte{0x00, 'a', 's', 'm'}},
	{"a static library", []byte("!<arch>\n")},
	{"a Go object file", []byte("go object ")},
	{archive, []byte{0x1f, 0x8b}},                       // gzip
	{archive, []byte{'P', 'K', 0x03, 0x04}},             // zip, jar, whl
	{archive, []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}},   // xz
	{archive, []byte{0x28, 0xb5, 0x2f, 0xfd}},           // zstd
	{archive, []byte{'7', 'z', 0xbc, 0xaf, 0x27, 0x1c}}, // 7z
	{archive, []byte{'B', 'Z', 'h'}},                    // bzip2
}

// headLen is how much of a file the checks read: a tar header's magic sits
// at offset 257.
const headLen = 512

// kind names the build output whose bytes head starts, or "".
func kind(head []byte) string {
	for _, m := range magics {
		if bytes.HasPrefix(head, m.bytes) {
			return m.name
		}
	}
	// A Windows executable starts MZ and points, at 0x3c, to its PE
	// header; text that happens to start "MZ" does not.
	if bytes.HasPrefix(head, []byte("MZ")) && len(head) >= 0x40 {
		if off := int(binary.LittleEndian.Uint32(head[0x3c:])); off+4 <= len(head) && bytes.Equal(head[off:off+4], []byte("PE\x00\x00")) {
			return "a Windows executable"
		}
	}
	if len(head) >= 262 && bytes.Equal(head[257:262], []byte("ustar")) {
		return archive
	}
	return ""
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
	if st, err := os.Lstat(filepath.Join(root, path)); err == nil && st.Mode()&os.ModeSymlink != 0 {
		return "", nil // a link holds no bytes of its own
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
	head := make([]byte, headLen)
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return "", errors.Wrapf(err, "cannot read %s", path)
	}
	if k := kind(head[:n]); k != "" {
		return "is " + k + ": a build output, not a source (git rm --cached it and ignore it)", nil
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
