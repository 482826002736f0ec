package discovery_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordv1 "k8s.io/api/coordination/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// laggingCache is a cache that has not seen some Leases yet.
type laggingCache struct {
	client.Reader
	mu     sync.Mutex
	unseen map[string]bool
}

func (c *laggingCache) hide(name string) { c.mu.Lock(); defer c.mu.Unlock(); c.unseen[name] = true }

func (c *laggingCache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := c.Reader.List(ctx, list, opts...); err != nil {
		return err
	}
	if l, ok := list.(*coordv1.LeaseList); ok {
		c.mu.Lock()
		defer c.mu.Unlock()
		l.Items = slices.DeleteFunc(l.Items, func(le coordv1.Lease) bool { return c.unseen[le.Name] })
	}
	return nil
}

// TestLeaseSummaryPublished: a replica writes a LeaseSummary per fleet:
// the proxies held (its own grants too while its cache has not seen them),
// those it saw draining, its demand; the first change after a quiet spell
// at once, then a change at most every leasewire.SummaryInterval, a refresh
// every leasewire.SummaryRefresh and no sooner; and it deletes its summary of a
// fleet that is gone, any replica's summary of a gone fleet, and summaries
// nobody renewed for leasewire.SummarySweepAfter.
func TestLeaseSummaryPublished(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	ctx := context.Background()
	fleet(t, ns, "crawlers", 2, 1, nil)

	clk := &clock{t: time.Now().Truncate(time.Second)}
	cache := &laggingCache{Reader: bed.Client, unseen: map[string]bool{}}
	srv, s := serverOf(t, "team-token "+ns+" crawler\n", func(x *discovery.ServerConfig) {
		x.Now = clk.now
		withStore(x, func(l *lease.StoreConfig) { l.Now, l.Cache = clk.now, cache })
	})
	pub := discovery.NewSummaryPublisher(discovery.SummaryPublisherConfig{Server: s, Client: bed.Client, Replica: "replica-1", Log: logging.NewNopLogger()})
	name := leasewire.SummaryName("crawlers", "replica-1")
	published := func(what string) v1alpha1.LeaseSummarySpec {
		t.Helper()
		if err := pub.Publish(ctx); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		ls := &v1alpha1.LeaseSummary{}
		if err := bed.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, ls); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ls.Labels[fleetv1alpha1.LabelFleet] != "crawlers" || ls.Spec.Fleet != "crawlers" || ls.Spec.Replica != "replica-1" {
			t.Fatalf("%s: the summary does not name its fleet and replica: %+v", what, ls)
		}
		return ls.Spec
	}
	names := func(spec v1alpha1.LeaseSummarySpec) []string {
		var out []string
		for _, l := range spec.Leased {
			out = append(out, l.Name)
		}
		return out
	}

	first := published("nothing leased")
	if len(first.Leased) != 0 || len(first.Draining) != 0 || !first.ObservedAt.Equal(&metav1.MicroTime{Time: clk.now()}) ||
		!first.ValidUntil.Time.Equal(clk.now().Add(leasewire.SummaryFreshness)) {
		t.Fatalf("a fleet without leases: want an empty summary observed now and valid leasewire.SummaryFreshness, got %+v", first)
	}

	c := &apiv1.Client{BaseURL: srv.URL, Token: "team-token"}
	a, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "a", TTL: "15m", MaxWait: "0s"})
	if err != nil {
		t.Fatal(err)
	}
	// The first change after a quiet spell goes out at once.
	got := published("the first lease")
	if len(got.Leased) != 1 || got.Leased[0].Name != a.Proxy || got.Leased[0].Holders != 1 ||
		!got.Leased[0].HeldUntil.Time.Equal(clk.now().Add(15*time.Minute+leasewire.HoldSkew)) {
		t.Fatalf("one lease held on %s for 15m: want it listed at once, held until its renewal + 15m + the skew margin; got %+v", a.Proxy, got.Leased)
	}

	// A grant this replica made that its cache has not seen yet counts;
	// a second change within 10 s of the first waits.
	b, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "b", TTL: "15m", MaxWait: "0s"})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(published("a second change within 10 s")); len(got) != 1 {
		t.Errorf("a second change is written within 10 s of the first: %v", got)
	}
	slots := &coordv1.LeaseList{}
	if err := bed.Client.List(ctx, slots, client.InNamespace(ns), client.MatchingLabels(lease.SeatSelector("crawlers"))); err != nil {
		t.Fatal(err)
	}
	for _, l := range slots.Items {
		if fleetv1alpha1.ProxyName(&l) == b.Proxy {
			cache.hide(l.Name)
		}
	}
	clk.add(leasewire.SummaryInterval)
	if got := names(published("a grant the cache has not seen")); !slices.Equal(got, []string{"crawlers-0", "crawlers-1"}) {
		t.Fatalf("this replica's own grant, unseen by its cache, is left out: %v", got)
	}
	clk.add(30 * time.Second)
	if got := names(published("past the memory of own writes")); !slices.Equal(got, []string{a.Proxy}) {
		t.Errorf("past 30 s only the cache counts (which still hides %s here): %v", b.Proxy, got)
	}

	// Nothing new (the leases outlive the wait): not written again
	// before leasewire.SummaryRefresh, then written all the same.
	before := published("nothing new").ObservedAt
	clk.add(leasewire.SummaryRefresh - time.Second)
	if again := published("just before the refresh").ObservedAt; !again.Equal(&before) {
		t.Errorf("a summary with nothing new is written before leasewire.SummaryRefresh: observed %s, then %s", before, again)
	}
	clk.add(time.Second)
	if after := published("the refresh").ObservedAt; !after.After(before.Time) {
		t.Errorf("a summary with nothing new is not refreshed after leasewire.SummaryRefresh: observed %s, then %s", before, after)
	}
	if got := names(published("the refresh, read again")); !slices.Equal(got, []string{a.Proxy}) {
		t.Fatalf("the refresh lists the lease still held: %v", got)
	}

	// A proxy draining is listed as seen draining.
	p := &v1alpha1.Proxy{}
	if err := bed.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "crawlers-1"}, p); err != nil {
		t.Fatal(err)
	}
	p.Labels[fleetv1alpha1.LabelDrainingSince] = "1700000000"
	if err := bed.Client.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	clk.add(leasewire.SummaryInterval)
	if got := published("draining").Draining; !slices.Equal(got, []v1alpha1.DrainingProxy{{Name: "crawlers-1", Since: 1700000000}}) {
		t.Errorf("draining: want crawlers-1 since its label's 1700000000, got %v", got)
	}
	if err := c.Release(ctx, a.LeaseID); err != nil {
		t.Fatal(err)
	}
	clk.add(leasewire.SummaryInterval)
	if got := names(published("released")); len(got) != 0 {
		t.Errorf("a released lease is still listed: %v", got)
	}

	// Another replica's summary that nobody renewed for 10 minutes goes;
	// so does, once the fleet is gone, every summary of it.
	other := func(replica, fleet string, validUntil time.Time) *v1alpha1.LeaseSummary {
		ls := &v1alpha1.LeaseSummary{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: leasewire.SummaryName(fleet, replica), Labels: leasewire.SummarySelector(fleet)},
			Spec: v1alpha1.LeaseSummarySpec{Fleet: fleet, Replica: replica, ObservedAt: metav1.MicroTime{Time: validUntil.Add(-time.Minute)}, ValidUntil: metav1.MicroTime{Time: validUntil}}}
		if err := bed.Client.Create(ctx, ls); err != nil {
			t.Fatal(err)
		}
		return ls
	}
	abandoned := other("replica-2", "crawlers", clk.now().Add(-leasewire.SummarySweepAfter))
	live := other("replica-3", "crawlers", clk.now().Add(leasewire.SummaryFreshness))
	gone := other("replica-3", "gone", clk.now().Add(-time.Minute))
	// A fleet this replica's cache lacks, whose other replica's summary
	// still counts: this cache may lag (or see fewer fleets).
	unknown := other("replica-4", "not-in-this-cache", clk.now().Add(leasewire.SummaryFreshness+leasewire.SummaryRefresh))
	// One whose validUntil lies a year ahead (a buggy or another release's
	// replica), observed longer ago than the function trusts any
	// validUntil and the sweep delay: it counts no more, so it goes too.
	forever := other("replica-5", "crawlers", clk.now().Add(365*24*time.Hour))
	forever.Spec.ObservedAt = metav1.MicroTime{Time: clk.now().Add(leasewire.SummaryRefresh - leasewire.SummaryValidCeiling - leasewire.SummarySweepAfter)}
	if err := bed.Client.Update(ctx, forever); err != nil {
		t.Fatal(err)
	}
	clk.add(leasewire.SummaryRefresh)
	published("sweep")
	exists := func(ls *v1alpha1.LeaseSummary) bool {
		err := bed.Client.Get(ctx, client.ObjectKeyFromObject(ls), &v1alpha1.LeaseSummary{})
		if err != nil && !kerrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	}
	if exists(abandoned) {
		t.Error("a summary nobody renewed for 10 minutes is kept")
	}
	if !exists(live) {
		t.Error("another live replica's summary was deleted")
	}
	if exists(forever) {
		t.Error("a summary valid for a year by its own word, observed past the ceiling and the sweep delay, is kept")
	}
	if exists(gone) {
		t.Error("a summary of a fleet that is gone is kept")
	}
	if !exists(unknown) {
		t.Error("another replica's summary still counting, of a fleet this replica's cache lacks, was deleted")
	}
	if err := bed.Client.DeleteAllOf(ctx, &v1alpha1.Proxy{}, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if exists(&v1alpha1.LeaseSummary{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}) {
		t.Error("this replica's summary of a fleet that is gone is kept")
	}
}

