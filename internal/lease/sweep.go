package lease

import (
	"context"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
)

// The sweep of lease objects whose proxy is gone or that lapsed long ago.

// Sweep deletes expired slots and bans, and the leases of proxies that no
// longer exist. Each delete is guarded by the resourceVersion it saw, so a
// lease renewed or taken over meanwhile survives. Any replica may sweep.
func (s *Store) Sweep(ctx context.Context, proxyExists func(namespace, name string) bool, grace time.Duration) (int, error) {
	l := &coordv1.LeaseList{}
	// Read-only: the cache's own leases, not a copy of every one each
	// sweep (a Delete does not write into what it is given).
	if err := s.Client.List(ctx, l, client.UnsafeDisableDeepCopy, client.HasLabels{fleetv1alpha1.LabelLeaseKind}); err != nil {
		return 0, errors.Wrap(err, errListLeases)
	}
	now := s.Now()
	n := 0
	var firstErr error
	slots := map[string]bool{}
	// Every lease was listed: the observations of the others are of
	// slots that are gone.
	defer func() { s.forget(slots) }()
	for i := range l.Items {
		le := &l.Items[i]
		kind := le.Labels[fleetv1alpha1.LabelLeaseKind]
		// Demand and ban histories are of no proxy: they outlive them.
		gone := kind != fleetv1alpha1.LeaseKindDemand && kind != fleetv1alpha1.LeaseKindIPBans && !proxyExists(le.Namespace, fleetv1alpha1.ProxyName(le))
		over := Expired(le, now.Add(-grace))
		switch kind {
		case fleetv1alpha1.LeaseKindDemand:
			// Of no proxy: its replica rewrites it, and deletes it with
			// its fleet; one a dead replica left goes once long stale
			// (by the clock: a fast one deletes a live replica's, which
			// writes it again).
			over = Expired(le, now.Add(-leasewire.DemandSweepAfter))
		case fleetv1alpha1.LeaseKindSlot:
			// A slot is over by this replica's observation, never by its
			// clock.
			slots[le.Namespace+"/"+le.Name] = true
			over = s.stale(le, grace)
		}
		if !gone && !over {
			continue
		}
		err := s.Client.Delete(ctx, le, client.Preconditions{UID: &le.UID, ResourceVersion: &le.ResourceVersion})
		switch {
		case err == nil:
			n++
		case kerrors.IsConflict(err), kerrors.IsNotFound(err):
		case firstErr == nil:
			// On to the others: one lease that cannot be deleted (a
			// namespace's policy, say) must not keep the rest, nor
			// stop the pass that keeps observations.
			firstErr = errors.Wrapf(err, errFmtSweepLease, le.Namespace, le.Name)
		}
	}
	return n, firstErr
}
