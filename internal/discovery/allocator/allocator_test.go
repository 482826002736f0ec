package allocator_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator/fake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
)

const ns, fleet = "crawl", "f"

// proxy is a Proxy of the fleet as the catalogue reads it.
type proxy struct {
	name, ip  string
	healthy   bool
	maxLeases int32
}

// world is what the allocator reads: Proxies and a fleet spec, in memory.
type world struct {
	mu      sync.Mutex
	proxies []proxy
	spec    map[string]any // the ProxyFleet's spec; nil: none
}

func (w *world) object(p proxy) v1alpha1.Proxy {
	o := v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p.name, Labels: map[string]string{fleetv1alpha1.LabelFleet: fleet}}}
	o.Spec.ForProvider.MaxLeases = p.maxLeases
	o.Status.AtProvider.Host, o.Status.AtProvider.Port, o.Status.AtProvider.EgressIP = "127.0.0.1", 3128, p.ip
	o.Status.AtProvider.Healthy = p.healthy
	if p.healthy {
		o.SetConditions(xpv2.Available())
	} else {
		o.SetConditions(xpv2.Unavailable())
	}
	return o
}

// Get reads a Proxy or the ProxyFleet (client.Reader).
func (w *world) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch o := obj.(type) {
	case *v1alpha1.Proxy:
		for _, p := range w.proxies {
			if p.name == key.Name && key.Namespace == ns {
				*o = w.object(p)
				return nil
			}
		}
	case *unstructured.Unstructured:
		if w.spec != nil && key.Name == fleet && o.GetKind() == fleetv1alpha1.ProxyFleetKind {
			o.Object["spec"] = w.spec
			return nil
		}
	}
	return kerrors.NewNotFound(schema.GroupResource{Resource: "objects"}, key.Name)
}

// List lists the fleet's Proxies (client.Reader).
func (w *world) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if l, ok := list.(*v1alpha1.ProxyList); ok {
		for _, p := range w.proxies {
			l.Items = append(l.Items, w.object(p))
		}
	}
	return nil
}

type allowAll struct{}

func (allowAll) Authorize(context.Context, *auth.Identity, string, string) error { return nil }

// bed is an allocator over the fake store and an in-memory world.
type bed struct {
	w     *world
	store *fake.Store
	a     *allocator.Allocator
}

// newBed is an allocator over ps, its configuration changed by mods
// before it is built.
func newBed(t *testing.T, ps []proxy, spec map[string]any, mods ...func(*allocator.Config)) *bed {
	t.Helper()
	w := &world{proxies: ps, spec: spec}
	s := &fake.Store{}
	cfg := allocator.Config{
		Catalog: catalog.New(catalog.Config{Cache: w, Direct: w}),
		Leases:  s, Auth: allowAll{}, Metrics: metrics.NewDiscovery(),
	}
	for _, m := range mods {
		m(&cfg)
	}
	return &bed{w: w, store: s, a: allocator.New(cfg)}
}

func (b *bed) acquire(t *testing.T, user string, req apiv1.AcquireRequest) (*allocator.Granted, error) {
	t.Helper()
	req.Fleet = ns + "/" + fleet
	a, err := b.a.AcquisitionOf(context.Background(), &req, ns, fleet, &auth.Identity{User: user})
	if err != nil {
		return nil, err
	}
	return b.a.GrantFor(context.Background(), a)
}

func reasonOf(err error) string {
	var e *problem.Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return fmt.Sprint(err)
}

