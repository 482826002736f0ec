package gcp

import (
	"fmt"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/cloudvm/cloudvmtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
)

// TestOwnAddresses runs the startup script's own_addresses against a stub
// of GCP's metadata server: a VM with two interfaces, one external IPv4 on
// the first and one external IPv6 on the second. Every address must come
// out. The stub curl insists on the metadata header, as the server does,
// and fails (as curl -f does on 404) for what the tree lacks.
func TestOwnAddresses(t *testing.T) {
	tree := map[string]string{
		"index":                                 "0/\n1/\n",
		"0/access-configs/index":                "0/\n",
		"0/access-configs/0/external-ip":        "34.1.2.3",
		"1/access-configs/index":                "",
		"1/ipv6-access-configs/index":           "0/\n",
		"1/ipv6-access-configs/0/external-ipv6": "2600:1900:4000::5",
	}
	curl := func(md string) string {
		return `#!/bin/sh
case "$*" in *"Metadata-Flavor: Google"*) ;; *) exit 22 ;; esac
for a; do url=$a; done
path=${url#http://169.254.169.254/computeMetadata/v1/instance/network-interfaces/}
case "$path" in ""|*/) path="${path}index" ;; esac
cat "` + md + `/$path" 2>/dev/null || exit 22
`
	}
	cloudvmtest.CheckOwnAddresses(t, ownAddressesFunc, tree, curl, "10.128.0.5", "255.255.255.255\n10.128.0.5\n34.1.2.3\n2600:1900:4000::5\n")
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
	if _, err := squid.Render(squid.Config{Port: 3128, HtpasswdPath: "/h", OwnAddressesFile: "relative"}); err == nil || err.Error() != squid.ErrInvalidConfig+": "+fmt.Sprintf(squid.ErrFmtOwnAbs, "relative") {
		t.Errorf("a relative own-addresses file must be refused, saying why: %v", err)
	}
}
