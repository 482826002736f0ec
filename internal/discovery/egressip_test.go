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
// IP, so to a target they are one client; a lease goes to crawlers-2,
// which has an IP of its own, whenever it has a free slot, and the two
// others still serve once it has none. The status page says so.
func TestDistinctEgressIPsFirst(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	fleet(t, ns, "crawlers", 3, 1, nil)
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
	acquire := func() *apiv1.Lease {
		g, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "h", TTL: "1m"})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	// Eight times: without the preference, a random one of three.
	for i := range 8 {
		g := acquire()
		if g.Proxy != "crawlers-2" {
			t.Fatalf("lease %d went to %s; want crawlers-2, the one proxy with an egress IP of its own", i, g.Proxy)
		}
		if err := c.Release(ctx, g.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	acquire()
	if g := acquire(); g.Proxy == "crawlers-2" {
		t.Fatalf("crawlers-2's one slot is held; the next lease went to it again")
	}
	code, _, body := call(t, srv, "team", "GET", "/", "")
	page := string(body)
	if code != 200 || !strings.Contains(page, "2 distinct egress IPs") || strings.Count(page, ">shared<") != 2 {
		t.Errorf("the status page shows 2 distinct egress IPs and two proxies' IP shared (%d):\n%s", code, page)
	}
}
