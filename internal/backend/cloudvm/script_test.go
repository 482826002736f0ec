package cloudvm_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/aws"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// TestStartupScriptShell parses each cloud's generated start-up script
// (GCP's startup-script, EC2's user data: the shared script with the
// cloud's own_addresses) with the shells a VM may run it with, and lints
// it with shellcheck: a syntax error there would only show on a booting
// VM, as a proxy that never becomes Ready.
func TestStartupScriptShell(t *testing.T) {
	clouds := map[string]struct {
		script func(backend.Spec) (string, error)
		place  func(*backend.Spec)
	}{
		"GCP": {gcp.StartupScript, func(s *backend.Spec) { s.GCP = &v1alpha1.GCPPlacement{Zone: "europe-west1-b"} }},
		"AWS": {aws.UserData, func(s *backend.Spec) { s.AWS = &v1alpha1.AWSPlacement{Zone: "us-east-1a"} }},
	}
	specs := map[string]backend.Spec{
		"WithCredentials": {
			Owner: ownership.Owner{UID: "script-test"}, Port: 3128,
			Credentials:         &backend.Credentials{Username: "crawler", Password: `pw'"$(reboot)`},
			AllowedSourceRanges: []string{"203.0.113.0/24"},
		},
		"PrivateOnly": {
			Owner: ownership.Owner{UID: "script-test-2"}, Port: 8080,
			AllowedSourceRanges: []string{"10.0.0.0/8"}, AllowedPrivateDestinations: []string{"10.20.0.0/16"},
		},
	}
	shellcheck, err := exec.LookPath("shellcheck")
	if err != nil {
		t.Fatal("shellcheck is missing: install it (apt-get install shellcheck; .ci/run does)")
	}
	for cloud, c := range clouds {
		for name, s := range specs {
			c.place(&s)
			t.Run(cloud+"/"+name, func(t *testing.T) { checkShell(t, shellcheck, c.script, s) })
		}
	}
}

// checkShell parses script(s) with sh, bash and dash, and lints it.
func checkShell(t *testing.T, shellcheck string, script func(backend.Spec) (string, error), s backend.Spec) {
	t.Helper()
	text, err := script(s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(text, "#!/bin/sh\n") {
		t.Fatalf("the script says which shell runs it: %q", strings.SplitN(text, "\n", 2)[0])
	}
	f := filepath.Join(t.TempDir(), "startup.sh")
	if err := os.WriteFile(f, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, sh := range []string{"sh", "bash", "dash"} {
		path, err := exec.LookPath(sh)
		if err != nil {
			continue // dash is sh on Debian; bash and sh are always there.
		}
		if out, err := exec.Command(path, "-n", f).CombinedOutput(); err != nil {
			t.Errorf("%s -n: %v\n%s", sh, err, out)
		}
	}
	if out, err := exec.Command(shellcheck, "--shell=sh", f).CombinedOutput(); err != nil {
		t.Errorf("shellcheck: %v\n%s", err, out)
	}
}
