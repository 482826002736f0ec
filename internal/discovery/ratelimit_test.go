package discovery

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
)

// limited answers what s.limit decides for id, as the middleware does.
func limited(s *Server, w *httptest.ResponseRecorder, id *auth.Identity) bool {
	err := s.limit(id)
	if err != nil {
		problem.WriteError(w, problem.ToAPIError(err))
	}
	return err != nil
}

// TestIdentityLimits: an identity gets its burst at once and then its rate;
// one over is answered 429 with a Retry-After that is enough; another
// identity is not held up by it; and the buckets kept stay within Size.
func TestIdentityLimits(t *testing.T) {
	now := time.Unix(1000, 0)
	s := NewServer(ServerConfig{Limits: &auth.IdentityLimits{Rate: 2, Burst: 3, Size: 10}, Now: func() time.Time { return now }})
	alice, bob := &auth.Identity{User: "alice"}, &auth.Identity{User: "bob"}
	for i := range 3 {
		if limited(s, httptest.NewRecorder(), alice) {
			t.Fatalf("request %d of the burst refused", i)
		}
	}
	rec := httptest.NewRecorder()
	if !limited(s, rec, alice) || rec.Code != http.StatusTooManyRequests {
		t.Fatalf("one over the burst: want 429, got %d", rec.Code)
	}
	if !strings.Contains(rec.Body.String(), `"reason":"RateLimited"`) {
		t.Errorf("a 429 over the rate says RateLimited: %s", rec.Body)
	}
	wait, err := strconv.Atoi(rec.Header().Get("Retry-After"))
	if err != nil || wait < 1 {
		t.Fatalf("Retry-After %q", rec.Header().Get("Retry-After"))
	}
	if limited(s, httptest.NewRecorder(), bob) {
		t.Error("another identity is held up by alice's limit")
	}
	// A refused request took no token: after Retry-After one is there.
	now = now.Add(time.Duration(wait) * time.Second)
	if limited(s, httptest.NewRecorder(), alice) {
		t.Error("after Retry-After the request must pass")
	}
	for i := range 100 {
		limited(s, httptest.NewRecorder(), &auth.Identity{User: "random-" + strconv.Itoa(i)})
	}
	if n := s.Limits.Len(); n > 10 {
		t.Errorf("%d buckets kept, want at most 10", n)
	}
}
