package discovery_test

import (
	"context"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	coordv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestSweeper runs the sweeper as the manager does: every interval it
// deletes the leases of proxies that are gone and leaves those of live
// proxies, and it stops when its context ends.
func TestSweeper(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "crawlers", 2, 1, nil)
	ctx := context.Background()
	c, ca := bed.Replica(t, ns, &coordv1.Lease{}, &v1alpha1.Proxy{})
	store := lease.NewStore(lease.StoreConfig{Client: c, Cache: ca})
	for _, p := range []string{"crawlers-0", "crawlers-1"} {
		if _, err := store.Acquire(ctx, []lease.Candidate{{Namespace: ns, Fleet: "crawlers", Proxy: p, MaxLeases: 1}}, lease.Request{Holder: "h", TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	gone := &v1alpha1.Proxy{}
	gone.SetNamespace(ns)
	gone.SetName("crawlers-1")
	if err := bed.Client.Delete(ctx, gone); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	sw := &discovery.Sweeper{Leases: store, Proxies: ca, Interval: 100 * time.Millisecond, Log: logging.NewNopLogger()}
	if sw.NeedLeaderElection() {
		t.Error("every replica sweeps: the sweeper needs no leader election")
	}
	go func() { stopped <- sw.Start(sctx) }()
	testbed.Eventually(t, 10*time.Second, "the gone proxy's lease swept, the live one's kept", func() (bool, string) {
		l := &coordv1.LeaseList{}
		if err := bed.Client.List(ctx, l, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		var names []string
		for _, x := range l.Items {
			names = append(names, x.Name)
		}
		return len(names) == 1 && names[0] == "crawlers-0-slot-0", fmtNames(names)
	})
	cancel()
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("the sweeper stops cleanly: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("the sweeper did not stop when its context ended")
	}
}

func fmtNames(n []string) string {
	out := "leases:"
	for _, x := range n {
		out += " " + x
	}
	return out
}
