package lease

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
)

// ownWriteMemory is how long this replica counts a slot it wrote itself,
// whatever its cache says: past it, the cache has seen the write.
const ownWriteMemory = 30 * time.Second

// ownWrites are the slots this replica wrote lately, which its cache may
// not show yet.
type ownWrites struct {
	mu    sync.Mutex
	slots map[string]ownWrite // namespace/name
}

type ownWrite struct {
	namespace, fleet, proxy string
	renew                   time.Time
	ttl                     time.Duration
	at                      time.Time
}

func (w *ownWrites) note(l *coordv1.Lease, now time.Time) {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil || l.Labels[fleetv1alpha1.LabelLeaseKind] != fleetv1alpha1.LeaseKindSlot {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.slots == nil {
		w.slots = map[string]ownWrite{}
	}
	w.slots[l.Namespace+"/"+l.Name] = ownWrite{
		namespace: l.Namespace, fleet: fleetv1alpha1.FleetName(l), proxy: fleetv1alpha1.ProxyName(l),
		renew: l.Spec.RenewTime.Time, ttl: time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second, at: now,
	}
}

func (w *ownWrites) drop(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.slots, key)
}

// of returns the slots of a fleet written within ownWriteMemory of now,
// by namespace/name, forgetting older ones.
func (w *ownWrites) of(namespace, fleet string, now time.Time) map[string]ownWrite {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]ownWrite{}
	for k, o := range w.slots {
		switch {
		case now.Sub(o.at) >= ownWriteMemory || o.at.After(now):
			delete(w.slots, k)
		case o.namespace == namespace && o.fleet == fleet:
			out[k] = o
		}
	}
	return out
}

// takes counts, per proxy, the takes of its slots in flight.
type takes struct {
	mu sync.Mutex
	n  map[[3]string]int // namespace, fleet, proxy
}

// begin counts a take in flight until the returned func is called.
func (t *takes) begin(namespace, fleet, proxy string) func() {
	k := [3]string{namespace, fleet, proxy}
	t.mu.Lock()
	if t.n == nil {
		t.n = map[[3]string]int{}
	}
	t.n[k]++
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.n[k]--; t.n[k] <= 0 {
			delete(t.n, k)
		}
	}
}

// of returns the proxies of a fleet with a take in flight.
func (t *takes) of(namespace, fleet string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for k := range t.n {
		if k[0] == namespace && k[1] == fleet {
			out = append(out, k[2])
		}
	}
	return out
}

// Leased returns the proxies of a fleet crawlers hold leases on, sorted by
// name, each with how many and until when they may be held without a
// renewal this replica would see: its cache's slots, the slots it wrote
// itself lately, which its cache may not show yet, and the proxies it is
// taking a slot of now. maxTTL is the fleet's.
func (s *Store) Leased(ctx context.Context, namespace, fleet string, maxTTL time.Duration) ([]v1alpha1.LeasedProxy, error) {
	leased, _, err := s.LeasedAndSlots(ctx, namespace, fleet, maxTTL)
	return leased, err
}

// LeasedAndSlots is Leased, with how many live slots the cache shows (the
// leases held, as Slots counts them), from the same read.
func (s *Store) LeasedAndSlots(ctx context.Context, namespace, fleet string, maxTTL time.Duration) ([]v1alpha1.LeasedProxy, int, error) {
	// Takes in flight first: one that ends before the cache and this
	// replica's own writes are read is among the writes by then, and one
	// that begins after re-checks the proxy against a cache at least as
	// new as what the caller summarises.
	taking := s.taking.of(namespace, fleet)
	slots, err := s.Slots(ctx, namespace, fleet)
	if err != nil {
		return nil, 0, err
	}
	live := 0
	// holders counts a proxy's holders: its slots the cache shows, the
	// slots this replica wrote that are not among them, and one for takes
	// in flight. No key is made of each of a fleet's 10 000 slots at
	// every summary: only the few own writes are compared with them.
	type held struct {
		holders int
		until   time.Time
	}
	by := map[string]*held{}
	add := func(proxy string, holders int, renew time.Time, ttl time.Duration) {
		h := by[proxy]
		if h == nil {
			h = &held{}
			by[proxy] = h
		}
		h.holders += holders
		if until := renew.Add(min(ttl, maxTTL)).Add(leasewire.HoldSkew); until.After(h.until) {
			h.until = until
		}
	}
	for proxy, ls := range slots {
		live += len(ls)
		for _, l := range ls {
			add(proxy, 1, l.Spec.RenewTime.Time, leaseTTL(l))
		}
	}
	now := s.Now()
	for key, o := range s.written.of(namespace, fleet, now) {
		holders := 1
		if slices.ContainsFunc(slots[o.proxy], func(l *coordv1.Lease) bool { return l.Namespace+"/"+l.Name == key }) {
			holders = 0 // the cache shows it: counted once
		}
		add(o.proxy, holders, o.renew, o.ttl)
	}
	for _, proxy := range taking {
		// Held, if the take succeeds, for at most maxTTL from now.
		add(proxy, 1, now, maxTTL)
	}
	out := make([]v1alpha1.LeasedProxy, 0, len(by))
	for proxy, h := range by {
		out = append(out, v1alpha1.LeasedProxy{Name: proxy, Holders: int32(min(h.holders, 1<<30)), HeldUntil: metav1.MicroTime{Time: h.until}}) //nolint:gosec // Bounded above.
	}
	slices.SortFunc(out, func(a, b v1alpha1.LeasedProxy) int { return strings.Compare(a.Name, b.Name) })
	return out, live, nil
}
