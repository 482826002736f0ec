// Package gc is the orphan collector: it deletes the instances (processes,
// pods, VMs) that carry this cluster's ownership labels but whose Proxy,
// matched by UID, no longer exists, once they are older than a grace period.
package gc

import (
	"context"
	"fmt"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
)

// Target is one backend to collect in, and the object (its ProviderConfig)
// that events about it are recorded on.
type Target struct {
	// Kind of backend, for metrics.
	Kind    string
	Backend backend.Backend
	Object  runtime.Object
	// Err says why the backend of Object cannot be used (a missing key
	// Secret, a backend this provider image cannot run). Such a target is
	// reported and skipped; the others are collected all the same.
	Err error
}

// Sources are what the collector needs from the cluster.
type Sources interface {
	// Targets lists the backends in use, a broken one with its Err. An
	// error means the list itself is incomplete.
	Targets(ctx context.Context) ([]Target, error)
	// Owners lists the UIDs of every Proxy that exists.
	Owners(ctx context.Context) (map[types.UID]bool, error)
}

// Collector finds and deletes orphans.
type Collector struct {
	Sources   Sources
	ClusterID string
	// Grace is how old an orphan must be before it is deleted, so that an
	// instance whose Proxy is still being written is never taken.
	Grace time.Duration
	// DryRun only logs and counts.
	DryRun bool
	// Interval between passes.
	Interval time.Duration
	Now      func() time.Time
	Log      logging.Logger
	Record   event.Recorder
	Metrics  *metrics.Provider
}

// Report counts one pass.
type Report struct {
	Owned, Foreign, TooYoung, DryRun, Deleted, Failed int
	// Skipped counts targets that could not be collected: a backend that
	// cannot be built or cannot list its instances.
	Skipped int
}

// errListProxies stops a pass that cannot know every Proxy.
const errListProxies = "cannot list Proxies; collecting nothing"

// Collect runs one pass. It deletes nothing when it cannot list the Proxies:
// an orphan is only ever decided on a complete list.
func (c *Collector) Collect(ctx context.Context) (Report, error) {
	r := Report{}
	if _, err := c.Sources.Owners(ctx); err != nil {
		return r, errors.Wrap(err, errListProxies)
	}
	targets, err := c.Sources.Targets(ctx)
	if err != nil {
		return r, errors.Wrap(err, "cannot list backends")
	}
	seen := map[backend.Backend]bool{}
	var errs []error
	for _, t := range targets {
		if t.Err == nil && seen[t.Backend] {
			continue
		}
		seen[t.Backend] = true
		err := t.Err
		if err == nil {
			var instances []backend.Instance
			instances, err = t.Backend.ListOwned(ctx)
			var partial *backend.PartialList
			if errors.As(err, &partial) {
				// What was listed is complete in itself: collected, and
				// what was not is reported.
				c.Metrics.Orphans.WithLabelValues(t.Kind, "partial").Inc()
				c.Log.Info("Orphan collection lists part of a backend only", "kind", t.Kind, "error", err)
				c.event(t, event.Warning("OrphanCollectionPartial", errors.Wrap(err, "orphans of this kind are not collected")))
				err = nil
			}
			if err == nil {
				// The Proxies are read after the instances: a Proxy that
				// imported one of them (and so exists) since the last
				// read is in this list.
				owners, err := c.Sources.Owners(ctx)
				if err != nil {
					return r, errors.Join(append(errs, errors.Wrap(err, "cannot list Proxies; collecting no more"))...)
				}
				errs = append(errs, c.collect(ctx, t, instances, owners, &r)...)
				continue
			}
		}
		// One broken backend must not switch collection off for the
		// others: report it and go on.
		r.Skipped++
		c.Metrics.Orphans.WithLabelValues(t.Kind, "skipped").Inc()
		c.Log.Info("Orphan collection skips a backend", "kind", t.Kind, "error", err)
		c.event(t, event.Warning("OrphanCollectionSkipped", errors.Wrap(err, "orphans of this configuration are not collected")))
		errs = append(errs, errors.Wrapf(err, "cannot collect %s instances", t.Kind))
	}
	return r, errors.Join(errs...)
}

