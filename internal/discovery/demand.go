package discovery

import (
	"context"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	coordv1 "k8s.io/api/coordination/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
)

// DefaultPublishTick is how often the demand and summary publishers look
// at the fleets by default.
const DefaultPublishTick = time.Second

// publisherDefaults are a publisher's replica name (ReplicaName when empty)
// and tick (DefaultPublishTick when not positive).
func publisherDefaults(replica string, tick time.Duration) (string, time.Duration) {
	if replica == "" {
		replica = ReplicaName()
	}
	if tick <= 0 {
		tick = DefaultPublishTick
	}
	return replica, tick
}

// DemandPublisherConfig is what NewDemandPublisher builds a
// DemandPublisher from.
type DemandPublisherConfig struct {
	Server *Server
	// Client writes the demand Leases; Fleets lists the ProxyFleets
	// (cached). Without Fleets nothing is published.
	Client client.Client
	Fleets client.Reader
	// Replica names this replica in its Leases (when empty, ReplicaName:
	// the host name and a random suffix, so that two processes on one host
	// differ).
	Replica string
	Log     logging.Logger
	// Tick is how often demand is looked at (DefaultPublishTick when
	// zero): a fleet at zero learns of its first waiting crawler within it.
	Tick time.Duration
}

// DemandPublisher writes this replica's share of each autoscaled fleet's
// lease demand to a demand Lease in the fleet's namespace, which the
// function sums to size the fleet: when it changes, at most every
// leasewire.DemandInterval, and every leasewire.DemandRefresh while not zero, so
// that it stays fresh. It deletes its Leases of fleets that are gone or no
// longer autoscaled, and those of any replica of fleets that are gone.
// Every replica publishes; it is a manager Runnable.
type DemandPublisher struct {
	DemandPublisherConfig

	published map[string]publishedDemand
	lastSweep time.Time
}

// NewDemandPublisher builds a DemandPublisher, its zero settings taking
// their defaults.
func NewDemandPublisher(cfg DemandPublisherConfig) *DemandPublisher {
	cfg.Replica, cfg.Tick = publisherDefaults(cfg.Replica, cfg.Tick)
	return &DemandPublisher{DemandPublisherConfig: cfg, published: map[string]publishedDemand{}}
}

type publishedDemand struct {
	ns, fleet string
	d         leasewire.Demand
	at        time.Time
}

// NeedLeaderElection is false: every replica publishes its own share.
func (p *DemandPublisher) NeedLeaderElection() bool { return false }

// Start publishes until ctx is done, then deletes this replica's demand
// Leases: a replica that stops asks for nothing.
func (p *DemandPublisher) Start(ctx context.Context) error {
	t := time.NewTicker(p.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			for key, pd := range p.published {
				if p.remove(stop, pd) {
					delete(p.published, key)
				}
			}
			return nil
		case <-t.C:
			if err := p.Publish(ctx); err != nil {
				p.Log.Info("Cannot publish lease demand", "error", err)
			}
		}
	}
}

// autoscaled lists the fleets with spec.autoscaling, by namespace/name,
// and every fleet there is.
func (p *DemandPublisher) autoscaled(ctx context.Context) (map[string][2]string, map[string]bool, error) {
	xrs := &unstructured.UnstructuredList{}
	xrs.SetGroupVersionKind(fleetv1alpha1.SchemeGroupVersion.WithKind(fleetv1alpha1.ProxyFleetKind + "List"))
	if err := p.Fleets.List(ctx, xrs); err != nil {
		return nil, nil, errors.Wrap(err, "cannot list ProxyFleets")
	}
	auto, all := map[string][2]string{}, map[string]bool{}
	for _, xr := range xrs.Items {
		key := xr.GetNamespace() + "/" + xr.GetName()
		all[key] = true
		if a, ok, _ := unstructured.NestedMap(xr.Object, "spec", "autoscaling"); ok && a != nil && xr.GetDeletionTimestamp() == nil {
			auto[key] = [2]string{xr.GetNamespace(), xr.GetName()}
		}
	}
	return auto, all, nil
}

