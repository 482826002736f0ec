package proxy

import (
	"strings"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
)

// TestCreateGate: how each class of create failure holds off the next
// attempt, and what the Proxy's Ready condition says meanwhile.
func TestCreateGate(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	cases := map[string]struct {
		reason   string
		class    backend.Class
		failures int
		at       time.Duration // after the last failure
		blocked  bool
		want     xpv2.ConditionReason
		says     string
	}{
		"TransientRetried":    {reason: "Transient errors are left to the controller's rate limiter.", class: backend.ClassTransient, failures: 3},
		"StockoutHeld":        {reason: "A stockout waits its backoff, and says the zone has no capacity.", class: backend.ClassStockout, failures: 1, at: 10 * time.Second, blocked: true, want: "ZoneExhausted", says: "no capacity"},
		"StockoutRetried":     {reason: "After the backoff a stockout is retried.", class: backend.ClassStockout, failures: 1, at: 31 * time.Second},
		"ThrottledHeld":       {reason: "A rate limit waits 10s.", class: backend.ClassThrottled, failures: 1, at: 5 * time.Second, blocked: true, want: "Throttled", says: "rate-limiting"},
		"QuotaHeld":           {reason: "Quota waits its backoff.", class: backend.ClassQuota, failures: 2, at: 30 * time.Second, blocked: true, want: "QuotaExceeded", says: "quota"},
		"AccessDeniedHeld":    {reason: "Access denied waits its backoff at first.", class: backend.ClassAccessDenied, failures: 2, at: 30 * time.Second, blocked: true, want: "AccessDenied", says: "IAM grant propagates"},
		"AccessDeniedRetried": {reason: "And is retried after it.", class: backend.ClassAccessDenied, failures: 2, at: 61 * time.Second},
		"AccessDeniedLatches": {reason: "After AccessDeniedAttempts it is permanent until the spec changes.", class: backend.ClassAccessDenied, failures: backend.AccessDeniedAttempts, at: time.Hour, blocked: true, want: "PermanentError", says: "taken as permanent"},
		"PermanentLatches":    {reason: "Permanent errors wait for a spec change.", class: backend.ClassPermanent, failures: 1, at: 24 * time.Hour, blocked: true, want: "PermanentError"},
		"PermanentNewSpec":    {reason: "A new generation is tried again.", class: backend.ClassPermanent, failures: 1, at: time.Second},
		"AccessDeniedNewSpec": {reason: "So is a latched access error, once its backoff is over.", class: backend.ClassAccessDenied, failures: backend.AccessDeniedAttempts, at: time.Hour},
	}
	t.Run("AccessDeniedInARowOnly", func(t *testing.T) {
		p := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Generation: 1}}
		for i := 0; i < backend.AccessDeniedAttempts-1; i++ {
			recordCreateFailure(p, backend.Errorf(backend.ClassStockout, "no capacity"), t0)
		}
		recordCreateFailure(p, backend.Errorf(backend.ClassAccessDenied, "denied"), t0)
		if c, _ := readGate(p).blocked(p, t0.Add(time.Hour)); c.Reason == xpv2.ConditionReason(backend.ClassPermanent) {
			t.Errorf("stockouts before one access error do not make it permanent: %s", c.Message)
		}
		if g := readGate(p); g.Failures != 1 || g.Next != t0.Add(30*time.Second) {
			t.Errorf("a new class starts its own count and backoff: %+v", g)
		}
	})
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Generation: 1}}
			for i := 0; i < tc.failures; i++ {
				recordCreateFailure(p, backend.Errorf(tc.class, "boom"), t0)
			}
			if strings.HasSuffix(name, "NewSpec") {
				p.Generation = 2
			}
			c, blocked := readGate(p).blocked(p, t0.Add(tc.at))
			if blocked != tc.blocked || c.Reason != tc.want || !strings.Contains(c.Message, tc.says) {
				t.Errorf("%s\nwant blocked=%v %s %q, got blocked=%v %s %q", tc.reason, tc.blocked, tc.want, tc.says, blocked, c.Reason, c.Message)
			}
		})
	}
}
