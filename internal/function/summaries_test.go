package function

import (
	"encoding/json"
	"testing"
	"time"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/resource"
	"google.golang.org/protobuf/types/known/structpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
)

// held is a proxy a summary lists as leased: holders until until.
type held struct {
	proxy   string
	holders int32
	until   time.Time
}

// leaseSummary is a discovery replica's LeaseSummary of fleet, observed at
// observed and valid leasewire.SummaryFreshness, as Crossplane sends it.
func leaseSummary(fleet, replica string, observed time.Time, leased []held, draining []string, d leasewire.Demand) *structpb.Struct {
	ls := v1alpha1.LeaseSummary{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.LeaseSummaryKind},
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: leasewire.SummaryName(fleet, replica), Labels: leasewire.SummarySelector(fleet)},
		Spec: v1alpha1.LeaseSummarySpec{Fleet: fleet, Replica: replica,
			ObservedAt: metav1.MicroTime{Time: observed}, ValidUntil: metav1.MicroTime{Time: observed.Add(leasewire.SummaryFreshness)},
			Draining: drains(draining),
			Demand:   v1alpha1.LeaseDemand{Held: int32(d.Held), Waiting: int32(d.Waiting), Refused: int32(d.Refused)}}, //nolint:gosec // Test figures.
	}
	for _, h := range leased {
		ls.Spec.Leased = append(ls.Spec.Leased, v1alpha1.LeasedProxy{Name: h.proxy, Holders: h.holders, HeldUntil: metav1.MicroTime{Time: h.until}})
	}
	b, err := json.Marshal(ls)
	if err != nil {
		panic(err)
	}
	return resource.MustStructJSON(string(b))
}

// drainedAt is when the tests' draining proxies began to drain, as their
// labels say.
var drainedAt = t0.Add(-time.Minute)

// drains are names seen draining since drainedAt.
func drains(names []string) []v1alpha1.DrainingProxy {
	var out []v1alpha1.DrainingProxy
	for _, n := range names {
		out = append(out, v1alpha1.DrainingProxy{Name: n, Since: drainedAt.Unix()})
	}
	return out
}

// summaries is the required resources Crossplane sends: these summaries.
func summaries(items ...*structpb.Struct) map[string]*fnv1.Resources {
	rs := &fnv1.Resources{}
	for _, i := range items {
		rs.Items = append(rs.Items, &fnv1.Resource{Resource: i})
	}
	return map[string]*fnv1.Resources{requiredSummaries: rs}
}

// staleAt is when the tests' stale summaries were observed: past their
// freshness and the skew margin at t0.
var staleAt = t0.Add(-leasewire.SummaryFreshness - 2*time.Minute)

// viewMaxTTL is the maxTTL view merges with: long enough that a stale
// summary's leases may still be held.
const viewMaxTTL = leasewire.SummaryFreshness + 10*time.Minute

// view merges items at t0 with viewMaxTTL.
func view(items ...*structpb.Struct) *leaseView {
	return viewLeases(summaries(items...)[requiredSummaries].GetItems(), true, "crawlers", "", viewMaxTTL, t0)
}

