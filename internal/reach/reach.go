// Package reach decides which addresses a proxy may be reached at, by
// the provider's probe and by egress-discovery's gateway. The address is
// checked where it is dialed, after name resolution (net.Dialer's Control),
// so that a name that resolves somewhere else later (DNS rebinding) is
// refused at that dial, and nothing is sent to a refused address.
//
// A proxy's kind justifies its addresses: a Managed proxy's address comes
// from its backend (a pod's, a VM's, a local Squid's bind address), an
// External proxy's from whoever wrote its endpoint, who must not be able to
// point the provider or the gateway at the metadata server or an internal
// service that way; nor may the tenant whose own cluster runs a namespaced
// ProviderConfig's pods. Files: reach.go.
package reach

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
)

// ErrRefused is a dial to an address the proxy's kind does not justify.
var ErrRefused = errors.New("upstream address refused")

// Rule says which addresses a proxy may be reached at. Link-local,
// metadata, multicast and broadcast addresses never are, nor an address
// embedding one (NAT64, 6to4, IPv4-translated), which is judged as the
// IPv4 address it carries. The zero Rule refuses only those and the
// unspecified addresses, as for an address a platform's backend reported.
type Rule struct {
	// NoLoopback refuses loopback: every proxy but a local one bound to
	// loopback (or to every address).
	NoLoopback bool
	// NoPrivate refuses private addresses (RFC 1918, CGNAT, unique local,
	// the documentation ranges ...): an address a tenant chose.
	NoPrivate bool
	// Unspecified permits 0.0.0.0 and ::, which reach the host itself: a
	// local proxy bound to every address publishes them.
	Unspecified bool
	// Permitted are networks permitted whatever the above, loopback or
	// private: the platform's policy for addresses tenants choose. A
	// pointer, so that a Rule compares with ==, as the probe's targets do.
	Permitted *Networks
}

// Networks is a set of networks, as ParseNetworks reads them.
type Networks []netip.Prefix

