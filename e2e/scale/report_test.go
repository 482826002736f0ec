//go:build scale

package scale

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
)

// result is what one size measured.
type result struct {
	n                 int
	pools             int
	ready             time.Duration // apply -> every proxy Ready and the fleet Ready
	window            time.Duration
	requests          map[string]float64 // verb resource -> requests in the window
	proxyStatusWrites float64
	xrReconciles      float64
	xrReconcileP99    map[string]float64 // "fleet" or "pool" -> seconds
	// timing says where an XR reconcile's time goes: per level its
	// reconciles in the window and their mean and p99, and the
	// apiserver's own latency for the applies a reconcile makes.
	timing                    map[string]timing
	runP99                    map[string]float64
	largest                   map[string]float64 // kind direction -> bytes
	cpu                       map[string]float64 // component -> cores over the window
	rss                       map[string]float64 // component -> bytes at the end
	breakerOpen               []string
	opensBringUp, opensSteady float64 // circuit_breaker_opens_total from apply to the window, and in it
	// fillP99 is the p99 of taking the held leases (n of them, all at
	// once); acquireP99 that of the same 200 acquisitions at every size,
	// made once they are held and the fleet is steady.
	fillP99, acquireP99, gatewayP99 time.Duration
	rollout                         string
	changed                         map[string]int // what the Proxies' updates in the window changed
	deleted                         time.Duration
}

func (r result) perProxyPerMinute() float64 {
	var total float64
	for _, v := range r.requests {
		total += v
	}
	return total / float64(r.n) / r.window.Minutes()
}