// TestViewLeases: the summaries of every replica merge conservatively: the
// union of what they list, stale ones within the time each lease may be
// held; demand from the fresh ones only; anything that does not parse, or
// no fresh summary, makes the leases unknown.
func TestViewLeases(t *testing.T) {
	v := view(
		leaseSummary("crawlers", "r1", t0.Add(-10*time.Second), []held{{"crawlers-0", 2, t0.Add(time.Minute)}}, []string{"crawlers-3"}, leasewire.Demand{Waiting: 2, Refused: 1}),
		leaseSummary("crawlers", "r2", t0.Add(-5*time.Second), []held{{"crawlers-0", 3, t0.Add(time.Minute)}, {"crawlers-1", 1, t0.Add(time.Minute)}}, []string{"crawlers-3"}, leasewire.Demand{Waiting: 1}),
		// Stale (its replica died): its lease on crawlers-2 may still be
		// held, its demand counts no more, its lease on crawlers-4 ended.
		leaseSummary("crawlers", "r3", staleAt, []held{{"crawlers-2", 1, t0.Add(time.Minute)}, {"crawlers-4", 1, t0.Add(-time.Second)}}, nil, leasewire.Demand{Waiting: 50}),
		// Another fleet whose name hashes to the same label.
		leaseSummary("other", "r1", t0, []held{{"other-0", 1, t0.Add(time.Minute)}}, nil, leasewire.Demand{Waiting: 50}),
	)
	if !v.known {
		t.Fatalf("two fresh summaries: leases known, got %q", v.why)
	}
	for _, p := range []string{"crawlers-0", "crawlers-1", "crawlers-2"} {
		if !v.leased[p] {
			t.Errorf("%s is leased by some summary: not in %v", p, v.leased)
		}
	}
	if v.leased["crawlers-4"] || v.leased["other-0"] {
		t.Errorf("an ended lease of a stale summary, or another fleet's, counts: %v", v.leased)
	}
	if want := (leasewire.Demand{Held: 3 + 1 + 1, Waiting: 3, Refused: 1}); v.demand != want {
		t.Errorf("demand %+v, want %+v (holders the most any replica lists, per proxy; waiting and refused of the fresh ones)", v.demand, want)
	}
	if want := t0.Add(time.Minute); !v.next.Equal(want) {
		t.Errorf("the view changes unannounced when the stale r3's lease on crawlers-2 ends, at %s; got %s", want, v.next)
	}
	if !v.drainSeen("crawlers-3", drainedAt) || v.drainSeen("crawlers-0", drainedAt) {
		t.Errorf("crawlers-3 is seen draining by both fresh replicas, crawlers-0 by none: %v %v", v.drainSeen("crawlers-3", drainedAt), v.drainSeen("crawlers-0", drainedAt))
	}
	if v.drainSeen("crawlers-3", drainedAt.Add(time.Second)) {
		t.Error("a drain seen before (the proxy served again since, or another had its name) counts for the drain now")
	}
	if v := view(
		leaseSummary("crawlers", "r1", t0, nil, []string{"crawlers-3"}, leasewire.Demand{}),
		leaseSummary("crawlers", "r2", t0, nil, nil, leasewire.Demand{}),
	); v.drainSeen("crawlers-3", drainedAt) {
		t.Error("a proxy one live replica has not seen draining yet is seen draining")
	}

	// Its freshness old by a reader whose clock is up to 30 s ahead is
	// fresh; past that it is not.
	if v := view(leaseSummary("crawlers", "r1", t0.Add(-leasewire.SummaryFreshness-29*time.Second), nil, nil, leasewire.Demand{})); !v.known {
		t.Errorf("a summary within its freshness and the skew margin: unknown (%s)", v.why)
	}
	unknown := map[string]*structpb.Struct{
		"Stale":           leaseSummary("crawlers", "r1", t0.Add(-leasewire.SummaryFreshness-31*time.Second), nil, nil, leasewire.Demand{}),
		"FromTheFuture":   leaseSummary("crawlers", "r1", t0.Add(time.Hour), nil, nil, leasewire.Demand{}),
		"OfAnotherFleet":  leaseSummary("other", "r1", t0, nil, nil, leasewire.Demand{}),
		"ValidForAYear":   leaseSummary("crawlers", "r1", staleAt, nil, nil, leasewire.Demand{}),
		"NegativeHolders": leaseSummary("crawlers", "r1", t0, []held{{"crawlers-0", -1, t0.Add(time.Minute)}}, nil, leasewire.Demand{}),
	}
	unknown["ValidForAYear"].GetFields()["spec"].GetStructValue().Fields["observedAt"] = structpb.NewStringValue(t0.Add(-leasewire.SummaryValidCeiling - time.Minute).Format(time.RFC3339Nano))
	unknown["ValidForAYear"].GetFields()["spec"].GetStructValue().Fields["validUntil"] = structpb.NewStringValue(t0.Add(365 * 24 * time.Hour).Format(time.RFC3339Nano))
	for name, s := range unknown {
		if v := view(s); v.known {
			t.Errorf("%s: leases known from it alone", name)
		}
	}
	// A replica of another release may give its summaries a longer
	// freshness than this one's, up to leasewire.SummaryValidCeiling: it is
	// trusted.
	longer := leaseSummary("crawlers", "r1", t0.Add(-2*leasewire.SummaryFreshness), nil, nil, leasewire.Demand{})
	longer.GetFields()["spec"].GetStructValue().Fields["validUntil"] = structpb.NewStringValue(t0.Add(time.Minute).Format(time.RFC3339Nano))
	if v := view(longer); !v.known {
		t.Errorf("a summary valid for %s, within the ceiling: unknown (%s)", 2*leasewire.SummaryFreshness+time.Minute, v.why)
	}
	// Crawlers waiting and refused count while the summary saying so is
	// fresh (a crashed replica's until it turns stale), not only for a
	// minute: a summary is rewritten every leasewire.SummaryRefresh, and a
	// rewrite composes every pool that requires it.
	if v := view(
		leaseSummary("crawlers", "r1", t0.Add(-9*time.Minute), nil, nil, leasewire.Demand{Waiting: 50, Refused: 5}),
		leaseSummary("crawlers", "r2", staleAt, nil, nil, leasewire.Demand{Waiting: 2}),
	); !v.known || v.demand != (leasewire.Demand{Waiting: 50, Refused: 5}) {
		t.Errorf("demand of a fresh summary 9 minutes old and a stale one: want the former's, got %+v (known %v)", v.demand, v.known)
	}
	// One summary that does not parse beside a good one: unknown.
	broken := leaseSummary("crawlers", "r2", t0, nil, nil, leasewire.Demand{})
	broken.GetFields()["spec"].GetStructValue().Fields["leased"] = structpb.NewStringValue("everything")
	if v := view(leaseSummary("crawlers", "r1", t0, nil, nil, leasewire.Demand{}), broken); v.known {
		t.Error("a summary that does not parse is ignored: leases known")
	}
	if v := viewLeases(nil, false, "crawlers", "", time.Minute, t0); v.known || v.why == "" {
		t.Errorf("nothing sent yet: want unknown and why, got %+v", v)
	}
	// A stale summary's lease counts no longer than maxTTL after it was
	// observed, whatever it says.
	long := leaseSummary("crawlers", "r3", t0.Add(-viewMaxTTL-5*time.Minute), []held{{"crawlers-9", 1, t0.Add(time.Hour)}}, nil, leasewire.Demand{})
	if v := view(leaseSummary("crawlers", "r1", t0, nil, nil, leasewire.Demand{}), long); v.leased["crawlers-9"] {
		t.Error("a stale summary's lease held past maxTTL after it was observed counts")
	}
}