// TestGrantsWithinMaxLeases: every slot of the fleet is granted, the
// load spread evenly, no proxy above its maxLeases; then the next is
// refused NoFreeSlot with a Retry-After.
func TestGrantsWithinMaxLeases(t *testing.T) {
	b := newBed(t, []proxy{{"a", "192.0.2.1", true, 2}, {"b", "192.0.2.2", true, 2}, {"c", "192.0.2.3", true, 2}}, nil)
	per := map[string]int{}
	for i := range 6 {
		g, err := b.acquire(t, "alice", apiv1.AcquireRequest{Holder: fmt.Sprintf("h%d", i)})
		if err != nil {
			t.Fatalf("acquisition %d of 6 free slots: %v", i, err)
		}
		per[g.Grant.Proxy]++
		// Least loaded first: no proxy is two ahead of another.
		lo, hi := 99, 0
		for _, p := range []string{"a", "b", "c"} {
			lo, hi = min(lo, per[p]), max(hi, per[p])
		}
		if hi-lo > 1 {
			t.Fatalf("after %d grants the load is %v: the least loaded must go first", i+1, per)
		}
	}
	for p, n := range per {
		if n > 2 {
			t.Errorf("proxy %s holds %d leases over its maxLeases 2", p, n)
		}
	}
	_, err := b.acquire(t, "alice", apiv1.AcquireRequest{Holder: "one-too-many"})
	var pe *problem.Error
	if !errors.As(err, &pe) || pe.Reason != apiv1.ReasonNoFreeSlot || pe.Code != 409 || pe.RetryAfter < 1 {
		t.Fatalf("a seventh lease on 6 slots: %v; want 409 NoFreeSlot with Retry-After", err)
	}
}

// TestQuotaBoundsAnIdentity: an identity gets at most its quota, another
// identity is not charged for it, and a release gives the place back.
func TestQuotaBoundsAnIdentity(t *testing.T) {
	b := newBed(t, []proxy{{"a", "192.0.2.1", true, 10}}, map[string]any{
		"leases": map[string]any{"quotas": map[string]any{"maxLeasesPerIdentity": int64(2)}},
	})
	var held []*allocator.Granted
	for i := range 2 {
		g, err := b.acquire(t, "alice", apiv1.AcquireRequest{Holder: fmt.Sprintf("h%d", i)})
		if err != nil {
			t.Fatalf("lease %d within the quota of 2: %v", i+1, err)
		}
		held = append(held, g)
	}
	if _, err := b.acquire(t, "alice", apiv1.AcquireRequest{Holder: "h3"}); reasonOf(err) != apiv1.ReasonQuotaExceeded {
		t.Fatalf("a third lease over the quota of 2: %v; want QuotaExceeded", err)
	}
	if _, err := b.acquire(t, "bob", apiv1.AcquireRequest{Holder: "h0"}); err != nil {
		t.Fatalf("another identity is not charged alice's leases: %v", err)
	}
	g := held[0].Grant
	if err := b.store.Release(context.Background(), g.ID, "alice"); err != nil {
		t.Fatal(err)
	}
	b.a.Released(g.Namespace, g.Fleet, "alice", g.ID)
	if _, err := b.acquire(t, "alice", apiv1.AcquireRequest{Holder: "h3"}); err != nil {
		t.Fatalf("after a release, the quota has room again: %v", err)
	}
}

// TestAdmissionBelowHealthyShare: below the fleet's minHealthyFraction a
// lease is refused TooFewHealthy, though a healthy proxy has free slots;
// at it, granted.
func TestAdmissionBelowHealthyShare(t *testing.T) {
	b := newBed(t, []proxy{{"a", "192.0.2.1", true, 5}, {"b", "192.0.2.2", false, 5}, {"c", "192.0.2.3", false, 5}}, map[string]any{
		"replicas": int64(3),
		"leases":   map[string]any{"admission": map[string]any{"minHealthyFraction": 0.5}},
	})
	if _, err := b.acquire(t, "alice", apiv1.AcquireRequest{Holder: "h"}); reasonOf(err) != apiv1.ReasonTooFewHealthy {
		t.Fatalf("1 of 3 healthy under a minimum of a half: %v; want TooFewHealthy", err)
	}
	b.w.mu.Lock()
	b.w.proxies[1].healthy = true
	b.w.mu.Unlock()
	g, err := b.acquire(t, "alice", apiv1.AcquireRequest{Holder: "h"})
	if err != nil || (g.Grant.Proxy != "a" && g.Grant.Proxy != "b") {
		t.Fatalf("2 of 3 healthy: %v on %v; want a lease on a healthy proxy", err, g)
	}
}

