package discovery_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// BenchmarkSummaryTickBySize measures what egress-discovery's lease
// summary publisher costs a replica each second at rest: a pooled fleet of
// 100, 1 000 and 10 000 proxies (BENCH_SUMMARY_SIZES overrides) in pools
// of 105, as make scale composes it, with 10 leases held on a tenth of
// them, its summaries written once, then (30 s on, when the replica no
// longer counts its own writes apart) ticks in which nothing changed.
// It reports the CPU this process spends per tick (the publisher, and the
// cache it reads) at each size and as a ratio to the smallest, and checks
// that a tick at rest writes nothing. make scale's steady window at
// 10 000 found discovery at 0.20 cores with nothing to do.
func BenchmarkSummaryTickBySize(b *testing.B) {
	sizes := benchSizes(b, "BENCH_SUMMARY_SIZES")
	const (
		perPool = 105
		ticks   = 50
	)
	bed := sharedBed.Env(b)
	ctx := context.Background()
	measure := func(n int) time.Duration {
		f := newHeldFleet(b, bed, n, perPool)
		defer f.close(b)
		p := discovery.NewSummaryPublisher(discovery.SummaryPublisherConfig{Server: f.srv, Client: f.c, Replica: "bench", Log: logging.NewNopLogger()})
		if err := p.Publish(ctx); err != nil {
			b.Fatal(err)
		}
		pools := (n + perPool - 1) / perPool
		testbed.Eventually(b, time.Minute, "the summaries of the fleet and its pools written", func() (bool, string) {
			l := &v1alpha1.LeaseSummaryList{}
			if err := f.bed.Client.List(ctx, l, client.InNamespace(f.ns), client.MatchingLabels(leasewire.SummarySelector("f"))); err != nil {
				return false, err.Error()
			}
			return len(l.Items) == 1+pools, fmt.Sprintf("%d of %d", len(l.Items), 1+pools)
		})
		written := func() string {
			l := &v1alpha1.LeaseSummaryList{}
			if err := f.bed.Client.List(ctx, l, client.InNamespace(f.ns)); err != nil {
				b.Fatal(err)
			}
			rv := ""
			for _, s := range l.Items {
				rv += s.Name + "@" + s.ResourceVersion + " "
			}
			return rv
		}
		// At rest: past the 30 s a replica counts its own writes
		// whatever its cache says (the held leases were taken just now).
		time.Sleep(31 * time.Second)
		at := written()
		// The ticks alone, not the setup.
		defer profileCPU(b, "BENCH_SUMMARY_PROFILE", fmt.Sprintf("summary-tick-%d.prof", n))()
		before := testbed.ProcessCPU(b)
		for range ticks {
			if err := p.Publish(ctx); err != nil {
				b.Fatal(err)
			}
		}
		cpu := (testbed.ProcessCPU(b) - before) / ticks
		if now := written(); now != at {
			b.Fatalf("%d proxies: ticks at rest wrote summaries: %s, then %s", n, at, now)
		}
		return cpu
	}
	results := map[int][]time.Duration{}
	for b.Loop() {
		for _, n := range sizes {
			cpu := measure(n)
			results[n] = append(results[n], cpu)
			b.Logf("%d proxies in pools of %d, %d leases held: %s of CPU a tick at rest", n, perPool, n/10*heldPerProxy, cpu.Round(10*time.Microsecond))
		}
	}
	med := func(ds []time.Duration) time.Duration {
		ds = append([]time.Duration(nil), ds...)
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}
	base := med(results[sizes[0]])
	for _, n := range sizes {
		b.ReportMetric(float64(med(results[n]).Microseconds()), fmt.Sprintf("cpu-us-tick-%d", n))
		if n != sizes[0] {
			b.ReportMetric(float64(med(results[n]))/float64(base), fmt.Sprintf("cpu-ratio-%d", n))
		}
	}
}
