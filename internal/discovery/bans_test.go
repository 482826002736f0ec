package discovery_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	coordv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// TestBanLimits: the live bans of a fleet, and of each identity in it, are
// bounded; a ban over either bound is answered 429 and not recorded, and
// extending a live ban is always allowed.
func TestBanLimits(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "banned", 1, 2, nil)
	// The replica's cache shows no ban at all, as one that lags does: only
	// what the replica remembers it recorded holds the bounds.
	srv := server(t, "alice-token "+ns+"\nbob-token "+ns+"\n", func(s *discovery.ServerConfig) {
		s.MaxBansPerFleet, s.MaxBansPerIdentity = 3, 2
		withStore(s, func(l *lease.StoreConfig) { l.Cache = blindToLeases{bed.Client} })
	})
	ctx := context.Background()
	alice := &apiv1.Client{BaseURL: srv.URL, Token: "alice-token"}
	bob := &apiv1.Client{BaseURL: srv.URL, Token: "bob-token"}
	la, err := alice.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/banned", Holder: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	lb, err := bob.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/banned", Holder: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	ban := func(c *apiv1.Client, id, domain string) error {
		return c.Report(ctx, id, apiv1.ReportRequest{Domain: domain, Outcome: "banned"})
	}
	tooMany := func(err error) bool {
		var ae *apiv1.APIError
		return asAPIError(err, &ae) && ae.Status == http.StatusTooManyRequests
	}
	recorded := func() []string {
		l := &coordv1.LeaseList{}
		if err := bed.Client.List(ctx, l, client.InNamespace(ns), client.MatchingLabels{fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindBan}); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, b := range l.Items {
			out = append(out, b.Annotations[lease.AnnotationDomain])
		}
		return out
	}
	// Six reports at once: two pass.
	var wg sync.WaitGroup
	var passed atomic.Int32
	for _, d := range []string{"a.example", "b.example", "c.example", "c1.example", "c2.example", "c3.example"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := ban(alice, la.LeaseID, d); err == nil {
				passed.Add(1)
			} else if !tooMany(err) {
				t.Errorf("ban %s: want 429 or success, got %v", d, err)
			}
		}()
	}
	wg.Wait()
	mine := recorded()
	if n := passed.Load(); n != 2 || len(mine) != 2 {
		t.Fatalf("reports racing past alice's bound of 2: %d answered, %v recorded", n, mine)
	}
	if err := ban(alice, la.LeaseID, mine[0]); err != nil {
		t.Errorf("extending a live ban is allowed: %v", err)
	}
	if err := ban(bob, lb.LeaseID, "d.example"); err != nil {
		t.Fatalf("bob's first ban, the fleet's third: %v", err)
	}
	if err := ban(bob, lb.LeaseID, "e.example"); !tooMany(err) {
		t.Errorf("a fourth ban in the fleet: want 429 at once, got %v", err)
	}
	if got := recorded(); len(got) != 3 {
		t.Errorf("want the 3 bans within the bounds recorded, got %v", got)
	}
}
