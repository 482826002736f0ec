package discovery

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/egressip"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// SummaryPublisherConfig is what NewSummaryPublisher builds a
// SummaryPublisher from.
type SummaryPublisherConfig struct {
	Server *Server
	// Client writes the summaries.
	Client client.Client
	// Replica names this replica (when empty, ReplicaName: the host name
	// and a random suffix, so that two processes on one host differ).
	Replica string
	Log     logging.Logger
	// Tick is how often the fleets are looked at (DefaultPublishTick when zero).
	Tick time.Duration
}

// SummaryPublisher writes, for every fleet, this replica's LeaseSummary:
// the proxies crawlers hold leases on (from its cache, and the slots it
// wrote itself lately, which its cache may not show yet), the proxies it
// saw draining, and its share of the fleet's demand. It writes a summary
// when what it says changes, at most every leasewire.SummaryInterval, and every
// leasewire.SummaryRefresh regardless, so that a summary still valid
// (leasewire.SummaryFreshness after it was observed) tells a live replica from
// a dead one. It deletes its summaries of fleets that are gone, any
// replica's summaries of gone fleets, and summaries no replica has renewed
// for leasewire.SummarySweepAfter. Every replica publishes; it is a manager
// Runnable.
type SummaryPublisher struct {
	SummaryPublisherConfig

	published map[string]publishedSummary
	lastSweep time.Time
}

// NewSummaryPublisher builds a SummaryPublisher, its zero settings
// taking their defaults.
func NewSummaryPublisher(cfg SummaryPublisherConfig) *SummaryPublisher {
	cfg.Replica, cfg.Tick = publisherDefaults(cfg.Replica, cfg.Tick)
	return &SummaryPublisher{SummaryPublisherConfig: cfg, published: map[string]publishedSummary{}}
}

// publishedSummary is what this replica last wrote for a fleet, or one of
// its pools: when, and what it said, but for the times.
type publishedSummary struct {
	ns, fleet, pool string
	said            string
	// at is when it was last written; changed when last with a change.
	at, changed time.Time
}

// NeedLeaderElection is false: every replica publishes its own summaries.
func (p *SummaryPublisher) NeedLeaderElection() bool { return false }

// Start publishes until ctx is done, then deletes this replica's
// summaries: a replica that stops leaves no account that would go stale.
func (p *SummaryPublisher) Start(ctx context.Context) error {
	t := time.NewTicker(p.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			for key, ps := range p.published {
				if p.remove(stop, ps.ns, ps.fleet, ps.pool) {
					delete(p.published, key)
				}
			}
			return nil
		case <-t.C:
			if err := p.Publish(ctx); err != nil {
				p.Log.Info("Cannot publish lease summaries", "error", err)
			}
		}
	}
}

// Publish writes what changed, once.
func (p *SummaryPublisher) Publish(ctx context.Context) error {
	fleets, err := p.Server.Catalog.All(ctx)
	if err != nil {
		return err
	}
	now := p.Server.Now()
	var firstErr error
	live := map[string]bool{}
	for key, members := range fleets {
		ns, fleet, _ := strings.Cut(key, "/")
		specs, err := p.summarise(ctx, ns, fleet, members, now)
		if err != nil {
			// What this replica wrote last stays and ages out: deleted,
			// its leases would stop counting at once.
			for k := range p.published {
				if strings.HasPrefix(k, key+"\x00") {
					live[k] = true
				}
			}
			firstErr = cmpErr(firstErr, err)
			continue
		}
		for _, spec := range specs {
			skey := key + "\x00" + spec.Pool
			live[skey] = true
			firstErr = cmpErr(firstErr, p.publish(ctx, skey, ns, spec, now))
		}
	}
	for key, ps := range p.published {
		if _, ok := fleets[ps.ns+"/"+ps.fleet]; ok && live[key] {
			continue
		}
		if p.remove(ctx, ps.ns, ps.fleet, ps.pool) {
			delete(p.published, key)
		}
	}
	if now.Sub(p.lastSweep) >= leasewire.SummaryRefresh {
		p.lastSweep = now
		firstErr = cmpErr(firstErr, p.sweep(ctx, fleets, now))
	}
	return firstErr
}

