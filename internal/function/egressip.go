package function

import (
	"fmt"
	"sort"
	"strings"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/response"
)

// ConditionDuplicateEgressIP says whether proxies of the fleet share an
// egress IP: to a target they are one client, whatever the fleet's size.
const ConditionDuplicateEgressIP = "DuplicateEgressIP"

// markDuplicates marks the members that share their egress IP with
// another. Members whose IP is not known yet share none.
func markDuplicates(members []*member) {
	n := map[string]int{}
	for _, m := range members {
		if m.EgressIP != "" {
			n[m.EgressIP]++
		}
	}
	for _, m := range members {
		m.Duplicate = m.EgressIP != "" && n[m.EgressIP] > 1
	}
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
