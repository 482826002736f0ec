package discovery

import (
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"
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
	buckets *ttlCache[*rate.Limiter]
}

// bucketIdle is how long an unused bucket is kept: long enough to have
// refilled whatever its burst.
const bucketIdle = 10 * time.Minute

// allow takes a request from who's bucket at now, or says after how long
// one may be made.
func (l *IdentityLimits) allow(who string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	if l.buckets == nil {
		l.buckets = newTTLCache[*rate.Limiter](l.Size)
	}
	b, ok := l.buckets.get(who, now, bucketIdle)
	if !ok {
		b = rate.NewLimiter(l.Rate, l.Burst)
	}
	// Re-added at every use, so that an identity in use is never dropped
	// for idleness.
	l.buckets.add(who, b, now)
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

// limited answers 429 with Retry-After to an identity over its limit.
func (s *Server) limited(w http.ResponseWriter, id *Identity) bool {
	if s.Limits == nil {
		return false
	}
	ok, wait := s.Limits.allow(id.User, s.now())
	if ok {
		return false
	}
	secs := int(math.Ceil(wait.Seconds()))
	w.Header().Set("Retry-After", fmt.Sprint(max(secs, 1)))
	writeError(w, http.StatusTooManyRequests, "", fmt.Sprintf("%s is over its limit of %g requests a second (burst %d): try again in %ds", id.User, float64(s.Limits.Rate), s.Limits.Burst, max(secs, 1)))
	return true
}
