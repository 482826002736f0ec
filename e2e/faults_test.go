//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	discoveryv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/local"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// crashLoopFor is how long the crash loop and the black hole last.
const crashLoopFor = time.Minute

// propagation is how long a Proxy's Ready=False may take to reach
// discovery's cache: a grant of the proxy within it is not a fault.
const propagation = time.Second

// crashLoopAndBlackHole kills one proxy's Squid every 2 s for a minute
// (a crash loop) while another's is stopped (SIGSTOP: connections are
// accepted and never answered, a black hole), and crawlers lease from the
// fleet all along. Both are reported, neither is handed out once reported,
// the crash-looping Squid's restarts back off, and the provider stays
// responsive: another fleet scales up within its goal meanwhile. Then
// both heal.
func crashLoopAndBlackHole(t *testing.T) {
	ps, err := proxies(rotor)
	if err != nil || len(ps) < 3 {
		t.Fatalf("want 3 proxies of %s: %d, %v", rotor, len(ps), err)
	}
	looper, hole := ps[0], ps[1]
	holePid := squidOf(&hole)
	if holePid == 0 {
		t.Fatalf("no Squid runs for %s", hole.Name)
	}
	if err := syscall.Kill(holePid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			_ = syscall.Kill(holePid, syscall.SIGCONT)
			resumed = true
		}
	}
	defer resume()
	start := time.Now()

	var mu sync.Mutex
	// When each victim was first seen held out: the black hole not Ready,
	// the looper crash-looping. Grants after that are faults.
	heldOut := map[string]time.Time{}
	grants := map[string][]time.Time{}
	var refused, failed, restarts int
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { // the crash loop
		defer wg.Done()
		seen := map[int]bool{}
		tick := time.NewTicker(2 * time.Second)
		defer tick.Stop()
		for {
			if pid := squidOf(&looper); pid > 0 {
				seen[pid] = true
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			select {
			case <-stop:
				mu.Lock()
				restarts = len(seen) - 1
				mu.Unlock()
				return
			case <-tick.C:
			}
		}
	}()
	go func() { // the watcher
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			now := time.Now()
			cur, err := proxies(rotor)
			if err != nil {
				continue
			}
			mu.Lock()
			for i := range cur {
				p := &cur[i]
				c := p.GetCondition("Ready")
				out := (p.Name == hole.Name && !isReady(p)) || (p.Name == looper.Name && c.Reason == proxy.ReasonCrashLoopBackOff)
				if _, seen := heldOut[p.Name]; out && !seen {
					heldOut[p.Name] = now
				}
			}
			mu.Unlock()
		}
	}()
	go func() { // the crawlers
		defer wg.Done()
		c := discoveryClient(t)
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			l, err := c.Acquire(ctx, discoveryv1.AcquireRequest{Fleet: ns + "/" + rotor, Holder: "e2e-faults", TTL: "30s"})
			at := time.Now()
			if err != nil {
				mu.Lock()
				if strings.Contains(err.Error(), "503") || strings.Contains(err.Error(), "429") {
					refused++
				} else {
					failed++
				}
				mu.Unlock()
				cancel()
				continue
			}
			mu.Lock()
			grants[l.Proxy] = append(grants[l.Proxy], at)
			mu.Unlock()
			_ = c.Release(ctx, l.LeaseID)
			cancel()
		}
	}()

	// The provider answers other work meanwhile.
	time.Sleep(10 * time.Second)
	up := time.Now()
	setReplicas(t, example, 4)
	waitFleet(t, example, 4, 40*time.Second)
	scaled := time.Since(up)
	setReplicas(t, example, 3)
	waitFleet(t, example, 3, 40*time.Second)
	t.Logf("during the faults, fleet %s scaled 3 -> 4 Ready in %.1fs (goal <= 20s)", example, scaled.Seconds())
	if scaled > 20*time.Second {
		t.Errorf("with a crash loop and a black hole in another fleet, scaling %s took %s; the goal is 20s", example, scaled.Round(100*time.Millisecond))
	}

	if left := crashLoopFor - time.Since(start); left > 0 {
		time.Sleep(left)
	}
	close(stop)
	wg.Wait()
	resume()

	mu.Lock()
	defer mu.Unlock()
	total := 0
	for _, gs := range grants {
		total += len(gs)
	}
	t.Logf("in %s: %d grants %v, %d refused (admission), %d failed; held out after %v; the looper's Squid restarted %d times",
		crashLoopFor, total, counts(grants), refused, failed, since(heldOut, start), restarts)
	for _, v := range []string{hole.Name, looper.Name} {
		at, ok := heldOut[v]
		if !ok {
			t.Errorf("%s was never held out of service", v)
			continue
		}
		for _, g := range grants[v] {
			if g.After(at.Add(propagation)) {
				t.Errorf("%s was handed out at %s, %.1fs after it was held out", v, g.Format(time.RFC3339Nano), g.Sub(at).Seconds())
			}
		}
	}
	if total == 0 || failed > 0 {
		t.Errorf("the crawlers must keep leasing the healthy proxy: %d grants, %d failures", total, failed)
	}
	// Killed every 2s with a restart delay of 6s, doubling: 6, 12, 24s,
	// so at most 4 restarts in a minute; without back-off 7 or 8.
	if restarts > 4 {
		t.Errorf("the crash-looping Squid restarted %d times in %s: its restarts must back off", restarts, crashLoopFor)
	}
	if st, err := fleetState(rotor); err != nil || !strings.Contains(st.message, looper.Name) {
		t.Errorf("the fleet's status must name the crash-looping %s: %+v, %v", looper.Name, st, err)
	}

	healed := time.Now()
	// The looper serves again once a Squid has stayed up for a minute.
	names := waitFleet(t, rotor, 3, 4*time.Minute)
	t.Logf("both healed %.1fs after the faults ended; proxies %v", time.Since(healed).Seconds(), names)
}

