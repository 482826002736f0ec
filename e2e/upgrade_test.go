//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	discoveryv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// upgradeVersion is the version this checkout's packages are pushed at
// when the Stack, started at testbed.PreviousRelease, is upgraded to it.
const upgradeVersion = "v0.2.0"

// configurationUpgradeKeepsFleet upgrades the running product from the
// previous release (a fleet of one level, whose function read Leases) to
// this checkout, as a platform team would: the Configuration's package,
// then the Function's (the provider and egress-discovery run this
// checkout from the start: they are upgraded first). The example fleet,
// which the previous release composed, serves throughout: never fewer
// Ready proxies than its floor (3: maxUnavailable 0), every Proxy kept
// (the same object: none replaced, none removed), a crawler's lease held
// across it on a proxy that stays; and this release's function composes
// the fleet once the upgrade is done. Every later step runs on the
// upgraded product, and the last one checks that deleting its fleets
// leaves nothing.
func configurationUpgradeKeepsFleet(t *testing.T) {
	ctx := context.Background()
	const floor = 3
	kept := map[string]types.UID{}
	for _, p := range mustProxies(t, example) {
		kept[p.Name] = p.UID
	}
	if len(kept) != 3 {
		t.Fatalf("the previous release's fleet has %d Proxies, want 3", len(kept))
	}
	c := discoveryClient(t)
	g, err := c.Acquire(ctx, discoveryv1.AcquireRequest{Fleet: ns + "/" + example, Holder: "upgrade", TTL: "10m"})
	if err != nil {
		t.Fatalf("cannot lease a proxy of the previous release's fleet: %v", err)
	}
	defer func() {
		if err := c.Release(ctx, g.LeaseID); err != nil {
			t.Errorf("cannot release the lease held through the upgrade: %v", err)
		}
	}()

	sample := sampleReady(example, floor)
	changed := watchReplaced(example, kept)
	began := time.Now()
	if err := stack.Upgrade(ctx, filepath.Join(stackRoot(), "_output"), filepath.Join(stackRoot(), "bin", "function-proxyfleet"), upgradeVersion); err != nil {
		t.Fatalf("upgrading from %s: %v", testbed.PreviousRelease[:7], err)
	}
	t.Logf("Configuration and Function upgraded from %s to this checkout (%s) in %.1fs", testbed.PreviousRelease[:7], upgradeVersion, time.Since(began).Seconds())
	testbed.Eventually(t, 3*time.Minute, "this release's function composing the fleet", func() (bool, string) {
		n, err := functionRuns()
		return err == nil && n > 0, fmt.Sprintf("RunFunction calls for ProxyFleets: %d (%v)", n, err)
	})
	composed := time.Now()
	// Past the first composition, long enough for the provider to probe
	// every proxy again (interval 10s) under what this release composed.
	time.Sleep(20 * time.Second)
	waitFleet(t, example, 3, time.Minute)
	r := sample()
	gone := changed()
	t.Logf("this release composed the fleet %.1fs after the upgrade began; lowest Ready count %d over %d samples", composed.Sub(began).Seconds(), r.minReady, r.samples)
	if r.minReady < floor {
		t.Errorf("the upgrade dropped the fleet to %d Ready proxies, below its floor of %d: %v", r.minReady, floor, r.lowAt)
	}
	if len(gone) > 0 {
		t.Errorf("the upgrade replaced or removed Proxies of a fleet it must keep as it is: %v", gone)
	}
	if _, ok := kept[g.Proxy]; !ok {
		t.Errorf("the lease held through the upgrade is on %s, not a proxy of the fleet %v", g.Proxy, kept)
	}
	held := heldLeases(t, example)
	if len(held) != 1 || !strings.HasSuffix(held[0], "=upgrade") {
		t.Errorf("the lease held through the upgrade: Leases held now %v, want the one of holder upgrade", held)
	}
}

// watchReplaced samples a fleet's Proxies every 200 ms until the returned
// function is called, which lists the Proxies of kept that were missing or
// another object (another UID) at some sample, and Proxies that were not
// in kept.
func watchReplaced(fleet string, kept map[string]types.UID) func() []string {
	var mu sync.Mutex
	seen := map[string]bool{}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			ps, err := proxies(fleet)
			if err != nil {
				continue
			}
			now := map[string]types.UID{}
			for _, p := range ps {
				now[p.Name] = p.UID
			}
			mu.Lock()
			for n, uid := range kept {
				switch got, ok := now[n]; {
				case !ok:
					seen[n+" removed"] = true
				case got != uid:
					seen[n+" replaced"] = true
				}
			}
			for n := range now {
				if _, ok := kept[n]; !ok {
					seen[n+" added"] = true
				}
			}
			mu.Unlock()
		}
	}()
	return func() []string {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		out := make([]string, 0, len(seen))
		for s := range seen {
			out = append(out, s)
		}
		sort.Strings(out)
		return out
	}
}

// functionRuns is how many times the newest function process composed a
// ProxyFleet, from its own metrics.
func functionRuns() (int, error) {
	url, err := stack.MetricsURL("function-proxyfleet")
	if err != nil {
		return 0, err
	}
	resp, err := http.Get(url) //nolint:gosec,noctx // The stack's own loopback endpoint.
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close() //nolint:errcheck // Read only.
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), `function_proxyfleet_run_seconds_count{kind="ProxyFleet"} `); ok {
			n, err := strconv.ParseFloat(v, 64)
			return int(n), err
		}
	}
	return 0, sc.Err()
}
