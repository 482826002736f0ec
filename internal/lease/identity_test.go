package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
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
	s := lease.NewStore(lease.StoreConfig{Client: bed.Client})
	g, err := s.Acquire(ctx, cands(ns, 2, "p0"), lease.Request{Identity: "system:serviceaccount:team-a:crawler", Holder: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	const mallory = "system:serviceaccount:team-b:crawler"
	// On the replica that granted it (which remembers the grant) and on
	// another (which reads it), whose client reads a cache that has not
	// seen the grant yet, as a manager's does: it reads the API server.
	other := lease.NewStore(lease.StoreConfig{Client: staleReads{bed.Client}, Reader: bed.Client})
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

// TestSharedLease: a gateway session's lease is found by its holder for
// its grantee only (HeldBy). A second replica takes it up (Share, the
// grantee only) and is named on it beside the granter; each replica
// leaving takes itself off, and the last deletes it. A lease never shared
// is deleted by its granter leaving.
func TestSharedLease(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	granter := lease.NewStore(lease.StoreConfig{Client: bed.Client})
	// Another replica, whose reads go to the API server.
	other := lease.NewStore(lease.StoreConfig{Client: staleReads{bed.Client}, Reader: bed.Client})
	const me, mallory, holder = "system:serviceaccount:team-a:crawler", "system:serviceaccount:team-b:crawler", "gateway-session:k"
	take := func() *lease.Grant {
		g, err := granter.Acquire(ctx, cands(ns, 2, "p0"), lease.Request{Identity: me, Holder: holder, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	replicas := func(g *lease.Grant) (string, bool) {
		l, err := granter.Get(ctx, g.ID, me)
		if errors.Is(err, lease.ErrNotFound) {
			return "", false
		}
		if err != nil {
			t.Fatal(err)
		}
		return l.Annotations[lease.AnnotationReplicas], true
	}
	g := take()
	if found, err := other.HeldBy(ctx, ns, "crawlers", holder, me); err != nil || found.ID != g.ID || found.Proxy != "p0" {
		t.Fatalf("HeldBy the grantee: %+v, %v; want %s", found, err, g.ID)
	}
	for _, who := range [][3]string{{holder, mallory, "crawlers"}, {"gateway-session:other", me, "crawlers"}, {holder, me, "other-fleet"}} {
		if found, err := other.HeldBy(ctx, ns, who[2], who[0], who[1]); !errors.Is(err, lease.ErrNotFound) {
			t.Errorf("HeldBy(%v): %+v, %v; want ErrNotFound", who, found, err)
		}
	}
	if ok, err := other.Leave(ctx, g.ID, me, "second", false); ok || err != nil {
		t.Fatalf("a replica that never took up a lease leaving it: deleted %v, %v; want it kept", ok, err)
	}
	if _, ok := replicas(g); !ok {
		t.Fatal("a replica that never took up the lease deleted it")
	}
	if ok, err := granter.Leave(ctx, g.ID, me, "first", true); !ok || err != nil {
		t.Fatalf("a lease never shared is deleted by its granter leaving: %v, %v", ok, err)
	}
	if _, ok := replicas(g); ok {
		t.Fatal("left, the lease is still there")
	}

	g = take()
	if _, err := other.Share(ctx, g.ID, mallory, time.Minute, "second"); !errors.Is(err, lease.ErrNotYours) {
		t.Errorf("another identity shares the lease: want ErrNotYours, got %v", err)
	}
	for range 2 { // Twice: a replica is named once.
		if _, err := other.Share(ctx, g.ID, me, time.Minute, "second"); err != nil {
			t.Fatal(err)
		}
	}
	if r, _ := replicas(g); r != lease.Granter+",second" {
		t.Fatalf("shared: replicas %q, want the granter and the second", r)
	}
	if ok, err := granter.Leave(ctx, g.ID, me, "first", true); ok || err != nil {
		t.Fatalf("the granter leaving a lease the second uses: deleted %v, %v; want it kept", ok, err)
	}
	if r, ok := replicas(g); !ok || r != "second" {
		t.Fatalf("after the granter left: held %v, replicas %q; want held by the second alone", ok, r)
	}
	if ok, err := other.Leave(ctx, g.ID, me, "third", false); ok || err != nil {
		t.Fatalf("a replica not named leaving: deleted %v, %v; want nothing changed", ok, err)
	}
	if ok, err := other.Leave(ctx, g.ID, me, "second", false); !ok || err != nil {
		t.Fatalf("the last replica leaving deletes the lease: %v, %v", ok, err)
	}
	if _, ok := replicas(g); ok {
		t.Fatal("the last replica left, and the lease is still there")
	}

	// A session that moved holds its old lease while tunnels on it run:
	// the one granted last is the session's.
	old, moved := take(), take()
	// Renewed for longer, the old one expires last.
	if _, err := granter.Renew(ctx, old.ID, me, time.Hour); err != nil {
		t.Fatal(err)
	}
	if found, err := other.HeldBy(ctx, ns, "crawlers", holder, me); err != nil || found.ID != moved.ID {
		t.Fatalf("HeldBy with two leases: %+v, %v; want the later %s, not %s", found, err, moved.ID, old.ID)
	}
}
