package lease

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/test"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
	"github.com/google/go-cmp/cmp"
	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestProxyOf(t *testing.T) {
	type want struct {
		proxy string
		ok    bool
	}
	cases := map[string]struct {
		reason string
		name   string
		want   want
	}{
		"SlotObject": {
			reason: "A slot object's name gives back its proxy.",
			name:   "crawlers-0-slot-1",
			want:   want{proxy: "crawlers-0", ok: true},
		},
		"ProxyNamedSlot": {
			reason: "Only the last -slot- separates the index, so a proxy may have -slot- in its name.",
			name:   "a-slot-b-slot-12",
			want:   want{proxy: "a-slot-b", ok: true},
		},
		"BanObject": {
			reason: "A ban object is not a slot.",
			name:   BanName("crawlers-0", "example.com"),
		},
		"NoIndex": {
			reason: "A slot name ends in a number.",
			name:   "crawlers-0-slot-",
		},
		"IndexNotANumber": {
			reason: "A slot name ends in a number.",
			name:   "crawlers-0-slot-x",
		},
		"NoProxy": {
			reason: "A slot name starts with a proxy name.",
			name:   "-slot-1",
		},
		"Empty": {
			reason: "An empty name is nobody's slot.",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			proxy, ok := ProxyOf(tc.name)
			if diff := cmp.Diff(tc.want, want{proxy, ok}, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("%s\nProxyOf(%q): -want, +got:\n%s", tc.reason, tc.name, diff)
			}
		})
	}
}

func TestSlotNameRoundTrip(t *testing.T) {
	for _, proxy := range []string{"p", "crawlers-0", "a-slot-b", "x-slot-1"} {
		for _, slot := range []int{0, 1, 15} {
			name := SlotName(proxy, slot)
			got, ok := ProxyOf(name)
			if !ok || got != proxy {
				t.Errorf("ProxyOf(SlotName(%q, %d) = %q): want %q, got %q (ok %t)", proxy, slot, name, proxy, got, ok)
			}
			if g := (NewStore(StoreConfig{})).toGrant(slotLease(name), "id"); g.Slot != slot {
				t.Errorf("the grant of %s: want slot %d, got %d", name, slot, g.Slot)
			}
		}
	}
}

func TestParseID(t *testing.T) {
	type want struct {
		namespace, name, tok string
		err                  error
	}
	cases := map[string]struct {
		reason string
		id     string
		want   want
	}{
		"Valid":          {reason: "An ID is namespace/name/token.", id: "ns/p-slot-0/uid-1", want: want{namespace: "ns", name: "p-slot-0", tok: "uid-1"}},
		"TwoParts":       {reason: "The token is required.", id: "ns/p-slot-0", want: want{err: errors.Errorf(errFmtLeaseID, "ns/p-slot-0")}},
		"FourParts":      {reason: "Nothing may follow the token.", id: "ns/p-slot-0/uid/x", want: want{err: errors.Errorf(errFmtLeaseID, "ns/p-slot-0/uid/x")}},
		"EmptyNamespace": {reason: "Every part is required.", id: "/p-slot-0/uid", want: want{err: errors.Errorf(errFmtLeaseID, "/p-slot-0/uid")}},
		"EmptyName":      {reason: "Every part is required.", id: "ns//uid", want: want{err: errors.Errorf(errFmtLeaseID, "ns//uid")}},
		"EmptyToken":     {reason: "Every part is required.", id: "ns/p-slot-0/", want: want{err: errors.Errorf(errFmtLeaseID, "ns/p-slot-0/")}},
		"EmptyID":        {reason: "An empty ID is no lease.", want: want{err: errors.Errorf(errFmtLeaseID, "")}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ns, n, tok, err := ParseID(tc.id)
			got := want{namespace: ns, name: n, tok: tok, err: err}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{}), test.EquateErrors()); diff != "" {
				t.Errorf("%s\nParseID(%q): -want, +got:\n%s", tc.reason, tc.id, diff)
			}
			if err != nil && !strings.Contains(err.Error(), "<namespace>/<name>/<token>") {
				t.Errorf("%s\nthe error must show the expected form, got %q", tc.reason, err)
			}
		})
	}
}

