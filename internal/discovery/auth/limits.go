package auth

import (
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/ttlcache"
)

// IdentityLimits is a token bucket per authenticated identity: each may
// make Rate requests a second on average and Burst at once. Buckets are
// kept for the identities seen last, at most Size of them; an identity
// whose bucket was forgotten starts with a full one.
type IdentityLimits struct {
	Rate  rate.Limit
	Burst int
	Size  int

	mu      sync.Mutex
	buckets *ttlcache.Cache[*rate.Limiter]
}

// bucketIdle is how long an unused bucket is kept: long enough to have
// refilled whatever its burst.
const bucketIdle = 10 * time.Minute

// Allow takes a request from who's bucket at now, or says after how long
// one may be made.
func (l *IdentityLimits) Allow(who string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	if l.buckets == nil {
		l.buckets = ttlcache.New[*rate.Limiter](l.Size)
	}
	b, ok := l.buckets.Get(who, now, bucketIdle)
	if !ok {
		b = rate.NewLimiter(l.Rate, l.Burst)
	}
	// Re-added at every use, so that an identity in use is never dropped
	// for idleness.
	l.buckets.Add(who, b, now)
	l.mu.Unlock()
	r := b.ReserveN(now, 1)
	if !r.OK() {
		return false, time.Second
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// Check refuses a request of id over its limit at now: 429 with
// Retry-After, as the API and the gateway answer it. Without limits (a nil
// IdentityLimits) every request passes.
func (l *IdentityLimits) Check(id *Identity, now time.Time) error {
	if l == nil {
		return nil
	}
	ok, wait := l.Allow(id.User, now)
	if ok {
		return nil
	}
	secs := max(int(math.Ceil(wait.Seconds())), 1)
	return &problem.Error{
		Code: http.StatusTooManyRequests, Reason: apiv1.ReasonRateLimited, RetryAfter: secs,
		Msg: fmt.Sprintf("%s is over its limit of %g requests a second (burst %d): try again in %ds", id.User, float64(l.Rate), l.Burst, secs),
	}
}

// Len is how many identities' buckets it keeps.
func (l *IdentityLimits) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buckets == nil {
		return 0
	}
	return l.buckets.Len()
}
