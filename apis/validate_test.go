package apis_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestExamplesValidate runs make validate's script, the real
// `crossplane beta validate` offline, over every example: each has a
// schema (the RBAC kinds from hack/validate/schemas) and passes. The
// same run over a RoleBinding without its roleRef fails naming it, so
// the check can fail.
func TestExamplesValidate(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "bin", "crossplane")); err != nil {
		t.Fatal("bin/crossplane is missing: run `make tools` (it builds the Crossplane CLI from the Go module proxy)")
	}
	run := func(args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(root, "hack", "validate.sh"), args...)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run()
	if err != nil || !strings.Contains(out, " 0 missing schemas") || !strings.Contains(out, " 0 failure cases") {
		t.Fatalf("make validate on the examples: %v\n%s", err, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte(`apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: broken
  namespace: crawl-team
subjects:
- kind: ServiceAccount
  name: crawler
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := run(bad); err == nil || !strings.Contains(out, "roleRef: Required value") {
		t.Errorf("a RoleBinding without roleRef passed validation: %v\n%s", err, out)
	}
}
