package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// TestIdentityBound: a lease records who was granted it; another identity
// that knows its ID can neither renew, release nor read it (ErrNotYours,
// which discovery answers 403), and the lease stays the grantee's. A lease
// granted before identities were recorded is anybody's who knows its ID.
func TestIdentityBound(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	s := &lease.Store{Client: bed.Client}
	g, err := s.Acquire(ctx, cands(ns, 2, "p0"), lease.Request{Identity: "system:serviceaccount:team-a:crawler", Holder: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	const mallory = "system:serviceaccount:team-b:crawler"
	// On the replica that granted it (which remembers the grant) and on
	// another (which reads it), whose client reads a cache that has not
	// seen the grant yet, as a manager's does: it reads the API server.
	other := &lease.Store{Client: staleReads{bed.Client}, Reader: bed.Client}
	for name, st := range map[string]*lease.Store{"granting replica": s, "another replica": other} {
		if _, err := st.Renew(ctx, g.ID, mallory, time.Hour); !errors.Is(err, lease.ErrNotYours) {
			t.Errorf("%s: renew by another identity: want ErrNotYours, got %v", name, err)
		}
		if err := st.Release(ctx, g.ID, mallory); !errors.Is(err, lease.ErrNotYours) {
			t.Errorf("%s: release by another identity: want ErrNotYours, got %v", name, err)
		}
	}
	if _, err := other.Renew(ctx, g.ID, "system:serviceaccount:team-a:crawler", time.Minute); err != nil {
		t.Errorf("renew by the grantee on another replica: %v", err)
	}
	if _, err := s.Get(ctx, g.ID, mallory); !errors.Is(err, lease.ErrNotYours) {
		t.Errorf("get by another identity: want ErrNotYours, got %v", err)
	}
	l, err := s.Get(ctx, g.ID, "system:serviceaccount:team-a:crawler")
	if err != nil || lease.ExpiresAt(l).After(g.ExpiresAt.Add(time.Minute)) {
		t.Fatalf("the grantee's lease is not extended by another: %v %v", l, err)
	}
	if _, err := s.Renew(ctx, g.ID, "system:serviceaccount:team-a:crawler", time.Minute); err != nil {
		t.Errorf("renew by the grantee: %v", err)
	}
	if err := s.Release(ctx, g.ID, "system:serviceaccount:team-a:crawler"); err != nil {
		t.Errorf("release by the grantee: %v", err)
	}

	old, err := s.Acquire(ctx, cands(ns, 2, "p0"), lease.Request{Holder: "legacy", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Renew(ctx, old.ID, mallory, time.Minute); err != nil {
		t.Errorf("a lease without a recorded identity renews for whoever knows its ID: %v", err)
	}
	if err := s.Release(ctx, old.ID, mallory); err != nil {
		t.Errorf("a lease without a recorded identity releases for whoever knows its ID: %v", err)
	}
}

// staleReads is a client whose reads come from a cache that has seen
// nothing yet.
type staleReads struct{ client.Client }

func (staleReads) Get(_ context.Context, key client.ObjectKey, _ client.Object, _ ...client.GetOption) error {
	return kerrors.NewNotFound(coordv1.Resource("leases"), key.Name)
}
