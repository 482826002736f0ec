package proxy

import (
	"context"
	"testing"

	kerrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/prometheus/client_golang/prometheus/testutil"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
)

// lagging reads Proxies as a cache that has not seen the latest write.
type lagging struct {
	client.Client
	stale *v1alpha1.Proxy
}

func (l lagging) Get(_ context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	l.stale.DeepCopyInto(obj.(*v1alpha1.Proxy)) //nolint:forcetypeassert // Proxies only.
	return nil
}

// TestStatusFilterTrustsOnlyAFreshCache: an unchanged status is left out,
// but not while the cache is behind this process's own last write: a
// reconcile that read the older version (Synced True, before the write
// that made it False) must send its write, which the API server refuses
// as a conflict and crossplane-runtime retries, rather than leave the
// newer, wrong status standing.
func TestStatusFilterTrustsOnlyAFreshCache(t *testing.T) {
	s := runtime.NewScheme()
	if err := v1alpha1.SchemeBuilder.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	p := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: types.UID("u1")}}
	p.SetConditions(xpv2.ReconcileSuccess())
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(p).WithStatusSubresource(p).Build()
	read := func() *v1alpha1.Proxy {
		got := &v1alpha1.Proxy{}
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(p), got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	m := metrics.NewProvider()
	f := &statusFilter{Client: c, m: m, wrote: map[types.UID]string{}}
	ctx := context.Background()

	// Unchanged, with a fresh cache: left out.
	v1 := read()
	if err := f.Status().Update(ctx, v1.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	if got := read(); got.ResourceVersion != v1.ResourceVersion {
		t.Fatalf("an unchanged status was written: resourceVersion %s -> %s", v1.ResourceVersion, got.ResourceVersion)
	}
	// A change is written.
	failing := v1.DeepCopy()
	failing.SetConditions(xpv2.ReconcileError(context.Canceled))
	if err := f.Status().Update(ctx, failing); err != nil {
		t.Fatal(err)
	}
	// A cache still at v1 (Synced True) hands a reconcile v1 again; its
	// status equals the cache's, but not the server's.
	lag := &statusFilter{Client: lagging{Client: c, stale: v1}, m: m, wrote: f.wrote}
	err := lag.Status().Update(ctx, v1.DeepCopy())
	if !kerrors.IsConflict(err) {
		t.Fatalf("a write from a cache behind this process's own write was left out (or accepted): %v; want it sent and refused as a conflict", err)
	}
	if got := read(); got.GetCondition(xpv2.TypeSynced).Status != failing.GetCondition(xpv2.TypeSynced).Status {
		t.Fatalf("the server's status changed to %v", got.GetCondition(xpv2.TypeSynced))
	}
}

// TestStatusFilterAfterObjectWrite: a write of the object itself made here
// (crossplane-runtime adds a finalizer, sets an annotation) moves the
// resourceVersion; the unchanged status write of the next reconcile is
// still left out, not sent as a no-op. A Proxy whose last finalizer is
// removed is forgotten.
func TestStatusFilterAfterObjectWrite(t *testing.T) {
	s := runtime.NewScheme()
	if err := v1alpha1.SchemeBuilder.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	p := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: types.UID("u1"), Finalizers: []string{"finalizer.managedresource.crossplane.io"}}}
	p.SetConditions(xpv2.ReconcileSuccess())
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(p).WithStatusSubresource(p).Build()
	ctx := context.Background()
	read := func() *v1alpha1.Proxy {
		got := &v1alpha1.Proxy{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	m := metrics.NewProvider()
	f := &statusFilter{Client: c, m: m, wrote: map[types.UID]string{}}
	failing := read()
	failing.SetConditions(xpv2.ReconcileError(context.Canceled))
	if err := f.Status().Update(ctx, failing); err != nil {
		t.Fatal(err)
	}
	annotated := read()
	annotated.SetAnnotations(map[string]string{"crossplane.io/external-create-succeeded": "now"})
	if err := f.Update(ctx, annotated); err != nil {
		t.Fatal(err)
	}
	v := read()
	skipped := testutil.ToFloat64(m.StatusWritesSkipped)
	if err := f.Status().Update(ctx, v.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	if testutil.ToFloat64(m.StatusWritesSkipped) != skipped+1 {
		t.Errorf("after this process wrote the object, an unchanged status was sent, not left out")
	}
	if f.wrote[p.UID] != v.ResourceVersion {
		t.Errorf("the object write was not recorded: %q, want %q", f.wrote[p.UID], v.ResourceVersion)
	}
	// Deleted: the finalizer's removal lets it go, and the filter forgets it.
	if err := c.Delete(ctx, read()); err != nil {
		t.Fatal(err)
	}
	gone := read()
	gone.Finalizers = nil
	if err := f.Update(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.wrote[p.UID]; ok {
		t.Errorf("a Proxy deleted for good is still remembered: %d entries", len(f.wrote))
	}
}
