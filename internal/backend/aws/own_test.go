package aws

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestOwnAddresses runs the user data's own_addresses with curl and
// hostname replaced by stubs that answer as EC2's instance metadata
// service does with IMDSv2 required: a PUT for a session token first,
// then reads that carry it (a read without it is refused, 401). The
// instance has two interfaces, a public IPv4 address on the first and an
// IPv6 address on the second. Every address must come out, and without a
// metadata service the file still holds one, so Squid starts.
func TestOwnAddresses(t *testing.T) {
	root := t.TempDir()
	md := filepath.Join(root, "md")
	const macA, macB = "0a:1b:2c:3d:4e:5f/", "0a:1b:2c:3d:4e:60/"
	for path, body := range map[string]string{
		"network/interfaces/macs/index":                    macA + "\n" + macB + "\n",
		"network/interfaces/macs/" + macA + "public-ipv4s": "54.1.2.3",
		"network/interfaces/macs/" + macB + "ipv6s":        "2600:1f18:1234::5",
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
	// The stub curl hands out a token to a PUT of api/token with a TTL,
	// and answers reads only with that token, as IMDSv2 does; curl -f
	// fails (22) on what the tree lacks.
	stubs := map[string]string{
		"curl": `#!/bin/sh
[ -d "` + md + `" ] || exit 7
for a; do url=$a; done
case "$*" in
*"-X PUT"*"X-aws-ec2-metadata-token-ttl-seconds: "*"/latest/api/token") echo tok-123; exit 0 ;;
*"X-aws-ec2-metadata-token: tok-123"*) ;;
*) exit 22 ;;
esac
path=${url#http://169.254.169.254/latest/meta-data/}
case "$path" in ""|*/) path="${path}index" ;; esac
cat "` + md + `/$path" 2>/dev/null || exit 22
`,
		"hostname": "#!/bin/sh\necho '172.31.5.9 '\n",
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
	want := "255.255.255.255\n172.31.5.9\n54.1.2.3\n2600:1f18:1234::5\n"
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
