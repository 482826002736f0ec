package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// TestTakeInFlightIsListed: from the moment a take is in flight, Leased
// lists its proxy, held for up to maxTTL; the take then asks Serving, and
// a proxy that began to drain meanwhile gets no lease.
func TestTakeInFlightIsListed(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	ctx := context.Background()
	asked, answer := make(chan struct{}), make(chan bool)
	s := lease.NewStore(lease.StoreConfig{Client: bed.Client, Serving: func(context.Context, string, string, string, int) bool {
		asked <- struct{}{}
		return <-answer
	}})
	done := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctx, []lease.Candidate{{Namespace: ns, Fleet: "crawlers", Proxy: "crawlers-0", MaxLeases: 1}}, lease.Request{Holder: "a", TTL: time.Minute})
		done <- err
	}()
	<-asked
	got, slots, err := s.LeasedAndSlots(ctx, ns, "crawlers", 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Name != "crawlers-0" || time.Until(got[0].HeldUntil.Time) < 10*time.Minute || slots != 0 {
		t.Fatalf("a take in flight: want crawlers-0 listed, held up to maxTTL + skew, and no slot yet; got %+v, %d slots", got, slots)
	}
	// It began to drain: the take gives up, and nothing is held.
	answer <- false
	if err := <-done; !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("a take of a proxy no longer serving: want ErrUnavailable, got %v", err)
	}
	l := &coordv1.LeaseList{}
	if err := bed.Client.List(ctx, l, client.InNamespace(ns)); err != nil || len(l.Items) != 0 {
		t.Fatalf("a refused take wrote %d Leases (%v)", len(l.Items), err)
	}
	if got, _ := s.Leased(ctx, ns, "crawlers", 10*time.Minute); len(got) != 0 {
		t.Errorf("after the take gave up: want nothing listed, got %+v", got)
	}
	// Still serving: granted, and listed from this replica's own write.
	go func() {
		_, err := s.Acquire(ctx, []lease.Candidate{{Namespace: ns, Fleet: "crawlers", Proxy: "crawlers-0", MaxLeases: 1}}, lease.Request{Holder: "a", TTL: time.Minute})
		done <- err
	}()
	<-asked
	answer <- true
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, slots, _ := s.LeasedAndSlots(ctx, ns, "crawlers", 10*time.Minute); len(got) != 1 || got[0].Holders != 1 || slots != 1 {
		t.Errorf("a granted lease: want crawlers-0 listed once, its one slot counted; got %+v, %d slots", got, slots)
	}
}
