package cloudvm

import (
	"strings"
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

// Families are the releases the generated start-up script supports:
// Debian 11 to 13 and Ubuntu 20.04 to 26.04. A release is added here, to
// hack/tools/images/fetch.sh, and proven by TestScriptOnEachFamily.
var Families = []Family{
	{Name: "debian-11", Distro: "debian", Version: "11", Codename: "bullseye"},
	{Name: "debian-12", Distro: "debian", Version: "12", Codename: "bookworm"},
	{Name: "debian-13", Distro: "debian", Version: "13", Codename: "trixie"},
	{Name: "ubuntu-2004", Distro: "ubuntu", Version: "20.04", Codename: "focal"},
	{Name: "ubuntu-2204", Distro: "ubuntu", Version: "22.04", Codename: "jammy"},
	{Name: "ubuntu-2404", Distro: "ubuntu", Version: "24.04", Codename: "noble"},
	{Name: "ubuntu-2504", Distro: "ubuntu", Version: "25.04", Codename: "plucky"},
	{Name: "ubuntu-2510", Distro: "ubuntu", Version: "25.10", Codename: "questing"},
	{Name: "ubuntu-2604", Distro: "ubuntu", Version: "26.04", Codename: "resolute"},
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
// another image: "Debian 11, 12, 13 or Ubuntu 20.04, ...".
func SupportedReleases() string {
	var debian, ubuntu []string
	for _, f := range Families {
		if f.Distro == "debian" {
			debian = append(debian, f.Version)
		} else {
			ubuntu = append(ubuntu, f.Version)
		}
	}
	return "Debian " + strings.Join(debian, ", ") + " or Ubuntu " + strings.Join(ubuntu, ", ")
}
