package aws

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// TestListingNeverHoldsAGetLong: a listing slower than a Get may wait
// (10 000 instances take pages) holds no Get past maxWait, starts once,
// answers once done; after a failure none starts for maxAge.
func TestListingNeverHoldsAGetLong(t *testing.T) {
	var calls atomic.Int32
	var fail atomic.Bool
	release := make(chan struct{})
	l := newListing(time.Hour, time.Now, func(ctx context.Context) ([]types.Instance, error) {
		calls.Add(1)
		<-release
		if fail.Load() {
			return nil, errors.New("throttled")
		}
		return nil, nil
	})
	ctx := context.Background()
	for range 2 {
		start := time.Now()
		if _, _, err := l.current(ctx); err == nil {
			t.Fatal("answered before the listing finished")
		}
		if d := time.Since(start); d > maxWait+500*time.Millisecond {
			t.Errorf("a Get waited %s for a slow listing, more than %s", d, maxWait)
		}
	}
	close(release)
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, _, err := l.current(ctx); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the listing never came")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d listings, want 1", n)
	}

	// A failed listing: no other for maxAge.
	fail.Store(true)
	f := newListing(time.Hour, time.Now, func(ctx context.Context) ([]types.Instance, error) {
		calls.Add(1)
		return nil, errors.New("throttled")
	})
	calls.Store(0)
	for range 5 {
		_, _, _ = f.current(ctx)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("after a failed listing, %d listings within maxAge, want 1", n)
	}
}
