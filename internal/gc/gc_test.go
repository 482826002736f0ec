package gc

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

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
	c := &Collector{
		Sources:   sources{targets: []Target{{Kind: "Local", Backend: b}}, err: errors.New("apiserver unreachable")},
		ClusterID: "me", Grace: time.Minute, Now: func() time.Time { return now },
		Log: logging.NewNopLogger(), Metrics: metrics.NewProvider(),
	}
	if _, err := c.Collect(context.Background()); err == nil {
		t.Error("without the list of Proxies the collector must fail")
	}
	if b.CallCount("ListOwned") != 0 || b.CallCount("Delete") != 0 {
		t.Error("and touch no backend")
	}
}
