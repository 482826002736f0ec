package gc

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/test"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/fake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

type sources struct {
	targets []Target
	owners  map[types.UID]bool
	err     error
}

func (s sources) Targets(context.Context) ([]Target, error)          { return s.targets, nil }
func (s sources) Owners(context.Context) (map[types.UID]bool, error) { return s.owners, s.err }

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func inst(name, cluster, uid string, age time.Duration) backend.Instance {
	return backend.Instance{Ref: backend.Ref{Name: name}, ProviderID: "fake/" + name, CreatedAt: now.Add(-age),
		Owner: ownership.Owner{ClusterID: cluster, Namespace: "team", Name: "p-" + name, UID: types.UID(uid)}}
}

func TestCollect(t *testing.T) {
	cases := map[string]struct {
		reason   string
		instance backend.Instance
		dryRun   bool
		want     Report
		wantGone bool
	}{
		"Owned":          {reason: "An instance whose Proxy exists is kept.", instance: inst("a", "me", "live-uid", time.Hour), want: Report{Owned: 1}},
		"OrphanTooYoung": {reason: "A young orphan is kept: its Proxy may still be being written.", instance: inst("b", "me", "gone-uid", time.Minute), want: Report{TooYoung: 1}},
		"OrphanOld":      {reason: "An old orphan is deleted.", instance: inst("c", "me", "gone-uid", time.Hour), want: Report{Deleted: 1}, wantGone: true},
		"DryRun":         {reason: "Dry run only counts.", instance: inst("d", "me", "gone-uid", time.Hour), dryRun: true, want: Report{DryRun: 1}},
		"Foreign":        {reason: "Another cluster's instances are never touched.", instance: inst("e", "other-cluster", "gone-uid", time.Hour), want: Report{Foreign: 1}},
		"Retained": {reason: "An instance made under management policies without Delete outlives its Proxy.", instance: func() backend.Instance {
			i := inst("f", "me", "gone-uid", time.Hour)
			i.Owner.Retain = true
			return i
		}(), want: Report{Owned: 1}},
		"Adopted": {reason: "An instance imported by a live Proxy is kept, though its maker is gone.", instance: func() backend.Instance {
			i := inst("g", "me", "gone-uid", time.Hour)
			i.Owner.Adopter = "live-uid"
			return i
		}(), want: Report{Owned: 1}},
		"AdopterGone": {reason: "An imported instance whose adopter is gone is an orphan, though its maker lives.", instance: func() backend.Instance {
			i := inst("h", "me", "live-uid", time.Hour)
			i.Owner.Adopter = "gone-uid"
			return i
		}(), want: Report{Deleted: 1}, wantGone: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := fake.New()
			b.Put(tc.instance)
			c := &Collector{
				Sources:   sources{targets: []Target{{Kind: "Local", Backend: b}, {Kind: "Local", Backend: b}}, owners: map[types.UID]bool{"live-uid": true}},
				ClusterID: "me", Grace: 15 * time.Minute, DryRun: tc.dryRun, Now: func() time.Time { return now },
				Log: logging.NewNopLogger(), Record: event.NewNopRecorder(), Metrics: metrics.NewProvider(),
			}
			got, err := c.Collect(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("%s\n-want, +got:\n%s", tc.reason, diff)
			}
			_, err = b.Get(context.Background(), tc.instance.Ref)
			if gone := backend.IsNotFound(err); gone != tc.wantGone {
				t.Errorf("%s\ninstance gone: %v, want %v", tc.reason, gone, tc.wantGone)
			}
		})
	}
}

func TestCollectNothingWithoutOwners(t *testing.T) {
	b := fake.New()
	b.Put(inst("a", "me", "uid", time.Hour))
	unreachable := errors.New("apiserver unreachable")
	c := &Collector{
		Sources:   sources{targets: []Target{{Kind: "Local", Backend: b}}, err: unreachable},
		ClusterID: "me", Grace: time.Minute, Now: func() time.Time { return now },
		Log: logging.NewNopLogger(), Metrics: metrics.NewProvider(),
	}
	if _, err := c.Collect(context.Background()); cmp.Diff(errors.Wrap(unreachable, errListProxies), err, test.EquateErrors()) != "" {
		t.Errorf("without the list of Proxies the collector must fail, saying why: %v", err)
	}
	if b.CallCount("ListOwned") != 0 || b.CallCount("Delete") != 0 {
		t.Error("and touch no backend")
	}
}