// validFor sets a summary's validUntil d after its observedAt.
func validFor(s *structpb.Struct, d time.Duration) *structpb.Struct {
	spec := s.GetFields()["spec"].GetStructValue().Fields
	observed, err := time.Parse(time.RFC3339Nano, spec["observedAt"].GetStringValue())
	if err != nil {
		panic(err)
	}
	spec["validUntil"] = structpb.NewStringValue(observed.Add(d).Format(time.RFC3339Nano))
	return s
}

// TestViewLeasesNextChange: the view says when it changes with no summary
// written, which no watch announces: a fresh summary turning stale, a stale
// one's lease ending; the soonest of its own and its fleet's summaries.
func TestViewLeasesNextChange(t *testing.T) {
	fresh := t0.Add(-time.Minute)
	staleAfter := fresh.Add(leasewire.SummaryFreshness + leasewire.HoldSkew)
	cases := map[string]struct {
		items []*structpb.Struct
		want  time.Time
	}{
		"FreshTurnsStale": {
			items: []*structpb.Struct{leaseSummary("crawlers", "r1", fresh, []held{{"crawlers-0", 1, t0.Add(time.Minute)}}, nil, leasewire.Demand{})},
			want:  staleAfter,
		},
		"AStaleOnesLeaseEnds": {
			items: []*structpb.Struct{
				leaseSummary("crawlers", "r1", fresh, nil, nil, leasewire.Demand{}),
				leaseSummary("crawlers", "r2", staleAt, []held{{"crawlers-1", 1, t0.Add(2 * time.Minute)}, {"crawlers-2", 1, t0.Add(-time.Second)}}, nil, leasewire.Demand{}),
			},
			want: t0.Add(2 * time.Minute),
		},
		"AheadOfEveryClock": {
			// Observed 2 minutes ahead: no skew explains it until
			// HoldSkew before then, when the view may be known.
			items: []*structpb.Struct{leaseSummary("crawlers", "r1", t0.Add(2*time.Minute), nil, nil, leasewire.Demand{})},
			want:  t0.Add(2*time.Minute - leasewire.HoldSkew),
		},
		"ValidUntilBeyondTheCeiling": {
			items: []*structpb.Struct{validFor(leaseSummary("crawlers", "r1", t0.Add(-leasewire.SummaryValidCeiling+time.Minute), nil, nil, leasewire.Demand{}), 365*24*time.Hour)},
			want:  t0.Add(time.Minute + leasewire.HoldSkew),
		},
		"HeldBeyondMaxTTL": {
			items: []*structpb.Struct{
				leaseSummary("crawlers", "r1", t0, nil, nil, leasewire.Demand{}),
				leaseSummary("crawlers", "r2", staleAt, []held{{"crawlers-1", 1, t0.Add(365 * 24 * time.Hour)}}, nil, leasewire.Demand{}),
			},
			want: staleAt.Add(viewMaxTTL + leasewire.HoldSkew),
		},
		"ZeroDemandNothingSooner": {
			// Two fresh summaries, none waiting: the first to turn stale.
			items: []*structpb.Struct{
				leaseSummary("crawlers", "r1", t0.Add(-2*time.Minute), nil, nil, leasewire.Demand{}),
				leaseSummary("crawlers", "r2", fresh, nil, nil, leasewire.Demand{Waiting: 3}),
			},
			want: t0.Add(-2*time.Minute + leasewire.SummaryFreshness + leasewire.HoldSkew),
		},
		"NothingDue": {
			items: []*structpb.Struct{leaseSummary("crawlers", "r2", staleAt, []held{{"crawlers-2", 1, t0.Add(-time.Second)}}, nil, leasewire.Demand{})},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := view(tc.items...).next; !got.Equal(tc.want) {
				t.Errorf("next change at %s, want %s", got, tc.want)
			}
		})
	}
	t.Run("PoolsOwnSooner", func(t *testing.T) {
		pool := view(leaseSummary("crawlers", "r1", fresh, nil, nil, leasewire.Demand{}))
		pool.coveredBy(view(leaseSummary("crawlers", "r1", t0, nil, nil, leasewire.Demand{})))
		if !pool.next.Equal(staleAfter) {
			t.Errorf("a pool's own summary turning stale first: at %s; got %s", staleAfter, pool.next)
		}
	})
	t.Run("FleetWideSooner", func(t *testing.T) {
		pool := view(leaseSummary("crawlers", "r1", t0, nil, nil, leasewire.Demand{}))
		pool.coveredBy(view(leaseSummary("crawlers", "r1", fresh, nil, nil, leasewire.Demand{})))
		if !pool.next.Equal(staleAfter) {
			t.Errorf("a pool's view changes when its fleet's summary turns stale, at %s; got %s", staleAfter, pool.next)
		}
	})
}
