package testbed

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

func TestQuantiles(t *testing.T) {
	ds := make([]time.Duration, 0, 200)
	for i := 200; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	if got := P99(ds); got != 198*time.Millisecond {
		t.Errorf("p99 of 1..200 ms: %s, want 198ms", got)
	}
	if got := Median(ds); got != 101*time.Millisecond {
		t.Errorf("median of 1..200 ms: %s, want 101ms (the upper middle)", got)
	}
	if ds[0] != 200*time.Millisecond {
		t.Errorf("the quantiles reordered their input: first is %s", ds[0])
	}
	if P99(nil) != 0 || Median([]float64(nil)) != 0 {
		t.Error("the quantiles of nothing are not 0")
	}
}

// recorder keeps a Load's errors instead of failing the test.
type recorder struct {
	testing.TB
	errors atomic.Int64
}

func (r *recorder) Error(...any) { r.errors.Add(1) }

func TestLoad(t *testing.T) {
	var calls atomic.Int64
	r := &recorder{TB: t}
	rate, p99 := Load(r, 4, 10, func(client, i int) (time.Duration, error) {
		calls.Add(1)
		if client == 3 && i == 5 {
			return 0, errors.New("refused")
		}
		return time.Duration(i+1) * time.Millisecond, nil
	})
	if calls.Load() != 36 || r.errors.Load() != 1 {
		t.Errorf("a failing call ends its client's calls and fails the test: %d calls, %d errors; want 36 and 1", calls.Load(), r.errors.Load())
	}
	if rate <= 0 || p99 != 10*time.Millisecond {
		t.Errorf("rate %.0f/s, p99 %s; want a rate and 10ms", rate, p99)
	}
}
