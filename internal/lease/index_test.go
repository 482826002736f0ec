package lease_test

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestIndexedReadsAgree: a store whose cache has the Lease indexes (an
// informer cache) reads a fleet's slots, one proxy's slots, its bans, a
// sticky key's proxy and an identity's seats as one selecting by label
// does, in a namespace holding two fleets (one of them of the longest
// name, whose label is a hash) and the leases of neither.
func TestIndexedReadsAgree(t *testing.T) {
	ctx := context.Background()
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	long := "crawlers-" + strings.Repeat("y", fleetv1alpha1.MaxNameLength-len("crawlers-"))
	plain := lease.NewStore(lease.StoreConfig{Client: bed.Client})
	for _, fleet := range []string{"crawlers", "other", long} {
		for p := range 4 {
			proxy := fmt.Sprintf("%s-%d", fleet, p)
			for h := range p {
				if _, err := plain.Acquire(ctx, []lease.Candidate{{Namespace: ns, Fleet: fleet, Proxy: proxy, MaxLeases: 3}},
					lease.Request{Holder: fmt.Sprintf("h-%d-%d", p, h), Identity: fmt.Sprintf("id-%d", h), TTL: time.Minute, StickyKey: fmt.Sprintf("key-%d", h)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := plain.Ban(ctx, ns, fleet, proxy, fmt.Sprintf("d%d.example.com", p), time.Minute, "id-0"); err != nil {
				t.Fatal(err)
			}
		}
	}
	c, ca := bed.Replica(t, ns, &coordv1.Lease{})
	// Indexed before the store reads, as egress-discovery's main does: a
	// store on that cache reads through the indexes (a cache of one
	// namespace, as this test's, answers for no other).
	if err := lease.IndexCache(ctx, ca); err != nil {
		t.Fatal(err)
	}
	indexed := lease.NewStore(lease.StoreConfig{Client: c, Cache: ca})
	if !lease.Indexed(ctx, indexed, ns) {
		t.Fatal("a store on an indexed cache reads by label")
	}
	if lease.Indexed(ctx, plain, ns) {
		t.Fatal("a store without a cache claims indexes")
	}
	testbed.Eventually(t, 10*time.Second, "the cache sees the leases", func() (bool, string) {
		l := &coordv1.LeaseList{}
		if err := ca.List(ctx, l); err != nil {
			return false, err.Error()
		}
		// 3 fleets x (6 slots + 4 bans)
		return len(l.Items) == 30, fmt.Sprint(len(l.Items))
	})
	names := func(m map[string][]*coordv1.Lease) map[string][]string {
		out := map[string][]string{}
		for p, ls := range m {
			for _, l := range ls {
				out[p] = append(out[p], l.Name)
			}
			sort.Strings(out[p])
		}
		return out
	}
	for _, fleet := range []string{"crawlers", long} {
		want, err := plain.View(ctx, ns, fleet)
		if err != nil {
			t.Fatal(err)
		}
		got, err := indexed.View(ctx, ns, fleet)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(names(got.Live), names(want.Live)) || len(want.Live) != 3 {
			t.Errorf("%s: the indexed view's slots %v, by label %v", fleet, names(got.Live), names(want.Live))
		}
		some := []string{fleet + "-2", fleet + "-3"}
		part, err := indexed.ViewOf(ctx, ns, fleet, some)
		if err != nil {
			t.Fatal(err)
		}
		wantPart := map[string][]string{}
		for _, p := range some {
			wantPart[p] = names(want.Live)[p]
		}
		if !reflect.DeepEqual(names(part.Live), wantPart) {
			t.Errorf("%s: a view of %v holds %v, want %v", fleet, some, names(part.Live), wantPart)
		}
		for _, read := range []struct {
			name string
			of   func(*lease.Store) (any, error)
		}{
			{"bans", func(s *lease.Store) (any, error) { return s.Bans(ctx, ns, fleet) }},
			{"sticky key-1", func(s *lease.Store) (any, error) { return s.Sticky(ctx, ns, fleet, "key-1") }},
			{"sticky key-2", func(s *lease.Store) (any, error) { return s.Sticky(ctx, ns, fleet, "key-2") }},
			{"seats of id-1", func(s *lease.Store) (any, error) {
				h, err := s.Held(ctx, ns, fleet, "id-1")
				return len(h), err
			}},
			{"banned for d2.example.com", func(s *lease.Store) (any, error) { return s.BannedFor(ctx, ns, fleet, "D2.example.com") }},
		} {
			w, err := read.of(plain)
			if err != nil {
				t.Fatal(err)
			}
			g, err := read.of(indexed)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(g, w) || reflect.ValueOf(w).IsZero() {
				t.Errorf("%s: %s read through the indexes %v, by label %v", fleet, read.name, g, w)
			}
		}
	}
}

// TestHeldSlotsTriedBounded: candidates whose every slot the cache shows
// held (a full fleet) cost at most a few creates before the refusal, not
// one per slot; a slot this replica released a moment ago is tried as free
// whatever its cache shows yet.
func TestHeldSlotsTriedBounded(t *testing.T) {
	ctx := context.Background()
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	plain := lease.NewStore(lease.StoreConfig{Client: bed.Client})
	var all []lease.Candidate
	for p := range 30 {
		c := lease.Candidate{Namespace: ns, Fleet: "crawlers", Proxy: fmt.Sprintf("crawlers-%d", p), MaxLeases: 2}
		all = append(all, c)
		for h := range 2 {
			if _, err := plain.Acquire(ctx, []lease.Candidate{c}, lease.Request{Holder: fmt.Sprintf("h-%d-%d", p, h), TTL: time.Minute}); err != nil {
				t.Fatal(err)
			}
		}
	}
	_, ca := bed.Replica(t, ns, &coordv1.Lease{})
	c, err := client.NewWithWatch(bed.Config, client.Options{Scheme: bed.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	creates := 0
	counting := interceptor.NewClient(c, interceptor.Funcs{Create: func(ctx context.Context, cl client.WithWatch, o client.Object, opts ...client.CreateOption) error {
		creates++
		return cl.Create(ctx, o, opts...)
	}})
	s := lease.NewStore(lease.StoreConfig{Client: counting, Cache: ca})
	testbed.Eventually(t, 10*time.Second, "the cache sees the full fleet", func() (bool, string) {
		v, err := s.View(ctx, ns, "crawlers")
		return err == nil && len(v.Live) == 30, fmt.Sprint(err)
	})
	if _, err := s.Acquire(ctx, all, lease.Request{Holder: "late", TTL: time.Minute}); !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("a full fleet: want ErrUnavailable, got %v", err)
	}
	if creates == 0 || creates > 16 {
		t.Errorf("a full fleet of 60 slots cost %d creates before the refusal, want 1 to 16", creates)
	}
	// A slot of crawlers-20 released here: granted again at once, before
	// the cache has seen the release, though held slots are skipped.
	g, err := s.Acquire(ctx, []lease.Candidate{all[20]}, lease.Request{Holder: "h-20-0", TTL: time.Minute})
	if !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("crawlers-20 is full: %v %v", g, err)
	}
	held, err := plain.HeldBy(ctx, ns, "crawlers", "h-20-1", "")
	if err != nil {
		t.Fatal(err)
	}
	// The cache shows the fleet as it was before the release.
	frozen := &coordv1.LeaseList{}
	if err := ca.List(ctx, frozen, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(frozen.Items) != 60 {
		t.Fatalf("the cache shows %d slots of a full fleet of 60", len(frozen.Items))
	}
	if err := s.Release(ctx, held.ID, ""); err != nil {
		t.Fatal(err)
	}
	s.Cache = frozenLeases{Reader: ca, items: frozen.Items}
	g, err = s.Acquire(ctx, append(append([]lease.Candidate{}, all[:5]...), all[20]), lease.Request{Holder: "again", TTL: time.Minute, SkipHeld: true})
	if err != nil || g.Proxy != "crawlers-20" {
		t.Fatalf("the slot just released, among held ones: want crawlers-20, got %+v %v", g, err)
	}
}

// frozenLeases is a cache whose Leases stay as they were read: one that has
// not seen the latest changes yet.
type frozenLeases struct {
	client.Reader
	items []coordv1.Lease
}

func (f frozenLeases) List(ctx context.Context, l client.ObjectList, opts ...client.ListOption) error {
	if ll, ok := l.(*coordv1.LeaseList); ok {
		ll.Items = append([]coordv1.Lease(nil), f.items...)
		return nil
	}
	return f.Reader.List(ctx, l, opts...)
}

// TestStickyRemembersOwnGrants: a sticky key's last proxy is the one this
// replica granted it a moment ago, though its cache shows no lease yet
// (a crawler's acquisitions back to back come faster than the watch).
func TestStickyRemembersOwnGrants(t *testing.T) {
	ctx := context.Background()
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	_, ca := bed.Replica(t, ns, &coordv1.Lease{})
	s := lease.NewStore(lease.StoreConfig{Client: bed.Client, Cache: frozenLeases{Reader: ca}})
	g, err := s.Acquire(ctx, []lease.Candidate{{Namespace: ns, Fleet: "crawlers", Proxy: "crawlers-7", MaxLeases: 2}}, lease.Request{Holder: "a", TTL: time.Minute, StickyKey: "session"})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := s.Sticky(ctx, ns, "crawlers", "session"); err != nil || p != g.Proxy {
		t.Errorf("the sticky key's proxy, the cache empty: want %s, got %q %v", g.Proxy, p, err)
	}
	v, err := s.View(ctx, ns, "crawlers")
	if err != nil {
		t.Fatal(err)
	}
	if p := s.StickyIn(v, ns, "crawlers", "session"); p != g.Proxy {
		t.Errorf("the sticky key's proxy in a view that lacks the grant: want %s, got %q", g.Proxy, p)
	}
	if p, _ := s.Sticky(ctx, ns, "other", "session"); p != "" {
		t.Errorf("another fleet's sticky key: want none, got %q", p)
	}

	// Another replica grants the key later, on another proxy. Once this
	// replica's cache shows both grants, it follows the later one rather
	// than its own memory: two replicas agree on the key's proxy.
	other := lease.NewStore(lease.StoreConfig{Client: bed.Client, Cache: frozenLeases{Reader: ca}})
	time.Sleep(10 * time.Millisecond) // acquire times apart
	g2, err := other.Acquire(ctx, []lease.Candidate{{Namespace: ns, Fleet: "crawlers", Proxy: "crawlers-8", MaxLeases: 2}}, lease.Request{Holder: "b", TTL: time.Minute, StickyKey: "session"})
	if err != nil {
		t.Fatal(err)
	}
	s.Cache = ca
	testbed.Eventually(t, 10*time.Second, "the cache shows both grants", func() (bool, string) {
		l := &coordv1.LeaseList{}
		err := ca.List(ctx, l, client.InNamespace(ns))
		return err == nil && len(l.Items) == 2, fmt.Sprint(len(l.Items), err)
	})
	if p, err := s.Sticky(ctx, ns, "crawlers", "session"); err != nil || p != g2.Proxy {
		t.Errorf("the cache shows this replica's grant and another's later one: want %s, got %q %v", g2.Proxy, p, err)
	}
	if v, err := s.View(ctx, ns, "crawlers"); err != nil || s.StickyIn(v, ns, "crawlers", "session") != g2.Proxy {
		t.Errorf("in a view with both grants: want %s, got %q %v", g2.Proxy, s.StickyIn(v, ns, "crawlers", "session"), err)
	}

	// A grant released is forgotten: the key follows the cache again
	// (here one that shows nothing), not a proxy it no longer holds.
	s.Cache = frozenLeases{Reader: ca}
	g3, err := s.Acquire(ctx, []lease.Candidate{{Namespace: ns, Fleet: "crawlers", Proxy: "crawlers-9", MaxLeases: 2}}, lease.Request{Holder: "c", TTL: time.Minute, StickyKey: "released"})
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := s.Sticky(ctx, ns, "crawlers", "released"); p != g3.Proxy {
		t.Fatalf("before its release: want %s, got %q", g3.Proxy, p)
	}
	if err := s.Release(ctx, g3.ID, ""); err != nil {
		t.Fatal(err)
	}
	if p, _ := s.Sticky(ctx, ns, "crawlers", "released"); p != "" {
		t.Errorf("a released grant still pins its key: %q", p)
	}
}
