package aws

import (
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/cloudvm/cloudvmtest"
)

// TestOwnAddresses runs the user data's own_addresses against a stub of
// EC2's instance metadata service with IMDSv2 required: a PUT for a
// session token first, then reads that carry it (a read without it is
// refused). The instance has two interfaces, a public IPv4 address on the
// first and an IPv6 address on the second. Every address must come out.
func TestOwnAddresses(t *testing.T) {
	const macA, macB = "0a:1b:2c:3d:4e:5f/", "0a:1b:2c:3d:4e:60/"
	tree := map[string]string{
		"network/interfaces/macs/index":                    macA + "\n" + macB + "\n",
		"network/interfaces/macs/" + macA + "public-ipv4s": "54.1.2.3",
		"network/interfaces/macs/" + macB + "ipv6s":        "2600:1f18:1234::5",
	}
	// The stub curl hands out a token to a PUT of api/token with a TTL,
	// and answers reads only with that token; curl -f fails (22) on what
	// the tree lacks, and cannot connect (7) without a service.
	curl := func(md string) string {
		return `#!/bin/sh
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
`
	}
	cloudvmtest.CheckOwnAddresses(t, ownAddressesFunc, tree, curl, "172.31.5.9", "255.255.255.255\n172.31.5.9\n54.1.2.3\n2600:1f18:1234::5\n")
}
