package discovery

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
)

// Timeouts of the API's HTTP server: a client that sends its headers or
// body slowly, or reads the answer slowly, holds a connection no longer
// than these.
const (
	ReadHeaderTimeout = 10 * time.Second
	ReadTimeout       = 30 * time.Second
	WriteTimeout      = 60 * time.Second
	IdleTimeout       = 120 * time.Second
	// RequestTimeout bounds a request's handling: its context is
	// cancelled, so that one stuck on the API server does not hold its
	// in-flight slot.
	RequestTimeout = 30 * time.Second
	// MaxHeaderBytes bounds a request's line and headers: room for a
	// ServiceAccount token, not for a megabyte of path.
	MaxHeaderBytes = 64 << 10
)

// WithTimeout gives a request's context a deadline of RequestTimeout, so
// that a handler stuck on the API server fails (503) and gives back its
// in-flight slot. The handler still writes its own answer: a lease granted
// just before the deadline is answered, not lost.
func WithTimeout(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), RequestTimeout)
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// LimitInFlight serves at most n requests at once; one more is answered
// 503 with Retry-After at once, rather than queued, so that a crowd of
// crawlers cannot pile up goroutines and API server calls without bound.
// Renewals, releases and reports (what crawlers holding leases send) have
// n/4 more slots of their own, so that a crowd acquiring cannot make the
// leases already held lapse. An acquisition that parks to wait for a slot
// gives its in-flight slot back (allocator.BeforeWait): waiters are bounded
// on their own.
func LimitInFlight(h http.Handler, n int) http.Handler {
	slots := make(chan struct{}, max(n, 1))
	held := make(chan struct{}, max(n/4, 1))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var sem chan struct{}
		select {
		case slots <- struct{}{}:
			sem = slots
		default:
			if holding(r) {
				select {
				case held <- struct{}{}:
					sem = held
				default:
				}
			}
		}
		if sem == nil {
			problem.WriteError(w, &problem.Error{Code: http.StatusServiceUnavailable, Reason: apiv1.ReasonOverloaded, RetryAfter: 1,
				Msg: fmt.Sprintf("egress-discovery is serving %d requests already, its limit: try again in a second", cap(slots))})
			return
		}
		var once sync.Once
		release := func() { once.Do(func() { <-sem }) }
		defer release()
		h.ServeHTTP(w, r.WithContext(allocator.BeforeWait(r.Context(), release)))
	})
}

// holding says whether a request is sent by a crawler holding a lease:
// a renewal, release or report.
func holding(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/v1/leases/")
}