func TestHolds(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	held := func(holder string, renew time.Time, ttl int32) *coordv1.Lease {
		return &coordv1.Lease{Spec: coordv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &metav1.MicroTime{Time: renew}, LeaseDurationSeconds: &ttl}}
	}
	const maxTTL = time.Hour
	cases := map[string]struct {
		reason string
		l      *coordv1.Lease
		holds  bool
	}{
		"Fresh":        {"A lease renewed a moment ago holds.", held("c", t0.Add(-time.Second), 60), true},
		"PastTTL":      {"A lease just past its TTL still holds: the renewing replica's clock may run behind.", held("c", t0.Add(-61*time.Second), 60), true},
		"PastSkew":     {"A lease past TTL and skew margin holds no more.", held("c", t0.Add(-60*time.Second-leasewire.HoldSkew), 60), false},
		"NoHolder":     {"A lease without a holder holds nothing.", held("", t0, 60), false},
		"NoRenewTime":  {"A lease never renewed holds nothing.", &coordv1.Lease{Spec: coordv1.LeaseSpec{HolderIdentity: ptrTo("c"), LeaseDurationSeconds: ptrTo[int32](60)}}, false},
		"NoTTL":        {"A lease without a duration holds nothing.", &coordv1.Lease{Spec: coordv1.LeaseSpec{HolderIdentity: ptrTo("c"), RenewTime: &metav1.MicroTime{Time: t0}}}, false},
		"FutureSkewed": {"A renewTime ahead by less than the skew margin is a fast clock: it holds.", held("c", t0.Add(leasewire.HoldSkew-time.Second), 60), true},
		"FutureForged": {"A renewTime far ahead is written by no replica: a forged lease pins nothing.", held("c", time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC), 60), false},
		"EndlessTTL":   {"A duration longer than the fleet's maxTTL counts as maxTTL.", held("c", t0.Add(-maxTTL-leasewire.HoldSkew), 2147483647), false},
		"LongTTL":      {"Within maxTTL a long lease holds.", held("c", t0.Add(-maxTTL+time.Minute), 2147483647), true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := Holds(tc.l, t0, maxTTL); got != tc.holds {
				t.Errorf("%s\nHolds = %v, want %v", tc.reason, got, tc.holds)
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }

func TestStickyHash(t *testing.T) {
	if got := StickyHash(""); got != "" {
		t.Errorf("no sticky key has no hash, got %q", got)
	}
	a, b := StickyHash("session-42"), StickyHash("session-43")
	if a == b || a != StickyHash("session-42") {
		t.Errorf("a sticky key has one hash of its own: %q, %q", a, b)
	}
	if errs := validation.IsValidLabelValue(a); len(errs) != 0 || len(a) != 32 {
		t.Errorf("the hash is a 32-character label value, got %q: %v", a, errs)
	}
}

func TestBanName(t *testing.T) {
	if a, b := BanName("p0", "Example.COM"), BanName("p0", "example.com"); a != b {
		t.Errorf("a ban's name ignores the domain's case: %q, %q", a, b)
	}
	if a, b := BanName("p0", "a.example"), BanName("p0", "b.example"); a == b {
		t.Errorf("two domains get two bans: %q", a)
	}
	got := BanName("p0", "example.com")
	if !strings.HasPrefix(got, "p0-ban-") || len(got) != len("p0-ban-")+12 {
		t.Errorf("a ban is <proxy>-ban-<12 hex digits>, got %q", got)
	}
	if _, ok := ProxyOf(got); ok {
		t.Errorf("a ban's name %q must not read as a slot", got)
	}
	if errs := validation.IsDNS1123Subdomain(got); len(errs) != 0 {
		t.Errorf("a ban's name must be an object name, got %q: %v", got, errs)
	}
}

func TestInvalidTTL(t *testing.T) {
	// Checked before any API call: the store has no client.
	s := NewStore(StoreConfig{})
	cands := []Candidate{{Namespace: "ns", Fleet: "f", Proxy: "f-0", MaxLeases: 1}}
	for _, ttl := range []time.Duration{0, 500 * time.Millisecond, -time.Minute, (math.MaxInt32 + 1) * time.Second} {
		if _, err := s.Acquire(context.Background(), cands, Request{Holder: "c", TTL: ttl}); !errors.Is(err, ErrInvalidTTL) {
			t.Errorf("Acquire with TTL %s: want ErrInvalidTTL, got %v", ttl, err)
		}
		if _, err := s.Renew(context.Background(), "ns/f-0-slot-0/uid", "", ttl); !errors.Is(err, ErrInvalidTTL) {
			t.Errorf("Renew with TTL %s: want ErrInvalidTTL, got %v", ttl, err)
		}
		if err := s.Ban(context.Background(), "ns", "f", "f-0", "example.com", ttl, ""); !errors.Is(err, ErrInvalidTTL) {
			t.Errorf("Ban for %s: want ErrInvalidTTL, got %v", ttl, err)
		}
	}
}