// TestBanSkipsTheProxyAndItsIP: a proxy banned for a domain, and every
// proxy leaving from the same egress IP, get no lease for that domain,
// even when the fleet has no other slot; for another domain they do.
func TestBanSkipsTheProxyAndItsIP(t *testing.T) {
	b := newBed(t, []proxy{{"a", "192.0.2.1", true, 10}, {"b", "192.0.2.1", true, 10}, {"c", "192.0.2.3", true, 3}}, nil)
	if err := b.a.Ban(context.Background(), ns, fleet, "a", "example.com", time.Minute, &auth.Identity{User: "alice"}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		g, err := b.acquire(t, "alice", apiv1.AcquireRequest{Holder: fmt.Sprintf("h%d", i), Domain: "example.com"})
		if err != nil {
			t.Fatal(err)
		}
		if g.Grant.Proxy != "c" {
			t.Fatalf("a lease for example.com on %s, which is banned for it or shares the banned one's IP", g.Grant.Proxy)
		}
	}
	if g, err := b.acquire(t, "alice", apiv1.AcquireRequest{Holder: "h3", Domain: "example.com", MaxWait: "0s"}); reasonOf(err) != apiv1.ReasonNoFreeSlot {
		t.Fatalf("c full, the rest banned for example.com through their IP: %v on %v; want NoFreeSlot", err, g)
	}
	seen := map[string]bool{}
	for i := range 20 {
		g, err := b.acquire(t, "alice", apiv1.AcquireRequest{Holder: fmt.Sprintf("o%d", i), Domain: "example.org"})
		if err != nil {
			t.Fatal(err)
		}
		seen[g.Grant.Proxy] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Errorf("leases for another domain went to %v; the ban is for example.com only", seen)
	}
}

