// Package egressip judges a fleet's egress addresses as targets do: rate
// limiters and bot defences key IPv4 clients by /24 and IPv6 clients by
// /64 (and, increasingly, by the network's ASN), so a fleet of 50 proxies
// in three /24s is three clients to them. It counts the distinct
// prefixes and ASNs a fleet's proxies leave from, and names the proxies
// beyond a per-prefix or per-ASN limit, which the fleet then treats like
// proxies that share an address: flagged and handed out last.
//
// Files: egressip.go (prefixes, the count and the limits), asn.go (the
// offline IP-to-ASN database, MaxMind DB format), recycle.go (when bans
// burn an address, and how many recycles a fleet may start and when).
package egressip

import (
	"fmt"
	"net/netip"
	"sort"
)

// Prefix lengths targets group clients by.
const (
	Bits4 = 24
	Bits6 = 64
)

// PrefixOf is the prefix a target groups a by: its /24 for IPv4 (an
// IPv4-mapped IPv6 address is its IPv4 address), its /64 for IPv6; the
// zero Prefix for an invalid address.
func PrefixOf(a netip.Addr) netip.Prefix {
	a = a.Unmap().WithZone("")
	switch {
	case a.Is4():
		p, _ := a.Prefix(Bits4)
		return p
	case a.Is6():
		p, _ := a.Prefix(Bits6)
		return p
	}
	return netip.Prefix{}
}

// Member is a proxy and the address it leaves from. Order ranks it for
// a place under a cap: lower first (a fleet passes its ordinal, so that
// the older proxies keep their places and a new one never displaces
// them), then by name.
type Member struct {
	Name  string
	IP    netip.Addr
	Order int
}

// Limits cap how many proxies of a fleet may leave from one /24, one /64
// and one ASN; zero is no cap.
type Limits struct {
	PerPrefix4, PerPrefix6, PerASN int
}

// Report is what Assess finds.
type Report struct {
	// Addresses, Prefixes4 and Prefixes6 count the distinct addresses,
	// IPv4 /24s and IPv6 /64s the members leave from.
	Addresses, Prefixes4, Prefixes6 int
	// ASNs counts the distinct networks, when an ASN database was given
	// (and knew at least one address); -1 otherwise.
	ASNs int
	// Excess names the members beyond a limit, sorted, with why.
	Excess map[string]string
}

// ASNLookup says which autonomous system an address belongs to.
type ASNLookup interface {
	ASN(netip.Addr) (uint32, bool)
}

// Assess counts the distinct addresses, prefixes and ASNs of members
// (those with a valid IP), and names the members beyond lim: in each group
// over its cap, the first members by Order, then name, keep their place
// and the rest are excess, so the choice is stable from one assessment to
// the next.
// asn may be nil.
func Assess(members []Member, lim Limits, asn ASNLookup) Report {
	ms := make([]Member, 0, len(members))
	for _, m := range members {
		if m.IP.IsValid() {
			m.IP = m.IP.Unmap().WithZone("")
			ms = append(ms, m)
		}
	}
	sort.Slice(ms, func(i, j int) bool {
		if ms[i].Order != ms[j].Order {
			return ms[i].Order < ms[j].Order
		}
		return ms[i].Name < ms[j].Name
	})
	r := Report{ASNs: -1, Excess: map[string]string{}}
	addrs := map[netip.Addr]bool{}
	prefixes := map[netip.Prefix][]string{}
	asns := map[uint32][]string{}
	for _, m := range ms {
		addrs[m.IP] = true
		p := PrefixOf(m.IP)
		prefixes[p] = append(prefixes[p], m.Name)
		if asn != nil {
			if n, ok := asn.ASN(m.IP); ok {
				asns[n] = append(asns[n], m.Name)
			}
		}
	}
	r.Addresses = len(addrs)
	for p, names := range prefixes {
		limit := lim.PerPrefix4
		if p.Addr().Is4() {
			r.Prefixes4++
		} else {
			r.Prefixes6++
			limit = lim.PerPrefix6
		}
		excess(r.Excess, names, limit, fmt.Sprintf("%s holds its limit of %d proxies already", p, limit))
	}
	if asn != nil && len(asns) > 0 {
		r.ASNs = len(asns)
		for n, names := range asns {
			// A member beyond a prefix cap takes no place under its ASN's
			// either: it is flagged already, and counting it would flag
			// one that keeps both caps.
			kept := names[:0:0]
			for _, name := range names {
				if _, out := r.Excess[name]; !out {
					kept = append(kept, name)
				}
			}
			excess(r.Excess, kept, lim.PerASN, fmt.Sprintf("AS%d holds its limit of %d proxies already", n, lim.PerASN))
		}
	}
	return r
}

// excess marks the names of a group past limit (zero: none), with why.
func excess(out map[string]string, names []string, limit int, why string) {
	if limit <= 0 || len(names) <= limit {
		return
	}
	for _, n := range names[limit:] {
		if _, ok := out[n]; !ok {
			out[n] = why
		}
	}
}
