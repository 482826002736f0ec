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
// service that way. Files: reach.go.
package reach

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"time"

	"github.com/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
)

// ErrRefused is a dial to an address the proxy's kind does not justify.
var ErrRefused = errors.New("upstream address refused")

// Rule says which addresses a proxy may be reached at. Link-local,
// metadata, unspecified, multicast and broadcast addresses never are; the
// zero Rule refuses only those, as for an address a backend reported.
type Rule struct {
	// NoLoopback refuses loopback: every proxy but a local one bound to
	// loopback.
	NoLoopback bool
	// NoPrivate refuses private addresses (RFC 1918, CGNAT, unique local,
	// the documentation ranges ...): an External proxy's.
	NoPrivate bool
	// Permitted are networks permitted whatever the above, loopback or
	// private: the platform's policy for External proxies. A pointer, so
	// that a Rule compares with ==, as the probe's targets do.
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

// For is the rule for the address published for p (status.atProvider.host):
// an External proxy's may be public, or inside permitted; a local proxy's
// may be loopback when it is bound there; any other Managed proxy's may be
// private but not loopback.
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
		return Rule{NoLoopback: err != nil || !a.Unmap().IsLoopback()}
	}
	return Rule{NoLoopback: true}
}

// Check refuses an address the rule does not permit, saying why.
func (r Rule) Check(a netip.Addr) error {
	a = a.Unmap()
	switch {
	case !a.IsValid():
		return errors.Wrap(ErrRefused, "no address")
	case squid.Metadata(a), a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return errors.Wrapf(ErrRefused, "%s is link-local or a metadata server, which no proxy is reached at", a)
	case a.IsUnspecified(), a.IsMulticast(), a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return errors.Wrapf(ErrRefused, "%s is not a unicast address", a)
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
		return errors.Wrapf(ErrRefused, "%s is a private address, which an External proxy may have only inside the platform's permitted networks (--external-private-networks)", a)
	}
	return nil
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