// publish writes one summary if it is due: the first, a refresh, or a
// change (at most every leasewire.SummaryInterval, but the first after a
// quiet spell at once: a crawler waiting on a fleet at rest is demand
// now).
func (p *SummaryPublisher) publish(ctx context.Context, key, ns string, spec v1alpha1.LeaseSummarySpec, now time.Time) error {
	said := saying(spec)
	last, ok := p.published[key]
	changed := ok && last.said != said
	switch {
	case !ok, now.Sub(last.at) >= leasewire.SummaryRefresh:
	case !changed || now.Sub(last.changed) < leasewire.SummaryInterval:
		return nil
	}
	if err := p.write(ctx, ns, spec); err != nil {
		p.Server.Metrics.SummaryWrites.WithLabelValues("failed").Inc()
		return err
	}
	p.Server.Metrics.SummaryWrites.WithLabelValues("written").Inc()
	ps := publishedSummary{ns: ns, fleet: spec.Fleet, pool: spec.Pool, said: said, at: now, changed: last.changed}
	if changed {
		ps.changed = now
	}
	p.published[key] = ps
	return nil
}

// summarise is what this replica says of a fleet now: one summary of the
// fleet as a whole (its demand, and the proxies of no pool), and one of
// each of its pools, so that no summary grows with a pooled fleet and
// each pool is sent only its own. A leased proxy this replica's cache
// places in no pool (its cache lags its own grant) is listed in every
// summary: no pool removes it then. members are sorted by name, as
// Catalog.All gives them.
func (p *SummaryPublisher) summarise(ctx context.Context, ns, fleet string, members []catalog.Member, now time.Time) ([]v1alpha1.LeaseSummarySpec, error) {
	_, maxTTL, err := p.Server.Catalog.TTLs(ctx, ns, fleet)
	if err != nil {
		return nil, err
	}
	leased, held, err := p.Server.Leases.LeasedAndSlots(ctx, ns, fleet, maxTTL)
	if err != nil {
		return nil, err
	}
	d := p.Server.Allocator().DemandWith(ns, fleet, held)
	base := func(pool string) v1alpha1.LeaseSummarySpec {
		return v1alpha1.LeaseSummarySpec{
			Fleet: fleet, Pool: pool, Replica: p.Replica,
			ObservedAt: metav1.MicroTime{Time: now}, ValidUntil: metav1.MicroTime{Time: now.Add(leasewire.SummaryFreshness)},
		}
	}
	whole := base("")
	leasedProxies := clamp32(len(leased)) // one entry per proxy
	whole.Demand = v1alpha1.LeaseDemand{Held: clamp32(d.Held), Waiting: clamp32(d.Waiting), Refused: clamp32(d.Refused), LeasedProxies: &leasedProxies}
	pools := map[string]*v1alpha1.LeaseSummarySpec{}
	for _, m := range members {
		spec := &whole
		if m.Pool != "" {
			if pools[m.Pool] == nil {
				s := base(m.Pool)
				pools[m.Pool] = &s
			}
			spec = pools[m.Pool]
		}
		if !m.DrainSince.IsZero() {
			spec.Draining = append(spec.Draining, v1alpha1.DrainingProxy{Name: m.Name, Since: m.DrainSince.Unix()})
		}
	}
	for _, l := range leased {
		// members are sorted by name (Catalog.All): a fleet at rest is
		// not made into a map of its 10 000 names each second.
		m := catalog.MemberNamed(members, l.Name)
		known, pool := m != nil, ""
		if known {
			pool = m.Pool
		}
		switch {
		case !known:
			whole.Leased = append(whole.Leased, l)
			for _, s := range pools {
				s.Leased = append(s.Leased, l)
			}
		case pool == "":
			whole.Leased = append(whole.Leased, l)
		default:
			pools[pool].Leased = append(pools[pool].Leased, l)
		}
	}
	if err := p.burned(ctx, ns, fleet, members, &whole, now); err != nil {
		return nil, err
	}
	out := []v1alpha1.LeaseSummarySpec{whole}
	for _, s := range pools {
		out = append(out, *s)
	}
	for i := range out {
		slices.SortFunc(out[i].Draining, func(a, b v1alpha1.DrainingProxy) int { return strings.Compare(a.Name, b.Name) })
	}
	return out, nil
}

