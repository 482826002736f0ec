// Package leasetest checks, from a log of grants, that leases were
// exclusive: no slot ever had two holders and no proxy more than maxLeases.
//
// One file: leasetest.go, the grant log and its checks.
package leasetest

import (
	"context"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// Grant is one line of a grant log. Granted is taken after the grant was
// answered and Released before the release was asked for, so the recorded
// interval lies inside the real one and any overlap is a real overlap.
type Grant struct {
	Proxy, Slot, Holder string
	Granted, Released   time.Time
	// UID is the grant's Lease object UID, when known: holds of one UID
	// are one grant, never a double one.
	UID string
}

// CheckExclusive fails t when the log shows a slot held twice at once or a
// proxy held by more than maxLeases crawlers at once.
func CheckExclusive(t testing.TB, log []Grant, maxLeases int) {
	t.Helper()
	bySlot, byProxy := map[string][]Grant{}, map[string][]Grant{}
	for _, g := range log {
		bySlot[g.Proxy+"/"+g.Slot] = append(bySlot[g.Proxy+"/"+g.Slot], g)
		byProxy[g.Proxy] = append(byProxy[g.Proxy], g)
	}
	for k, gs := range bySlot {
		sort.Slice(gs, func(i, j int) bool { return gs[i].Granted.Before(gs[j].Granted) })
		// Against the hold that lasts longest of those before, not just
		// the one before: a short hold between must not hide an overlap.
		last := gs[0]
		for _, g := range gs[1:] {
			if g.Granted.Before(last.Released) && (g.UID == "" || g.UID != last.UID) {
				t.Fatalf("slot %s double-granted: %s held it until %s, %s got it at %s", k, last.Holder, last.Released, g.Holder, g.Granted)
			}
			if g.Released.After(last.Released) {
				last = g
			}
		}
	}
	type edge struct {
		at    time.Time
		delta int
	}
	for p, gs := range byProxy {
		edges := make([]edge, 0, 2*len(gs))
		for _, g := range gs {
			edges = append(edges, edge{g.Granted, 1}, edge{g.Released, -1})
		}
		sort.Slice(edges, func(i, j int) bool {
			if edges[i].at.Equal(edges[j].at) {
				return edges[i].delta < edges[j].delta
			}
			return edges[i].at.Before(edges[j].at)
		})
		live := 0
		for _, e := range edges {
			if live += e.delta; live > maxLeases {
				t.Fatalf("proxy %s had %d live holders at %s per the grant log", p, live, e.at)
			}
		}
	}
}

// WatchHolders polls the Lease objects of namespace until the returned stop
// is called, which returns the most live holders ever seen on one proxy:
// the check from the API objects, beside the one from the grant log.
func WatchHolders(ctx context.Context, c client.Reader, namespace string) (stop func() int64) {
	var maxSeen atomic.Int64
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			default:
			}
			l := &coordv1.LeaseList{}
			if c.List(ctx, l, client.InNamespace(namespace), client.MatchingLabels{fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindSlot}) == nil {
				per := map[string]int64{}
				for i := range l.Items {
					if !lease.Expired(&l.Items[i], time.Now()) {
						per[fleetv1alpha1.ProxyName(&l.Items[i])]++
					}
				}
				for _, n := range per {
					for cur := maxSeen.Load(); n > cur && !maxSeen.CompareAndSwap(cur, n); cur = maxSeen.Load() {
					}
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return func() int64 {
		close(done)
		<-stopped
		return maxSeen.Load()
	}
}
