package lease_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// TestIPBanHistory: a ban reported on a proxy is kept in the history of
// its egress IP (an IPv4-mapped form is the IPv4 address), one object per
// fleet and IP owned by the fleet, never by the proxy: the proxy's sweep
// leaves it. A ban holds for its cooldown; the history keeps the newest
// MaxIPHistory bans of IPHistoryRetention, and an IP with none lapses and
// is swept.
func TestIPBanHistory(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	c := &clock{t: time.Now()}
	fleetRef := &metav1.OwnerReference{APIVersion: "crawl.example.com/v1alpha1", Kind: "ProxyFleet", Name: "crawlers", UID: "7f0c5a1e-0000-4000-8000-000000000001"}
	s := lease.NewStore(lease.StoreConfig{Client: bed.Client, Now: c.now, FleetOwnerOf: func(context.Context, string, string) *metav1.OwnerReference { return fleetRef }})

	if err := s.RecordIPBan(ctx, ns, "crawlers", "crawlers-0", "::ffff:203.0.113.7", "Shop.Example", 30*time.Minute); err != nil {
		t.Fatal(err)
	}
	c.add(time.Minute)
	if err := s.RecordIPBan(ctx, ns, "crawlers", "crawlers-0", "203.0.113.7", "news.example", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordIPBan(ctx, ns, "crawlers", "crawlers-0", "", "news.example", time.Hour); err != nil {
		t.Fatalf("a proxy without a known IP records nothing, and no error: %v", err)
	}
	got := &coordv1.Lease{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: lease.IPBansName("crawlers", "203.0.113.7")}, got); err != nil {
		t.Fatal(err)
	}
	if len(got.OwnerReferences) != 1 || got.OwnerReferences[0].UID != fleetRef.UID || got.Labels[fleetv1alpha1.LabelLeaseKind] != fleetv1alpha1.LeaseKindIPBans {
		t.Errorf("the history is owned by the fleet, of kind ipbans: %v %v", got.OwnerReferences, got.Labels)
	}
	hist, err := s.IPHistories(ctx, ns, "crawlers")
	if err != nil {
		t.Fatal(err)
	}
	h := hist["203.0.113.7"]
	if len(hist) != 1 || len(h) != 2 || h[0].Domain != "shop.example" || h[1].Domain != "news.example" {
		t.Fatalf("one IP's history of two bans, oldest first, domains in lower case: %+v", hist)
	}
	if !lease.BannedNow(h, "SHOP.example", c.now()) || lease.BannedNow(h, "other.example", c.now()) {
		t.Error("shop.example is banned now, other.example is not")
	}
	if lease.BannedNow(h, "shop.example", c.now().Add(30*time.Minute)) {
		t.Error("the ban ends with its cooldown")
	}

	// The proxy goes: its sweep leaves the history.
	if _, err := s.Sweep(ctx, func(string, string) bool { return false }, 0); err != nil {
		t.Fatal(err)
	}
	if hist, _ := s.IPHistories(ctx, ns, "crawlers"); len(hist["203.0.113.7"]) != 2 {
		t.Errorf("the sweep of a gone proxy's leases took the IP's history: %+v", hist)
	}

	// A burst of one domain is one ban, extended.
	c.add(2 * time.Minute)
	for range 5 {
		c.add(5 * time.Second)
		if err := s.RecordIPBan(ctx, ns, "crawlers", "crawlers-1", "203.0.113.7", "burst.example", 10*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	hist, _ = s.IPHistories(ctx, ns, "crawlers")
	if h := hist["203.0.113.7"]; len(h) != 3 || h[2].Domain != "burst.example" || h[2].Until != c.now().Add(10*time.Minute).Unix() {
		t.Fatalf("five bans of one domain within a minute are one, extended to the last one's cooldown: %+v", h)
	}

	// At most MaxIPHistory are kept, those whose cooldown is over going
	// first: the live bans of shop.example and news.example stay.
	for i := range lease.MaxIPHistory + 5 {
		c.add(time.Second)
		if err := s.RecordIPBan(ctx, ns, "crawlers", "crawlers-1", "203.0.113.7", fmt.Sprintf("d%d.example", i), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	hist, _ = s.IPHistories(ctx, ns, "crawlers")
	h = hist["203.0.113.7"]
	if len(h) != lease.MaxIPHistory || h[len(h)-1].Domain != fmt.Sprintf("d%d.example", lease.MaxIPHistory+4) || !lease.BannedNow(h, "news.example", c.now()) || !lease.BannedNow(h, "burst.example", c.now()) {
		t.Errorf("the history keeps %d bans, the live ones among them: %d, %+v", lease.MaxIPHistory, len(h), h)
	}

	// An ok report with nothing live writes nothing; one with a live ban
	// ends it now and does not renew the history.
	before := &coordv1.Lease{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: lease.IPBansName("crawlers", "203.0.113.7")}, before); err != nil {
		t.Fatal(err)
	}
	if err := s.LiftIPBan(ctx, ns, "crawlers", "203.0.113.7", "never.example"); err != nil {
		t.Fatal(err)
	}
	after := &coordv1.Lease{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: lease.IPBansName("crawlers", "203.0.113.7")}, after); err != nil || after.ResourceVersion != before.ResourceVersion {
		t.Errorf("a lift of nothing live wrote the history: %s -> %s (%v)", before.ResourceVersion, after.ResourceVersion, err)
	}
	c.add(time.Minute)
	if err := s.LiftIPBan(ctx, ns, "crawlers", "203.0.113.7", "news.example"); err != nil {
		t.Fatal(err)
	}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: lease.IPBansName("crawlers", "203.0.113.7")}, after); err != nil || !after.Spec.RenewTime.Equal(before.Spec.RenewTime) {
		t.Errorf("a lift renewed the history: %v -> %v (%v)", before.Spec.RenewTime, after.Spec.RenewTime, err)
	}
	if h := lease.HistoryOf(after, c.now()); lease.BannedNow(h, "news.example", c.now()) {
		t.Error("the ok report ended news.example's ban")
	}

	// A replica whose clock runs ahead writes a ban from the future: the
	// others keep it, and it counts once its time comes.
	ahead := lease.NewStore(lease.StoreConfig{Client: bed.Client, Now: func() time.Time { return c.now().Add(10 * time.Minute) }})
	if err := ahead.RecordIPBan(ctx, ns, "crawlers", "crawlers-1", "203.0.113.7", "future.example", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordIPBan(ctx, ns, "crawlers", "crawlers-1", "203.0.113.7", "now.example", time.Hour); err != nil {
		t.Fatal(err)
	}
	hist, _ = s.IPHistories(ctx, ns, "crawlers")
	if h := hist["203.0.113.7"]; !lease.BannedNow(h, "now.example", c.now()) || !lease.BannedNow(h, "future.example", c.now().Add(11*time.Minute)) {
		t.Errorf("a ban written by a clock ahead is lost by one behind: %+v", h)
	}

	// A Lease of the history's name that is not the history is never
	// overwritten.
	squat := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: lease.IPBansName("crawlers", "198.51.100.9")}}
	if err := bed.Client.Create(ctx, squat); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordIPBan(ctx, ns, "crawlers", "crawlers-1", "198.51.100.9", "shop.example", time.Hour); err == nil || !strings.Contains(err.Error(), "is not the ban history") {
		t.Errorf("a foreign Lease of the name: %v", err)
	}

	// Past the retention with no ban the history lapses and is swept.
	c.add(lease.IPHistoryRetention + time.Minute)
	if hist, _ := s.IPHistories(ctx, ns, "crawlers"); len(hist) != 0 {
		t.Errorf("a history older than the retention still counts: %+v", hist)
	}
	if n, err := s.Sweep(ctx, func(string, string) bool { return true }, 0); err != nil || n != 1 {
		t.Errorf("the lapsed history is swept: %d, %v", n, err)
	}
}

