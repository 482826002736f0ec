package allocator

import (
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	s := New(Config{Now: func() time.Time { return now }})
	lease := func(expiresIn time.Duration) *coordLease {
		return &coordLease{Spec: coordv1.LeaseSpec{
			HolderIdentity: ptr.To("crawler"), LeaseDurationSeconds: ptr.To(int32(60)),
			RenewTime: &metav1.MicroTime{Time: now.Add(expiresIn - time.Minute)},
		}}
	}
	cases := map[string]struct {
		reason string
		slots  map[string][]*coordLease
		want   int
	}{
		"NoLeases":   {reason: "With no lease to wait for, a short default.", want: 5},
		"Soonest":    {reason: "The soonest expiry over every proxy, rounded up.", slots: map[string][]*coordLease{"p0": {lease(40 * time.Second)}, "p1": {lease(time.Minute), lease(10200 * time.Millisecond)}}, want: 11},
		"Capped":     {reason: "Never more than a minute.", slots: map[string][]*coordLease{"p0": {lease(time.Hour)}}, want: 60},
		"AlmostDone": {reason: "Less than a second left gives the short default.", slots: map[string][]*coordLease{"p0": {lease(500 * time.Millisecond)}}, want: 5},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := s.retryAfter(tc.slots); got != tc.want {
				t.Errorf("%s\nwant %d, got %d", tc.reason, tc.want, got)
			}
		})
	}
}