// report writes the table BENCHMARKS.md quotes and checks the goals that
// compare sizes.
func (e *env) report(t *testing.T, rows []result, interval, steady time.Duration) {
	if len(rows) == 0 {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "make scale, %s: probe interval %s, steady window %s; Crossplane's circuit breaker at devenv's burst 1000, refill 10/s; p99s interpolated within histogram buckets; the largest messages are the largest since the function started (sizes run in ascending order)\n\n",
		time.Now().UTC().Format("2006-01-02"), interval, steady)
	fmt.Fprintln(&b, "| proxies | pools | apply -> Ready | API requests / proxy / min | Proxy status writes / proxy / h | XR reconciles / min | XR reconcile p99 fleet / pool | RunFunction p99 fleet / pool | largest request / response fleet; pool | circuit breaker | acquire p99 API steady (filling) / gateway | rollout | delete |")
	fmt.Fprintln(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		breaker := fmt.Sprintf("opened %.0f times steady, %.0f bringing up", r.opensSteady, r.opensBringUp)
		if len(r.breakerOpen) > 0 {
			breaker += fmt.Sprintf("; %d XRs seen not Responsive", len(r.breakerOpen))
		}
		fleet, pool := "ProxyFleet ", fleetv1alpha1.ProxyPoolKind+" "
		fmt.Fprintf(&b, "| %d | %d | %.0f s | %.2f | %.2f | %.0f | %.2g / %.2g s | %.2g / %.2g s | %.0f / %.0f; %.0f / %.0f KB | %s | %s (%s) / %s | %s | %.0f s |\n",
			r.n, r.pools, r.ready.Seconds(), r.perProxyPerMinute(), r.proxyStatusWrites/float64(r.n)/r.window.Hours(),
			r.xrReconciles/r.window.Minutes(), r.xrReconcileP99["fleet"], r.xrReconcileP99["pool"], r.runP99["ProxyFleet"], r.runP99[fleetv1alpha1.ProxyPoolKind],
			r.largest[fleet+"request"]/1024, r.largest[fleet+"response"]/1024, r.largest[pool+"request"]/1024, r.largest[pool+"response"]/1024, breaker, r.acquireP99.Round(time.Millisecond), r.fillP99.Round(time.Millisecond), r.gatewayP99.Round(time.Millisecond), r.rollout, r.deleted.Seconds())
	}
	fmt.Fprint(&b, "\nWhere an XR reconcile's time goes in the steady window: reconciles by level, then the apiserver's latency for each kind of apply (count, mean, p99):\n\n")
	for _, r := range rows {
		keys := make([]string, 0, len(r.timing))
		for k := range r.timing {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var cells []string
		for _, k := range keys {
			cells = append(cells, k+" "+r.timing[k].String())
		}
		fmt.Fprintf(&b, "- %d: %s\n", r.n, strings.Join(cells, "; "))
	}
	fmt.Fprint(&b, "\nCPU (cores) and resident memory (MiB) over the steady window:\n\n")
	fmt.Fprintf(&b, "| proxies | %s |\n|---|%s\n", strings.Join(components, " | "), strings.Repeat("---|", len(components)))
	for _, r := range rows {
		var cells []string
		for _, c := range components {
			cells = append(cells, fmt.Sprintf("%.2f / %.0f", r.cpu[c], r.rss[c]/(1<<20)))
		}
		fmt.Fprintf(&b, "| %d | %s |\n", r.n, strings.Join(cells, " | "))
	}
	fmt.Fprint(&b, "\nWhat the Proxies' updates in the window changed (updates per proxy per hour):\n\n")
	for _, r := range rows {
		keys := make([]string, 0, len(r.changed))
		for k := range r.changed {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return r.changed[keys[i]] > r.changed[keys[j]] })
		var cells []string
		for _, k := range keys {
			cells = append(cells, fmt.Sprintf("%s %.2f", k, float64(r.changed[k])/float64(r.n)/r.window.Hours()))
		}
		fmt.Fprintf(&b, "- %d: %s\n", r.n, strings.Join(cells, ", "))
	}
	fmt.Fprint(&b, "\nAPI requests in the window by verb and resource, per proxy per minute (those above 0.01):\n\n")
	for _, r := range rows {
		keys := make([]string, 0, len(r.requests))
		for k, v := range r.requests {
			if v/float64(r.n)/r.window.Minutes() > 0.01 {
				keys = append(keys, k)
			}
		}
		sort.Slice(keys, func(i, j int) bool { return r.requests[keys[i]] > r.requests[keys[j]] })
		var cells []string
		for _, k := range keys {
			cells = append(cells, fmt.Sprintf("%s %.2f", k, r.requests[k]/float64(r.n)/r.window.Minutes()))
		}
		fmt.Fprintf(&b, "- %d: %s\n", r.n, strings.Join(cells, ", "))
	}
	out := outPath()
	_ = os.MkdirAll(filepath.Dir(out), 0o755)
	if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil { //nolint:gosec // A report.
		t.Error(err)
	}
	t.Logf("\n%s\n(written to %s)", b.String(), out)

	first, last := rows[0], rows[len(rows)-1]
	if last.n >= 10*first.n {
		if x := last.perProxyPerMinute() / first.perProxyPerMinute(); x > 1.2 {
			t.Errorf("API requests per proxy per minute at %d are %.2fx those at %d: the goal is linear, within 1.2x", last.n, x, first.n)
		}
		for _, c := range []string{"crossplane", "provider-egressproxy", "egress-discovery"} {
			if x := (last.rss[c] / float64(last.n)) / (first.rss[c] / float64(first.n)); x > 1.5 {
				t.Logf("note: %s's memory per proxy at %d is %.2fx that at %d (goal 1.5x; a process's base memory dominates at small sizes)", c, last.n, x, first.n)
			}
		}
		if x := float64(last.acquireP99) / float64(first.acquireP99); x > 1.5 {
			t.Errorf("acquisition p99 (200 acquisitions, the fleet's leases held) at %d is %.2fx that at %d: the goal is 1.5x", last.n, x, first.n)
		}
		t.Logf("filling the fleet with its leases: p99 at %d is %.2fx that at %d (%d against %d acquisitions, each size's own load)",
			last.n, float64(last.fillP99)/float64(first.fillP99), first.n, last.n, first.n)
	}
}

// timing is how many of something ran in the window, their mean and p99.
type timing struct{ count, mean, p99 float64 }

func (t timing) String() string {
	return fmt.Sprintf("%.0f, mean %s, p99 %s", t.count, seconds(t.mean), seconds(t.p99))
}

// seconds prints a duration in seconds the way the table does: ms below one.
func seconds(s float64) string {
	if s < 1 {
		return fmt.Sprintf("%.0f ms", s*1000)
	}
	return fmt.Sprintf("%.2g s", s)
}

// outPath is where the table goes: SCALE_OUT, or _output/scale.md.
func outPath() string {
	if out := os.Getenv("SCALE_OUT"); out != "" {
		return out
	}
	return filepath.Join("..", "..", "_output", "scale.md")
}
