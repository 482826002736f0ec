package discovery_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// TestQuotaNotBypassedByRenewingExpired: an identity whose leases lapsed
// may take new ones in their stead, but may not then renew the lapsed
// ones too and hold more than its quota.
func TestQuotaNotBypassedByRenewingExpired(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "crawlers", 4, 3, nil)
	fleetXR(t, ns, "crawlers", 4, map[string]any{"maxLeasesPerProxy": int64(3), "quotas": map[string]any{"maxLeasesPerIdentity": int64(2)}})
	var mu sync.Mutex
	now := time.Now()
	clk := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	srv := server(t, fmt.Sprintf("alice-token %s alice\n", ns), func(s *discovery.ServerConfig) {
		s.Now = clk
		withStore(s, func(l *lease.StoreConfig) { l.Now = clk })
	})
	ctx := context.Background()
	alice := &apiv1.Client{BaseURL: srv.URL, Token: "alice-token"}
	req := apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "h", TTL: "1s"}
	var first []*apiv1.Lease
	for range 2 {
		l, err := alice.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		first = append(first, l)
	}
	mu.Lock()
	now = now.Add(15 * time.Second) // past the TTL, the margin and recent grants; before any sweep
	mu.Unlock()
	for range 2 {
		if _, err := alice.Acquire(ctx, req); err != nil {
			t.Fatalf("lapsed leases count no more: %v", err)
		}
	}
	for _, l := range first {
		if _, err := alice.Renew(ctx, l.LeaseID, "1h"); apiErr(err) == nil || apiErr(err).Detail.Reason != apiv1.ReasonLeaseNotFound {
			t.Errorf("a lease the replica saw lapse is not renewed: %v", err)
		}
	}
	ll := &coordv1.LeaseList{}
	if err := bed.Client.List(ctx, ll, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	live := 0
	for i := range ll.Items {
		if ll.Items[i].Annotations[lease.AnnotationIdentity] == "static:alice" && !lease.Expired(&ll.Items[i], clk()) {
			live++
		}
	}
	if live > 2 {
		t.Errorf("quota 2 bypassed: alice holds %d live leases", live)
	}
}

// TestWaitersDoNotBlockOthers: an acquisition waiting for proxies nobody
// serves (a zone without any) neither holds up acquisitions for other
// proxies nor, parked, takes an in-flight slot renewals need; and an
// identity may park only so many.
func TestWaitersDoNotBlockOthers(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "crawlers", 4, 3, nil)
	fleetXR(t, ns, "crawlers", 4, map[string]any{"maxLeasesPerProxy": int64(3), "admission": map[string]any{"maxWait": "5s"}})
	h := replicaHandler(t, ns, fmt.Sprintf("alice-token %[1]s alice\nbob-token %[1]s bob\n", ns), func(s *discovery.ServerConfig) { s.MaxWaitingPerIdentity = 4 })
	srv := httptest.NewServer(discovery.LimitInFlight(h, 4))
	t.Cleanup(srv.Close)
	ctx := context.Background()
	alice := &apiv1.Client{BaseURL: srv.URL, Token: "alice-token"}
	bob := &apiv1.Client{BaseURL: srv.URL, Token: "bob-token"}
	held, err := bob.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "b", TTL: "5m"})
	if err != nil {
		t.Fatal(err)
	}
	nowhere := apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "a", Zone: "nowhere"}
	for range 4 {
		go func() { _, _ = alice.Acquire(ctx, nowhere) }()
	}
	time.Sleep(time.Second)
	start := time.Now()
	if _, err := alice.Acquire(ctx, nowhere); apiErr(err) == nil || apiErr(err).Status != http.StatusConflict || time.Since(start) > 2*time.Second {
		t.Errorf("an identity's fifth waiter, over its bound of 4, is refused at once: %v after %s", err, time.Since(start))
	}
	if _, err := bob.Renew(ctx, held.LeaseID, "5m"); err != nil {
		t.Errorf("a renewal goes through while 4 waiters are parked with an in-flight limit of 4: %v", err)
	}
	if _, err := bob.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "b2", MaxWait: "0"}); err != nil {
		t.Errorf("an acquisition for any zone, with free slots, is not held up by waiters for another zone: %v", err)
	}
}
