package lease_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease/leasetest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

var sharedBed testbed.Lazy

func TestMain(m *testing.M) { sharedBed.Main(m) }

// clock is a settable clock shared by the stores of a test.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.t = c.t.Add(d) }

func cands(ns string, max int, proxies ...string) []lease.Candidate {
	out := make([]lease.Candidate, 0, len(proxies))
	for _, p := range proxies {
		out = append(out, lease.Candidate{Namespace: ns, Fleet: "crawlers", Proxy: p, MaxLeases: max})
	}
	return out
}

func TestSemantics(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	c := &clock{t: time.Now()}
	s := lease.NewStore(lease.StoreConfig{Client: bed.Client, Now: c.now})
	req := lease.Request{Holder: "crawler-a", TTL: time.Minute}

	g1, err := s.Acquire(ctx, cands(ns, 2, "p0"), req)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := s.Acquire(ctx, cands(ns, 2, "p0"), lease.Request{Holder: "crawler-b", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if g1.Slot == g2.Slot || g1.Proxy != "p0" || g2.Proxy != "p0" {
		t.Fatalf("two holders get two slots of p0: %+v %+v", g1, g2)
	}
	if _, err := s.Acquire(ctx, cands(ns, 2, "p0"), lease.Request{Holder: "crawler-c", TTL: time.Minute}); !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("maxLeases 2: a third holder is refused, got %v", err)
	}

	t.Run("Renew", func(t *testing.T) {
		c.add(50 * time.Second)
		g, err := s.Renew(ctx, g1.ID, "", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if !g.ExpiresAt.After(g1.ExpiresAt) {
			t.Errorf("renew must push expiry out: %s -> %s", g1.ExpiresAt, g.ExpiresAt)
		}
	})

	t.Run("ExpiryAndTakeover", func(t *testing.T) {
		c.add(20 * time.Second) // g2 (not renewed) is now 70 s old: expired
		g3, err := s.Acquire(ctx, cands(ns, 2, "p0"), lease.Request{Holder: "crawler-c", TTL: time.Minute})
		if err != nil {
			t.Fatalf("an expired slot is taken over: %v", err)
		}
		if g3.Slot != g2.Slot {
			t.Errorf("crawler-c takes over g2's slot %d, got slot %d", g2.Slot, g3.Slot)
		}
		if _, err := s.Renew(ctx, g2.ID, "", time.Minute); !errors.Is(err, lease.ErrNotFound) {
			t.Errorf("the old holder can no longer renew a slot taken over: %v", err)
		}
		if err := s.Release(ctx, g2.ID, ""); !errors.Is(err, lease.ErrNotFound) {
			t.Errorf("nor release it: %v", err)
		}
		if _, err := s.Get(ctx, g3.ID, ""); err != nil {
			t.Errorf("the new holder still holds it: %v", err)
		}
	})

	t.Run("Release", func(t *testing.T) {
		if err := s.Release(ctx, g1.ID, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Renew(ctx, g1.ID, "", time.Minute); !errors.Is(err, lease.ErrNotFound) {
			t.Errorf("a released lease cannot be renewed: %v", err)
		}
		if _, err := s.Acquire(ctx, cands(ns, 2, "p0"), lease.Request{Holder: "crawler-d", TTL: time.Minute}); err != nil {
			t.Errorf("a released slot is free again: %v", err)
		}
	})

	t.Run("Sticky", func(t *testing.T) {
		g, err := s.Acquire(ctx, cands(ns, 1, "p1", "p2"), lease.Request{Holder: "crawler-e", TTL: time.Minute, StickyKey: "session-42"})
		if err != nil {
			t.Fatal(err)
		}
		last, err := s.Sticky(ctx, ns, "crawlers", "session-42")
		if err != nil || last != g.Proxy {
			t.Errorf("the sticky key remembers its proxy %s, got %q (%v)", g.Proxy, last, err)
		}
		// Taken again on the other proxy, later: the latest counts, in a
		// view of the slots as in the store's own lookup.
		other := map[string]string{"p1": "p2", "p2": "p1"}[g.Proxy]
		c.add(time.Second)
		g2, err := s.Acquire(ctx, cands(ns, 1, other), lease.Request{Holder: "crawler-f", TTL: time.Minute, StickyKey: "session-42"})
		if err != nil {
			t.Fatal(err)
		}
		v, err := s.View(ctx, ns, "crawlers")
		if err != nil {
			t.Fatal(err)
		}
		last, err = s.Sticky(ctx, ns, "crawlers", "session-42")
		if err != nil || last != g2.Proxy || v.Sticky("session-42") != g2.Proxy {
			t.Errorf("the sticky key remembers its latest proxy %s: the store says %q (%v), a view %q", g2.Proxy, last, err, v.Sticky("session-42"))
		}
		if v.Sticky("session-43") != "" || v.Sticky("") != "" {
			t.Error("a key that took nothing, or none, has no proxy")
		}
		if n := len(v.Live[g2.Proxy]); n < 1 {
			t.Errorf("the view lists the live slot of %s: %d", g2.Proxy, n)
		}
	})

	t.Run("Bans", func(t *testing.T) {
		if err := s.Ban(ctx, ns, "crawlers", "p1", "Example.COM", 10*time.Minute, "someone"); err != nil {
			t.Fatal(err)
		}
		bans, err := s.Bans(ctx, ns, "crawlers")
		if err != nil || len(bans["p1"]) != 1 || bans["p1"][0] != "example.com" {
			t.Errorf("a ban is stored for p1 and example.com: %v (%v)", bans, err)
		}
		c.add(11 * time.Minute)
		if bans, _ := s.Bans(ctx, ns, "crawlers"); len(bans["p1"]) != 0 {
			t.Errorf("a ban ends with its cooldown: %v", bans)
		}
	})

	t.Run("Sweep", func(t *testing.T) {
		n, err := s.Sweep(ctx, func(_, name string) bool { return name != "p2" }, 0)
		if err != nil {
			t.Fatal(err)
		}
		l := &coordv1.LeaseList{}
		if err := bed.Client.List(ctx, l, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		if n == 0 || len(l.Items) != 0 {
			t.Errorf("everything here is expired (11 minutes later) or on a gone proxy: swept %d, %d left", n, len(l.Items))
		}
	})
}

// grantEvent is one line of the grant log.
type grantEvent struct {
	proxy, slot       string
	holder            string
	granted, released time.Time
}

// TestConcurrency runs 4 stores (as 4 discovery replicas, each with its own
// client and cache) and 64 clients against one real apiserver for at least
// 10 000 acquisitions, one replica dying half-way, and checks from the grant
// log and from the API objects that no proxy ever had more than maxLeases
// live holders, and no slot two at once.
func TestConcurrency(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	const (
		replicas  = 4
		clients   = 64
		target    = 10000
		maxLeases = 2
	)
	proxies := make([]string, 8)
	for i := range proxies {
		proxies[i] = fmt.Sprintf("p%d", i)
	}

	stores := make([]*lease.Store, replicas)
	for i := range replicas {
		c, ca := bed.Replica(t, ns, &coordv1.Lease{})
		stores[i] = lease.NewStore(lease.StoreConfig{Client: c, Cache: ca})
	}

	var (
		mu      sync.Mutex
		log     []grantEvent
		grants  atomic.Int64
		refused atomic.Int64
		dead    atomic.Bool
	)
	watchHolders := leasetest.WatchHolders(ctx, bed.Client, ns)

	start := time.Now()
	var wg sync.WaitGroup
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			holder := fmt.Sprintf("crawler-%d", w)
			for n := 0; grants.Load() < target; n++ {
				// Replica 0 dies half-way; its clients move to the others.
				r := w % replicas
				if r == 0 && dead.Load() {
					r = 1 + w%(replicas-1)
				}
				s := stores[r]
				order := append([]string(nil), proxies[(w+n)%len(proxies):]...)
				order = append(order, proxies[:(w+n)%len(proxies)]...)
				g, err := s.Acquire(ctx, cands(ns, maxLeases, order...), lease.Request{Holder: holder, TTL: time.Minute})
				if errors.Is(err, lease.ErrUnavailable) {
					refused.Add(1)
					continue
				}
				if err != nil {
					t.Errorf("acquire: %v", err)
					return
				}
				granted := time.Now()
				if grants.Add(1) == target/2 {
					dead.Store(true)
				}
				released := time.Now()
				if err := s.Release(ctx, g.ID, ""); err != nil {
					t.Errorf("release %s: %v", g.ID, err)
					return
				}
				mu.Lock()
				log = append(log, grantEvent{proxy: g.Proxy, slot: fmt.Sprint(g.Slot), holder: holder, granted: granted, released: released})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	maxSeen := watchHolders()
	elapsed := time.Since(start)
	t.Logf("%d acquisitions (+%d refused as full) by %d clients on %d replicas in %s: %.0f/s; max live holders seen on one proxy: %d",
		grants.Load(), refused.Load(), clients, replicas, elapsed.Round(time.Millisecond), float64(grants.Load())/elapsed.Seconds(), maxSeen)

	if grants.Load() < target {
		t.Fatalf("want at least %d acquisitions, got %d", target, grants.Load())
	}
	if m := maxSeen; m > maxLeases {
		t.Errorf("the API objects showed %d live holders on one proxy, more than maxLeases %d", m, maxLeases)
	}
	grantLog := make([]leasetest.Grant, 0, len(log))
	for _, e := range log {
		grantLog = append(grantLog, leasetest.Grant{Proxy: e.proxy, Slot: e.slot, Holder: e.holder, Granted: e.granted, Released: e.released})
	}
	leasetest.CheckExclusive(t, grantLog, maxLeases)
	l := &coordv1.LeaseList{}
	if err := bed.Client.List(ctx, l, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 0 {
		t.Errorf("every lease was released, yet %d objects remain", len(l.Items))
	}
}

// TestAcquireSkipsSlotItCannotCreate: a proxy whose slot the API server
// refuses to store (its name would pass 253 characters) is skipped, and
// the lease granted on the next proxy; with no other, the answer is
// ErrUnavailable, not the API server's error.
func TestAcquireSkipsSlotItCannotCreate(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	s := lease.NewStore(lease.StoreConfig{Client: bed.Client})
	long := strings.Repeat("a", 250)
	g, err := s.Acquire(ctx, cands(ns, 1, long, "p0"), lease.Request{Holder: "h", TTL: time.Minute})
	if err != nil || g.Proxy != "p0" {
		t.Fatalf("want the lease on p0 past the proxy whose slot cannot be stored, got %+v, %v", g, err)
	}
	if _, err := s.Acquire(ctx, cands(ns, 1, long), lease.Request{Holder: "h", TTL: time.Minute}); !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("only an unstorable slot: want ErrUnavailable, got %v", err)
	}
}
