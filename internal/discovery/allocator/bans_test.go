package allocator_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator/fake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
)

// healthy are n healthy proxies p0, p1, ... of 10 leases each, proxy i
// leaving from ip(i).
func healthy(n int, ip func(i int) string) []proxy {
	ps := make([]proxy, n)
	for i := range ps {
		ps[i] = proxy{fmt.Sprintf("p%d", i), ip(i), true, 10}
	}
	return ps
}

// admitted counts the fleet's proxies an acquisition for domain may use.
func (b *bed) admitted(t *testing.T, domain string) int {
	t.Helper()
	ms, err := b.a.Catalog.Fleet(context.Background(), ns, fleet)
	if err != nil {
		t.Fatal(err)
	}
	ok, _, err := b.a.Healthy(context.Background(), ms, "", nil, domain)
	if err != nil {
		t.Fatal(err)
	}
	return len(ok)
}

// TestBanFromAnswerKeepsHalfByAddress: an origin's answers ban at most
// half of the fleet's serving proxies for a domain, counting every proxy
// that leaves from a banned one's egress IP (the target banned the
// address). Six proxies behind two addresses: the first ban takes three
// out, the second, on the other address, would take all six and is
// refused; a crawler's own report is not bound so.
func TestBanFromAnswerKeepsHalfByAddress(t *testing.T) {
	b := newBed(t, healthy(6, func(i int) string { return []string{"192.0.2.1", "192.0.2.2"}[i/3] }), nil)
	ctx := context.Background()
	alice := &auth.Identity{User: "alice"}
	if err := b.a.BanFromAnswer(ctx, ns, fleet, "p0", "login.example", time.Hour, alice, 403); err != nil {
		t.Fatalf("the first ban from an answer: %v", err)
	}
	if n := b.admitted(t, "login.example"); n != 3 {
		t.Fatalf("a ban of p0 takes its address's three proxies out: %d admitted", n)
	}
	err := b.a.BanFromAnswer(ctx, ns, fleet, "p3", "login.example", time.Hour, alice, 403)
	if reasonOf(err) != apiv1.ReasonBanLimit {
		t.Fatalf("a ban of the other address's p3 would leave none: %v, want BanLimit", err)
	}
	if n := b.admitted(t, "login.example"); n != 3 {
		t.Errorf("after the refused ban: %d admitted, want 3", n)
	}
	// Extending a live ban is always allowed.
	if err := b.a.BanFromAnswer(ctx, ns, fleet, "p0", "login.example", 2*time.Hour, alice, 429); err != nil {
		t.Errorf("extending p0's ban: %v", err)
	}
	// A crawler's report knows what it saw.
	if err := b.a.Ban(ctx, ns, fleet, "p3", "login.example", time.Hour, alice); err != nil {
		t.Errorf("a reported ban is not bound by half: %v", err)
	}

	// Eight proxies, four of them behind one address: with one proxy out,
	// a ban of one of the four takes four more, five of eight.
	b = newBed(t, healthy(8, func(i int) string { return fmt.Sprintf("198.51.100.%d", max(i, 3)) }), nil)
	if err := b.a.BanFromAnswer(ctx, ns, fleet, "p7", "login.example", time.Hour, alice, 403); err != nil {
		t.Fatalf("a ban of p7, alone on its address: %v", err)
	}
	if err := b.a.BanFromAnswer(ctx, ns, fleet, "p0", "login.example", time.Hour, alice, 403); reasonOf(err) != apiv1.ReasonBanLimit {
		t.Errorf("a ban of p0, whose address three others share, would leave 3 of 8: %v, want BanLimit", err)
	}
	if n := b.admitted(t, "login.example"); n != 7 {
		t.Errorf("%d of 8 admitted, want 7", n)
	}
}

// TestBanFromAnswerRacing: ten answers at once, through ten proxies of
// ten addresses, ban five: the bound is checked and the ban written under
// one lock per fleet (each write takes 20 ms, as an API call does; checked
// before the others' writes, all ten would pass).
func TestBanFromAnswerRacing(t *testing.T) {
	b := newBed(t, healthy(10, func(i int) string { return fmt.Sprintf("192.0.2.%d", i+1) }), nil)
	b.store.BanTakes = 20 * time.Millisecond
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			_ = b.a.BanFromAnswer(context.Background(), ns, fleet, fmt.Sprintf("p%d", i), "busy.example", time.Hour, &auth.Identity{User: "alice"}, 429)
		})
	}
	wg.Wait()
	if n := b.admitted(t, "busy.example"); n != 5 {
		t.Errorf("ten answers at once left %d of 10 proxies for the domain, want 5", n)
	}
}

