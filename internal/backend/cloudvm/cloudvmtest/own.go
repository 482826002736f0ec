// Package cloudvmtest helps the cloud VM backends' tests: contract.go
// checks, against a cloud's fake, what every cloud VM backend promises
// the controller and the orphan collector (the checklist a third cloud
// passes first); own.go runs a cloud's own_addresses, what it adds to
// cloudvm's start-up script, against a stub metadata service.
package cloudvmtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// CheckOwnAddresses runs the shell function own_addresses (ownAddresses)
// with curl and hostname replaced by stubs, and checks the file Squid's
// dst ACL reads: want, from a metadata tree (paths under md, bodies) that
// curl(md) serves as the cloud's metadata service does, and hostname -I
// answering hostAddr. Without a metadata service the file must still
// hold an address, so that Squid starts.
func CheckOwnAddresses(t *testing.T, ownAddresses string, tree map[string]string, curl func(md string) string, hostAddr, want string) {
	t.Helper()
	root := t.TempDir()
	md, bin := filepath.Join(root, "md"), filepath.Join(root, "bin")
	for path, body := range tree {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(md, path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(md, path), []byte(body), 0o644); err != nil { //nolint:gosec // A stub tree.
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"curl": curl(md), "hostname": "#!/bin/sh\necho '" + hostAddr + " '\n"} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(body), 0o755); err != nil { //nolint:gosec // A stub program.
			t.Fatal(err)
		}
	}
	out := filepath.Join(root, "self")
	run := func() ([]byte, error) {
		cmd := exec.Command("/bin/sh", "-euc", ownAddresses+"\nown_addresses | grep -E '^[0-9a-fA-F:.]+$' > "+out)
		cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin"}
		return cmd.CombinedOutput()
	}
	if b, err := run(); err != nil {
		t.Fatalf("own_addresses: %v\n%s", err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, string(got)); diff != "" {
		t.Errorf("own addresses file (-want +got):\n%s", diff)
	}
	if err := os.RemoveAll(md); err != nil {
		t.Fatal(err)
	}
	if b, err := run(); err != nil {
		t.Fatalf("own_addresses without metadata: %v\n%s", err, b)
	}
	if got, _ := os.ReadFile(out); !strings.HasPrefix(string(got), "255.255.255.255\n") {
		t.Errorf("own addresses without metadata: %q", got)
	}
}
