package lease_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// failingDeletes refuses to delete the leases of one proxy, as a
// namespace's admission policy might.
type failingDeletes struct {
	client.Client
	proxy string
}

var errDenied = errors.New("denied by policy")

func (f failingDeletes) Delete(ctx context.Context, o client.Object, opts ...client.DeleteOption) error {
	if strings.HasPrefix(o.GetName(), f.proxy+"-") {
		return errDenied
	}
	return f.Client.Delete(ctx, o, opts...)
}

// TestSweepGoesOnPastErrors: a lease the sweeper cannot delete neither
// keeps it from deleting the others nor ends the pass early; the error is
// still reported.
func TestSweepGoesOnPastErrors(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	ctx := context.Background()
	s := lease.NewStore(lease.StoreConfig{Client: bed.Client})
	for _, p := range []string{"p0", "p1", "p2"} {
		if _, err := s.Acquire(ctx, cands(ns, 1, p), lease.Request{Holder: "h", TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	sw := lease.NewStore(lease.StoreConfig{Client: failingDeletes{Client: bed.Client, proxy: "p0"}})
	n, err := sw.Sweep(ctx, func(string, string) bool { return false }, 0)
	if !errors.Is(err, errDenied) {
		t.Errorf("the lease that could not be deleted is reported: %v", err)
	}
	l := &coordv1.LeaseList{}
	if err := bed.Client.List(ctx, l, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	// Sweep reaches every namespace: other tests' leases count in n too.
	if n < 2 || len(l.Items) != 1 || l.Items[0].Name != "p0-slot-0" {
		t.Errorf("the others are swept past the error: deleted %d, left %d", n, len(l.Items))
	}
}