// TestBanFromAnswerOwnBudget: bans from origins' answers count neither
// against the identity whose request drew them nor against the fleet's
// bound for reports, but against a quarter of the fleet's of their own:
// a hostile origin banning host after host cannot use up what the
// crawler's own reports may record.
func TestBanFromAnswerOwnBudget(t *testing.T) {
	b := newBed(t, healthy(4, func(i int) string { return fmt.Sprintf("192.0.2.%d", i+1) }), nil, func(c *allocator.Config) {
		c.MaxBansPerFleet, c.MaxBansPerIdentity = 8, 2
	})
	ctx := context.Background()
	alice := &auth.Identity{User: "alice"}
	for i := range 2 {
		if err := b.a.BanFromAnswer(ctx, ns, fleet, "p0", fmt.Sprintf("a%d.evil.example", i), time.Hour, alice, 403); err != nil {
			t.Fatalf("answer ban %d within its budget of 2: %v", i, err)
		}
	}
	if err := b.a.BanFromAnswer(ctx, ns, fleet, "p0", "a2.evil.example", time.Hour, alice, 403); reasonOf(err) != apiv1.ReasonBanLimit {
		t.Errorf("a third answer ban past a quarter of the fleet's bound of 8: %v, want BanLimit", err)
	}
	for i := range 2 {
		if err := b.a.Ban(ctx, ns, fleet, "p1", fmt.Sprintf("shop%d.example", i), time.Hour, alice); err != nil {
			t.Errorf("alice's report %d, her bound 2 untouched by the answers' bans: %v", i, err)
		}
	}
	if err := b.a.Ban(ctx, ns, fleet, "p1", "shop2.example", time.Hour, alice); reasonOf(err) != apiv1.ReasonBanLimit {
		t.Errorf("alice's third report, past her bound of 2: %v, want BanLimit", err)
	}
}

// TestBanFromAnswerReplicasRacing: two replicas of a fleet, each blind to
// the other's bans (its cache lagging), ban by answers at once through the
// ten proxies they serve: each keeps the bans it recorded itself within
// its share (a quarter of the fleet each, two bans), so together they
// leave six. Checking the half alone, each banned five, and none was
// left.
func TestBanFromAnswerReplicasRacing(t *testing.T) {
	b := newBed(t, healthy(10, func(i int) string { return fmt.Sprintf("192.0.2.%d", i+1) }), nil)
	two := func(context.Context, string, string) (int, error) { return 2, nil }
	// Each replica sees none of the bans written: only its own recent ones.
	replica := func(name string) *allocator.Allocator {
		return allocator.New(allocator.Config{Catalog: b.a.Catalog, Leases: blind{lagging{b.store}}, Auth: allowAll{}, Metrics: metrics.NewDiscovery(), Replicas: two, Replica: name})
	}
	r1, r2 := replica("r1"), replica("r2")
	var wg sync.WaitGroup
	for i := range 10 {
		r := r1
		if i >= 5 {
			r = r2
		}
		wg.Go(func() {
			_ = r.BanFromAnswer(context.Background(), ns, fleet, fmt.Sprintf("p%d", i), "wall.example", time.Hour, &auth.Identity{User: "alice"}, 403)
		})
	}
	wg.Wait()
	if n := b.admitted(t, "wall.example"); n != 6 {
		t.Errorf("two replicas racing, each blind to the other's bans, left %d of 10 proxies for the domain, want 6 (two bans each)", n)
	}
}

// TestBanFromAnswerNamesOnlyMembers: an answer through a proxy the
// catalogue does not show (gone, or not yet seen) bans nothing: its
// address cannot be counted, and a ban of its name would pass to the next
// proxy of that name.
func TestBanFromAnswerNamesOnlyMembers(t *testing.T) {
	b := newBed(t, []proxy{{"p0", "192.0.2.1", true, 10}, {"p1", "192.0.2.2", true, 10}}, nil)
	err := b.a.BanFromAnswer(context.Background(), ns, fleet, "ghost", "x.example", time.Hour, &auth.Identity{User: "alice"}, 403)
	if reasonOf(err) != apiv1.ReasonBanLimit {
		t.Errorf("an answer ban of a proxy the catalogue lacks: %v, want BanLimit", err)
	}
}

