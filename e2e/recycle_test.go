//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	discoveryv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// burnedAddressRecycled gives the rotor fleet a recycling policy and has a
// crawler report bans by two domains on the proxy its lease is on: its
// address is burned, and the fleet recycles it through the rollout
// machinery: a replacement (which leaves from another address) is Ready
// before the burned proxy goes, the fleet never drops below its floor,
// and its status lists the recycle with the address and why, and says
// that nothing burned waits afterwards.
func burnedAddressRecycled(t *testing.T) {
	ctx := context.Background()
	const floor = 2
	start := waitFleet(t, rotor, 2, 2*time.Minute)
	patch(t, rotor, `{"spec":{"recycling":{"bannedByDomains":2,"maxPerHour":1,"backoff":"1m"}}}`)
	c := discoveryClient(t)
	held, err := c.Acquire(ctx, discoveryv1.AcquireRequest{Fleet: ns + "/" + rotor, Holder: "e2e-recycle", TTL: "5m"})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	victim, ip := held.Proxy, ""
	if ps, err := proxies(rotor); err == nil {
		for _, p := range ps {
			if p.Name == victim {
				ip = p.Status.AtProvider.EgressIP
			}
		}
	}
	if ip == "" {
		t.Fatalf("the leased proxy %s has no egress IP; proxies %v", victim, start)
	}
	for _, domain := range []string{"shop.example", "news.example"} {
		if err := c.Report(ctx, held.LeaseID, discoveryv1.ReportRequest{Domain: domain, Outcome: "banned"}); err != nil {
			t.Fatalf("report a ban by %s: %v", domain, err)
		}
	}
	if err := c.Release(ctx, held.LeaseID); err != nil {
		t.Fatal(err)
	}
	sample := sampleReady(rotor, floor)
	burned := time.Now()
	// The replacement is Ready while the burned proxy is still there.
	var replacement string
	testbed.Eventually(t, 4*time.Minute, "a replacement of "+victim+" Ready beside it", func() (bool, string) {
		ps, err := proxies(rotor)
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		found := false
		for _, p := range ps {
			seen = append(seen, fmt.Sprintf("%s(ready=%t ip=%s recycle-of=%q)", p.Name, isReady(&p), p.Status.AtProvider.EgressIP, p.Annotations[fleetv1alpha1.AnnotationRecycleOf]))
			if p.Name == victim {
				found = true
			}
			if p.Annotations[fleetv1alpha1.AnnotationRecycleOf] == victim && isReady(&p) {
				replacement = p.Name
				if got := p.Status.AtProvider.EgressIP; got == ip || got == "" {
					return false, fmt.Sprintf("the replacement %s leaves from %q, want another address than %s", p.Name, got, ip)
				}
			}
		}
		if replacement != "" && !found {
			t.Fatalf("%s went before its replacement %s was Ready: %v", victim, replacement, seen)
		}
		return replacement != "" && found, strings.Join(seen, " ")
	})
	testbed.Eventually(t, 2*time.Minute, victim+" gone, the fleet whole again", func() (bool, string) {
		st, ps, err := observe(rotor)
		if err != nil {
			return false, err.Error()
		}
		now, _ := namesAndReady(ps)
		return st.ready && st.healthy == 2 && len(ps) == 2 && !contains(now, victim), fmt.Sprintf("%v %+v", now, st)
	})
	// The ban history stays with the address, not the proxy that went.
	hist := &coordv1.Lease{}
	if err := stack.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: lease.IPBansName(rotor, lease.CanonicalIP(ip))}, hist); err != nil {
		t.Errorf("the ban history of %s after %s went: %v", ip, victim, err)
	} else {
		domains := map[string]bool{}
		for _, b := range lease.HistoryOf(hist, time.Now()) {
			domains[b.Domain] = true
		}
		if !domains["shop.example"] || !domains["news.example"] {
			t.Errorf("the ban history of %s after %s went lists %v, want both domains", ip, victim, domains)
		}
	}
	r := sample()
	t.Logf("%s (%s) recycled into %s in %.1fs after two domains banned it; lowest Ready count %d over %d samples",
		victim, ip, replacement, time.Since(burned).Seconds(), r.minReady, r.samples)
	if r.minReady < floor {
		t.Errorf("the recycle dropped to %d Ready proxies, below replicas - maxUnavailable = %d: %v", r.minReady, floor, r.lowAt)
	}
	testbed.Eventually(t, time.Minute, "the fleet's status lists the recycle, nothing burned waiting", func() (bool, string) {
		u := fleetObject(rotor)
		if err := stack.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: rotor}, u); err != nil {
			return false, err.Error()
		}
		recs, _, _ := unstructured.NestedSlice(u.Object, "status", "egress", "recycles")
		waiting, _, _ := unstructured.NestedString(u.Object, "status", "egress", "recycleWaiting")
		for _, v := range recs {
			m, _ := v.(map[string]any)
			reason, _ := m["reason"].(string)
			if m["proxy"] == victim && m["egressIP"] == ip && strings.Contains(reason, "banned by 2 or more domains") {
				return waiting == "", fmt.Sprintf("recycleWaiting %q", waiting)
			}
		}
		return false, fmt.Sprintf("status.egress.recycles %v", recs)
	})
	patch(t, rotor, `{"spec":{"recycling":null}}`)
	assertNotThrottled(t, rotor)
}