// TestPoolSummaries: of a pooled fleet each replica writes one summary per
// pool, listing that pool's leased and draining proxies only, and one of
// the fleet as a whole with its demand, labelled so that a pool and the
// fleet each select theirs alone; a pool gone loses its summary.
func TestPoolSummaries(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	ctx := context.Background()
	fleet(t, ns, "pooled", 4, 1, nil)
	// Proxies 0 and 1 in pool 1, 2 and 3 in pool 2; 3 drains.
	for i, pool := range []string{"pooled-pool-1", "pooled-pool-1", "pooled-pool-2", "pooled-pool-2"} {
		p := &v1alpha1.Proxy{}
		if err := bed.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("pooled-%d", i)}, p); err != nil {
			t.Fatal(err)
		}
		p.Labels[fleetv1alpha1.LabelPool] = pool
		if i == 3 {
			p.Labels[fleetv1alpha1.LabelDrainingSince] = strconv.FormatInt(time.Now().Add(-time.Minute).Unix(), 10)
		}
		if err := bed.Client.Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	srv, s := serverOf(t, "team-token "+ns+" crawler\n")
	pub := discovery.NewSummaryPublisher(discovery.SummaryPublisherConfig{Server: s, Client: bed.Client, Replica: "replica-1", Log: logging.NewNopLogger()})
	c := &apiv1.Client{BaseURL: srv.URL, Token: "team-token"}
	var leased []string
	for _, h := range []string{"a", "b"} {
		l, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/pooled", Holder: h, TTL: "2m", MaxWait: "0s"})
		if err != nil {
			t.Fatal(err)
		}
		leased = append(leased, l.Proxy)
	}
	testbed.Eventually(t, 10*time.Second, "summaries of the fleet and both pools", func() (bool, string) {
		if err := pub.Publish(ctx); err != nil {
			return false, err.Error()
		}
		l := &v1alpha1.LeaseSummaryList{}
		if err := bed.Client.List(ctx, l, client.InNamespace(ns), client.MatchingLabels(leasewire.SummarySelector("pooled"))); err != nil {
			return false, err.Error()
		}
		return len(l.Items) == 3, fmt.Sprintf("%d summaries", len(l.Items))
	})
	get := func(pool string) v1alpha1.LeaseSummarySpec {
		t.Helper()
		l := &v1alpha1.LeaseSummaryList{}
		if err := bed.Client.List(ctx, l, client.InNamespace(ns), client.MatchingLabels(leasewire.SummaryLabels("pooled", pool))); err != nil {
			t.Fatal(err)
		}
		if len(l.Items) != 1 {
			t.Fatalf("pool %q: want its one summary selected alone, got %d", pool, len(l.Items))
		}
		return l.Items[0].Spec
	}
	names := func(spec v1alpha1.LeaseSummarySpec) (out []string) {
		for _, l := range spec.Leased {
			out = append(out, l.Name)
		}
		sort.Strings(out)
		return out
	}
	whole, one, two := get(""), get("pooled-pool-1"), get("pooled-pool-2")
	if whole.Pool != "" || len(whole.Leased) != 0 || whole.Demand.Held != 2 {
		t.Errorf("the fleet's summary: pool %q, leased %v, demand %+v; want no pool, none listed, 2 held", whole.Pool, names(whole), whole.Demand)
	}
	// The fleet counts its leased proxies from it: its steady pools do
	// not read their own.
	if distinct := len(slices.Compact(slices.Sorted(slices.Values(leased)))); whole.Demand.LeasedProxies == nil || int(*whole.Demand.LeasedProxies) != distinct {
		t.Errorf("the fleet's summary counts leased proxies %v, want %d (%v)", whole.Demand.LeasedProxies, distinct, leased)
	}
	var want1, want2 []string
	for _, p := range leased {
		if p == "pooled-0" || p == "pooled-1" {
			want1 = append(want1, p)
		} else {
			want2 = append(want2, p)
		}
	}
	sort.Strings(want1)
	sort.Strings(want2)
	if one.Pool != "pooled-pool-1" || !slices.Equal(names(one), want1) || len(one.Draining) != 0 {
		t.Errorf("pool 1's summary: %+v; want leased %v", one, want1)
	}
	if two.Pool != "pooled-pool-2" || !slices.Equal(names(two), want2) || len(two.Draining) != 1 || two.Draining[0].Name != "pooled-3" {
		t.Errorf("pool 2's summary: %+v; want leased %v and pooled-3 draining", two, want2)
	}

	// Pool 2's proxies go: its summary goes with them.
	for _, n := range []string{"pooled-2", "pooled-3"} {
		if err := bed.Client.Delete(ctx, &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	testbed.Eventually(t, 10*time.Second, "pool 2's summary deleted", func() (bool, string) {
		if err := pub.Publish(ctx); err != nil {
			return false, err.Error()
		}
		l := &v1alpha1.LeaseSummaryList{}
		if err := bed.Client.List(ctx, l, client.InNamespace(ns), client.MatchingLabels(leasewire.SummaryLabels("pooled", "pooled-pool-2"))); err != nil {
			return false, err.Error()
		}
		return len(l.Items) == 0, fmt.Sprintf("%d left", len(l.Items))
	})
}

// failingReader fails every read while failing is set.
type failingReader struct {
	client.Reader
	mu      sync.Mutex
	failing bool
}

func (r *failingReader) fail(on bool) { r.mu.Lock(); defer r.mu.Unlock(); r.failing = on }

func (r *failingReader) broken() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing {
		return kerrors.NewServiceUnavailable("the API server is failing")
	}
	return nil
}

