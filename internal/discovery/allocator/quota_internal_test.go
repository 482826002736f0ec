package allocator

import (
	"context"
	"testing"
	"time"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
)

// noLeases holds no leases for anyone; nothing else of Leases is called.
type noLeases struct{ Store }

func (noLeases) Held(context.Context, string, string, string) (map[string]bool, error) {
	return map[string]bool{}, nil
}

// TestConnWaiterWokenByItsCallerOnly: a connection waiting at its caller's
// quota is woken by the end of one of its caller's connections, not by
// every connection that ends on the replica (with one channel for all,
// each of a thousand closes elsewhere woke every waiter to count again
// under the lock API grants share).
func TestConnWaiterWokenByItsCallerOnly(t *testing.T) {
	s := New(Config{Leases: noLeases{}})
	one := int32(1)
	p := &catalog.Policy{Quotas: &fleetv1alpha1.Quotas{MaxLeasesPerIdentity: &one}}
	ctx := context.Background()
	alice, bob := &auth.Identity{User: "alice"}, &auth.Identity{User: "bob"}
	aliceLeave, err := s.HoldConn(ctx, "ns", "f", alice, p)
	if err != nil {
		t.Fatal(err)
	}
	bobLeave, err := s.HoldConn(ctx, "ns", "f", bob, p)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		l, err := s.HoldConn(ctx, "ns", "f", alice, p)
		if l != nil {
			defer l()
		}
		done <- err
	}()
	waiting := func() chan struct{} {
		s.quotas.mu.Lock()
		defer s.quotas.mu.Unlock()
		return s.quotas.connClosed[quotaKey("ns", "f", "alice")]
	}
	deadline := time.Now().Add(time.Second)
	for waiting() == nil {
		if time.Now().After(deadline) {
			t.Fatal("alice's second connection does not wait on her own channel")
		}
		time.Sleep(time.Millisecond)
	}
	ch := waiting()
	bobLeave()
	select {
	case <-ch:
		t.Fatal("bob's connection ending woke alice's waiter")
	case err := <-done:
		t.Fatalf("alice's waiter went on when bob's connection ended: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	aliceLeave()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("alice's waiter once her connection ended: %v", err)
		}
	case <-time.After(ConnQuotaGrace):
		t.Fatal("alice's connection ending did not wake her waiter")
	}
}
