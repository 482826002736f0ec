package lease_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/resource"
	"google.golang.org/protobuf/types/known/structpb"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/function"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
)

// TestLongFleetNameLeasesAndRotates runs a fleet whose name (the longest
// allowed) and proxy names are too long for label values through both sides: the
// lease store grants a seat on a real apiserver, its account of the fleet's
// leases is written as a LeaseSummary (as egress-discovery writes it), the
// function selects the fleet's summaries with the selector it gives
// Crossplane, holds rotation of the leased proxy, and rotates it once the
// lease is released.
func TestLongFleetNameLeasesAndRotates(t *testing.T) {
	ctx := context.Background()
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet := "crawlers-" + strings.Repeat("x", fleetv1alpha1.MaxNameLength-len("crawlers-"))
	if len(fleet) < 64 || len(validation.IsValidLabelValue(fleet)) == 0 {
		t.Fatalf("fleet name %q must be too long for a label value", fleet)
	}
	old := fleet + "-0"
	now := time.Now().UTC().Truncate(time.Second)
	s := lease.NewStore(lease.StoreConfig{Client: bed.Client, Now: func() time.Time { return now }})

	g, err := s.Acquire(ctx, []lease.Candidate{{Namespace: ns, Fleet: fleet, Proxy: old, MaxLeases: 1}}, lease.Request{Holder: "crawler-1", TTL: 10 * time.Minute})
	if err != nil {
		t.Fatalf("Acquire on a proxy of a long-named fleet: %v", err)
	}
	if g.Fleet != fleet || g.Proxy != old {
		t.Errorf("grant names fleet %q proxy %q, want the exact names", g.Fleet, g.Proxy)
	}
	slots, err := s.Slots(ctx, ns, fleet)
	if err != nil || len(slots[old]) != 1 {
		t.Fatalf("Slots by exact proxy name: %v, %v", slots, err)
	}
	// A ban's object name is the longest the fleet makes.
	if err := s.Ban(ctx, ns, fleet, old, "shop.example", time.Minute, ""); err != nil {
		t.Fatalf("Ban on a proxy of a long-named fleet: %v", err)
	}
	if bans, err := s.Bans(ctx, ns, fleet); err != nil || len(bans[old]) != 1 {
		t.Fatalf("Bans by exact proxy name: %v, %v", bans, err)
	}

	// The function composes again some time later: the old proxy is past
	// maxAge and its replacement is ready.
	fn := function.New(function.Config{Log: logging.NewNopLogger(), Now: func() time.Time { return now }})
	compose := func() map[string]*fnv1.Resource {
		t.Helper()
		rsp, err := fn.RunFunction(ctx, &fnv1.RunFunctionRequest{
			Observed: &fnv1.State{
				Composite: &fnv1.Resource{Resource: resource.MustStructJSON(fmt.Sprintf(`{
					"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyFleet",
					"metadata": {"name": %q, "namespace": %q},
					"spec": {"replicas": 2, "zones": ["a", "b"], "placement": {"local": {}},
						"proxy": {"authSecretRef": {"name": "auth"}}, "rotation": {"maxAge": "1h"},
						"healthCheck": {"url": "https://example.com/ip"}}}`, fleet, ns))},
				Resources: map[string]*fnv1.Resource{
					// Drained a minute: it goes once no lease is on it.
					"proxy-0": observed(fleet, ns, 0, "a", now.Add(-3*time.Hour), fmt.Sprintf(`, %q: "%d"`, fleetv1alpha1.LabelDrainingSince, now.Add(-time.Minute).Unix())),
					"proxy-1": observed(fleet, ns, 1, "b", now.Add(-10*time.Minute), ""),
					"proxy-2": observed(fleet, ns, 2, "a", now.Add(-5*time.Minute), `, "crawl.example.com/replaces": "0"`),
				},
			},
			RequiredResources: map[string]*fnv1.Resources{"leaseSummaries": {Items: summaries(t, bed.Client, s, ns, fleet, old, now)}},
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rsp.GetResults() {
			if r.GetSeverity() == fnv1.Severity_SEVERITY_FATAL {
				t.Fatalf("function: %s", r.GetMessage())
			}
		}
		// The selector the function hands Crossplane is the summaries'.
		sel := rsp.GetRequirements().GetResources()["leaseSummaries"].GetMatchLabels().GetLabels()
		for k, v := range leasewire.SummarySelector(fleet) {
			if sel[k] != v {
				t.Errorf("function selects LeaseSummaries by %v, they are labelled %v", sel, leasewire.SummarySelector(fleet))
			}
		}
		for _, r := range rsp.GetDesired().GetResources() {
			labels := r.GetResource().GetFields()["metadata"].GetStructValue().AsMap()["labels"].(map[string]any)
			for k, v := range labels {
				if errs := validation.IsValidLabelValue(v.(string)); len(errs) > 0 {
					t.Errorf("composed Proxy label %s=%q is not a valid label value: %v", k, v, errs)
				}
			}
		}
		return rsp.GetDesired().GetResources()
	}

	if _, kept := compose()["proxy-0"]; !kept {
		t.Fatal("the leased proxy was rotated away under its crawler")
	}
	if err := s.Release(ctx, g.ID, ""); err != nil {
		t.Fatal(err)
	}
	if _, kept := compose()["proxy-0"]; kept {
		t.Fatal("the released proxy was not rotated: the function did not see its lease go")
	}
}

// summaries writes the store's account of the fleet's leases to the
// apiserver as a LeaseSummary, as egress-discovery does (draining lists the
// proxy it sees draining), and lists the fleet's summaries back by the
// selector the function gives Crossplane, as Crossplane passes them.
func summaries(t *testing.T, c client.Client, s *lease.Store, ns, fleet, draining string, now time.Time) []*fnv1.Resource {
	t.Helper()
	ctx := context.Background()
	leased, err := s.Leased(ctx, ns, fleet, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ls := &v1alpha1.LeaseSummary{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: leasewire.SummaryName(fleet, "replica-1")}}
	if err := c.Get(ctx, client.ObjectKeyFromObject(ls), ls); err != nil && !kerrors.IsNotFound(err) {
		t.Fatal(err)
	}
	ls.Labels = leasewire.SummarySelector(fleet)
	ls.Spec = v1alpha1.LeaseSummarySpec{Fleet: fleet, Replica: "replica-1", ObservedAt: metav1.MicroTime{Time: now},
		ValidUntil: metav1.MicroTime{Time: now.Add(leasewire.SummaryFreshness)}, Leased: leased, Draining: []v1alpha1.DrainingProxy{{Name: draining, Since: now.Add(-time.Minute).Unix()}}}
	if ls.ResourceVersion == "" {
		err = c.Create(ctx, ls)
	} else {
		err = c.Update(ctx, ls)
	}
	if err != nil {
		t.Fatalf("write the LeaseSummary of a long-named fleet: %v", err)
	}
	l := &v1alpha1.LeaseSummaryList{}
	if err := c.List(ctx, l, client.InNamespace(ns), client.MatchingLabels(leasewire.SummarySelector(fleet))); err != nil {
		t.Fatal(err)
	}
	out := make([]*fnv1.Resource, 0, len(l.Items))
	for i := range l.Items {
		l.Items[i].SetGroupVersionKind(v1alpha1.LeaseSummaryGroupVersionKind)
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&l.Items[i])
		if err != nil {
			t.Fatal(err)
		}
		st, err := structpb.NewStruct(u)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, &fnv1.Resource{Resource: st})
	}
	return out
}

// observed is a Ready Proxy of the fleet as Crossplane observes it.
func observed(fleet, ns string, ord int, zone string, created time.Time, extraLabels string) *fnv1.Resource {
	at := created.Format(time.RFC3339)
	return &fnv1.Resource{Resource: resource.MustStructJSON(fmt.Sprintf(`{
		"apiVersion": "egress.crawl.example.com/v1alpha1", "kind": "Proxy",
		"metadata": {"name": "%s-%d", "namespace": %q, "creationTimestamp": %q,
			"annotations": {%q: %q},
			"labels": {"crawl.example.com/zone": %q %s}},
		"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Available", "lastTransitionTime": %q}],
			"atProvider": {"healthy": true, "host": "127.0.0.1", "port": 3128}}}`,
		fleet, ord, ns, at, fleetv1alpha1.AnnotationFleet, fleet, zone, extraLabels, at))}
}