// TestCollectSkipsBrokenTargets: one ProviderConfig whose backend cannot be
// built, or cannot list, is reported and skipped; every other backend is
// collected all the same.
func TestCollectSkipsBrokenTargets(t *testing.T) {
	good, listless := fake.New(), fake.New()
	good.Put(inst("orphan", "me", "gone-uid", time.Hour))
	listless.ListErr = backend.Errorf(backend.ClassTransient, "apiserver of the pods' cluster unreachable")
	rec := &recorder{}
	c := &Collector{
		Sources: sources{targets: []Target{
			{Kind: "GCP", Err: errors.New("cannot read the service-account key: secret not found"), Object: &v1alpha1.ClusterProviderConfig{}},
			{Kind: "Kubernetes", Backend: listless, Object: &v1alpha1.ClusterProviderConfig{}},
			{Kind: "Local", Backend: good},
		}, owners: map[types.UID]bool{}},
		ClusterID: "me", Grace: time.Minute, Now: func() time.Time { return now },
		Log: logging.NewNopLogger(), Record: rec, Metrics: metrics.NewProvider(),
	}
	r, err := c.Collect(context.Background())
	if err == nil || !strings.Contains(err.Error(), "service-account key") || !strings.Contains(err.Error(), "unreachable") {
		t.Errorf("the broken targets are reported: %v", err)
	}
	if r.Deleted != 1 || r.Skipped != 2 {
		t.Errorf("the good backend is collected and the two broken ones skipped: %+v", r)
	}
	if _, err := good.Get(context.Background(), backend.Ref{Name: "orphan"}); !backend.IsNotFound(err) {
		t.Error("the orphan of the good backend is gone")
	}
	if n := testutil.ToFloat64(c.Metrics.Orphans.WithLabelValues("GCP", "skipped")); n != 1 {
		t.Errorf("a skipped target is counted: %v", n)
	}
	skipped := 0
	for _, e := range rec.events {
		if e.Reason == "OrphanCollectionSkipped" && e.Type == event.TypeWarning {
			skipped++
		}
	}
	if skipped != 2 {
		t.Errorf("each skipped configuration gets a Warning event: %+v", rec.events)
	}
}

// TestCollectClusterIDEncoding: a cluster ID that no label value can hold
// as it is (Prod-EU, upper case, is fine on Kubernetes but not on GCP) is
// compared through the encoding it was written with.
func TestCollectClusterIDEncoding(t *testing.T) {
	for name, labels := range map[string]func(ownership.Owner) map[string]string{
		"Kubernetes": ownership.Owner.Labels, "GCP": ownership.Owner.GCPLabels,
	} {
		t.Run(name, func(t *testing.T) {
			written := ownership.Owner{ClusterID: "Prod-EU/one", Namespace: "team", Name: "p", UID: "gone-uid"}
			read, ok := ownership.FromLabels(labels(written))
			if !ok || read.ClusterID == "Prod-EU/one" {
				t.Fatalf("the label holds an encoded cluster ID: %+v", read)
			}
			b := fake.New()
			i := inst("x", "", "gone-uid", time.Hour)
			i.Owner = read
			b.Put(i)
			c := &Collector{
				Sources:   sources{targets: []Target{{Kind: name, Backend: b}}, owners: map[types.UID]bool{}},
				ClusterID: "Prod-EU/one", Grace: time.Minute, Now: func() time.Time { return now },
				Log: logging.NewNopLogger(), Record: event.NewNopRecorder(), Metrics: metrics.NewProvider(),
			}
			if r, err := c.Collect(context.Background()); err != nil || r.Deleted != 1 || r.Foreign != 0 {
				t.Errorf("this cluster's orphan is recognised and collected: %+v, %v", r, err)
			}
			c.ClusterID = "Prod-US/one"
			b.Put(i)
			if r, _ := c.Collect(context.Background()); r.Foreign != 1 {
				t.Errorf("another cluster's instance stays foreign: %+v", r)
			}
		})
	}
}

type recorder struct{ events []event.Event }

func (r *recorder) Event(_ runtime.Object, e event.Event)    { r.events = append(r.events, e) }
func (r *recorder) WithAnnotations(...string) event.Recorder { return r }

// laterSources answers Owners from its list, one map per call, the last
// one repeated: the Proxies as they were at each read.
type laterSources struct {
	targets []Target
	reads   []map[types.UID]bool
	n       int
}

func (s *laterSources) Targets(context.Context) ([]Target, error) { return s.targets, nil }
func (s *laterSources) Owners(context.Context) (map[types.UID]bool, error) {
	o := s.reads[min(s.n, len(s.reads)-1)]
	s.n++
	return o, nil
}

