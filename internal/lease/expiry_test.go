package lease

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// slotLease is a slot object as the store writes it, with no holder yet.
func slotLease(name string) *coordv1.Lease {
	return &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// held is a lease renewed at renew for seconds, held by holder.
func held(holder string, renew time.Time, seconds int32) *coordv1.Lease {
	return &coordv1.Lease{Spec: coordv1.LeaseSpec{
		HolderIdentity: ptr.To(holder), RenewTime: &metav1.MicroTime{Time: renew}, LeaseDurationSeconds: ptr.To(seconds),
	}}
}

func TestExpiry(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	type want struct {
		expired   bool
		expiresAt time.Time
	}
	cases := map[string]struct {
		reason string
		lease  *coordv1.Lease
		want   want
	}{
		"Live": {
			reason: "A lease renewed 30s ago for a minute is live for 30s more.",
			lease:  held("a", now.Add(-30*time.Second), 60),
			want:   want{expiresAt: now.Add(30 * time.Second)},
		},
		"EndsNow": {
			reason: "A lease is over at the very instant it runs out.",
			lease:  held("a", now.Add(-time.Minute), 60),
			want:   want{expired: true, expiresAt: now},
		},
		"Over": {
			reason: "A lease renewed two minutes ago for a minute is over.",
			lease:  held("a", now.Add(-2*time.Minute), 60),
			want:   want{expired: true, expiresAt: now.Add(-time.Minute)},
		},
		"RenewedInTheFuture": {
			reason: "Another replica's clock may run ahead: its lease is live for longer, never expired early.",
			lease:  held("a", now.Add(time.Second), 60),
			want:   want{expiresAt: now.Add(61 * time.Second)},
		},
		"NoHolder": {
			reason: "A lease nobody holds is free, whatever its times say.",
			lease:  held("", now, 60),
			want:   want{expired: true, expiresAt: now.Add(time.Minute)},
		},
		"NoRenewTime": {
			reason: "A lease with no renew time has no expiry and is free.",
			lease:  &coordv1.Lease{Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To("a"), LeaseDurationSeconds: ptr.To(int32(60))}},
			want:   want{expired: true},
		},
		"NoDuration": {
			reason: "A lease with no duration has no expiry and is free.",
			lease:  &coordv1.Lease{Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To("a"), RenewTime: &metav1.MicroTime{Time: now}}},
			want:   want{expired: true},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := want{expired: Expired(tc.lease, now), expiresAt: ExpiresAt(tc.lease)}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("%s\n-want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}

func TestRecentlyTaken(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	s := NewStore(StoreConfig{Now: func() time.Time { return now }})
	if s.seenTaken("ns/p-slot-0") {
		t.Error("a slot never seen taken is not recently taken")
	}
	s.noteTaken("ns/p-slot-0")
	now = now.Add(recentlyTaken)
	if !s.seenTaken("ns/p-slot-0") {
		t.Errorf("a slot seen taken is tried last for %s", recentlyTaken)
	}
	if s.seenTaken("ns/p-slot-1") {
		t.Error("only the slot seen taken is tried last")
	}
	now = now.Add(time.Nanosecond)
	if s.seenTaken("ns/p-slot-0") {
		t.Errorf("after %s the slot is tried in its turn again", recentlyTaken)
	}
	if _, ok := s.recent.Load("ns/p-slot-0"); ok {
		t.Error("a slot no longer recently taken is forgotten")
	}
}
