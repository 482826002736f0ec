package discovery_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
)

// TestDistinctEgressIPsFirst: crawlers-0 and crawlers-1 leave from one
// IP, so to a target they are one client. A lease goes to crawlers-2,
// which has an IP of its own, whenever it has a free slot, even when it is
// the busier; once it has none the two others serve, except for a domain
// that banned either of them, since it banned their IP. The status page
// says which IPs are shared.
func TestDistinctEgressIPsFirst(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	fleet(t, ns, "crawlers", 3, 2, nil)
	p := &v1alpha1.Proxy{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "crawlers-1"}, p); err != nil {
		t.Fatal(err)
	}
	p.Status.AtProvider.EgressIP = "198.51.100.0" // crawlers-0's
	if err := bed.Client.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	srv := server(t, fmt.Sprintf("team %[1]s team\n", ns))
	c := &apiv1.Client{BaseURL: srv.URL, Token: "team"}
	acquire := func(domain string) (*apiv1.Lease, error) {
		return c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "h", TTL: "1m", Domain: domain})
	}
	must := func(domain string) *apiv1.Lease {
		g, err := acquire(domain)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	// Eight times: without the preference, a random one of three.
	for i := range 8 {
		g := must("")
		if g.Proxy != "crawlers-2" {
			t.Fatalf("lease %d went to %s; want crawlers-2, the one proxy with an egress IP of its own", i, g.Proxy)
		}
		if err := c.Release(ctx, g.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	// Half full, crawlers-2 is still first: a distinct IP before load.
	must("")
	if g := must(""); g.Proxy != "crawlers-2" {
		t.Fatalf("with one of crawlers-2's two slots held, the next lease went to %s; want crawlers-2", g.Proxy)
	}
	// Full, the shared ones serve; a ban of crawlers-1 for a domain holds
	// for crawlers-0, which leaves from the same IP.
	banned := must("")
	if banned.Proxy == "crawlers-2" {
		t.Fatalf("crawlers-2's slots are held; the next lease went to it again")
	}
	if err := c.Report(ctx, banned.LeaseID, apiv1.ReportRequest{Domain: "shop.example", Outcome: "banned"}); err != nil {
		t.Fatal(err)
	}
	if g, err := acquire("shop.example"); err == nil {
		t.Fatalf("shop.example banned %s, and so its IP; a lease for it went to %s, which shares that IP", banned.Proxy, g.Proxy)
	}
	if g := must("other.example"); g.Proxy == "crawlers-2" {
		t.Fatalf("another domain: a lease went to the full crawlers-2")
	}
	code, _, body := call(t, srv, "team", "GET", "/", "")
	page := string(body)
	if code != 200 || !strings.Contains(page, "2 distinct egress IPs in 1 IPv4 /24s and 0 IPv6 /64s") || strings.Count(page, ">shared<") != 2 {
		t.Errorf("the status page shows 2 distinct egress IPs, both in one /24, and two proxies' IP shared (%d):\n%s", code, page)
	}
}
