package catalog

import (
	"context"
	"sync/atomic"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
)

// WatchVersion watches Proxies and Leases in the cache the catalog and the
// lease store read, and returns a version that any change to them bumps:
// listing snapshots are checked against it, and waiting acquisitions try
// again when it changes.
func WatchVersion(ctx context.Context, c cache.Informers) (func() uint64, error) {
	version := &atomic.Uint64{}
	bump := func(any) { version.Add(1) }
	for _, o := range []client.Object{&v1alpha1.Proxy{}, &coordv1.Lease{}} {
		inf, err := c.GetInformer(ctx, o)
		if err != nil {
			return nil, errors.Wrapf(err, "cannot watch %T", o)
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: bump, DeleteFunc: bump, UpdateFunc: func(_, n any) { bump(n) },
		}); err != nil {
			return nil, errors.Wrapf(err, "cannot watch %T", o)
		}
	}
	return version.Load, nil
}