func (r *failingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := r.broken(); err != nil {
		return err
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

func (r *failingReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := r.broken(); err != nil {
		return err
	}
	return r.Reader.List(ctx, list, opts...)
}

// TestSummariesStayWhenAFleetCannotBeRead: a replica that cannot read a
// fleet's policy keeps the summaries it wrote, which age out, rather than
// deleting them: deleted, the leases they list would stop counting at
// once.
func TestSummariesStayWhenAFleetCannotBeRead(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	ctx := context.Background()
	fleet(t, ns, "crawlers", 2, 1, nil)
	clk := &clock{t: time.Now().Truncate(time.Second)}
	fleets := &failingReader{Reader: bed.Client}
	srv, s := serverOf(t, "team-token "+ns+" crawler\n", func(x *discovery.ServerConfig) {
		x.Now = clk.now
		withStore(x, func(l *lease.StoreConfig) { l.Now = clk.now })
		withCatalog(x, func(c *discovery.CatalogConfig) { c.Now, c.Fleets, c.Direct = clk.now, fleets, fleets })
	})
	pub := discovery.NewSummaryPublisher(discovery.SummaryPublisherConfig{Server: s, Client: bed.Client, Replica: "replica-1", Log: logging.NewNopLogger()})
	c := &apiv1.Client{BaseURL: srv.URL, Token: "team-token"}
	if _, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "a", TTL: "15m", MaxWait: "0s"}); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	name := leasewire.SummaryName("crawlers", "replica-1")
	if err := bed.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &v1alpha1.LeaseSummary{}); err != nil {
		t.Fatalf("the summary was not written: %v", err)
	}
	// Past the time its policy read last stands in for, and failing.
	clk.add(10 * time.Minute)
	fleets.fail(true)
	if err := pub.Publish(ctx); !kerrors.IsServiceUnavailable(err) {
		t.Fatalf("publishing a fleet that cannot be read must say so with the read's error, got %v", err)
	}
	ls := &v1alpha1.LeaseSummary{}
	if err := bed.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, ls); err != nil {
		t.Fatalf("the replica deleted its summary when it could not read the fleet: %v", err)
	}
	if len(ls.Spec.Leased) != 1 {
		t.Errorf("the summary kept must still list the lease: %+v", ls.Spec.Leased)
	}
}

