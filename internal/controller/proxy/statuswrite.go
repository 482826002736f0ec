package proxy

import (
	"context"

	"k8s.io/apimachinery/pkg/api/equality"
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
	return changesOnly{Manager: mgr, c: statusFilter{Client: c, m: m}}
}

// statusFilter is a client whose status writer skips writes that change
// nothing.
type statusFilter struct {
	client.Client
	m *metrics.Provider
}

func (f statusFilter) Status() client.SubResourceWriter {
	return filteredStatus{SubResourceWriter: f.Client.Status(), reader: f.Client, m: f.m}
}

// filteredStatus leaves out an Update of a Proxy whose status is what the
// cache holds at the same resourceVersion: the object it was read as,
// unchanged, so the API server would change nothing either. Any other
// write (an older cache, another kind) goes through.
type filteredStatus struct {
	client.SubResourceWriter
	reader client.Reader
	m      *metrics.Provider
}

func (w filteredStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if p, ok := obj.(*v1alpha1.Proxy); ok && len(opts) == 0 {
		cur := &v1alpha1.Proxy{}
		if err := w.reader.Get(ctx, client.ObjectKeyFromObject(p), cur); err == nil &&
			cur.ResourceVersion == p.ResourceVersion && equality.Semantic.DeepEqual(cur.Status, p.Status) {
			w.m.StatusWritesSkipped.Inc()
			return nil
		}
	}
	return w.SubResourceWriter.Update(ctx, obj, opts...)
}
