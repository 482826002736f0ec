package lease_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease/leasetest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// holds runs crawlers against replicas for d. Each crawler holds each
// lease for real, 10-200 ms: it releases it, or renews it once and
// releases it, or abandons it, so that it expires and is taken over. The
// log records each hold from the moment the grant was answered to the
// moment the crawler let go: before it asked to release, or, abandoned,
// when its own clock, started before it asked, says the TTL is over; so a
// recorded hold lies within the real one, and any overlap is real.
func holds(t *testing.T, replicas []*lease.Store, ns string, crawlers, proxies, maxLeases int, d time.Duration) (log []leasetest.Grant, takenOver int) {
	t.Helper()
	ctx := context.Background()
	names := make([]string, proxies)
	for i := range names {
		names[i] = fmt.Sprintf("p%02d", i)
	}
	const ttl = time.Second
	var mu sync.Mutex
	abandoned := map[string]bool{} // slot whose last hold was abandoned
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for w := range crawlers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			who := fmt.Sprintf("crawler-%d", w)
			for time.Now().Before(end) {
				s := replicas[rand.IntN(len(replicas))]
				order := append([]string(nil), names...)
				rand.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
				asked := time.Now()
				g, err := s.Acquire(ctx, cands(ns, maxLeases, order...), lease.Request{Identity: who, Holder: who, TTL: ttl})
				if errors.Is(err, lease.ErrUnavailable) {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				if err != nil {
					t.Errorf("acquire: %v", err)
					return
				}
				h := leasetest.Grant{Proxy: g.Proxy, Slot: lease.SlotName(g.Proxy, g.Slot), Holder: who, Granted: time.Now(), UID: g.ID}
				until := asked.Add(g.TTL)
				hold := time.Duration(10+rand.IntN(190)) * time.Millisecond
				mode := rand.IntN(3)
				mu.Lock()
				if abandoned[h.Slot] {
					takenOver++
				}
				abandoned[h.Slot] = mode == 0
				mu.Unlock()
				switch mode {
				case 0:
					h.Released = until
				case 1:
					time.Sleep(hold / 2)
					renewAsked := time.Now()
					if _, err := replicas[rand.IntN(len(replicas))].Renew(ctx, g.ID, who, ttl); err == nil {
						until = renewAsked.Add(ttl)
					}
					time.Sleep(hold / 2)
					h.Released = minTime(time.Now(), until)
					_ = s.Release(ctx, g.ID, who)
				default:
					time.Sleep(hold)
					h.Released = minTime(time.Now(), until)
					_ = s.Release(ctx, g.ID, who)
				}
				mu.Lock()
				log = append(log, h)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return log, takenOver
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// replicas makes n stores, each with its own cache, as n discovery
// replicas; mutate breaks each, for the mutation test.
func replicas(t *testing.T, ns string, n int, mutate func(*lease.Store)) []*lease.Store {
	t.Helper()
	bed := sharedBed.Env(t)
	out := make([]*lease.Store, n)
	for i := range out {
		c, ca := bed.Replica(t, ns, &coordv1.Lease{})
		out[i] = lease.NewStore(lease.StoreConfig{Client: c, Cache: ca})
		lease.SetExpiryMargin(out[i], 100*time.Millisecond)
		if mutate != nil {
			mutate(out[i])
		}
	}
	return out
}

// TestExclusiveUnderTakeovers: 4 replicas and 32 crawlers on 8 proxies
// (maxLeases 2), with real holds, renewals and leases left to expire and
// be taken over: no slot is ever held twice, nor a proxy by more than 2.
func TestExclusiveUnderTakeovers(t *testing.T) {
	ns := sharedBed.Env(t).Namespace(t)
	log, takenOver := holds(t, replicas(t, ns, 4, nil), ns, 32, 8, 2, 8*time.Second)
	t.Logf("%d holds, %d expired slots taken over", len(log), takenOver)
	if takenOver < 10 {
		t.Fatalf("only %d expired slots were taken over: the takeover path was not exercised", takenOver)
	}
	leasetest.CheckExclusive(t, log, 2)
}

// TestCheckerCatchesUnguardedTakeover is the checker's mutation test: the
// same run against a broken store, which takes expired slots over without
// the UID and resourceVersion preconditions, must be caught
// double-granting. A checker that passes it has no power.
//
// Whether the broken store's unguarded window is hit in a run depends on
// how the replicas interleave: with every test package running at once
// under the race detector on two cores, one CI run had none in 8 s. So
// up to three runs, each in a namespace of its own; the checker must catch
// one of them.
func TestCheckerCatchesUnguardedTakeover(t *testing.T) {
	for attempt := 1; attempt <= 3; attempt++ {
		ns := sharedBed.Env(t).Namespace(t)
		broken := replicas(t, ns, 4, func(s *lease.Store) { lease.Unguarded(s, 20*time.Millisecond) })
		log, takenOver := holds(t, broken, ns, 32, 8, 2, 8*time.Second)
		msg := testbed.Failure(func(t testing.TB) { leasetest.CheckExclusive(t, log, 2) })
		t.Logf("broken store, run %d: %d holds, %d takeovers; the checker says: %s", attempt, len(log), takenOver, msg)
		if msg != "" {
			return
		}
	}
	t.Fatal("the checker passed a store that takes slots over without preconditions, three runs: it cannot catch a double grant")
}