// refusingWrites is an API client whose writes of LeaseSummaries fail, as
// when the replica's RBAC was narrowed or the API server refuses them.
type refusingWrites struct{ client.Client }

func (c refusingWrites) Create(context.Context, client.Object, ...client.CreateOption) error {
	return kerrors.NewForbidden(v1alpha1.SchemeGroupVersion.WithResource("leasesummaries").GroupResource(), "", fmt.Errorf("refused"))
}

func (c refusingWrites) Update(context.Context, client.Object, ...client.UpdateOption) error {
	return kerrors.NewForbidden(v1alpha1.SchemeGroupVersion.WithResource("leasesummaries").GroupResource(), "", fmt.Errorf("refused"))
}

// TestLeaseSummaryWriteFailuresCounted: a replica that cannot write its
// summary says so, in its error and in
// egress_discovery_lease_summary_writes_total{result="failed"}, and counts
// the writes that succeed apart.
func TestLeaseSummaryWriteFailuresCounted(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "crawlers", 1, 1, nil)
	_, s := serverOf(t, "")
	writes := s.Metrics.SummaryWrites
	failing := discovery.NewSummaryPublisher(discovery.SummaryPublisherConfig{Server: s, Client: refusingWrites{bed.Client}, Replica: "replica-1", Log: logging.NewNopLogger()})
	// Every fleet the shared API server holds is summarised, so the
	// counts are compared, not fixed.
	if err := failing.Publish(context.Background()); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("a refused write: want its error, got %v", err)
	}
	failed, written := testutil.ToFloat64(writes.WithLabelValues("failed")), testutil.ToFloat64(writes.WithLabelValues("written"))
	if failed < 1 || written != 0 {
		t.Errorf("refused writes: want failed >= 1 and written 0, got %v and %v", failed, written)
	}
	ok := discovery.NewSummaryPublisher(discovery.SummaryPublisherConfig{Server: s, Client: bed.Client, Replica: "replica-2", Log: logging.NewNopLogger()})
	if err := ok.Publish(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f, n := testutil.ToFloat64(writes.WithLabelValues("failed")), testutil.ToFloat64(writes.WithLabelValues("written")); f != failed || n < 1 {
		t.Errorf("then writes that succeed: want failed to stay %v and written >= 1; got %v, %v", failed, f, n)
	}
}