// collect deletes the orphans among one target's instances.
func (c *Collector) collect(ctx context.Context, t Target, instances []backend.Instance, owners map[types.UID]bool, r *Report) []error {
	var errs []error
	for _, i := range instances {
		switch {
		case !i.Owner.OfCluster(c.ClusterID):
			r.Foreign++
		case owners[i.Owner.Holder()], i.Owner.Retain:
			// An imported instance belongs to its adopter. Retained
			// instances were made to outlive their Proxy.
			r.Owned++
		case c.Now().Sub(i.CreatedAt) < c.Grace:
			r.TooYoung++
			c.Metrics.Orphans.WithLabelValues(t.Kind, "too-young").Inc()
		case c.DryRun:
			r.DryRun++
			c.Metrics.Orphans.WithLabelValues(t.Kind, "dry-run").Inc()
			c.Log.Info("Orphan found (dry run: not deleted)", "instance", i.ProviderID, "proxy", i.Owner.Namespace+"/"+i.Owner.Name, "uid", i.Owner.UID)
			c.event(t, event.Normal("OrphanFound", fmt.Sprintf("dry run: %s belongs to Proxy %s/%s (uid %s), which no longer exists", i.ProviderID, i.Owner.Namespace, i.Owner.Name, i.Owner.UID)))
		case c.adoptedSince(ctx, t, i):
			r.Owned++
		default:
			if err := t.Backend.Delete(ctx, i.Ref); err != nil {
				r.Failed++
				errs = append(errs, errors.Wrapf(err, "cannot delete orphan %s", i.ProviderID))
				c.event(t, event.Warning("OrphanDeleteFailed", errors.Wrapf(err, "cannot delete orphan %s", i.ProviderID)))
				continue
			}
			r.Deleted++
			c.Metrics.Orphans.WithLabelValues(t.Kind, "deleted").Inc()
			c.Log.Info("Deleted orphan", "instance", i.ProviderID, "proxy", i.Owner.Namespace+"/"+i.Owner.Name, "uid", i.Owner.UID)
			c.event(t, event.Normal("OrphanDeleted", fmt.Sprintf("deleted %s: its Proxy %s/%s (uid %s) no longer exists", i.ProviderID, i.Owner.Namespace, i.Owner.Name, i.Owner.UID)))
		}
	}
	return errs
}

// adoptedSince reports whether a running orphan has been imported by
// another Proxy since it was listed, or could not be looked at again: it
// is left for the next pass. What is left of an instance (a rule, a
// policy) is not looked at again: nothing imports it.
func (c *Collector) adoptedSince(ctx context.Context, t Target, i backend.Instance) bool {
	if i.Phase == v1alpha1.InstancePhaseTerminated {
		return false
	}
	cur, err := t.Backend.Get(ctx, i.Ref)
	switch {
	case backend.IsNotFound(err):
		return false
	case err != nil:
		return true
	}
	return cur.Owner.Holder() != i.Owner.Holder() || cur.Owner.Retain
}

func (c *Collector) event(t Target, e event.Event) {
	if t.Object != nil && c.Record != nil {
		c.Record.Event(t.Object, e)
	}
}

// Start runs a pass every Interval until ctx ends. It is a manager
// runnable that only the elected leader runs.
func (c *Collector) Start(ctx context.Context) error {
	tick := time.NewTicker(c.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			r, err := c.Collect(ctx)
			if err != nil {
				c.Log.Info("Orphan collection incomplete", "error", err)
			}
			c.Log.Debug("Orphan collection done", "owned", r.Owned, "deleted", r.Deleted, "dry-run", r.DryRun, "too-young", r.TooYoung, "foreign", r.Foreign)
		}
	}
}

// NeedLeaderElection makes only the leader collect.
func (c *Collector) NeedLeaderElection() bool { return true }
