package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, root, path string, data []byte, mode os.FileMode) {
	t.Helper()
	p := filepath.Join(root, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
}

func git(t *testing.T, root string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", root}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

// TestCheckTree tracks allowed files in a fresh repository, then adds each
// kind of build output in turn; the checker must pass the first and name
// every one of the others.
func TestCheckTree(t *testing.T) {
	root := t.TempDir()
	git(t, root, "init", "-q")
	self, err := os.ReadFile(os.Args[0]) // this test binary: a real go build output
	if err != nil {
		t.Fatal(err)
	}
	write(t, root, "main.go", []byte("package main\n"), 0o644)
	write(t, root, "hack/run.sh", []byte("#!/bin/sh\necho hi\n"), 0o755)
	write(t, root, "internal/x/testdata/fixture.bin", self, 0o644)
	write(t, root, "testdata/tiny.elf", []byte("\x7fELF\x02\x01"), 0o644)
	write(t, root, "empty", nil, 0o644)
	write(t, root, "data/countries.csv", []byte("MZ,Mozambique\nPE,Peru\n"), 0o644)
	if err := os.Symlink("does-not-exist", filepath.Join(root, "dangling")); err != nil {
		t.Fatal(err)
	}
	git(t, root, "add", "-A")

	var out bytes.Buffer
	if err := run(root, &out); err != nil {
		t.Fatalf("allowed files were refused: %v\n%s", err, out.String())
	}

	bad := map[string][]byte{
		"function.test":  self,                              // the file that leaked into main
		"tiny":           []byte("\x7fELF\x02\x01\x01\x00"), // small ELF
		"tool.exe":       pe(),                              // Windows
		"dist.tar.gz":    []byte{0x1f, 0x8b, 0x08, 0x00},
		"dist.zip":       []byte("PK\x03\x04\x14\x00"),
		"dist.tar":       tarHeader(),
		"main.o":         []byte("go object linux amd64 go1.26\n"),
		"mac":            []byte{0xcf, 0xfa, 0xed, 0xfe, 7, 0, 0}, // Mach-O 64
		"docs/dump.json": bytes.Repeat([]byte("{}\n"), maxSize/3+1),
	}
	for p, data := range bad {
		write(t, root, p, data, 0o755)
	}
	git(t, root, "add", "-A")
	out.Reset()
	if err := run(root, &out); err == nil {
		t.Fatalf("build outputs were accepted:\n%s", out.String())
	}
	for p := range bad {
		if !strings.Contains(out.String(), p+" ") {
			t.Errorf("checker did not name %s:\n%s", p, out.String())
		}
	}
	for _, p := range []string{"main.go", "hack/run.sh", "fixture.bin", "tiny.elf", "empty", "countries.csv", "dangling"} {
		if strings.Contains(out.String(), p) {
			t.Errorf("checker named allowed file %s:\n%s", p, out.String())
		}
	}
}

// pe is the start of a Windows executable: MZ, and at 0x3c the offset of
// the PE signature.
func pe() []byte {
	b := make([]byte, 0x80)
	copy(b, "MZ")
	b[0x3c] = 0x40
	copy(b[0x40:], "PE\x00\x00")
	return b
}

// tarHeader is the first block of a tar archive.
func tarHeader() []byte {
	b := make([]byte, 512)
	copy(b, "file.txt")
	copy(b[257:], "ustar\x0000")
	return b
}
