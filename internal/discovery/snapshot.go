package discovery

import (
	"context"
	"sync/atomic"

	"github.com/pkg/errors"
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
	for _, o := range []client.Object{&v1alpha1.Proxy{}, &coordLease{}} {
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

// snapshot is a rendered listing.
type snapshot struct {
	version uint64
	second  int64
	body    []byte
}

// maxSnapshots bounds the snapshots kept, whatever queries callers send.
const maxSnapshots = 1024

// snapshot returns the listing rendered for key at the current version
// within the current second, if any.
func (s *Server) snapshot(key string) ([]byte, bool) {
	if s.Version == nil {
		return nil, false
	}
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	sn, ok := s.snaps[key]
	if !ok || sn.version != s.Version() || sn.second != s.now().Unix() {
		return nil, false
	}
	return sn.body, true
}

// keep remembers a listing rendered at version within second.
func (s *Server) keep(key string, version uint64, second int64, body []byte) {
	if s.Version == nil {
		return
	}
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	if s.snaps == nil || len(s.snaps) >= maxSnapshots {
		s.snaps = map[string]snapshot{}
	}
	s.snaps[key] = snapshot{version: version, second: second, body: body}
}
