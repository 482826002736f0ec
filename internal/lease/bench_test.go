package lease_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// BenchmarkLeaseThroughput compares, in one run and at the same
// concurrency (64 clients), lease acquire+release through the store with
// raw create+delete of Lease objects: the store's rate as a fraction of the
// raw rate, and its acquire p99 against the raw create p99.
func BenchmarkLeaseThroughput(b *testing.B) {
	const clients, perClient = 64, 40
	ctx := context.Background()
	bed := sharedBed.Env(b)
	ns := bed.Namespace(b)
	c, err := client.New(bed.Config, client.Options{Scheme: bed.Scheme})
	if err != nil {
		b.Fatal(err)
	}

	run := func(op func(w, i int) (time.Duration, error)) (float64, time.Duration) {
		return testbed.Load(b, clients, perClient, op)
	}

	b.ResetTimer()
	rawRate, rawP99 := run(func(w, i int) (time.Duration, error) {
		return testbed.RawLeaseCycle(ctx, c, ns, fmt.Sprintf("raw-%d-%d", w, i))
	})

	_, ca := bed.Replica(b, ns, &coordv1.Lease{})
	s := lease.NewStore(lease.StoreConfig{Client: c, Cache: ca})
	// As many proxies as clients, and maxLeases 2, so that free slots exist;
	// each call tries them in random order, as the server spreads ties.
	proxies := make([]string, clients)
	for i := range proxies {
		proxies[i] = fmt.Sprintf("p%02d", i)
	}
	leaseRate, leaseP99 := run(func(w, i int) (time.Duration, error) {
		order := append([]string(nil), proxies...)
		rand.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		t := time.Now()
		// Identity-bound, as discovery grants: the release checks it.
		who := fmt.Sprintf("system:serviceaccount:team:c%d", w)
		g, err := s.Acquire(ctx, cands(ns, 2, order...), lease.Request{Identity: who, Holder: fmt.Sprintf("c%d", w), TTL: time.Minute})
		if err != nil {
			return 0, err
		}
		d := time.Since(t)
		return d, s.Release(ctx, g.ID, who)
	})
	b.StopTimer()

	b.ReportMetric(rawRate, "raw-cycles/s")
	b.ReportMetric(leaseRate, "lease-cycles/s")
	b.ReportMetric(leaseRate/rawRate, "rate-ratio")
	b.ReportMetric(float64(rawP99.Milliseconds()), "raw-create-p99-ms")
	b.ReportMetric(float64(leaseP99.Milliseconds()), "acquire-p99-ms")
	b.ReportMetric(float64(leaseP99)/float64(rawP99), "p99-ratio")
}