// burned lists, in the summary of the fleet as a whole, the members
// whose egress IP the fleet's spec.recycling judges burned by its ban
// history (at most maxBurnedListed): what the fleet recycles. A pooled
// fleet names each pool's to it; a pool's own summary lists none, so
// that a ban composes the fleet, not every pool.
func (p *SummaryPublisher) burned(ctx context.Context, ns, fleet string, members []catalog.Member, whole *v1alpha1.LeaseSummarySpec, now time.Time) error {
	pol, err := p.Server.Catalog.Policy(ctx, ns, fleet)
	if err != nil || pol.Recycling == nil {
		return err
	}
	hist, err := p.Server.Leases.IPHistories(ctx, ns, fleet)
	if err != nil || len(hist) == 0 {
		return err
	}
	for _, m := range members {
		h := hist[m.CanonicalIP()]
		if len(h) == 0 || !m.DrainSince.IsZero() {
			continue
		}
		bans := make([]egressip.Ban, len(h))
		for i, b := range h {
			bans[i] = egressip.Ban{Domain: b.Domain, At: time.Unix(b.At, 0)}
		}
		if ok, why := pol.Recycling.Burned(bans, now); ok && len(whole.Burned) < maxBurnedListed {
			whole.Burned = append(whole.Burned, v1alpha1.BurnedProxy{Name: m.Name, Reason: m.EgressIP + " " + why})
		}
	}
	return nil
}

// maxBurnedListed bounds the burned proxies a summary lists: more than a
// fleet may recycle in a day (spec.recycling.maxPerHour is at most 10) and
// than a fleet without pools has proxies, few enough that the summary,
// which every busy pool of the fleet is sent too, stays small (about 50
// KB).
const maxBurnedListed = 250

// saying is what a summary says, but for its times: a change of it is
// worth a write before the refresh.
func saying(s v1alpha1.LeaseSummarySpec) string {
	var b strings.Builder
	for _, l := range s.Leased {
		b.WriteString(l.Name + "=" + strconv.Itoa(int(l.Holders)) + ",")
	}
	b.WriteString("|")
	for _, d := range s.Draining {
		b.WriteString(d.Name + "@" + strconv.FormatInt(d.Since, 10) + ",")
	}
	b.WriteString("|")
	for _, d := range s.Burned {
		b.WriteString(d.Name + ":" + d.Reason + ",")
	}
	b.WriteString("|")
	fmt.Fprintf(&b, "%d,%d,%d", s.Demand.Held, s.Demand.Waiting, s.Demand.Refused)
	if s.Demand.LeasedProxies != nil {
		fmt.Fprintf(&b, ",%d", *s.Demand.LeasedProxies)
	}
	return b.String()
}

func clamp32(n int) int32 { return int32(min(max(n, 0), 1<<30)) } //nolint:gosec // Bounded.

// write creates or updates this replica's summary of a fleet or a pool.
func (p *SummaryPublisher) write(ctx context.Context, ns string, spec v1alpha1.LeaseSummarySpec) error {
	ls := &v1alpha1.LeaseSummary{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: leasewire.PoolSummaryName(spec.Fleet, spec.Pool, p.Replica)}}
	err := p.Client.Get(ctx, client.ObjectKeyFromObject(ls), ls)
	switch {
	case kerrors.IsNotFound(err):
		ls.Labels = leasewire.SummaryLabels(spec.Fleet, spec.Pool)
		ls.Spec = spec
		return errors.Wrapf(p.Client.Create(ctx, ls), "cannot create LeaseSummary %s/%s", ns, ls.Name)
	case err != nil:
		return errors.Wrapf(err, "cannot read LeaseSummary %s/%s", ns, ls.Name)
	}
	if ls.Labels == nil {
		ls.Labels = map[string]string{}
	}
	for k, v := range leasewire.SummaryLabels(spec.Fleet, spec.Pool) {
		ls.Labels[k] = v
	}
	ls.Spec = spec
	return errors.Wrapf(p.Client.Update(ctx, ls), "cannot update LeaseSummary %s/%s", ns, ls.Name)
}

