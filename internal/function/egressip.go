package function

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/response"
	"google.golang.org/protobuf/types/known/structpb"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/egressip"
)

// ConditionDuplicateEgressIP says whether proxies of the fleet share an
// egress IP: to a target they are one client, whatever the fleet's size.
const ConditionDuplicateEgressIP = "DuplicateEgressIP"

// ConditionEgressDiversity says whether the fleet's proxies keep within
// spec.diversity: at most so many per IPv4 /24, IPv6 /64 and ASN.
const ConditionEgressDiversity = "EgressDiversity"

// keyBeyondLimit is status.egress' count of the proxies beyond a cap, in a
// fleet's, a pool's and a pooled fleet's status.
const keyBeyondLimit = "beyondLimit"

// limitsOf reads spec.diversity.
func limitsOf(s *fleetv1alpha1.ProxyFleetSpec) egressip.Limits {
	var l egressip.Limits
	if d := s.Diversity; d != nil {
		get := func(v *int32) int {
			if v == nil {
				return 0
			}
			return int(*v)
		}
		l = egressip.Limits{PerPrefix4: get(d.MaxPerIPv4Prefix), PerPrefix6: get(d.MaxPerIPv6Prefix), PerASN: get(d.MaxPerASN)}
	}
	return l
}

// assessEgress marks the members that share their egress IP with another
// (Duplicate) and those beyond the fleet's diversity caps (Beyond), and
// counts the distinct addresses and networks the healthy ones leave from.
// Members whose IP is not known yet share none and take no place; the
// oldest (lowest ordinal) keep theirs, so a new proxy never displaces an
// old one. Every
// member with a known IP takes its place under a cap, healthy or not, so
// that a proxy's health flapping does not move the flags of others.
func assessEgress(f *Fleet, members []*member, asn egressip.ASNLookup) egressip.Report {
	n := map[string]int{}
	all := make([]egressip.Member, 0, len(members))
	healthy := make([]egressip.Member, 0, len(members))
	for _, m := range members {
		if m.EgressIP == "" {
			continue
		}
		n[m.EgressIP]++
		ip, err := netip.ParseAddr(m.EgressIP)
		if err != nil {
			continue
		}
		all = append(all, egressip.Member{Name: m.Name, IP: ip, Order: m.Ordinal})
		if m.Healthy {
			healthy = append(healthy, egressip.Member{Name: m.Name, IP: ip})
		}
	}
	excess := egressip.Assess(all, limitsOf(f.spec), asn).Excess
	for _, m := range members {
		m.Duplicate = m.EgressIP != "" && n[m.EgressIP] > 1
		m.Beyond = excess[m.Name]
	}
	r := egressip.Assess(healthy, egressip.Limits{}, asn)
	r.Excess = excess
	return r
}

// egressStatus is status.egress: the report's counts.
func egressStatus(r egressip.Report) *structpb.Value {
	n := func(v int) *structpb.Value { return structpb.NewNumberValue(float64(v)) }
	s := &structpb.Struct{Fields: map[string]*structpb.Value{
		"addresses":    n(r.Addresses),
		"ipv4Prefixes": n(r.Prefixes4),
		"ipv6Prefixes": n(r.Prefixes6),
		keyBeyondLimit: n(len(r.Excess)),
	}}
	if r.ASNs >= 0 {
		s.Fields["asns"] = n(r.ASNs)
	}
	return structpb.NewStructValue(s)
}

// reportDiversity sets the EgressDiversity condition: beyond counts the
// proxies beyond a cap, examples says why for a few of them (at most
// three, by proxy).
func reportDiversity(rsp *fnv1.RunFunctionResponse, f *Fleet, beyond int, examples map[string]string) {
	lim := limitsOf(f.spec)
	if lim == (egressip.Limits{}) {
		response.ConditionTrue(rsp, ConditionEgressDiversity, "NoLimits").
			WithMessage("spec.diversity caps no network: status.egress counts the distinct addresses and networks").TargetCompositeAndClaim()
		return
	}
	if beyond == 0 {
		response.ConditionTrue(rsp, ConditionEgressDiversity, "WithinLimits").
			WithMessage("no network holds more of the fleet's proxies than spec.diversity allows").TargetCompositeAndClaim()
		return
	}
	names := make([]string, 0, len(examples))
	for n := range examples {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names[:min(3, len(names))] {
		parts = append(parts, n+" ("+examples[n]+")")
	}
	msg := fmt.Sprintf("%d proxies leave from a network that holds as many of the fleet's proxies as spec.diversity allows already, and are handed out last: %s", beyond, strings.Join(parts, ", "))
	if len(names) > 3 {
		msg += fmt.Sprintf(" and %d more", len(names)-3)
	}
	msg += fmt.Sprintf("; kubectl get proxies -l %s=true lists them", fleetv1alpha1.LabelBeyondDiversityLimit)
	response.ConditionFalse(rsp, ConditionEgressDiversity, "LimitExceeded").WithMessage(msg).TargetCompositeAndClaim()
}

// reportDuplicates sets the DuplicateEgressIP condition, naming the
// proxies that share an IP (at most three IPs, then how many more).
func reportDuplicates(rsp *fnv1.RunFunctionResponse, members []*member) {
	groups := map[string][]string{}
	known := 0
	for _, m := range members {
		if m.EgressIP != "" {
			known++
		}
		if m.Duplicate {
			groups[m.EgressIP] = append(groups[m.EgressIP], m.Name)
		}
	}
	if known == 0 {
		// No proxy yet, or a health check whose target does not echo the
		// caller's IP: nothing is known to be distinct.
		response.ConditionUnknown(rsp, ConditionDuplicateEgressIP, "NoEgressIPsKnown").
			WithMessage("no proxy's egress IP is known yet: spec.healthCheck.url must answer with the caller's IP").TargetCompositeAndClaim()
		return
	}
	if len(groups) == 0 {
		response.ConditionFalse(rsp, ConditionDuplicateEgressIP, "DistinctEgressIPs").
			WithMessage("every proxy whose egress IP is known leaves from an IP of its own").TargetCompositeAndClaim()
		return
	}
	ips := make([]string, 0, len(groups))
	for ip := range groups {
		ips = append(ips, ip)
	}
	sort.Strings(ips)
	var parts []string
	for i, ip := range ips {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more IPs", len(ips)-3))
			break
		}
		names := groups[ip]
		sort.Strings(names)
		if len(names) > 5 {
			// A fleet behind one NAT would name every proxy.
			names = append(names[:5:5], fmt.Sprintf("%d more", len(names)-5))
		}
		parts = append(parts, fmt.Sprintf("%s share egress IP %s", strings.Join(names, ", "), ip))
	}
	response.ConditionTrue(rsp, ConditionDuplicateEgressIP, "SharedEgressIP").
		WithMessage(strings.Join(parts, "; ") + ": to a target they are one client").TargetCompositeAndClaim()
}
