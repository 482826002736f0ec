//go:build scale

package scale

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// bringUp logs, every minute until stopped, where a fleet's bring-up
// stands and what it costs: the Proxies stored and the VMs booted, the
// API requests a second by verb and resource, each process's cores and
// the work queues of Crossplane and the provider. The returned func stops
// it and logs the whole bring-up's cost per proxy. A run that takes too
// long says where its time went.
func (e *env) bringUp(t *testing.T, n int, start sampled) func() {
	t.Helper()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		prev := start
		tick := time.NewTicker(time.Minute)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			cur, err := e.read()
			if err != nil {
				t.Logf("bring-up: %v", err)
				continue
			}
			ready, readyN, _, _ := e.fleetStatus(fmt.Sprintf("scale-%d", n))
			progressf(t, "bring-up %s: %.0f Proxies stored, %d VMs, %d ready and healthy (fleet Ready %t); %s; cores %s; queues %s",
				cur.at.Sub(start.at).Round(time.Second), storedProxies(cur.api), e.fake.Instances(), readyN, ready,
				topRequests(prev, cur, 5, cur.at.Sub(prev.at).Seconds(), "a second"), cores(prev, cur), queues(cur))
			prev = cur
		}
	}()
	var once sync.Once
	finish := func() {
		once.Do(func() {
			close(stop)
			<-done
			end, err := e.read()
			if err != nil {
				t.Logf("bring-up: %v", err)
				return
			}
			progressf(t, "bring-up of %d: %s; CPU seconds a proxy %s", n, topRequests(start, end, 8, float64(n), "a proxy"), cpuPer(start, end, float64(n), 3))
		})
	}
	// A bring-up that fails still says what it cost.
	t.Cleanup(finish)
	return finish
}

// progressf logs a line, and appends it at once to scale-progress.log
// beside the table: go test shows a test's log only when it ends, and a
// bring-up of 10 000 takes long enough to want to watch.
func progressf(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Logf(format, args...)
	f, err := os.OpenFile(filepath.Join(filepath.Dir(outPath()), "scale-progress.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644) //nolint:gosec // A log.
	if err != nil {
		return
	}
	_, _ = fmt.Fprintf(f, "%s %s: %s\n", time.Now().UTC().Format(time.TimeOnly), t.Name(), fmt.Sprintf(format, args...))
	_ = f.Close()
}

func storedProxies(m metrics) float64 {
	for k, v := range m {
		if name, l := labels(k); name == "apiserver_storage_objects" && strings.HasPrefix(l["resource"], "proxies.") {
			return v
		}
	}
	return 0
}

// topRequests is the k most made requests between two samples, each
// divided by per.
func topRequests(a, b sampled, k int, per float64, unit string) string {
	reqs := requests(a, b)
	keys := make([]string, 0, len(reqs))
	var total float64
	for key, v := range reqs {
		keys = append(keys, key)
		total += v
	}
	sort.Slice(keys, func(i, j int) bool { return reqs[keys[i]] > reqs[keys[j]] })
	cells := []string{fmt.Sprintf("%.1f API requests %s", total/per, unit)}
	for _, key := range keys[:min(k, len(keys))] {
		cells = append(cells, fmt.Sprintf("%s %.1f", key, reqs[key]/per))
	}
	return strings.Join(cells, ", ")
}

// cores is each process's CPU between two samples, in cores.
func cores(a, b sampled) string { return cpuPer(a, b, b.at.Sub(a.at).Seconds(), 2) }

// cpuPer is each process's CPU seconds between two samples, divided by per.
func cpuPer(a, b sampled, per float64, digits int) string {
	var cells []string
	for _, c := range append(components, "test") {
		cells = append(cells, fmt.Sprintf("%s %.*f", c, digits, (b.cpu[c]-a.cpu[c])/per))
	}
	return strings.Join(cells, ", ")
}

// queues is the depth of Crossplane's XR queues and the provider's.
func queues(s sampled) string {
	var cells []string
	for _, m := range []struct {
		who string
		m   metrics
	}{{"crossplane", s.xp}, {"provider", s.prov}} {
		for k, v := range m.m {
			if name, l := labels(k); name == "workqueue_depth" && v > 0 {
				cells = append(cells, fmt.Sprintf("%s %s %.0f", m.who, l["name"], v))
			}
		}
	}
	sort.Strings(cells)
	if len(cells) == 0 {
		return "all empty"
	}
	return strings.Join(cells, ", ")
}
