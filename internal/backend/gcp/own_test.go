package gcp

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
)

// TestOwnAddresses runs the startup script's own_addresses with curl and
// hostname replaced by stubs that answer from a metadata tree shaped like
// GCP's: a VM with two interfaces, one external IPv4 on the first and one
// external IPv6 on the second. Every address must come out, and the
// script's output must be a file Squid's dst ACL reads.
func TestOwnAddresses(t *testing.T) {
	root := t.TempDir()
	md := filepath.Join(root, "md")
	for path, body := range map[string]string{
		"index":                                 "0/\n1/\n",
		"0/access-configs/index":                "0/\n",
		"0/access-configs/0/external-ip":        "34.1.2.3",
		"1/access-configs/index":                "",
		"1/ipv6-access-configs/index":           "0/\n",
		"1/ipv6-access-configs/0/external-ipv6": "2600:1900:4000::5",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(md, path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(md, path), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(root, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	// The stub curl insists on the metadata header, as the server does,
	// and fails (as curl -f does on 404) for what the tree lacks.
	stubs := map[string]string{
		"curl": `#!/bin/sh
case "$*" in *"Metadata-Flavor: Google"*) ;; *) exit 22 ;; esac
for a; do url=$a; done
path=${url#http://169.254.169.254/computeMetadata/v1/instance/network-interfaces/}
case "$path" in ""|*/) path="${path}index" ;; esac
cat "` + md + `/$path" 2>/dev/null || exit 22
`,
		"hostname": "#!/bin/sh\necho '10.128.0.5 '\n",
	}
	for name, body := range stubs {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(root, "self")
	run := func() ([]byte, error) {
		cmd := exec.Command("/bin/sh", "-euc", ownAddressesFunc+"\nown_addresses | grep -E '^[0-9a-fA-F:.]+$' > "+out)
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
	want := "255.255.255.255\n10.128.0.5\n34.1.2.3\n2600:1900:4000::5\n"
	if diff := cmp.Diff(want, string(got)); diff != "" {
		t.Errorf("own addresses file (-want +got):\n%s", diff)
	}

	// Without a metadata server the file still holds an address, so
	// Squid starts.
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

// TestStartupScriptDeniesOwnAddresses checks that the generated script
// writes the file before Squid's config and that the config denies what
// the file lists.
func TestStartupScriptDeniesOwnAddresses(t *testing.T) {
	script, err := StartupScript(backend.Spec{Port: 3128, Credentials: &backend.Credentials{Username: "u", Password: "p"}})
	if err != nil {
		t.Fatal(err)
	}
	file := vmSelf
	write := strings.Index(script, "own_addresses | grep -E '^[0-9a-fA-F:.]+$' > "+file)
	conf := strings.Index(script, "cat > "+vmConfig+" <<")
	if write < 0 || conf < 0 || write > conf {
		t.Fatalf("the script must write %s before Squid's config:\n%s", file, script)
	}
	if !strings.Contains(script, `acl egress_self_started dst "`+file+`"`) || !strings.Contains(script, "http_access deny egress_self_started") {
		t.Errorf("the config must deny the addresses in %s:\n%s", file, script)
	}
	if _, err := squid.Render(squid.Config{Port: 3128, HtpasswdPath: "/h", OwnAddressesFile: "relative"}); err == nil || !strings.Contains(err.Error(), `own addresses file "relative" must be an absolute path`) {
		t.Errorf("a relative own-addresses file must be refused, saying why: %v", err)
	}
}