// TestReplicasCountedFromSummaries: the replicas sharing a fleet's pacing
// are those whose LeaseSummaries of it still count, each once however many
// summaries (pools) it writes; a summary that stopped counting, or another
// fleet's, is no replica; a fleet without any has this one.
func TestReplicasCountedFromSummaries(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	ctx := context.Background()
	fleet(t, ns, "paced", 2, 1, nil)
	fleet(t, ns, "other", 1, 1, nil)
	_, s := serverOf(t, "team-token "+ns+" crawler\n")
	count := discovery.Replicas(bed.Client, nil, "")
	replicas := func(ctx context.Context, ns, fleet string) int { n, _ := count(ctx, ns, fleet); return n }
	if n := replicas(ctx, ns, "paced"); n != 1 {
		t.Fatalf("no summaries yet: %d replicas, want 1 (this one)", n)
	}
	// A replica counts itself, before its own summary shows: replica-2,
	// just started, beside replica-1 whose summary shows.
	self := discovery.Replicas(bed.Client, nil, "replica-2")
	if n, _ := self(ctx, ns, "paced"); n != 1 {
		t.Fatalf("replica-2 alone, no summaries yet: %d replicas, want 1", n)
	}
	first := discovery.NewSummaryPublisher(discovery.SummaryPublisherConfig{Server: s, Client: bed.Client, Replica: "replica-1", Log: logging.NewNopLogger()})
	if err := first.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, "replica-2 counts replica-1 and itself", func() (bool, string) {
		n, err := self(ctx, ns, "paced")
		return n == 2, fmt.Sprintf("%d replicas, %v", n, err)
	})
	for _, r := range []string{"replica-1", "replica-2"} {
		pub := discovery.NewSummaryPublisher(discovery.SummaryPublisherConfig{Server: s, Client: bed.Client, Replica: r, Log: logging.NewNopLogger()})
		if err := pub.Publish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A replica gone without deleting its summary: it stopped counting.
	now := time.Now()
	stale := &v1alpha1.LeaseSummary{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: leasewire.SummaryName("paced", "replica-3"), Labels: leasewire.SummaryLabels("paced", "")},
		Spec: v1alpha1.LeaseSummarySpec{Fleet: "paced", Replica: "replica-3",
			ObservedAt: metav1.NewMicroTime(now.Add(-time.Hour)), ValidUntil: metav1.NewMicroTime(now.Add(-time.Minute))},
	}
	if err := bed.Client.Create(ctx, stale); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, "two replicas of paced", func() (bool, string) {
		n := replicas(ctx, ns, "paced")
		return n == 2, fmt.Sprintf("%d replicas", n)
	})
	if err := bed.Client.DeleteAllOf(ctx, &v1alpha1.LeaseSummary{}, client.InNamespace(ns), client.MatchingLabels{fleetv1alpha1.LabelFleet: "other"}); err != nil {
		t.Fatal(err)
	}
	if n := replicas(ctx, ns, "other"); n != 1 {
		t.Errorf("a fleet without summaries: %d replicas, want 1", n)
	}
	if err := bed.Client.Delete(ctx, &v1alpha1.LeaseSummary{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: leasewire.SummaryName("paced", "replica-2")}}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, "one replica of paced", func() (bool, string) {
		n := replicas(ctx, ns, "paced")
		return n == 1, fmt.Sprintf("%d replicas", n)
	})
}