// TestBanFromAnswerHostsPerSite: one site's answers ban proxies for at
// most MaxAnswerHostsPerSite of its hosts (wildcard DNS names as many as
// it likes); another site's answers are not held up by it.
func TestBanFromAnswerHostsPerSite(t *testing.T) {
	b := newBed(t, healthy(4, func(i int) string { return fmt.Sprintf("192.0.2.%d", i+1) }), nil, func(c *allocator.Config) { c.MaxBansPerFleet = 5000 })
	ctx := context.Background()
	alice := &auth.Identity{User: "alice"}
	for i := range allocator.MaxAnswerHostsPerSite {
		if err := b.a.BanFromAnswer(ctx, ns, fleet, "p0", fmt.Sprintf("a%d.evil.example", i), time.Hour, alice, 403); err != nil {
			t.Fatalf("host %d of evil.example: %v", i, err)
		}
	}
	if err := b.a.BanFromAnswer(ctx, ns, fleet, "p0", "more.evil.example", time.Hour, alice, 403); reasonOf(err) != apiv1.ReasonBanLimit {
		t.Errorf("a host past the site's bound: %v, want BanLimit", err)
	}
	if err := b.a.BanFromAnswer(ctx, ns, fleet, "p0", "a0.evil.example", 2*time.Hour, alice, 403); err != nil {
		t.Errorf("extending a host's ban within the bound: %v", err)
	}
	if err := b.a.BanFromAnswer(ctx, ns, fleet, "p0", "login.example", time.Hour, alice, 403); err != nil {
		t.Errorf("another site's answer: %v", err)
	}
}

// lagging is a store whose listing of bans lags: it shows none, as a
// replica's cache before its own writes reach it.
type lagging struct{ *fake.Store }

func (lagging) ActiveBans(context.Context, string, string) ([]lease.Ban, error) { return nil, nil }

// blind is lagging in every read of bans: the proxies banned for a domain
// and the IP histories too.
type blind struct{ lagging }

func (blind) BannedFor(context.Context, string, string, string) (map[string]bool, error) {
	return map[string]bool{}, nil
}

func (blind) IPHistories(context.Context, string, string) (map[string][]lease.IPBan, error) {
	return map[string][]lease.IPBan{}, nil
}

// TestExtendedBanStaysWhoseItWas: an origin's answer that extends a ban a
// crawler reported leaves the ban the crawler's in the replica's own
// count too, while its cache lags: the crawler's next report still meets
// its bound. (Counted as the answer's, it passed one report over.)
func TestExtendedBanStaysWhoseItWas(t *testing.T) {
	b := newBed(t, []proxy{{"p0", "192.0.2.1", true, 10}, {"p1", "192.0.2.2", true, 10}}, nil, func(c *allocator.Config) {
		c.Leases, c.MaxBansPerIdentity = lagging{c.Leases.(*fake.Store)}, 1
	})
	ctx := context.Background()
	alice := &auth.Identity{User: "alice"}
	if err := b.a.Ban(ctx, ns, fleet, "p0", "shop.example", time.Hour, alice); err != nil {
		t.Fatal(err)
	}
	if err := b.a.BanFromAnswer(ctx, ns, fleet, "p0", "shop.example", 2*time.Hour, alice, 429); err != nil {
		t.Fatalf("an answer extending the report: %v", err)
	}
	if err := b.a.Ban(ctx, ns, fleet, "p1", "news.example", time.Hour, alice); reasonOf(err) != apiv1.ReasonBanLimit {
		t.Errorf("alice's second report, her bound 1: %v, want BanLimit", err)
	}
}

// TestBanWaitEndsWithItsCaller: a ban waiting for its fleet's lock behind
// a slow write gives up when its caller goes, rather than queueing on.
func TestBanWaitEndsWithItsCaller(t *testing.T) {
	b := newBed(t, []proxy{{"p0", "192.0.2.1", true, 10}, {"p1", "192.0.2.2", true, 10}, {"p2", "192.0.2.3", true, 10}, {"p3", "192.0.2.4", true, 10}}, nil)
	b.store.BanTakes = time.Second
	writing := make(chan struct{})
	b.store.OnBan = func(proxy string) {
		if proxy == "p0" {
			close(writing)
		}
	}
	alice := &auth.Identity{User: "alice"}
	go func() {
		_ = b.a.BanFromAnswer(context.Background(), ns, fleet, "p0", "slow.example", time.Hour, alice, 403)
	}()
	<-writing
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := b.a.Ban(ctx, ns, fleet, "p1", "other.example", time.Hour, alice)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 500*time.Millisecond {
		t.Errorf("a ban whose caller went while it waited: %v after %s", err, time.Since(start))
	}
}
