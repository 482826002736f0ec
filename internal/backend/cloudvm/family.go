package cloudvm

import (
	"strings"
)

// The distributions of Families.
const (
	Debian = "debian"
	Ubuntu = "ubuntu"
)

// A Family is a release of a distribution the generated start-up script
// supports: it installs Squid with that release's apt, and runs the
// release's Squid with the generated configuration. Each family is tested
// against that release's own packages (TestScriptOnEachFamily, with the
// trees hack/tools/images/fetch.sh unpacks), so that the images a cloud
// accepts are the ones the script is known to work on.
type Family struct {
	// Name is the family as GCP names its image family (debian-12,
	// ubuntu-2404) and the tests name its package tree.
	Name string
	// Distro is debian or ubuntu.
	Distro string
	// Version is the release's number (12, 24.04) and Codename its name
	// (bookworm, noble), as the clouds' image names and parameters spell
	// them.
	Version, Codename string
}

// Families are the releases the generated start-up script supports: the
// Debian and Ubuntu LTS releases still given security updates (on
// 2026-12-07: Debian 12 until 2028-06, 13 until 2030-06; Ubuntu 22.04 until
// 2027-04, 24.04 until 2029-04, 26.04 until 2031-04). A proxy faces the
// internet: a release past its security support is not accepted, nor an
// interim Ubuntu release (nine months). Debian 11 and Ubuntu 20.04 are
// past it, and their Squid 4 could not have run the generated
// configuration before 2026-12 (it predefined no CONNECT ACL). A release
// is added here and to hack/tools/images/fetch.sh, and proven by
// TestScriptOnEachFamily; one is removed at the end of its security
// support.
var Families = []Family{
	{Name: "debian-12", Distro: Debian, Version: "12", Codename: "bookworm"},
	{Name: "debian-13", Distro: Debian, Version: "13", Codename: "trixie"},
	{Name: "ubuntu-2204", Distro: Ubuntu, Version: "22.04", Codename: "jammy"},
	{Name: "ubuntu-2404", Distro: Ubuntu, Version: "24.04", Codename: "noble"},
	{Name: "ubuntu-2604", Distro: Ubuntu, Version: "26.04", Codename: "resolute"},
}

// FamilyOf is the supported family of distro's release, given by its
// number or its codename; false when the script does not support it.
func FamilyOf(distro, release string) (Family, bool) {
	for _, f := range Families {
		if f.Distro == distro && (f.Version == release || f.Codename == release) {
			return f, true
		}
	}
	return Family{}, false
}

// SupportedReleases names the supported releases, for an error refusing
// another image: "Debian 12, 13 or Ubuntu 22.04, ...".
func SupportedReleases() string {
	var debian, ubuntu []string
	for _, f := range Families {
		if f.Distro == Debian {
			debian = append(debian, f.Version)
		} else {
			ubuntu = append(ubuntu, f.Version)
		}
	}
	return "Debian " + strings.Join(debian, ", ") + " or Ubuntu " + strings.Join(ubuntu, ", ")
}
