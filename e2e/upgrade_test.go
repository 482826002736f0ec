//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
// then the Function's. The provider and egress-discovery run this checkout
// throughout, as if upgraded first (docs/sizing.md advises discovery
// first). The example fleet, which the previous release composed, serves
// throughout: sampled every 200 ms, it never has fewer Ready proxies than
// its floor (3: maxUnavailable 0) and is never unReady itself; every Proxy
// is kept (the same object) with the same Squid process and egress IP; a
// crawler's lease held across it stays on its proxy; and this release's
// function composes the fleet once the upgrade is done (status.egress,
// which only this release writes, appears, and the fleet is Synced). Every
// later step runs on the upgraded product, and the last one checks that
// deleting its fleets leaves nothing.
func configurationUpgradeKeepsFleet(t *testing.T) {
	ctx := context.Background()
	const floor = 3
	kept, ips := map[string]types.UID{}, map[string]string{}
	for _, p := range mustProxies(t, example) {
		kept[p.Name], ips[p.Name] = p.UID, p.Status.AtProvider.EgressIP
	}
	if len(kept) != 3 {
		t.Fatalf("the previous release's fleet has %d Proxies, want 3", len(kept))
	}
	if u := fleetObject(example); !getFleet(t, u) {
		t.Fatal("the previous release's fleet is gone")
	} else if egress, ok, _ := unstructured.NestedFieldNoCopy(u.Object, "status", "egress"); ok || egress != nil {
		t.Fatal("the previous release's fleet has status.egress, which only this release writes: the check below could not tell the releases apart")
	}
	pids := squidPids(t, example)
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

	watched := watchUpgrade(example, kept)
	began := time.Now()
	if err := stack.Upgrade(ctx, filepath.Join(stackRoot(), "_output"), filepath.Join(stackRoot(), "bin", "function-proxyfleet"), upgradeVersion); err != nil {
		t.Fatalf("upgrading from %s: %v", testbed.PreviousRelease[:7], err)
	}
	t.Logf("Configuration and Function upgraded from %s to this checkout (%s) in %.1fs", testbed.PreviousRelease[:7], upgradeVersion, time.Since(began).Seconds())
	testbed.Eventually(t, 3*time.Minute, "this release's function composing the fleet: status.egress written, Synced", func() (bool, string) {
		u := fleetObject(example)
		if !getFleet(t, u) {
			return false, "no fleet"
		}
		egress, _, _ := unstructured.NestedMap(u.Object, "status", "egress")
		synced := ""
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			if m, _ := c.(map[string]any); m["type"] == "Synced" {
				synced = fmt.Sprintf("%v %v %v", m["status"], m["reason"], m["message"])
			}
		}
		return egress != nil && strings.HasPrefix(synced, "True"), fmt.Sprintf("status.egress %v; Synced %s", egress, synced)
	})
	composed := time.Now()
	// Past the first composition, long enough for the provider to probe
	// every proxy again (interval 10s) under what this release composed.
	time.Sleep(20 * time.Second)
	waitFleet(t, example, 3, time.Minute)
	w := watched()
	t.Logf("this release composed the fleet %.1fs after the upgrade began; lowest Ready count %d, fleet unReady in %d, over %d samples (%d failed reads, longest gap %s)",
		composed.Sub(began).Seconds(), w.minReady, w.unreadyXR, w.samples, w.failed, w.gap.Round(time.Millisecond))
	if w.samples < 50 || w.gap > 5*time.Second {
		t.Errorf("the upgrade was watched %d times with a longest gap of %s: too blind to vouch for the floor", w.samples, w.gap)
	}
	if w.minReady < floor {
		t.Errorf("the upgrade dropped the fleet to %d Ready proxies, below its floor of %d: %v", w.minReady, floor, w.lowAt)
	}
	if w.unreadyXR > 0 {
		t.Errorf("the fleet itself was not Ready in %d samples of the upgrade", w.unreadyXR)
	}
	if len(w.changed) > 0 {
		t.Errorf("the upgrade replaced, removed or added Proxies of a fleet it must keep as it is: %v", w.changed)
	}
	if now := squidPids(t, example); fmt.Sprint(now) != fmt.Sprint(pids) {
		t.Errorf("the upgrade restarted Squids behind the fleet's Proxies: pids before %v, after %v", pids, now)
	}
	for _, p := range mustProxies(t, example) {
		if p.Status.AtProvider.EgressIP != ips[p.Name] {
			t.Errorf("%s left from %s before the upgrade and from %s after", p.Name, ips[p.Name], p.Status.AtProvider.EgressIP)
		}
	}
	held := heldLeases(t, example)
	if len(held) != 1 || !strings.HasPrefix(held[0], g.Proxy+"-slot-") || !strings.HasSuffix(held[0], "=upgrade") {
		t.Errorf("the lease held through the upgrade, on %s: Leases held now %v", g.Proxy, held)
	}
}

// getFleet reads the example namespace's fleet into u, reporting whether
// it exists.
func getFleet(t *testing.T, u *unstructured.Unstructured) bool {
	t.Helper()
	err := stack.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: u.GetName()}, u)
	if err != nil && !kerrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// upgradeWatch is what watchUpgrade saw.
type upgradeWatch struct {
	readySamples
	// failed counts samples whose reads failed, gap is the longest time
	// between two good samples.
	failed int
	gap    time.Duration
	// changed lists Proxies of kept missing or another object (another
	// UID) at some sample, and Proxies not in kept.
	changed []string
}

// watchUpgrade samples a fleet and its Proxies every 200 ms until the
// returned function is called.
func watchUpgrade(fleet string, kept map[string]types.UID) func() upgradeWatch {
	var w upgradeWatch
	w.minReady = len(kept)
	seen := map[string]bool{}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		last := time.Now()
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			st, ps, err := observe(fleet)
			if err != nil {
				w.failed++
				continue
			}
			w.gap = max(w.gap, time.Since(last))
			last = time.Now()
			w.samples++
			if !st.ready {
				w.unreadyXR++
			}
			now := map[string]types.UID{}
			ready := 0
			var at []string
			for _, p := range ps {
				now[p.Name] = p.UID
				if isReady(&p) {
					ready++
				}
				at = append(at, fmt.Sprintf("%s(ready=%t)", p.Name, isReady(&p)))
			}
			if ready < w.minReady {
				w.minReady, w.lowAt = ready, at
			}
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
		}
	}()
	return func() upgradeWatch {
		close(stop)
		<-done // the sampler has stopped writing w
		for s := range seen {
			w.changed = append(w.changed, s)
		}
		sort.Strings(w.changed)
		return w
	}
}
