package discovery_test

import (
	"context"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestFleetMembersRemembered: the catalog lists a fleet's proxies once
// while none of them changes (an acquisition asks at every try), and a
// change of any Proxy is seen at the next call after the cache saw it.
func TestFleetMembersRemembered(t *testing.T) {
	ctx := context.Background()
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "f", 3, 1, nil)
	c, ca := bed.Replica(t, ns, &coordv1.Lease{}, &v1alpha1.Proxy{})
	cat := &discovery.Catalog{Cache: ca, Direct: c}
	healthy := func() (int, *string) {
		ms, err := cat.Fleet(ctx, ns, "f")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, m := range ms {
			if m.Healthy {
				n++
			}
		}
		if len(ms) == 0 {
			return 0, nil
		}
		return n, &ms[0].Name
	}
	testbed.Eventually(t, 10*time.Second, "the cache sees the fleet", func() (bool, string) {
		n, _ := healthy()
		return n == 3, "healthy proxies: " + string(rune('0'+n))
	})
	// Nothing changed: the same members, not a new list.
	_, a := healthy()
	_, b := healthy()
	if a != b {
		t.Error("the catalog listed an unchanged fleet again: nothing is remembered")
	}
	setHealthy(t, ns, "f-1", false)
	testbed.Eventually(t, 10*time.Second, "a proxy turned unhealthy is seen", func() (bool, string) {
		n, _ := healthy()
		return n == 2, "healthy proxies: " + string(rune('0'+n))
	})
}