// adoptingBackend lists an instance as its maker's orphan, and then shows it
// imported by another Proxy, as an import racing the collector does.
type adoptingBackend struct {
	*fake.Backend
	adopter types.UID
}

func (b adoptingBackend) Get(ctx context.Context, r backend.Ref) (*backend.Instance, error) {
	i, err := b.Backend.Get(ctx, r)
	if err == nil {
		i.Owner.Adopter = b.adopter
	}
	return i, err
}

// TestCollectRacingImport: an instance imported while the collector runs
// is not taken, whether the import came before the instances were listed
// (the Proxies are read after them) or between the listing and the delete
// (the instance is looked at again).
func TestCollectRacingImport(t *testing.T) {
	collector := func(s Sources) *Collector {
		return &Collector{Sources: s, ClusterID: "me", Grace: time.Minute, Now: func() time.Time { return now },
			Log: logging.NewNopLogger(), Record: event.NewNopRecorder(), Metrics: metrics.NewProvider()}
	}
	t.Run("ImportedBeforeListing", func(t *testing.T) {
		b := fake.New()
		i := inst("a", "me", "maker-uid", time.Hour)
		i.Owner.Adopter = "adopter-uid"
		b.Put(i)
		s := &laterSources{targets: []Target{{Kind: "Local", Backend: b}}, reads: []map[types.UID]bool{{}, {"adopter-uid": true}}}
		if _, err := collector(s).Collect(context.Background()); err != nil {
			t.Fatal(err)
		}
		if b.CallCount("Delete") != 0 {
			t.Error("an instance whose adopter appeared after the first read of the Proxies must be kept")
		}
	})
	t.Run("ImportedBeforeDelete", func(t *testing.T) {
		b := fake.New()
		b.Put(inst("a", "me", "maker-uid", time.Hour))
		s := &laterSources{targets: []Target{{Kind: "Local", Backend: adoptingBackend{Backend: b, adopter: "adopter-uid"}}}, reads: []map[types.UID]bool{{}}}
		r, err := collector(s).Collect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if b.CallCount("Delete") != 0 || r.Owned != 1 {
			t.Errorf("an instance imported after it was listed must be kept: %+v", r)
		}
	})
}

// partialBackend lists its instances, and says a part of what it holds
// (its firewall rules) could not be read.
type partialBackend struct{ *fake.Backend }

func (b partialBackend) ListOwned(ctx context.Context) ([]backend.Instance, error) {
	is, err := b.Backend.ListOwned(ctx)
	if err != nil {
		return nil, err
	}
	return is, &backend.PartialList{Skipped: "firewall rules (compute.firewalls.list)", Err: errors.New("googleapi: Error 403: forbidden")}
}

// TestCollectPartialList: a backend that lists its instances but not all
// it holds has its instances collected all the same, and what it could
// not list is counted and reported, not hidden.
func TestCollectPartialList(t *testing.T) {
	b := fake.New()
	b.Put(inst("orphan", "me", "gone-uid", time.Hour))
	b.Put(inst("owned", "me", "live-uid", time.Hour))
	rec := &recorder{}
	c := &Collector{
		Sources:   sources{targets: []Target{{Kind: "GCP", Backend: partialBackend{b}, Object: &v1alpha1.ClusterProviderConfig{}}}, owners: map[types.UID]bool{"live-uid": true}},
		ClusterID: "me", Grace: time.Minute, Now: func() time.Time { return now },
		Log: logging.NewNopLogger(), Record: rec, Metrics: metrics.NewProvider(),
	}
	r, err := c.Collect(context.Background())
	if err != nil {
		t.Fatalf("a partial list is no failure of the collection: %v", err)
	}
	if r.Deleted != 1 || r.Owned != 1 || r.Skipped != 0 {
		t.Errorf("the instances listed are collected as from a full list: %+v", r)
	}
	if _, err := b.Get(context.Background(), backend.Ref{Name: "orphan"}); !backend.IsNotFound(err) {
		t.Error("the orphan listed is gone")
	}
	if n := testutil.ToFloat64(c.Metrics.Orphans.WithLabelValues("GCP", "partial")); n != 1 {
		t.Errorf("the partial list is counted: %v", n)
	}
	warned := false
	for _, e := range rec.events {
		warned = warned || (e.Reason == "OrphanCollectionPartial" && e.Type == event.TypeWarning && strings.Contains(e.Message, "compute.firewalls.list"))
	}
	if !warned {
		t.Errorf("a Warning event names what was not listed: %+v", rec.events)
	}
}
