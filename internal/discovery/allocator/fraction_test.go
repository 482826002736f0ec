package allocator

import (
	"fmt"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
)

// TestHealthyFraction: a fleet's healthy share counts proxies gone against
// spec.replicas, but an autoscaled fleet's proxies still booting are no
// proxies lost: growing must not trip admission control.
func TestHealthyFraction(t *testing.T) {
	up := catalog.Member{Healthy: true}
	booting := catalog.Member{Booting: true}
	failed := catalog.Member{}
	cases := map[string]struct {
		ms   []catalog.Member
		p    catalog.Policy
		want float64
	}{
		"GoneCountAgainstReplicas":  {[]catalog.Member{up, failed}, catalog.Policy{Replicas: 4}, 0.25},
		"BootingCountWhenFixedSize": {[]catalog.Member{up, booting}, catalog.Policy{Replicas: 2}, 0.5},
		"AutoscaledGrowing":         {[]catalog.Member{up, booting, booting}, catalog.Policy{Autoscaled: true}, 1},
		"AutoscaledLosing":          {[]catalog.Member{up, failed, booting}, catalog.Policy{Autoscaled: true}, 0.5},
		"AutoscaledAtZero":          {nil, catalog.Policy{Autoscaled: true}, 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := HealthyFraction(tc.ms, &tc.p); got != tc.want {
				t.Errorf("HealthyFraction = %g, want %g", got, tc.want)
			}
		})
	}
}

// TestRefusalsCounted: a crawler refused counts once however often it asks
// again, for a minute after its last refusal, and no longer; an identity
// counts for at most its quota.
func TestRefusalsCounted(t *testing.T) {
	var r refusals
	t0 := time.Now()
	for i := range 3 {
		r.record("ns/f", fmt.Sprintf("crawler-%d", i), "h", 0, t0.Add(time.Duration(i)*10*time.Second))
	}
	for i := range 50 {
		r.record("ns/f", "crawler-2", "h", 0, t0.Add(20*time.Second+time.Duration(i)*100*time.Millisecond))
	}
	if n := r.count("ns/f", t0.Add(30*time.Second)); n != 3 {
		t.Errorf("3 crawlers refused, one of them 51 times: counted %d, want 3", n)
	}
	if n := r.count("ns/f", t0.Add(65*time.Second)); n != 2 {
		t.Errorf("65 s after the first of 3 refusals 10 s apart: counted %d, want 2", n)
	}
	if n := r.count("ns/f", t0.Add(leasewire.DemandFreshness+30*time.Second)); n != 0 {
		t.Errorf("90 s on: counted %d, want 0", n)
	}
	if len(r.at) != 0 {
		t.Errorf("a fleet with no refusals left is forgotten: %v", r.at)
	}
	for i := range maxRefusalsKept + 10 {
		r.record("ns/g", fmt.Sprintf("c%d", i), "h", 0, t0)
	}
	if n := r.count("ns/g", t0); n != maxRefusalsKept {
		t.Errorf("refused crawlers remembered: %d, bound %d", n, maxRefusalsKept)
	}
	// One identity making up a holder name per request counts for no
	// more than its quota; without one, per holder.
	for i := range 100 {
		r.record("ns/h", "greedy", fmt.Sprintf("random-%d", i), 2, t0)
		r.record("ns/h", "team", fmt.Sprintf("worker-%d", i%5), 0, t0)
	}
	if n := r.count("ns/h", t0); n != 2+5 {
		t.Errorf("an identity with quota 2 under 100 holder names and one without a quota under 5: counted %d, want 7", n)
	}
	// Without a quota, made-up holder names count up to a bound, and are
	// not kept past it: the flood leaves room for everyone else.
	for i := range maxRefusalsKept {
		r.record("ns/i", "flood", fmt.Sprintf("random-%d", i), 0, t0)
	}
	r.record("ns/i", "honest", "h", 0, t0)
	if n := r.count("ns/i", t0); n != refusedHoldersWithoutQuota+1 {
		t.Errorf("an identity without a quota under %d holder names, and another: counted %d, want %d", maxRefusalsKept, n, refusedHoldersWithoutQuota+1)
	}
}

// TestPolicyServes: a refusal for a zone the fleet has no proxies in is no
// demand a new proxy could meet.
func TestPolicyServes(t *testing.T) {
	p := &catalog.Policy{Zones: []string{"a", "b"}}
	if !p.Serves("") || !p.Serves("a") || p.Serves("nope") {
		t.Errorf("serves: any %v, a %v, nope %v", p.Serves(""), p.Serves("a"), p.Serves("nope"))
	}
}