// TestHistoryRead: a history annotation is read as at most MaxIPHistory
// bans, and one larger than any store writes, or damaged, as none.
func TestHistoryRead(t *testing.T) {
	now := time.Now()
	var b strings.Builder
	b.WriteString("[")
	for i := range 100 {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"d":"d%d.example","at":%d,"until":%d}`, i, now.Unix()-int64(100-i), now.Unix()+3600)
	}
	b.WriteString("]")
	l := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{lease.AnnotationBanHistory: b.String()}}}
	if h := lease.HistoryOf(l, now); len(h) != lease.MaxIPHistory || h[len(h)-1].Domain != "d99.example" {
		t.Errorf("100 bans read as %d, the newest last: %+v", len(h), h[len(h)-1])
	}
	l.Annotations[lease.AnnotationBanHistory] = "[" + strings.Repeat(`{"d":"x.example","at":1,"until":2},`, 3000) + `{"d":"x.example","at":1,"until":2}]`
	if h := lease.HistoryOf(l, now); len(h) != 0 {
		t.Errorf("an oversized history reads as %d bans", len(h))
	}
	l.Annotations[lease.AnnotationBanHistory] = `[{"d":`
	if h := lease.HistoryOf(l, now); len(h) != 0 {
		t.Errorf("a damaged history reads as %d bans", len(h))
	}
}

// TestIPBanHistoryKeepsLiveBans: a history full of live bans keeps them
// all when more come (an origin answering 403 for host after host): the
// newcomer is not kept, and the first live ban, of another domain, stays.
// With the oldest live ban dropped instead, victim.example's would go.
func TestIPBanHistoryKeepsLiveBans(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	c := &clock{t: time.Now()}
	s := lease.NewStore(lease.StoreConfig{Client: bed.Client, Now: c.now})
	if err := s.RecordIPBan(ctx, ns, "crawlers", "crawlers-0", "203.0.113.9", "victim.example", 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	for i := range lease.MaxIPHistory + 3 {
		c.add(time.Second)
		if err := s.RecordIPBan(ctx, ns, "crawlers", "crawlers-0", "203.0.113.9", fmt.Sprintf("a%d.evil.example", i), 24*time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	hist, err := s.IPHistories(ctx, ns, "crawlers")
	if err != nil {
		t.Fatal(err)
	}
	h := hist["203.0.113.9"]
	if len(h) != lease.MaxIPHistory || !lease.BannedNow(h, "victim.example", c.now()) {
		t.Errorf("a full history of live bans keeps victim.example's: %d bans, first %+v", len(h), h[0])
	}
}

// TestIPBanHistoryAnswersGoFirst: bans taken from origins' answers give
// way in a full history: 64 live ones from one origin's hosts leave room
// for a crawler's report that comes after them (it once was the one not
// kept), and a burst of answers after a report pushes out older answers,
// never the report.
func TestIPBanHistoryAnswersGoFirst(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	c := &clock{t: time.Now()}
	s := lease.NewStore(lease.StoreConfig{Client: bed.Client, Now: c.now})
	for i := range lease.MaxIPHistory {
		c.add(time.Second)
		if err := s.RecordAnswerIPBan(ctx, ns, "crawlers", "crawlers-0", "203.0.113.10", fmt.Sprintf("a%d.evil.example", i), 24*time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	c.add(time.Second)
	if err := s.RecordIPBan(ctx, ns, "crawlers", "crawlers-0", "203.0.113.10", "victim.example", time.Hour); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		c.add(time.Second)
		if err := s.RecordAnswerIPBan(ctx, ns, "crawlers", "crawlers-0", "203.0.113.10", fmt.Sprintf("b%d.evil.example", i), 24*time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	hist, err := s.IPHistories(ctx, ns, "crawlers")
	if err != nil {
		t.Fatal(err)
	}
	h := hist["203.0.113.10"]
	if len(h) != lease.MaxIPHistory || !lease.BannedNow(h, "victim.example", c.now()) || !lease.BannedNow(h, "b4.evil.example", c.now()) || lease.BannedNow(h, "a0.evil.example", c.now()) {
		t.Errorf("a full history of answers keeps the report and the newest answers: %d bans, %+v ... %+v", len(h), h[0], h[len(h)-1])
	}
}
