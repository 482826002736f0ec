package kubernetes

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestStartCommandWritesOwnAddresses runs the pod's command with /bin/sh,
// a stub squid that reports what it was started with, and the addresses
// the downward API would give a dual-stack pod and its node: all must be
// in the file
// Squid's config denies, and Squid must then start with the config.
func TestStartCommandWritesOwnAddresses(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "self")
	report := filepath.Join(dir, "report")
	stub := "#!/bin/sh\n{ echo \"$*\"; cat " + self + "; } > " + report + "\n"
	if err := os.WriteFile(filepath.Join(dir, "squid"), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ podIPs, hostIPs, want string }{
		{"10.1.2.3,2600:1f00::7", "34.1.2.3,2600:1f00::1", "255.255.255.255\n10.1.2.3\n2600:1f00::7\n34.1.2.3\n2600:1f00::1\n"},
		// Before the kubelet knows the IPs, the file still holds one
		// address, so Squid starts.
		{"", "", "255.255.255.255\n"},
		// Nothing but addresses reaches Squid's ACL file.
		{"10.1.2.3,\"/etc/passwd\"", "$(id)", "255.255.255.255\n10.1.2.3\n"},
	} {
		argv := startCommand()
		argv[len(argv)-1] = strings.ReplaceAll(argv[len(argv)-1], ownAddressesFile, self)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = []string{"PATH=" + dir + ":/usr/bin:/bin", "POD_IPS=" + tc.podIPs, "HOST_IPS=" + tc.hostIPs}
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("POD_IPS=%q: %v\n%s", tc.podIPs, err, b)
		}
		got, err := os.ReadFile(report)
		if err != nil {
			t.Fatal(err)
		}
		want := "-N -f " + configDir + "/squid.conf\n" + tc.want
		if string(got) != want {
			t.Errorf("POD_IPS=%q: squid saw\n%s\nwant\n%s", tc.podIPs, got, want)
		}
	}
}
