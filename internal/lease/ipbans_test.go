package lease_test

import (
	"context"
	"fmt"
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
	s := &lease.Store{Client: bed.Client, Now: c.now, FleetOwnerOf: func(context.Context, string, string) *metav1.OwnerReference { return fleetRef }}

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

	// The newest MaxIPHistory bans are kept.
	for i := range lease.MaxIPHistory + 5 {
		c.add(time.Second)
		if err := s.RecordIPBan(ctx, ns, "crawlers", "crawlers-1", "203.0.113.7", fmt.Sprintf("d%d.example", i), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	hist, _ = s.IPHistories(ctx, ns, "crawlers")
	if h := hist["203.0.113.7"]; len(h) != lease.MaxIPHistory || h[len(h)-1].Domain != fmt.Sprintf("d%d.example", lease.MaxIPHistory+4) || h[0].Domain != "d5.example" {
		t.Errorf("the history keeps the newest %d bans: %d, from %+v to %+v", lease.MaxIPHistory, len(h), h[0], h[len(h)-1])
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
