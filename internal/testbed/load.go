package testbed

import (
	"context"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Load runs op from clients goroutines at once, perClient calls each (op
// is told which client and which call), and returns the rate of the calls
// that went through, per second, and the p99 of the latencies they
// reported. A call that fails fails tb and ends its client's calls.
func Load(tb testing.TB, clients, perClient int, op func(client, i int) (time.Duration, error)) (rate float64, p99 time.Duration) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lat []time.Duration
	var n atomic.Int64
	start := time.Now()
	for w := range clients {
		wg.Go(func() {
			for i := range perClient {
				d, err := op(w, i)
				if err != nil {
					tb.Error(err)
					return
				}
				n.Add(1)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds(), P99(lat)
}

// RawLeaseCycle creates a Lease named name in ns and deletes it again, and
// returns how long the create took: what the lease benchmarks compare
// their acquisitions with.
func RawLeaseCycle(ctx context.Context, c client.Client, ns, name string) (time.Duration, error) {
	l := &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       coordv1.LeaseSpec{HolderIdentity: ptr.To("raw"), LeaseDurationSeconds: ptr.To(int32(60)), RenewTime: &metav1.MicroTime{Time: time.Now()}},
	}
	t := time.Now()
	if err := c.Create(ctx, l); err != nil {
		return 0, errors.Wrap(err, "raw create")
	}
	d := time.Since(t)
	return d, c.Delete(ctx, l)
}

// P99 is the 99th percentile of ds (the smallest value at least 99 % of
// them do not exceed); 0 for none. ds is left as it was.
func P99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(math.Ceil(0.99*float64(len(s))))-1)]
}

// Median is the median of vs (the upper one of an even count); 0 for
// none. vs is left as it was.
func Median[T float64 | time.Duration](vs []T) T {
	if len(vs) == 0 {
		var zero T
		return zero
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	return s[len(s)/2]
}

// ProcessCPU is the CPU this process used so far, user and system: what
// benchmarks divide by the work they did, as CPU per operation.
func ProcessCPU(t testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
