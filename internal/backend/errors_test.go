package backend

import (
	"fmt"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/google/go-cmp/cmp"
)

func TestClassOf(t *testing.T) {
	cases := map[string]struct {
		reason string
		err    error
		want   Class
	}{
		"Nil":          {reason: "No error has no class.", err: nil, want: ""},
		"Plain":        {reason: "Unclassified errors are transient.", err: errors.New("boom"), want: ClassTransient},
		"Direct":       {reason: "A classified error keeps its class.", err: Errorf(ClassQuota, "quota"), want: ClassQuota},
		"Wrapped":      {reason: "Wrapping keeps the class.", err: fmt.Errorf("cannot create: %w", Errorf(ClassPermanent, "bad image")), want: ClassPermanent},
		"Joined":       {reason: "The most severe class of a joined error wins.", err: errors.Join(Errorf(ClassTransient, "a"), Errorf(ClassQuota, "b")), want: ClassQuota},
		"JoinedNew":    {reason: "Access outranks a stockout, which outranks a rate limit.", err: errors.Join(Errorf(ClassThrottled, "a"), Errorf(ClassAccessDenied, "b"), Errorf(ClassStockout, "c")), want: ClassAccessDenied},
		"JoinedInWrap": {reason: "Joined errors are looked through under wrapping.", err: fmt.Errorf("x: %w", errors.Join(errors.New("a"), Errorf(ClassNotFound, "gone"))), want: ClassNotFound},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ClassOf(tc.err)); diff != "" {
				t.Errorf("%s\n-want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	cases := map[string]struct {
		reason   string
		class    Class
		failures int
		want     time.Duration
	}{
		"TransientLeftToController": {reason: "Transient errors use the controller's rate limiter.", class: ClassTransient, failures: 5, want: 0},
		"QuotaFirst":                {reason: "The first quota error waits 30s.", class: ClassQuota, failures: 1, want: 30 * time.Second},
		"QuotaThird":                {reason: "Quota backoff doubles.", class: ClassQuota, failures: 3, want: 2 * time.Minute},
		"QuotaCapped":               {reason: "Quota backoff stops growing at 5 minutes.", class: ClassQuota, failures: 50, want: 5 * time.Minute},
		"ThrottledFirst":            {reason: "A rate limit waits 10s.", class: ClassThrottled, failures: 1, want: 10 * time.Second},
		"ThrottledCapped":           {reason: "Rate-limit backoff stops at 2 minutes.", class: ClassThrottled, failures: 9, want: 2 * time.Minute},
		"StockoutSecond":            {reason: "A stockout backs off like quota.", class: ClassStockout, failures: 2, want: time.Minute},
		"AccessDeniedSixth":         {reason: "Access errors back off to the cap.", class: ClassAccessDenied, failures: AccessDeniedAttempts, want: 5 * time.Minute},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := Backoff(tc.class, tc.failures); got != tc.want {
				t.Errorf("%s\nwant %s, got %s", tc.reason, tc.want, got)
			}
		})
	}
}