// squidOf returns the pid of the Squid running p's config; 0 if none.
func squidOf(p *v1alpha1.Proxy) int {
	conf := instanceDir(p) + "/squid.conf"
	for _, pid := range local.Processes(stack.SquidDir) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(b), conf) {
			return pid
		}
	}
	return 0
}

func counts(m map[string][]time.Time) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		out[k] = len(v)
	}
	return out
}

func since(m map[string]time.Time, start time.Time) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = fmt.Sprintf("%.1fs", v.Sub(start).Seconds())
	}
	return out
}

// controlPlaneRestarts crashes etcd and kube-apiserver in the steady state
// (SIGKILL) and starts them again as they were, etcd after 5 s down: the
// fleets recover with the same Proxies, none replaced because of the
// outage, and crawlers lease again.
func controlPlaneRestarts(t *testing.T) {
	// Each Proxy, and the instance it runs on: neither may be replaced.
	instances := func() map[string]string {
		out := map[string]string{}
		for _, f := range []string{example, rotor} {
			ps, err := proxies(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range ps {
				ap := p.Status.AtProvider
				out[p.Name] = fmt.Sprintf("%s %s %v", p.UID, ap.ProviderID, ap.InstanceCreatedAt)
			}
		}
		return out
	}
	for _, f := range []string{example, rotor} {
		waitFleet(t, f, 3, time.Minute)
	}
	before := instances()
	crashed := time.Now()
	if err := testbed.RestartChild("etcd", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := testbed.RestartChild("kube-apiserver", 0); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 2*time.Minute, "the apiserver serving again", func() (bool, string) {
		for _, name := range []string{"etcd", "kube-apiserver"} {
			if ended, how := testbed.RestartedEnded(name); ended {
				t.Fatal(how)
			}
		}
		_, err := proxies(example)
		return err == nil, fmt.Sprint(err)
	})
	back := time.Now()
	t.Logf("etcd and kube-apiserver crashed and restarted: serving again %.1fs later", back.Sub(crashed).Seconds())
	for _, f := range []string{example, rotor} {
		waitFleet(t, f, 3, 3*time.Minute)
	}
	t.Logf("both fleets Ready with 3 healthy proxies %.1fs after the apiserver came back", time.Since(back).Seconds())
	if after := instances(); !maps.Equal(before, after) {
		t.Errorf("the outage replaced Proxies or their instances: before %v, after %v", before, after)
	}
	c := discoveryClient(t)
	testbed.Eventually(t, time.Minute, "a crawler leasing again", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l, err := c.Acquire(ctx, discoveryv1.AcquireRequest{Fleet: ns + "/" + example, Holder: "e2e-restart", TTL: "30s"})
		if err != nil {
			return false, err.Error()
		}
		_ = c.Release(ctx, l.LeaseID)
		return true, ""
	})
	t.Logf("leasing again %.1fs after the apiserver came back", time.Since(back).Seconds())
}