// Contains reports whether a lies in one of the networks; a nil set holds
// none.
func (n *Networks) Contains(a netip.Addr) bool {
	if n == nil {
		return false
	}
	for _, p := range *n {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// For is the rule for the address published for p (status.atProvider.host).
// An address a tenant chose, an External proxy's endpoint or one reported
// by the backend of a namespaced ProviderConfig (the tenant's own cluster
// or account), may be public, or inside permitted. A local proxy's may be
// loopback when it is bound to loopback or to every address (a tenant's
// local proxy's never private). Any other Managed proxy's, its platform
// backend's (a pod's, a VM's), may be private but not loopback. The mode,
// the placement and the ProviderConfig's kind it goes by are immutable.
func For(p *v1alpha1.Proxy, permitted *Networks) Rule {
	fp := p.Spec.ForProvider
	switch {
	case fp.Mode == v1alpha1.ProxyModeExternal:
		return Rule{NoLoopback: true, NoPrivate: true, Permitted: permitted}
	case fp.Local != nil:
		bind := string(fp.Local.BindAddress)
		if bind == "" {
			bind = "127.0.0.1"
		}
		a, err := netip.ParseAddr(bind)
		host := err == nil && (a.Unmap().IsLoopback() || a.IsUnspecified())
		r := Rule{NoLoopback: !host, Unspecified: err == nil && a.IsUnspecified()}
		if TenantBackend(p) {
			// A tenant's local proxy listens on loopback (its
			// ProviderConfig may not choose otherwise): never private.
			r.NoPrivate, r.Permitted = true, permitted
		}
		return r
	case TenantBackend(p):
		return Rule{NoLoopback: true, NoPrivate: true, Permitted: permitted}
	}
	return Rule{NoLoopback: true}
}

// TenantBackend reports whether p's backend is its namespace's own: a
// namespaced ProviderConfig, whose cluster or cloud account the tenant
// runs, and so whose addresses (a pod's IP) the tenant may choose.
func TenantBackend(p *v1alpha1.Proxy) bool {
	ref := p.GetProviderConfigReference()
	return ref != nil && ref.Kind == v1alpha1.ProviderConfigKind
}

// PlatformVM reports whether p is a VM of the platform's cloud account:
// a Managed GCP or AWS proxy of a ClusterProviderConfig, whose address the
// platform's backend reported.
func PlatformVM(p *v1alpha1.Proxy) bool {
	fp := p.Spec.ForProvider
	return fp.Mode != v1alpha1.ProxyModeExternal && (fp.GCP != nil || fp.AWS != nil) && !TenantBackend(p)
}

// StandInVMs is where make scale's stand-in VMs listen (one loopback
// address each): the only loopback addresses a platform VM may be dialed
// at, and only with egress-discovery's hidden test flag.
func StandInVMs() *Networks { return &Networks{netip.MustParsePrefix("127.1.0.0/16")} }

// Check refuses an address the rule does not permit, saying why.
func (r Rule) Check(a netip.Addr) error {
	a = a.Unmap()
	if v4, ok := embedded(a); ok {
		return r.Check(v4)
	}
	switch {
	case !a.IsValid():
		return errors.Wrap(ErrRefused, "no address")
	case squid.Metadata(a), a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return errors.Wrapf(ErrRefused, "%s is link-local or a metadata server, which no proxy is reached at", a)
	case a.IsUnspecified():
		if r.Unspecified {
			return nil
		}
		return errors.Wrapf(ErrRefused, "%s is the unspecified address, which reaches the host itself", a)
	case thisNetwork.Contains(a), a.IsMulticast(), a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return errors.Wrapf(ErrRefused, "%s is not a unicast address a proxy is reached at", a)
	case r.Permitted.Contains(a):
		return nil
	case a.IsLoopback():
		if !r.NoLoopback {
			return nil
		}
		return errors.Wrapf(ErrRefused, "%s is loopback, where only a local proxy bound to loopback is reached", a)
	case private(a):
		if !r.NoPrivate {
			return nil
		}
		return errors.Wrapf(ErrRefused, "%s is a private address, which a proxy whose address its tenant chose (External, or of a namespaced ProviderConfig) may have only inside the platform's --tenant-private-networks", a)
	}
	return nil
}

// thisNetwork is 0.0.0.0/8, which Linux takes for the host itself.
var thisNetwork = netip.MustParsePrefix("0.0.0.0/8")

// embedders are the IPv6 prefixes that carry an IPv4 address, and where
// it sits: NAT64 (64:ff9b::/96 and the local-use 64:ff9b:1::/48, last 32
// bits), IPv4-translated (::ffff:0:0:0/96, last 32 bits) and 6to4
// (2002::/16, bits 16 to 48).
var embedders = []struct {
	p   netip.Prefix
	off int
}{
	{netip.MustParsePrefix("64:ff9b::/96"), 12},
	{netip.MustParsePrefix("64:ff9b:1::/48"), 12},
	{netip.MustParsePrefix("::ffff:0:0:0/96"), 12},
	{netip.MustParsePrefix("2002::/16"), 2},
}

// embedded is the IPv4 address an IPv6 one carries, if it does.
func embedded(a netip.Addr) (netip.Addr, bool) {
	if !a.Is6() {
		return netip.Addr{}, false
	}
	for _, e := range embedders {
		if e.p.Contains(a) {
			b := a.As16()
			return netip.AddrFrom4([4]byte(b[e.off : e.off+4])), true
		}
	}
	return netip.Addr{}, false
}

// private reports whether a is in the space no public proxy is at: the
// destinations a proxy never reaches by default.
func private(a netip.Addr) bool {
	for _, p := range squid.PrivateDestinations {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Control is net.Dialer's Control: it refuses the dial of an address the
// rule does not permit before a packet is sent.
func (r Rule) Control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return errors.Wrapf(ErrRefused, "cannot tell where %s is", address)
	}
	return r.Check(ap.Addr())
}

// Dial connects to address with the rule checked on every address tried.
func (r Rule) Dial(ctx context.Context, network, address string, timeout time.Duration) (net.Conn, error) {
	return (&net.Dialer{Timeout: timeout, Control: r.Control}).DialContext(ctx, network, address)
}

// ParseNetworks reads CIDRs, masked, naming the one at fault.
func ParseNetworks(cidrs []string) (*Networks, error) {
	out := make(Networks, 0, len(cidrs))
	for _, c := range cidrs {
		if c = strings.TrimSpace(c); c == "" {
			continue
		}
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, errors.Errorf("%q is not a network in CIDR notation, such as 10.0.0.0/8", c)
		}
		out = append(out, p.Masked())
	}
	return &out, nil
}
