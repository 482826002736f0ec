package gateway

import (
	"fmt"
	"testing"
	"time"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
)

// members are proxies named p0.. leaving from ips, as a fleet's members,
// and all of them as candidates, in the catalogue's tiers; beyond are
// the indexes of those labelled beyond the fleet's diversity caps.
func members(ips []string, beyond ...int) (*catalog.Members, [2][]*catalog.Member) {
	ms := make([]catalog.Member, len(ips))
	for i, ip := range ips {
		ms[i] = catalog.Member{Name: fmt.Sprintf("p%d", i), EgressIP: ip, Healthy: true, MaxLeases: 1}
	}
	for _, i := range beyond {
		ms[i].BeyondDiversityLimit = true
	}
	f := catalog.NewMembers(0, ms)
	var cands [2][]*catalog.Member
	for t, idx := range [2][]int32{f.Own, f.Shared} {
		for _, i := range idx {
			cands[t] = append(cands[t], &f.Items[i])
		}
	}
	return f, cands
}

// pick runs n connections of one caller through the rotor, each taking
// the strategy's first choice, and returns the proxies in order.
func pick(r *rotor, strategy string, cands [2][]*catalog.Member, n int) []string {
	now := time.Unix(1_700_000_000, 0)
	var out []string
	for i := range n {
		at := now.Add(time.Duration(i) * time.Second)
		m := r.order(strategy, cands, 1, "caller", "ring", nil, nil, at)[0]
		r.note("caller", m, at)
		out = append(out, m.Name)
	}
	return out
}

// TestRotationSpreadsOverNetworks: a target counts an IPv4 /24 (an IPv6
// /64) as one client. Least recently used takes the network used longest
// ago first: p3, alone in its /24, carries every other connection, and
// the three of 203.0.113.0/24 share the rest; round robin lets networks
// take turns; the IPv4-mapped form of an address is its IPv4 network.
func TestRotationSpreadsOverNetworks(t *testing.T) {
	_, cands := members([]string{"203.0.113.1", "203.0.113.2", "::ffff:203.0.113.3", "198.51.100.1"})
	got := pick(&rotor{}, apiv1.RotateLeastRecentlyUsed, cands, 12)
	count := map[string]int{}
	for i, p := range got {
		count[p]++
		if i > 0 && (p == "p3") == (got[i-1] == "p3") {
			t.Fatalf("connections %d and %d left through one network: %v", i-1, i, got)
		}
	}
	if count["p3"] != 6 || count["p0"] != 2 || count["p1"] != 2 || count["p2"] != 2 {
		t.Errorf("12 connections, least recently used: %v; want p3 6 times, the others of its /24 twice each", count)
	}

	got = pick(&rotor{}, apiv1.RotateRoundRobin, cands, 8)
	want := []string{"p0", "p3", "p1", "p2", "p0", "p3", "p1", "p2"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("round robin: %v, want networks in turn %v", got, want)
	}
}

// TestRotationCrowdedLast: proxies sharing an egress IP, or labelled
// beyond the fleet's diversity caps, are chosen only when fewer of the
// others serve than a connection tries.
func TestRotationCrowdedLast(t *testing.T) {
	_, cands := members([]string{"203.0.113.1", "203.0.113.1", "198.51.100.1", "192.0.2.1"}, 3)
	for _, strategy := range []string{apiv1.RotateLeastRecentlyUsed, apiv1.RotateRoundRobin, apiv1.RotateRandom, apiv1.RotateLeastConnections} {
		r := &rotor{}
		for i := range 20 {
			got := r.order(strategy, cands, 3, "caller", "ring", map[string]int{}, nil, time.Unix(int64(i), 0))
			if len(got) != 3 || got[0].Name != "p2" {
				t.Fatalf("%s: choices %v; want p2, the one proxy of its own, first", strategy, names(got))
			}
		}
	}
}

func names(ms []*catalog.Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Name
	}
	return out
}
