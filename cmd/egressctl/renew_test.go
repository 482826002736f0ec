package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
)

// These tests fake egress-discovery with an httptest server: they test how
// egressctl plans renewals and stops the command, which needs a server that
// misbehaves on cue. Their margins are wide, for a loaded machine.

// fakeDiscovery answers egress-discovery's lease endpoints.
type fakeDiscovery struct {
	// ttl is the ttlSeconds it answers; 0 answers none, as a server older
	// than the field does.
	ttl int64
	// skew is how far its clock, and so its expiresAt, is off.
	skew time.Duration
	// renewStatus is the status of the n-th renewal, from 1; 0 is 200.
	renewStatus func(n int) int
	// auth is the status of a request before anything else; 0 goes on.
	auth func(r *http.Request) int
	// refuse says whether to refuse the n-th acquisition, from 1, with
	// 409 and Retry-After 1.
	refuse       func(n int) bool
	acquisitions int

	mu     sync.Mutex
	renews []renewCall
}

// renewCall is one renewal the fake answered, on the test's clock.
type renewCall struct {
	at     time.Time
	status int
}

func (f *fakeDiscovery) lease() apiv1.Lease {
	ttl := time.Duration(f.ttl) * time.Second
	if f.ttl == 0 {
		ttl = 3 * time.Second
	}
	return apiv1.Lease{LeaseID: "ns/crawlers-0-slot-0/token", Proxy: "crawlers-0", ProxyURL: "http://u:p@127.0.0.1:31999",
		ExpiresAt: time.Now().Add(f.skew + ttl), TTLSeconds: f.ttl}
}

func (f *fakeDiscovery) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.auth != nil {
		if status := f.auth(r); status != 0 {
			w.WriteHeader(status)
			return
		}
	}
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/leases":
		f.mu.Lock()
		f.acquisitions++
		refused := f.refuse != nil && f.refuse(f.acquisitions)
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if refused {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusConflict)
			_ = json.NewEncoder(w).Encode(apiv1.Error{Error: apiv1.ErrorDetail{Code: http.StatusConflict, Reason: apiv1.ReasonNoFreeSlot, Message: "no free slot"}})
			return
		}
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(f.lease())
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/renew"):
		f.mu.Lock()
		status := 0
		if f.renewStatus != nil {
			status = f.renewStatus(len(f.renews) + 1)
		}
		if status == 0 {
			status = http.StatusOK
		}
		f.renews = append(f.renews, renewCall{at: time.Now(), status: status})
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		if status != http.StatusOK {
			_ = json.NewEncoder(w).Encode(apiv1.Error{Error: apiv1.ErrorDetail{Code: status, Message: "fake " + strconv.Itoa(status)}})
			return
		}
		_ = json.NewEncoder(w).Encode(f.lease())
	case r.Method == http.MethodDelete:
		w.WriteHeader(http.StatusNoContent)
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeDiscovery) calls() []renewCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]renewCall(nil), f.renews...)
}

// stderrLog is egressctl's stderr, which egressctl and the command write
// at once, and notes when egressctl said it stops the command: just before
// it sends SIGTERM.
type stderrLog struct {
	mu      sync.Mutex
	b       bytes.Buffer
	stopped time.Time
}

func (w *stderrLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped.IsZero() && bytes.Contains(p, []byte("stopping the command")) {
		w.stopped = time.Now()
	}
	return w.b.Write(p)
}

func (w *stderrLog) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// leaseResult is what one egressctl lease run did.
type leaseResult struct {
	code    int
	stderr  string
	stopped time.Time // zero unless egressctl stopped the command
	ended   time.Time
}

// runLease runs egressctl lease against f with flags, then the command.
func runLease(t *testing.T, f *fakeDiscovery, flags []string, command ...string) leaseResult {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	args := append([]string{"lease", "--server", srv.URL, "--fleet", "ns/crawlers"}, flags...)
	args = append(append(args, "--"), command...)
	var out bytes.Buffer
	errOut := &stderrLog{}
	code := run(context.Background(), args, &out, errOut)
	r := leaseResult{code: code, stderr: errOut.String(), ended: time.Now()}
	errOut.mu.Lock()
	r.stopped = errOut.stopped
	errOut.mu.Unlock()
	return r
}

