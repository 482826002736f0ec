package cloudvm

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"slices"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
)

// What SourceRanges and UnsupportedImage refuse, for the clouds' tests to
// compare errors with.
const (
	ErrFmtUserDataWithoutRanges = "spec.forProvider.allowedSourceRanges is required with spec.forProvider.%s.%s: the provider does not write that proxy's Squid configuration, so %s opens its port only to the ranges listed"
	ErrFmtPublicProbeRange      = "the ProviderConfig's spec.probe.sourceRanges %q is not private, loopback or CGNAT space: without spec.forProvider.authSecretRef the firewall would open the proxy to every client behind it; add credentials or probe from a private range"
	ErrFmtOpenProxy             = "spec.forProvider.allowedSourceRanges %q is not private, loopback or CGNAT space: without spec.forProvider.authSecretRef the firewall would open an open proxy to the internet; add credentials or narrow the range"
	ErrFmtPrivateOnly           = "spec.forProvider.allowedSourceRanges %q admit private networks only, but the proxy is published at its external IP, which clients inside a VPC reach only from their own external address (or their NAT's), never from a private one: %s"
	ErrFmtIPv4Only              = "spec.forProvider.allowedSourceRanges %q: %s takes IPv4 ranges only"
	// ErrFmtUnsupportedImage: the placement, the image, what it is, the
	// placement again and its user data field.
	ErrFmtUnsupportedImage = "spec.forProvider.%s.image %s is %s: the generated start-up script installs and runs Squid (apt, systemd, the distribution's squid package) on Debian and Ubuntu images only; use one, or bring your own start-up configuration in spec.forProvider.%s.%s"
)

// Cloud names what the shared core's errors speak of on one cloud: the
// Proxy's placement field and its start-up configuration field, and the
// kind of network opening (GCP: firewall rule; EC2: security group).
type Cloud struct {
	// Placement is the Proxy's placement field: gcp, aws.
	Placement string
	// UserDataField is the placement's own start-up configuration field:
	// cloudInit, userData.
	UserDataField string
	// OpeningKind is what the cloud calls the opening: "a GCP firewall
	// rule".
	OpeningKind string
	// Internal is the placement field that publishes the VM's private
	// address, empty when the cloud has none.
	Internal string
}

// SourceRanges are the ranges a VM's opening admits to its proxy port,
// masked (clouds refuse a range with host bits set): the Proxy's
// allowedSourceRanges with the ProviderConfig's probe ranges, or every
// IPv4 address when there are none (credentials only). It refuses, by
// arithmetic on the ranges, an opening that would admit public clients to
// a proxy without credentials, one of a proxy whose Squid configuration
// the provider did not write (the user's own) without ranges, one that
// admits private clients only to an external address they never come from
// (unless internal says the private address is published), and IPv6
// ranges, which the VMs' IPv4-only openings cannot take.
func SourceRanges(s backend.Spec, c Cloud, internal bool) ([]string, error) {
	ranges := s.AllowedSourceRanges
	public, err := squid.PublicSources(ranges)
	if err != nil {
		return nil, backend.Wrap(backend.ClassPermanent, errors.Wrap(err, "spec.forProvider.allowedSourceRanges"))
	}
	switch {
	case s.UserData != "" && len(ranges) == 0:
		return nil, backend.Errorf(backend.ClassPermanent, ErrFmtUserDataWithoutRanges, c.Placement, c.UserDataField, c.OpeningKind)
	case s.Credentials == nil && len(public) > 0 && slices.Contains(s.ProbeSourceRanges, public[0]):
		return nil, backend.Errorf(backend.ClassPermanent, ErrFmtPublicProbeRange, public[0])
	case s.Credentials == nil && len(public) > 0:
		return nil, backend.Errorf(backend.ClassPermanent, ErrFmtOpenProxy, public[0])
	case len(ranges) == 0:
		ranges = []string{"0.0.0.0/0"}
	case s.UserData == "" && !internal && VPCOnly(s):
		fix := "list the crawlers' external ranges (with authSecretRef)"
		if c.Internal != "" {
			fix = "set spec.forProvider." + c.Placement + "." + c.Internal + " for crawlers in the VPC, or " + fix
		}
		return nil, backend.Errorf(backend.ClassPermanent, ErrFmtPrivateOnly, OwnRanges(s), fix)
	}
	masked := make([]string, 0, len(ranges))
	for _, r := range ranges {
		p, err := netip.ParsePrefix(r)
		if err != nil || !p.Addr().Is4() {
			return nil, backend.Errorf(backend.ClassPermanent, ErrFmtIPv4Only, r, c.OpeningKind)
		}
		masked = append(masked, p.Masked().String())
	}
	return masked, nil
}

// MaskedRanges are the ranges SourceRanges would give s, without its
// checks, so that an opening can be named for a Proxy being deleted
// whatever its spec says now; nil when a range does not parse.
func MaskedRanges(s backend.Spec) []string {
	ranges := s.AllowedSourceRanges
	if len(ranges) == 0 {
		ranges = []string{"0.0.0.0/0"}
	}
	masked := make([]string, 0, len(ranges))
	for _, r := range ranges {
		p, err := netip.ParsePrefix(r)
		if err != nil {
			return nil
		}
		masked = append(masked, p.Masked().String())
	}
	return masked
}

// vpcPrivate are the networks a VPC's clients have addresses in: RFC 1918
// and CGNAT space, which traffic to an external IP never comes from.
var vpcPrivate = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("100.64.0.0/10"),
}

// OwnRanges are the Proxy's own allowedSourceRanges, without the probe's.
func OwnRanges(s backend.Spec) []string {
	var out []string
	for _, r := range s.AllowedSourceRanges {
		if !slices.Contains(s.ProbeSourceRanges, r) {
			out = append(out, r)
		}
	}
	return out
}

// VPCOnly reports whether every one of the Proxy's own source ranges lies
// in a VPC's private space: clients no external IP can be reached from.
func VPCOnly(s backend.Spec) bool {
	own := OwnRanges(s)
	for _, r := range own {
		p, err := netip.ParsePrefix(r)
		if err != nil {
			return false
		}
		if !slices.ContainsFunc(vpcPrivate, func(v netip.Prefix) bool { return v.Bits() <= p.Bits() && v.Contains(p.Addr()) }) {
			return false
		}
	}
	return len(own) > 0
}

// SharedName names a fleet's shared opening from what it is (the cluster,
// the fleet, and the opening's network, ports and ranges, in parts), so
// that an opening read back names itself again and a description copied
// onto another claims nothing: prefix and 16 base32 characters of a
// SHA-256. The ranges are sorted first: their order changes nothing.
func SharedName(prefix, cluster, namespace, fleet, network, ports string, ranges []string) string {
	ranges = slices.Clone(ranges)
	slices.Sort(ranges)
	sum := sha256.Sum256([]byte(strings.Join([]string{"egress fleet rule", cluster, namespace, fleet,
		network, ports, strings.Join(ranges, ",")}, "\x00")))
	return prefix + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:]))[:16]
}

// UnsupportedImage refuses an image the generated start-up script cannot
// run on (it installs and runs Squid with apt, systemd and the
// distribution's squid package, on Debian and Ubuntu only), saying what
// the image is and the two ways out.
func (c Cloud) UnsupportedImage(image, is string) error {
	return backend.Errorf(backend.ClassPermanent, ErrFmtUnsupportedImage, c.Placement, image, is, c.Placement, c.UserDataField)
}
