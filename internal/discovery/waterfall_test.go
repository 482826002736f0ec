package discovery_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease/leasetest"
)

// TestWaterfall is the waterfall scenario: a fleet of 5 proxies (2 leases
// each) loses 3 of them while 20 crawlers, each with its own identity and
// a quota of 1, lease in a loop. The survivors never get more than
// maxLeases holders; below the fleet's minHealthyFraction (0.6) nothing
// new is granted, rather than piling every crawler onto the 2 survivors;
// the acquisitions wait (maxWait 20s) and, as the proxies return, are
// served in the order they came. The waits are logged for BENCHMARKS.md.
func TestWaterfall(t *testing.T) {
	const (
		crawlers  = 20
		proxies   = 5
		maxLeases = 2
		lost      = 3
	)
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "crawlers", proxies, maxLeases, nil)
	fleetXR(t, ns, "crawlers", proxies, map[string]any{
		"maxLeasesPerProxy": int64(maxLeases),
		"admission":         map[string]any{"minHealthyFraction": 0.6, "maxWait": "20s"},
		"quotas":            map[string]any{"maxLeasesPerIdentity": int64(1)},
	})
	var tokens strings.Builder
	for i := range crawlers {
		fmt.Fprintf(&tokens, "token-%d %s crawler-%d\n", i, ns, i)
	}
	srv := replicaServer(t, ns, tokens.String())
	ctx := context.Background()

	type acquisition struct {
		holder          string
		asked, answered time.Time
		proxy           string
	}
	var (
		mu   sync.Mutex
		log  []leasetest.Grant
		acqs []acquisition
		wg   sync.WaitGroup
	)
	watch := leasetest.WatchHolders(ctx, bed.Client, ns)
	start := time.Now()
	outage, recovery, end := start.Add(2*time.Second), start.Add(7*time.Second), start.Add(12*time.Second)
	for w := range crawlers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &apiv1.Client{BaseURL: srv.URL, Token: fmt.Sprintf("token-%d", w)}
			holder := fmt.Sprintf("crawler-%d", w)
			for time.Now().Before(end) {
				asked := time.Now()
				l, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: holder, TTL: "1m"})
				if err != nil {
					t.Errorf("%s: an acquisition within maxWait of the proxies' return is granted: %v", holder, err)
					return
				}
				granted := time.Now()
				time.Sleep(time.Duration(300+17*w) * time.Millisecond)
				_, slot, _, _ := lease.ParseID(l.LeaseID)
				released := time.Now()
				if err := c.Release(ctx, l.LeaseID); err != nil {
					t.Errorf("release: %v", err)
					return
				}
				mu.Lock()
				log = append(log, leasetest.Grant{Proxy: l.Proxy, Slot: slot, Holder: holder, Granted: granted, Released: released})
				acqs = append(acqs, acquisition{holder: holder, asked: asked, answered: granted, proxy: l.Proxy})
				mu.Unlock()
			}
		}()
	}
	time.Sleep(time.Until(outage))
	for i := range lost {
		setHealthy(t, ns, fmt.Sprintf("crawlers-%d", i), false)
	}
	time.Sleep(time.Until(recovery))
	for i := range lost {
		setHealthy(t, ns, fmt.Sprintf("crawlers-%d", i), true)
	}
	wg.Wait()
	maxSeen := watch()

	leasetest.CheckExclusive(t, log, maxLeases)
	if maxSeen > maxLeases {
		t.Errorf("the API objects showed %d holders on one proxy, over maxLeases %d", maxSeen, maxLeases)
	}
	// Nothing new is granted during the outage (after a second for the
	// replica's cache to see it).
	var during, waited []acquisition
	for _, a := range acqs {
		if a.answered.After(outage.Add(time.Second)) && a.answered.Before(recovery) {
			during = append(during, a)
		}
		if a.asked.Before(recovery) && a.answered.After(recovery) {
			waited = append(waited, a)
		}
	}
	if len(during) > 0 {
		t.Errorf("%d leases were granted while 2 of 5 proxies were healthy, under minHealthyFraction 0.6: %+v", len(during), during)
	}
	if len(waited) < crawlers/2 {
		t.Fatalf("only %d acquisitions waited through the outage: the scenario did not happen", len(waited))
	}
	// Served in the order they came: no acquisition asked clearly later
	// was answered clearly earlier.
	sort.Slice(waited, func(i, j int) bool { return waited[i].asked.Before(waited[j].asked) })
	for i := range waited {
		for j := i + 1; j < len(waited); j++ {
			a, b := waited[i], waited[j]
			if b.asked.Sub(a.asked) > 100*time.Millisecond && a.answered.Sub(b.answered) > 50*time.Millisecond {
				t.Errorf("%s asked %s after %s but was granted %s before it: waiting acquisitions are served in order",
					b.holder, b.asked.Sub(a.asked).Round(time.Millisecond), a.holder, a.answered.Sub(b.answered).Round(time.Millisecond))
			}
		}
	}
	var waits, afterRecovery []time.Duration
	for _, a := range waited {
		waits = append(waits, a.answered.Sub(a.asked))
		afterRecovery = append(afterRecovery, a.answered.Sub(recovery))
	}
	sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
	sort.Slice(afterRecovery, func(i, j int) bool { return afterRecovery[i] < afterRecovery[j] })
	t.Logf("waterfall: %d crawlers, %d of %d proxies lost for 5s; %d grants, %d during the outage; %d acquisitions waited through it: wait median %s, max %s; granted after the proxies returned in median %s, at most %s; max holders on one proxy %d (maxLeases %d)",
		crawlers, lost, proxies, len(log), len(during), len(waited), waits[len(waits)/2].Round(time.Millisecond), waits[len(waits)-1].Round(time.Millisecond),
		afterRecovery[len(afterRecovery)/2].Round(time.Millisecond), afterRecovery[len(afterRecovery)-1].Round(time.Millisecond), maxSeen, maxLeases)
}