// TestBurnedInSummary: with spec.recycling, the summary of the fleet as a
// whole names the proxies whose address its ban history burns (two
// domains within the window), with why; the fleet recycles them. Of a
// pooled fleet too, whose fleet names each pool's burned proxies to it:
// a pool's own summary lists none.
func TestBurnedInSummary(t *testing.T) {
	for _, pooled := range []bool{false, true} {
		t.Run(map[bool]string{false: "Fleet", true: "Pooled"}[pooled], func(t *testing.T) { testBurnedInSummary(t, pooled) })
	}
}

func testBurnedInSummary(t *testing.T, pooled bool) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	ctx := context.Background()
	xr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyFleet",
		"metadata": map[string]any{"name": "crawlers", "namespace": ns},
		"spec": map[string]any{
			"replicas": int64(2), "zones": []any{"zone-a", "zone-b"}, "placement": map[string]any{"local": map[string]any{}},
			"proxy": map[string]any{"authSecretRef": map[string]any{"name": "auth"}}, "healthCheck": map[string]any{"url": "https://example.com/ip"},
			"recycling": map[string]any{"bannedByDomains": int64(2)},
		},
	}}
	if err := bed.Client.Create(ctx, xr); err != nil {
		t.Fatal(err)
	}
	fleet(t, ns, "crawlers", 2, 1, nil)
	if pooled {
		for i := range 2 {
			p := &v1alpha1.Proxy{}
			if err := bed.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("crawlers-%d", i)}, p); err != nil {
				t.Fatal(err)
			}
			p.Labels[fleetv1alpha1.LabelPool] = "crawlers-pool-1"
			if err := bed.Client.Update(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	srv, s := serverOf(t, "team-token "+ns+" crawler\n")
	pub := discovery.NewSummaryPublisher(discovery.SummaryPublisherConfig{Server: s, Client: bed.Client, Replica: "replica-1", Log: logging.NewNopLogger()})
	c := &apiv1.Client{BaseURL: srv.URL, Token: "team-token"}
	g, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "a", TTL: "5m"})
	if err != nil {
		t.Fatal(err)
	}
	burned := func() []v1alpha1.BurnedProxy {
		t.Helper()
		if err := pub.Publish(ctx); err != nil {
			t.Fatal(err)
		}
		ls := &v1alpha1.LeaseSummary{}
		if err := bed.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: leasewire.SummaryName("crawlers", "replica-1")}, ls); err != nil {
			t.Fatal(err)
		}
		return ls.Spec.Burned
	}
	if err := c.Report(ctx, g.LeaseID, apiv1.ReportRequest{Domain: "one.example", Outcome: "banned"}); err != nil {
		t.Fatal(err)
	}
	if b := burned(); len(b) != 0 {
		t.Fatalf("one domain's ban burns nothing (bannedByDomains 2): %+v", b)
	}
	if err := c.Report(ctx, g.LeaseID, apiv1.ReportRequest{Domain: "two.example", Outcome: "banned"}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 5*time.Second, "the summary names the burned proxy", func() (bool, string) {
		b := burned()
		return len(b) == 1 && b[0].Name == g.Proxy && strings.Contains(b[0].Reason, "banned by 2 or more domains"), fmt.Sprint(b)
	})
	if pooled {
		ls := &v1alpha1.LeaseSummary{}
		if err := bed.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: leasewire.PoolSummaryName("crawlers", "crawlers-pool-1", "replica-1")}, ls); err != nil {
			t.Fatal(err)
		}
		if len(ls.Spec.Burned) != 0 {
			t.Errorf("the pool's own summary lists burned proxies %+v: a ban would compose the pool; its fleet names them", ls.Spec.Burned)
		}
	}
}
