package discovery

import (
	"context"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// SweepGrace is how long past its expiry a lease is kept before the
// sweeper deletes it: a crawler renewing a little late still finds it.
const SweepGrace = time.Minute

// Sweeper deletes expired leases and bans, and the leases of proxies that
// are gone, every Interval. Every replica sweeps; deletes are guarded by
// resourceVersion, so two sweeping at once do no harm. It is a manager
// Runnable, like gc.Collector.
type Sweeper struct {
	Leases *lease.Store
	// Proxies is the cache the sweeper asks whether a proxy is gone.
	Proxies  client.Reader
	Interval time.Duration
	Log      logging.Logger
}

// Start sweeps until ctx is done.
func (s *Sweeper) Start(ctx context.Context) error {
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.Sweep(ctx)
		}
	}
}

// Sweep sweeps once, and says how many leases it deleted.
func (s *Sweeper) Sweep(ctx context.Context) int {
	n, err := s.Leases.Sweep(ctx, catalog.ProxyExists(ctx, s.Proxies), SweepGrace)
	switch {
	case err != nil:
		s.Log.Info("Sweep incomplete", "deleted", n, "error", err)
	case n > 0:
		s.Log.Debug("Swept leases", "deleted", n)
	}
	return n
}

// NeedLeaderElection is false: every replica sweeps.
func (s *Sweeper) NeedLeaderElection() bool { return false }