// Publish writes what changed once: each autoscaled fleet's demand when it
// changed and was last written at least leasewire.DemandInterval ago, or when
// it is not zero and was last written leasewire.DemandRefresh ago.
func (p *DemandPublisher) Publish(ctx context.Context) error {
	if p.Fleets == nil {
		return nil
	}
	auto, all, err := p.autoscaled(ctx)
	if err != nil {
		return err
	}
	now := p.Server.Now()
	var firstErr error
	for key, nf := range auto {
		d, err := p.Server.Allocator().DemandOf(ctx, nf[0], nf[1])
		if err != nil {
			firstErr = cmpErr(firstErr, err)
			continue
		}
		last, ok := p.published[key]
		since := now.Sub(last.at)
		switch {
		case !ok && d.Zero():
			// Nothing asked for and nothing said: a missing demand
			// Lease is no demand.
			continue
		case ok && last.d == d && (d.Zero() || since < leasewire.DemandRefresh):
			continue
		case ok && last.d != d && since < leasewire.DemandInterval:
			continue
		}
		if err := p.write(ctx, nf[0], nf[1], d, now); err != nil {
			firstErr = cmpErr(firstErr, err)
			continue
		}
		p.published[key] = publishedDemand{ns: nf[0], fleet: nf[1], d: d, at: now}
	}
	for key, pd := range p.published {
		if _, ok := auto[key]; !ok && p.remove(ctx, pd) {
			delete(p.published, key)
		}
	}
	if now.Sub(p.lastSweep) >= leasewire.DemandRefresh {
		p.lastSweep = now
		firstErr = cmpErr(firstErr, p.sweepGone(ctx, all, now))
	}
	return firstErr
}

// write creates or updates this replica's demand Lease of a fleet.
func (p *DemandPublisher) write(ctx context.Context, ns, fleet string, d leasewire.Demand, now time.Time) error {
	l := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: leasewire.DemandName(fleet, p.Replica)}}
	err := p.Client.Get(ctx, client.ObjectKeyFromObject(l), l)
	switch {
	case kerrors.IsNotFound(err):
		leasewire.SetDemand(l, fleet, p.Replica, d, now)
		return errors.Wrapf(p.Client.Create(ctx, l), "cannot create demand Lease %s/%s", ns, l.Name)
	case err != nil:
		return errors.Wrapf(err, "cannot read demand Lease %s/%s", ns, l.Name)
	}
	leasewire.SetDemand(l, fleet, p.Replica, d, now)
	return errors.Wrapf(p.Client.Update(ctx, l), "cannot update demand Lease %s/%s", ns, l.Name)
}

// remove deletes this replica's demand Lease of a fleet, and says whether
// it is gone.
func (p *DemandPublisher) remove(ctx context.Context, pd publishedDemand) bool {
	l := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: pd.ns, Name: leasewire.DemandName(pd.fleet, p.Replica)}}
	if err := p.Client.Delete(ctx, l); err != nil && !kerrors.IsNotFound(err) {
		p.Log.Info("Cannot delete demand Lease", "namespace", pd.ns, "name", l.Name, "error", err)
		return false
	}
	return true
}

// sweepGone deletes the demand Leases, of any replica, of fleets that are
// gone, once they are older than leasewire.DemandRefresh (a fleet just made
// may not be in this replica's cache yet).
func (p *DemandPublisher) sweepGone(ctx context.Context, fleets map[string]bool, now time.Time) error {
	l := &coordv1.LeaseList{}
	if err := p.Client.List(ctx, l, client.MatchingLabels{fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindDemand}); err != nil {
		return errors.Wrap(err, "cannot list demand Leases")
	}
	var firstErr error
	for i := range l.Items {
		le := &l.Items[i]
		if fleets[le.Namespace+"/"+fleetv1alpha1.FleetName(le)] || now.Sub(le.CreationTimestamp.Time) < leasewire.DemandRefresh {
			continue
		}
		err := p.Client.Delete(ctx, le, client.Preconditions{UID: &le.UID, ResourceVersion: &le.ResourceVersion})
		if err != nil && !kerrors.IsNotFound(err) && !kerrors.IsConflict(err) {
			firstErr = cmpErr(firstErr, errors.Wrapf(err, "cannot delete demand Lease %s/%s of a fleet that is gone", le.Namespace, le.Name))
		}
	}
	return firstErr
}

// cmpErr keeps the first error.
func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}