func TestLeaseRenewsOnOwnClock(t *testing.T) {
	cases := map[string]struct {
		reason string
		f      *fakeDiscovery
	}{
		"ServerClockAhead": {
			reason: "An expiresAt an hour ahead does not put renewals off: they follow ttlSeconds on egressctl's clock.",
			f:      &fakeDiscovery{ttl: 3, skew: time.Hour},
		},
		"ServerClockBehind": {
			reason: "An expiresAt an hour behind neither stops the command nor makes renewals spin.",
			f:      &fakeDiscovery{ttl: 3, skew: -time.Hour},
		},
		"OlderServer": {
			reason: "Without ttlSeconds the time left until expiresAt stands in for the TTL.",
			f:      &fakeDiscovery{},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// A TTL of 3s renews every second: about four times while the
			// command sleeps 4.5s.
			r := runLease(t, tc.f, nil, "sleep", "4.5")
			if r.code != 0 || !r.stopped.IsZero() {
				t.Fatalf("%s\nwant the command to run to its end with exit code 0, got %d:\n%s", tc.reason, r.code, r.stderr)
			}
			if n := len(tc.f.calls()); n < 2 || n > 6 {
				t.Errorf("%s\nwant 2 to 6 renewals in 4.5s, got %d:\n%s", tc.reason, n, r.stderr)
			}
		})
	}
}

func TestLeaseStopsWhenRenewalsFail(t *testing.T) {
	// With a TTL of 6s the first renewal, at 2s, succeeds; from the second,
	// at 4s, the server answers 503, and egressctl retries until 0.6s before
	// the lease expires, 6s after that first renewal.
	f := &fakeDiscovery{ttl: 6, renewStatus: func(n int) int {
		if n > 1 {
			return http.StatusServiceUnavailable
		}
		return 0
	}}
	termed := filepath.Join(t.TempDir(), "termed")
	// The trap runs once the group's SIGTERM ends the sleep.
	r := runLease(t, f, nil, "sh", "-c", `trap 'echo term >"$1"; exit 0' TERM; sleep 60`, "sh", termed)

	if r.code != exitLeaseLost {
		t.Errorf("want exit code %d when the lease is lost, got %d:\n%s", exitLeaseLost, r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "could not be renewed before it expires at") || !strings.Contains(r.stderr, "503") {
		t.Errorf("want egressctl to say it stops the command for want of a renewal, and the last error:\n%s", r.stderr)
	}
	if b, err := os.ReadFile(termed); err != nil || strings.TrimSpace(string(b)) != "term" {
		t.Errorf("want the command to get SIGTERM: %q, %v", b, err)
	}
	calls := f.calls()
	if len(calls) < 3 || calls[0].status != http.StatusOK {
		t.Fatalf("want a successful renewal and then retries of the failing one, got %v:\n%s", calls, r.stderr)
	}
	// egressctl counts the lease from when it asked, before the fake
	// answered, so its expiry is no later than this.
	expiry := calls[0].at.Add(6 * time.Second)
	if r.stopped.IsZero() || !r.stopped.Before(expiry) {
		t.Errorf("want the command stopped before the lease expires at %s, got %s", expiry.Format(time.StampMilli), r.stopped.Format(time.StampMilli))
	}
	if firstFail := calls[1].at; r.stopped.Sub(firstFail) < time.Second {
		t.Errorf("want failed renewals retried while the lease holds, got the command stopped %s after the first failure", r.stopped.Sub(firstFail))
	}
}

func TestLeaseKillsCommandIgnoringTerm(t *testing.T) {
	f := &fakeDiscovery{ttl: 3, renewStatus: func(int) int { return http.StatusNotFound }}
	// The ignored SIGTERM is inherited by the sleep, which only SIGKILL to
	// the whole group ends: egressctl would otherwise wait the 60s for it.
	r := runLease(t, f, []string{"--kill-grace", "2s"}, "sh", "-c", `trap "" TERM; sleep 60`)

	if r.code != exitLeaseLost {
		t.Errorf("want exit code %d, got %d:\n%s", exitLeaseLost, r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "sending SIGKILL") {
		t.Errorf("want egressctl to say it kills the command:\n%s", r.stderr)
	}
	if r.stopped.IsZero() {
		t.Fatalf("want egressctl to stop the command:\n%s", r.stderr)
	}
	if took := r.ended.Sub(r.stopped); took < 2*time.Second || took > 10*time.Second {
		t.Errorf("want the command killed --kill-grace (2s) after SIGTERM, got it ended %s after", took)
	}
}

func TestLeaseStopsAtOnceWhenLeaseGone(t *testing.T) {
	cases := map[string]struct {
		reason string
		status int
	}{
		"NotFound":  {reason: "A lease the server no longer has cannot be renewed.", status: http.StatusNotFound},
		"Forbidden": {reason: "A lease that is not the caller's cannot be renewed.", status: http.StatusForbidden},
		"Conflict":  {reason: "A lease whose proxy is being replaced is no longer renewed.", status: http.StatusConflict},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// A TTL of 9s renews at 3s; waiting for the expiry would stop
			// the command some 5s after that answer.
			f := &fakeDiscovery{ttl: 9, renewStatus: func(int) int { return tc.status }}
			r := runLease(t, f, nil, "sleep", "60")

			if r.code != exitLeaseLost || !strings.Contains(r.stderr, "can no longer be renewed") || !strings.Contains(r.stderr, strconv.Itoa(tc.status)) {
				t.Errorf("%s\nwant exit code %d and egressctl saying why, got %d:\n%s", tc.reason, exitLeaseLost, r.code, r.stderr)
			}
			calls := f.calls()
			if len(calls) != 1 {
				t.Fatalf("%s\nwant no retry, got %d renewals:\n%s", tc.reason, len(calls), r.stderr)
			}
			if r.stopped.IsZero() || r.stopped.Sub(calls[0].at) > 2*time.Second {
				t.Errorf("%s\nwant the command stopped at once, got %s after the answer", tc.reason, r.stopped.Sub(calls[0].at))
			}
		})
	}
}

