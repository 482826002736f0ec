package proxy

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
)

// changesOnly is the manager the managed reconciler is built with: its
// client writes a Proxy's status only when it changed. crossplane-runtime
// writes the status at the end of every reconcile, changed or not, which
// for a steady proxy is a PUT per poll and per probe outcome that the API
// server answers and drops: a fleet's cost in requests, not in changes.
type changesOnly struct {
	ctrl.Manager
	c client.Client
}

func (m changesOnly) GetClient() client.Client { return m.c }

// newChangesOnly wraps mgr so that unchanged Proxy status writes are left
// out (and counted).
func newChangesOnly(mgr ctrl.Manager, m *metrics.Provider) ctrl.Manager {
	c := mgr.GetClient()
	return changesOnly{Manager: mgr, c: &statusFilter{Client: c, m: m, wrote: map[types.UID]string{}}}
}

// statusFilter is a client whose status writer skips writes that change
// nothing.
type statusFilter struct {
	client.Client
	m *metrics.Provider
	// wrote is the resourceVersion of each Proxy's last write made here
	// (of its status, or of the object: a finalizer, an annotation):
	// until the cache shows it, the cache lags behind this process's own
	// write, and a status equal to the cache's may differ from the
	// server's. A write of the object counts too, or the status write
	// after it would go out unchanged (a no-op PUT the server answers).
	mu    sync.Mutex
	wrote map[types.UID]string
}

// Update records the version a Proxy's write made.
func (f *statusFilter) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	err := f.Client.Update(ctx, obj, opts...)
	f.record(obj, err)
	return err
}

// Patch records the version a Proxy's patch made.
func (f *statusFilter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	err := f.Client.Patch(ctx, obj, patch, opts...)
	f.record(obj, err)
	return err
}

// record notes the resourceVersion obj has after this process wrote it,
// and forgets a Proxy that is gone: not found, or its last finalizer
// removed from a deleted object (so the map holds live Proxies only).
func (f *statusFilter) record(obj client.Object, err error) {
	p, ok := obj.(*v1alpha1.Proxy)
	if !ok {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case kerrors.IsNotFound(err), err == nil && p.DeletionTimestamp != nil && len(p.Finalizers) == 0:
		delete(f.wrote, p.UID)
	case err == nil:
		f.wrote[p.UID] = p.ResourceVersion
	}
}

func (f *statusFilter) Status() client.SubResourceWriter {
	return filteredStatus{SubResourceWriter: f.Client.Status(), f: f}
}

// filteredStatus leaves out an Update of a Proxy whose status is what the
// cache holds at the same resourceVersion, when that is the version this
// process last wrote (or it wrote none): the object as the server has it,
// unchanged, so the API server would change nothing either. Any other
// write (a cache behind this process's last write, another kind) goes
// through, as crossplane-runtime would send it.
type filteredStatus struct {
	client.SubResourceWriter
	f *statusFilter
}

func (w filteredStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	p, ok := obj.(*v1alpha1.Proxy)
	if !ok || len(opts) > 0 {
		return w.SubResourceWriter.Update(ctx, obj, opts...)
	}
	w.f.mu.Lock()
	last, wrote := w.f.wrote[p.UID]
	w.f.mu.Unlock()
	cur := &v1alpha1.Proxy{}
	if (!wrote || last == p.ResourceVersion) && w.f.Get(ctx, client.ObjectKeyFromObject(p), cur) == nil &&
		cur.ResourceVersion == p.ResourceVersion && equality.Semantic.DeepEqual(cur.Status, p.Status) {
		w.f.m.StatusWritesSkipped.Inc()
		return nil
	}
	err := w.SubResourceWriter.Update(ctx, obj, opts...)
	w.f.record(p, err)
	return err
}
