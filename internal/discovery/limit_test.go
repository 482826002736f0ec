package discovery

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
)

// TestLimitInFlight: with n requests being served, one more is answered
// 503 with Retry-After and a JSON error at once, and once one ends the
// next is served.
func TestLimitInFlight(t *testing.T) {
	const n = 3
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(n)
	h := LimitInFlight(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		started.Done()
		<-release
		w.WriteHeader(http.StatusNoContent)
	}), n)
	var done sync.WaitGroup
	for range n {
		done.Add(1)
		go func() {
			defer done.Done()
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
		}()
	}
	started.Wait()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	var body apiv1.Error
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" || json.Unmarshal(rec.Body.Bytes(), &body) != nil || body.Error.Code != http.StatusServiceUnavailable {
		t.Errorf("one over the limit: want 503 with Retry-After and a JSON error, got %d %v %q", rec.Code, rec.Header(), rec.Body)
	}
	close(release)
	done.Wait()
	started.Add(1)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusNoContent {
		t.Errorf("under the limit again: got %d", rec.Code)
	}
}
