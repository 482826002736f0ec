package allocator_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
)

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
	var ps []proxy
	for i := range 6 {
		ps = append(ps, proxy{fmt.Sprintf("p%d", i), []string{"192.0.2.1", "192.0.2.2"}[i/3], true, 10})
	}
	b := newBed(t, ps, nil)
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
	ps = nil
	for i := range 8 {
		ps = append(ps, proxy{fmt.Sprintf("p%d", i), fmt.Sprintf("198.51.100.%d", max(i, 3)), true, 10})
	}
	b = newBed(t, ps, nil)
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
	var ps []proxy
	for i := range 10 {
		ps = append(ps, proxy{fmt.Sprintf("p%d", i), fmt.Sprintf("192.0.2.%d", i+1), true, 10})
	}
	b := newBed(t, ps, nil)
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
	var ps []proxy
	for i := range 4 {
		ps = append(ps, proxy{fmt.Sprintf("p%d", i), fmt.Sprintf("192.0.2.%d", i+1), true, 10})
	}
	b := newBed(t, ps, nil)
	b.a.MaxBansPerFleet, b.a.MaxBansPerIdentity = 8, 2
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
