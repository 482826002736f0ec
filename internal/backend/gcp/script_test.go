package gcp_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// TestStartupScriptShell parses the generated startup script with the
// shells a VM may run it with, and lints it with shellcheck: a syntax
// error there would only show on a booting VM, as a proxy that never
// becomes Ready.
func TestStartupScriptShell(t *testing.T) {
	specs := map[string]backend.Spec{
		"WithCredentials": {
			Owner: ownership.Owner{UID: "script-test"}, Port: 3128,
			Credentials:         &backend.Credentials{Username: "crawler", Password: `pw'"$(reboot)`},
			AllowedSourceRanges: []string{"203.0.113.0/24"}, GCP: &v1alpha1.GCPPlacement{Zone: "europe-west1-b"},
		},
		"PrivateOnly": {
			Owner: ownership.Owner{UID: "script-test-2"}, Port: 8080,
			AllowedSourceRanges: []string{"10.0.0.0/8"}, AllowedPrivateDestinations: []string{"10.20.0.0/16"},
			GCP: &v1alpha1.GCPPlacement{Zone: "europe-west1-b"},
		},
	}
	shellcheck, err := exec.LookPath("shellcheck")
	if err != nil {
		t.Fatal("shellcheck is missing: install it (apt-get install shellcheck; .ci/run does)")
	}
	for name, s := range specs {
		t.Run(name, func(t *testing.T) {
			script, err := gcp.StartupScript(s)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(script, "#!/bin/sh\n") {
				t.Fatalf("the script says which shell runs it: %q", strings.SplitN(script, "\n", 2)[0])
			}
			f := filepath.Join(t.TempDir(), "startup.sh")
			if err := os.WriteFile(f, []byte(script), 0o600); err != nil {
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
		})
	}
}