// TestLeaseExitCodeOfKilledCommand: a command killed by a signal makes
// egressctl exit 128 plus the signal's number, as a shell says, not 255.
func TestLeaseExitCodeOfKilledCommand(t *testing.T) {
	r := runLease(t, &fakeDiscovery{ttl: 30}, nil, "sh", "-c", "kill -TERM $$")
	if r.code != 128+15 {
		t.Errorf("want exit code 143 for a command killed by SIGTERM, got %d:\n%s", r.code, r.stderr)
	}
}

// TestLeaseWaitsForASlot: with --wait, egressctl asks again while the
// fleet answers 409 (a fleet waking from zero), after the Retry-After, and
// runs the command once granted; without it, the first 409 ends it.
func TestLeaseWaitsForASlot(t *testing.T) {
	f := &fakeDiscovery{ttl: 30, refuse: func(n int) bool { return n <= 2 }}
	r := runLease(t, f, []string{"--wait", "20s"}, "true")
	if r.code != 0 || f.acquisitions != 3 {
		t.Errorf("--wait 20s with two refusals: exit %d after %d acquisitions, want 0 after 3:\n%s", r.code, f.acquisitions, r.stderr)
	}
	if !strings.Contains(r.stderr, "asking again in 1s") {
		t.Errorf("egressctl says it asks again: %s", r.stderr)
	}
	once := &fakeDiscovery{ttl: 30, refuse: func(int) bool { return true }}
	if r := runLease(t, once, nil, "true"); r.code != 1 || once.acquisitions != 1 {
		t.Errorf("without --wait a 409 ends egressctl: exit %d after %d acquisitions", r.code, once.acquisitions)
	}
	start := time.Now()
	bounded := &fakeDiscovery{ttl: 30, refuse: func(int) bool { return true }}
	if r := runLease(t, bounded, []string{"--wait", "2s"}, "true"); r.code != 1 || time.Since(start) > 10*time.Second {
		t.Errorf("--wait 2s against a fleet that never frees a slot: exit %d after %s", r.code, time.Since(start))
	}
}
