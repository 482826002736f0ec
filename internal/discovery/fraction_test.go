package discovery

import (
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// TestHealthyFraction: a fleet's healthy share counts proxies gone against
// spec.replicas, but an autoscaled fleet's proxies still booting are no
// proxies lost: growing must not trip admission control.
func TestHealthyFraction(t *testing.T) {
	up := member{Healthy: true}
	booting := member{Booting: true}
	failed := member{}
	cases := map[string]struct {
		ms   []member
		p    Policy
		want float64
	}{
		"GoneCountAgainstReplicas":  {[]member{up, failed}, Policy{Replicas: 4}, 0.25},
		"BootingCountWhenFixedSize": {[]member{up, booting}, Policy{Replicas: 2}, 0.5},
		"AutoscaledGrowing":         {[]member{up, booting, booting}, Policy{Autoscaled: true}, 1},
		"AutoscaledLosing":          {[]member{up, failed, booting}, Policy{Autoscaled: true}, 0.5},
		"AutoscaledAtZero":          {nil, Policy{Autoscaled: true}, 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := healthyFraction(tc.ms, &tc.p); got != tc.want {
				t.Errorf("healthyFraction = %g, want %g", got, tc.want)
			}
		})
	}
}

// TestRefusalsCounted: refusals count for a minute, and no longer.
func TestRefusalsCounted(t *testing.T) {
	var r refusals
	t0 := time.Now()
	for i := range 3 {
		r.record("ns/f", t0.Add(time.Duration(i)*10*time.Second))
	}
	if n := r.count("ns/f", t0.Add(30*time.Second)); n != 3 {
		t.Errorf("3 refusals in the last 30 s: counted %d", n)
	}
	if n := r.count("ns/f", t0.Add(65*time.Second)); n != 2 {
		t.Errorf("65 s after the first of 3 refusals 10 s apart: counted %d, want 2", n)
	}
	if n := r.count("ns/f", t0.Add(lease.DemandFreshness+30*time.Second)); n != 0 {
		t.Errorf("90 s on: counted %d, want 0", n)
	}
	if len(r.at) != 0 {
		t.Errorf("a fleet with no refusals left is forgotten: %v", r.at)
	}
}