// remove deletes this replica's summary of a fleet or a pool, and says
// whether it is gone.
func (p *SummaryPublisher) remove(ctx context.Context, ns, fleet, pool string) bool {
	ls := &v1alpha1.LeaseSummary{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: leasewire.PoolSummaryName(fleet, pool, p.Replica)}}
	if err := p.Client.Delete(ctx, ls); err != nil && !kerrors.IsNotFound(err) {
		p.Log.Info("Cannot delete LeaseSummary", "namespace", ns, "name", ls.Name, "error", err)
		return false
	}
	return true
}

// sweep deletes, of any replica, the summaries of fleets that are gone
// (once older than leasewire.SummaryRefresh: a fleet just made may not be in
// this replica's cache yet) and those no replica renewed for
// leasewire.SummarySweepAfter (their replica is gone).
func (p *SummaryPublisher) sweep(ctx context.Context, fleets map[string][]catalog.Member, now time.Time) error {
	l := &v1alpha1.LeaseSummaryList{}
	if err := p.Client.List(ctx, l, client.HasLabels{fleetv1alpha1.LabelFleet}); err != nil {
		return errors.Wrap(err, "cannot list LeaseSummaries")
	}
	pools := map[string]bool{}
	for key, ms := range fleets {
		for _, m := range ms {
			if m.Pool != "" {
				pools[key+"\x00"+m.Pool] = true
			}
		}
	}
	var firstErr error
	for i := range l.Items {
		ls := &l.Items[i]
		// Another replica's summary of a fleet (or a pool) this replica's
		// cache lacks goes only once it stopped counting: this cache may
		// lag, or see fewer fleets (one started before the fleets' CRD).
		key := ls.Namespace + "/" + ls.Spec.Fleet
		_, live := fleets[key]
		if ls.Spec.Pool != "" {
			live = pools[key+"\x00"+ls.Spec.Pool]
		}
		until := leasewire.CountsUntil(&ls.Spec)
		gone := !live && now.Sub(ls.CreationTimestamp.Time) >= leasewire.SummaryRefresh && now.After(until.Add(leasewire.HoldSkew))
		abandoned := now.Sub(until) >= leasewire.SummarySweepAfter
		if ls.Spec.Replica == p.Replica || !gone && !abandoned {
			continue
		}
		err := p.Client.Delete(ctx, ls, client.Preconditions{UID: &ls.UID, ResourceVersion: &ls.ResourceVersion})
		if err != nil && !kerrors.IsNotFound(err) && !kerrors.IsConflict(err) {
			firstErr = cmpErr(firstErr, errors.Wrapf(err, "cannot delete LeaseSummary %s/%s", ls.Namespace, ls.Name))
		}
	}
	return firstErr
}

// Replicas counts, from the cache, the egress-discovery replicas whose
// LeaseSummaries of a fleet still count (leasewire.CountsUntil): the
// replicas serving it, among which its pacing is shared
// (allocator.Replicas). This replica (self, the name its summaries carry)
// always counts, before its first summary shows and while it cannot
// write one: otherwise a replica just started, which has not written the
// summaries of its thousand fleets yet, would pace at the whole rule
// beside the others. An empty self counts as one replica more than the
// summaries show only when they show none.
func Replicas(cache client.Reader, now func() time.Time, self string) func(ctx context.Context, namespace, fleet string) (int, error) {
	return func(ctx context.Context, namespace, fleet string) (int, error) {
		l := &v1alpha1.LeaseSummaryList{}
		// Read-only: a summary lists up to every leased proxy, and only
		// its replica and times are read here.
		if err := cache.List(ctx, l, client.InNamespace(namespace), client.MatchingLabels{fleetv1alpha1.LabelFleet: ownership.LabelValue(fleet)}, client.UnsafeDisableDeepCopy); err != nil {
			return 0, errors.Wrap(err, "cannot list LeaseSummaries")
		}
		at := time.Now()
		if now != nil {
			at = now()
		}
		replicas := map[string]bool{}
		if self != "" {
			replicas[self] = true
		}
		for i := range l.Items {
			s := &l.Items[i].Spec
			// The skew margin the sweep allows too: a replica whose clock
			// is behind is still counted.
			if s.Fleet == fleet && s.Replica != "" && at.Before(leasewire.CountsUntil(s).Add(leasewire.HoldSkew)) {
				replicas[s.Replica] = true
			}
		}
		return max(len(replicas), 1), nil
	}
}