// TestWaitTakesAFreedSlot: an acquisition that may wait gets the slot
// another gives back while it waits; one that may not is refused at once.
func TestWaitTakesAFreedSlot(t *testing.T) {
	b := newBed(t, []proxy{{"a", "192.0.2.1", true, 1}}, map[string]any{
		"leases": map[string]any{"admission": map[string]any{"maxWait": "5s"}},
	})
	first, err := b.acquire(t, "alice", apiv1.AcquireRequest{Holder: "first"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.acquire(t, "bob", apiv1.AcquireRequest{Holder: "no-wait", MaxWait: "0s"}); reasonOf(err) != apiv1.ReasonNoFreeSlot {
		t.Fatalf("a full fleet, no wait: %v; want NoFreeSlot", err)
	}
	type result struct {
		g   *allocator.Granted
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		g, err := b.acquire(t, "bob", apiv1.AcquireRequest{Holder: "waiter", MaxWait: "5s"})
		done <- result{g, err}
	}()
	time.Sleep(300 * time.Millisecond)
	if err := b.store.Release(context.Background(), first.Grant.ID, "alice"); err != nil {
		t.Fatal(err)
	}
	b.a.Released(ns, fleet, "alice", first.Grant.ID)
	r := <-done
	if r.err != nil || r.g.Grant.Holder != "waiter" {
		t.Fatalf("the waiter: %v; want the freed slot", r.err)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 4*time.Second {
		t.Errorf("the waiter took %v; want it once the slot was freed (after 300ms), well within its 5s", d)
	}
}

// TestDemandWithoutQuotaCapped: refusals of an autoscaled fleet are its
// demand, but one identity without a quota counts for a bounded number of
// holders, however many names it sends.
func TestDemandWithoutQuotaCapped(t *testing.T) {
	b := newBed(t, []proxy{{"a", "192.0.2.1", true, 1}}, map[string]any{
		"autoscaling": map[string]any{"maxReplicas": int64(100)},
	})
	if _, err := b.acquire(t, "alice", apiv1.AcquireRequest{Holder: "held"}); err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		if _, err := b.acquire(t, "mallory", apiv1.AcquireRequest{Holder: fmt.Sprintf("n%d", i), MaxWait: "0s"}); reasonOf(err) != apiv1.ReasonNoFreeSlot {
			t.Fatalf("refusal %d: %v", i, err)
		}
	}
	d, err := b.a.DemandOf(context.Background(), ns, fleet)
	if err != nil {
		t.Fatal(err)
	}
	if d.Refused < 1 || d.Refused > 16 {
		t.Errorf("200 holder names of one identity without a quota count as %d refused; want between 1 and 16", d.Refused)
	}
	if d.Held != 1 {
		t.Errorf("held %d, want 1", d.Held)
	}
}

// TestStickyKeyKeepsItsProxy: acquisitions with one sticky key land on
// the proxy the key had while it has a slot.
func TestStickyKeyKeepsItsProxy(t *testing.T) {
	b := newBed(t, []proxy{{"a", "192.0.2.1", true, 5}, {"b", "192.0.2.2", true, 5}, {"c", "192.0.2.3", true, 5}}, nil)
	first, err := b.acquire(t, "alice", apiv1.AcquireRequest{Holder: "h0", StickyKey: "site"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 5; i++ {
		g, err := b.acquire(t, "alice", apiv1.AcquireRequest{Holder: fmt.Sprintf("h%d", i), StickyKey: "site"})
		if err != nil {
			t.Fatal(err)
		}
		if g.Grant.Proxy != first.Grant.Proxy {
			t.Fatalf("sticky lease %d on %s, the key's proxy is %s with free slots", i, g.Grant.Proxy, first.Grant.Proxy)
		}
	}
	// Its proxy full, the key moves on rather than fail.
	if g, err := b.acquire(t, "alice", apiv1.AcquireRequest{Holder: "h5", StickyKey: "site"}); err != nil || g.Grant.Proxy == first.Grant.Proxy {
		t.Fatalf("the key's proxy full: %v on %v; want a lease on another", err, g)
	}
}

// TestBanBounds: a fleet's live bans are bounded; extending a live ban is
// always allowed.
func TestBanBounds(t *testing.T) {
	b := newBed(t, []proxy{{"a", "192.0.2.1", true, 5}, {"b", "192.0.2.2", true, 5}}, nil, func(c *allocator.Config) { c.MaxBansPerFleet = 2 })
	id := &auth.Identity{User: "alice"}
	for _, d := range []string{"one.example", "two.example"} {
		if err := b.a.Ban(context.Background(), ns, fleet, "a", d, time.Minute, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.a.Ban(context.Background(), ns, fleet, "b", "three.example", time.Minute, id); reasonOf(err) != apiv1.ReasonBanLimit {
		t.Fatalf("a third ban over the fleet's bound of 2: %v; want BanLimit", err)
	}
	if err := b.a.Ban(context.Background(), ns, fleet, "a", "one.example", 2*time.Minute, id); err != nil {
		t.Fatalf("extending a live ban: %v", err)
	}
}

// TestPacingSharedByReplicas: behind two replicas, each paces an egress IP
// at its share of the rule (the interval twice as long, the burst split),
// so that connections spread over both keep, together, to the rule's
// rate; counted alone, each would let the rule's rate through, twice it
// in all.
func TestPacingSharedByReplicas(t *testing.T) {
	spec := map[string]any{"gateway": map[string]any{"pacing": []any{map[string]any{"domains": []any{"shop.example"}, "interval": "1s", "burst": int64(3)}}}}
	taken := func(replicas int) int {
		clock := time.Unix(1000, 0)
		now := func() time.Time { return clock }
		var as []*allocator.Allocator
		for range 2 {
			b := newBed(t, []proxy{{"a", "192.0.2.1", true, 10}}, spec, func(c *allocator.Config) {
				c.Now, c.Replicas = now, func(context.Context, string, string) (int, error) { return replicas, nil }
			})
			as = append(as, b.a)
		}
		p, err := as[0].Catalog.Policy(context.Background(), ns, fleet)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		// 20 s of a connection every 50 ms, alternating replicas.
		for i := range 400 {
			a := as[i%2]
			rule := a.PacingFor(context.Background(), ns, fleet, p, "shop.example")
			if a.PaceTake(allocator.PaceKey(ns+"/"+fleet, rule, "192.0.2.1"), rule, clock) {
				n++
			}
			clock = clock.Add(50 * time.Millisecond)
		}
		return n
	}
	// The rule lets through 20 (one a second) and its burst of 3; split
	// over two replicas, the burst is 2 each (a bucket holds at least one
	// token, rounded up): at most 20 + 4.
	if n := taken(2); n > 20+2*2 || n < 18 {
		t.Errorf("two replicas, each at its share, let %d connections of one IP through in 20 s; want about 20 and at most 24 (1s, burst 3 as 2 + 2)", n)
	}
	// The broken variant: each replica counting itself alone.
	if n := taken(1); n <= 20+3+1 {
		t.Errorf("the check cannot fail: two replicas each pacing alone let %d through, want over 24", n)
	}
	b := newBed(t, []proxy{{"a", "192.0.2.1", true, 10}}, spec, func(c *allocator.Config) {
		c.Replicas = func(context.Context, string, string) (int, error) { return 2, nil }
	})
	p, _ := b.a.Catalog.Policy(context.Background(), ns, fleet)
	rule := b.a.PacingFor(context.Background(), ns, fleet, p, "shop.example")
	if rule.Interval != 2*time.Second || rule.Burst != 2 {
		t.Errorf("the share of 1s burst 3 between 2 replicas: %v burst %d; want 2s burst 2", rule.Interval, rule.Burst)
	}
	if p.PacingFor("shop.example").Interval != time.Second {
		t.Error("the share must be a copy: the fleet's own rule changed")
	}
	if b.a.PacingFor(context.Background(), ns, fleet, p, "other.example") != nil {
		t.Error("a domain no rule covers is not paced")
	}
}

// TestPaceReserveInTurn: connections waiting for one paced IP are given
// turns one interval apart, each its own token, as far as the wait bound
// reaches; past it, none is spent and the answer says when one is free.
func TestPaceReserveInTurn(t *testing.T) {
	b := newBed(t, []proxy{{"a", "192.0.2.1", true, 10}}, nil)
	rule := &catalog.PacingRule{Index: 0, Domains: []string{"shop.example"}, Interval: 200 * time.Millisecond, Burst: 1}
	key := allocator.PaceKey(ns+"/"+fleet, rule, "192.0.2.1")
	now := time.Unix(1000, 0)
	for i := range 5 {
		at, ok := b.a.PaceReserve(key, rule, now, 1*time.Second)
		if want := now.Add(time.Duration(i) * 200 * time.Millisecond); !ok || !at.Equal(want) {
			t.Fatalf("waiter %d: turn at %v (%v); want %v, one interval after the one before", i, at.Sub(now), ok, want.Sub(now))
		}
	}
	// The sixth would wait 1s, past a bound of 800ms: refused, nothing
	// spent.
	at, ok := b.a.PaceReserve(key, rule, now, 800*time.Millisecond)
	if ok || !at.Equal(now.Add(time.Second)) {
		t.Fatalf("a turn past the bound: at %v, ok %v; want refused, free at 1s", at.Sub(now), ok)
	}
	if at, ok := b.a.PaceReserve(key, rule, now, time.Second); !ok || !at.Equal(now.Add(time.Second)) {
		t.Fatalf("the refused one spent a token: next turn at %v, want 1s", at.Sub(now))
	}
	// Past every turn, the bucket refills as before.
	later := now.Add(2 * time.Second)
	if !b.a.PaceTake(key, rule, later) {
		t.Error("once every turn has passed, a token is free again")
	}
}

// TestReplicaCountRemembered: the replica count is read at most once a
// second per fleet; when it cannot be read the last count stands (a fresh
// one could only pace faster), and without one the replica counts alone.
func TestReplicaCountRemembered(t *testing.T) {
	spec := map[string]any{"gateway": map[string]any{"pacing": []any{map[string]any{"domains": []any{"shop.example"}, "interval": "1s"}}}}
	clock := time.Unix(1000, 0)
	n, fail, calls := 3, false, 0
	b := newBed(t, []proxy{{"a", "192.0.2.1", true, 10}}, spec, func(c *allocator.Config) {
		c.Now = func() time.Time { return clock }
		c.Replicas = func(context.Context, string, string) (int, error) {
			calls++
			if fail {
				return 0, errors.New("the cache is away")
			}
			return n, nil
		}
	})
	p, err := b.a.Catalog.Policy(context.Background(), ns, fleet)
	if err != nil {
		t.Fatal(err)
	}
	interval := func() time.Duration {
		return b.a.PacingFor(context.Background(), ns, fleet, p, "shop.example").Interval
	}
	if got := interval(); got != 3*time.Second || calls != 1 {
		t.Fatalf("3 replicas: interval %v after %d reads; want 3s after 1", got, calls)
	}
	n = 2
	clock = clock.Add(500 * time.Millisecond)
	if got := interval(); got != 3*time.Second || calls != 1 {
		t.Fatalf("within the second: interval %v after %d reads; want the count remembered (3s, 1 read)", got, calls)
	}
	clock = clock.Add(time.Second)
	fail = true
	if got := interval(); got != 3*time.Second || calls != 2 {
		t.Fatalf("the count unreadable: interval %v after %d reads; want the last count (3s), read again", got, calls)
	}
	if got := interval(); got != 3*time.Second || calls != 3 {
		t.Fatalf("still unreadable: interval %v after %d reads; want the last count, read again at once", got, calls)
	}
	fail = false
	if got := interval(); got != 2*time.Second {
		t.Fatalf("readable again, 2 replicas: interval %v, want 2s", got)
	}
	fresh := newBed(t, []proxy{{"a", "192.0.2.1", true, 10}}, spec, func(c *allocator.Config) {
		c.Replicas = func(context.Context, string, string) (int, error) { return 0, errors.New("away") }
	})
	if got := fresh.a.PacingFor(context.Background(), ns, fleet, p, "shop.example").Interval; got != time.Second {
		t.Errorf("never counted: interval %v, want the rule's own 1s", got)
	}
}

// TestPaceLateTakeRefillsNothing: a take whose time was read before
// another's (a connection that waited on a lease write) spends a token
// but does not wind the bucket's clock back, which would refill it again
// over an interval already counted: with a rule of 1s and burst 2, takes
// at 10s, 5s (late) and 10s leave the third refused.
func TestPaceLateTakeRefillsNothing(t *testing.T) {
	b := newBed(t, []proxy{{"a", "192.0.2.1", true, 10}}, nil)
	rule := &catalog.PacingRule{Interval: time.Second, Burst: 2}
	key := allocator.PaceKey(ns+"/"+fleet, rule, "192.0.2.1")
	t0 := time.Unix(1000, 0)
	if !b.a.PaceTake(key, rule, t0.Add(10*time.Second)) || !b.a.PaceTake(key, rule, t0.Add(5*time.Second)) {
		t.Fatal("a full bucket of 2 gives two tokens")
	}
	if b.a.PaceTake(key, rule, t0.Add(10*time.Second)) {
		t.Error("a third token at 10s: the late take at 5s wound the clock back and refilled the bucket")
	}
	if !b.a.PaceTake(key, rule, t0.Add(11*time.Second)) {
		t.Error("an interval later a token is free again")
	}
}

// TestPaceScanBounded: a connection that finds every IP of a fleet of
// 10 000 paced looks at a bounded run of them for the soonest turn,
// rather than a key and a bucket lookup per member under the lock every
// fleet shares; it still finds a turn, and each turn is another IP's.
func TestPaceScanBounded(t *testing.T) {
	b := newBed(t, []proxy{{"a", "192.0.2.1", true, 10}}, nil)
	rule := &catalog.PacingRule{Interval: time.Hour, Burst: 1}
	ms := make([]catalog.Member, 10000)
	for i := range ms {
		ms[i] = catalog.Member{Name: fmt.Sprintf("p-%d", i), EgressIP: fmt.Sprintf("10.%d.%d.1", i/256, i%256)}
	}
	looked := 0
	all := func(*catalog.Member) bool { looked++; return true }
	now := time.Unix(1000, 0)
	seen := map[string]bool{}
	for range 3 {
		ip, _, ok := b.a.PaceReserveSoonest(ns+"/"+fleet, rule, ms, all, now, time.Second)
		if !ok || seen[ip] {
			t.Fatalf("a turn on a fresh IP: %q %v (taken before: %v)", ip, ok, seen[ip])
		}
		seen[ip] = true
	}
	if looked > 3*1000 {
		t.Errorf("%d members looked at for 3 turns among 10 000 IPs: the scan is not bounded", looked)
	}
}

// TestPaceBucketsEvictedOldestFirst: past the bound of buckets a replica
// keeps, the least recently spent go, not every fleet's at once: an IP
// spent 5 000 buckets before the bound is still paced after 70 000 others
// were.
func TestPaceBucketsEvictedOldestFirst(t *testing.T) {
	b := newBed(t, []proxy{{"a", "192.0.2.1", true, 10}}, nil)
	rule := &catalog.PacingRule{Interval: time.Hour, Burst: 1}
	t0 := time.Unix(1000, 0)
	for i := range 70000 {
		b.a.PaceTake(allocator.PaceKey("ns/other", rule, fmt.Sprint(i)), rule, t0.Add(time.Duration(i)*time.Millisecond))
		if i == 60000 {
			b.a.PaceTake(allocator.PaceKey(ns+"/"+fleet, rule, "192.0.2.1"), rule, t0.Add(time.Duration(i)*time.Millisecond))
		}
	}
	if b.a.PaceTake(allocator.PaceKey(ns+"/"+fleet, rule, "192.0.2.1"), rule, t0.Add(70*time.Second)) {
		t.Error("a bucket spent recently was forgotten when the replica's buckets overflowed")
	}
}

// TestConnAtQuotaWaitsForOneToEnd: a gateway connection without a session
// that finds its caller's quota taken while the caller has such
// connections open on the replica waits for one to end (a crawler's next
// fetch opens before the gateway has seen the last one close) rather than
// being refused; one whose quota leases alone hold is refused at once;
// one that no ending frees is refused after ConnQuotaGrace.
func TestConnAtQuotaWaitsForOneToEnd(t *testing.T) {
	b := newBed(t, []proxy{{"a", "192.0.2.1", true, 10}}, map[string]any{
		"leases": map[string]any{"quotas": map[string]any{"maxLeasesPerIdentity": int64(2)}},
	})
	ctx := context.Background()
	p, err := b.a.Catalog.Policy(ctx, ns, fleet)
	if err != nil {
		t.Fatal(err)
	}
	alice := &auth.Identity{User: "alice"}
	if _, err := b.acquire(t, "alice", apiv1.AcquireRequest{Holder: "h0"}); err != nil {
		t.Fatal(err)
	}
	leave, err := b.a.HoldConn(ctx, ns, fleet, alice, p)
	if err != nil {
		t.Fatalf("a connection within the quota: %v", err)
	}
	type result struct {
		leave func()
		err   error
		after time.Duration
	}
	next := make(chan result, 1)
	start := time.Now()
	go func() {
		l, err := b.a.HoldConn(ctx, ns, fleet, alice, p)
		next <- result{l, err, time.Since(start)}
	}()
	select {
	case r := <-next:
		t.Fatalf("the next connection at the quota did not wait for the open one: %v after %s", r.err, r.after)
	case <-time.After(200 * time.Millisecond):
	}
	leave()
	r := <-next
	if r.err != nil || r.after >= allocator.ConnQuotaGrace {
		t.Fatalf("the next connection once the open one ended: %v after %s", r.err, r.after)
	}
	// Nothing ends: refused once the grace is over.
	start = time.Now()
	if _, err := b.a.HoldConn(ctx, ns, fleet, alice, p); reasonOf(err) != apiv1.ReasonQuotaExceeded || time.Since(start) < allocator.ConnQuotaGrace {
		t.Errorf("a connection over the quota that nothing frees: %v after %s; want QuotaExceeded after %s", err, time.Since(start), allocator.ConnQuotaGrace)
	}
	r.leave()
	// Leases alone: refused at once.
	for i := range 2 {
		if _, err := b.acquire(t, "bob", apiv1.AcquireRequest{Holder: fmt.Sprintf("b%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	start = time.Now()
	if _, err := b.a.HoldConn(ctx, ns, fleet, &auth.Identity{User: "bob"}, p); reasonOf(err) != apiv1.ReasonQuotaExceeded || time.Since(start) > time.Second {
		t.Errorf("a connection of a caller whose leases hold its quota: %v after %s; want QuotaExceeded at once", err, time.Since(start))
	}
}
