package function

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestRequeueAfter(t *testing.T) {
	maxAge := func(d time.Duration) func(*Fleet) { return func(f *Fleet) { f.MaxAge = d } }
	cases := map[string]struct {
		reason  string
		fleet   *Fleet
		members []*member
		blocked bool
		change  time.Time
		want    time.Duration
	}{
		"Idle": {
			reason:  "A healthy fleet without maxAge is composed again after the default TTL.",
			fleet:   fleetFor(2, []string{"a"}),
			members: []*member{m(0, "a"), m(1, "a")},
			want:    time.Minute,
		},
		"NextRotation": {
			reason:  "The fleet is composed again when its oldest proxy reaches maxAge, not a poll interval later.",
			fleet:   fleetFor(2, []string{"a"}, maxAge(90*time.Minute)),
			members: []*member{m(0, "a", age(89*time.Minute+40*time.Second)), m(1, "a", age(10*time.Minute))},
			want:    20 * time.Second,
		},
		"RotationFarAway": {
			reason:  "A rotation further away than the default TTL does not lengthen it.",
			fleet:   fleetFor(1, []string{"a"}, maxAge(24*time.Hour)),
			members: []*member{m(0, "a")},
			want:    time.Minute,
		},
		"UnhealthyDeadline": {
			reason:  "An unready proxy is looked at again when replaceUnhealthyAfter passes.",
			fleet:   fleetFor(2, []string{"a"}),
			members: []*member{m(0, "a"), m(1, "a", sick(4*time.Minute+45*time.Second))},
			want:    15 * time.Second,
		},
		"Blocked": {
			reason:  "A due replacement that waits on a lease, with nothing due by time alone, waits for the summaries' next write (a watch event) or the default TTL.",
			fleet:   fleetFor(1, []string{"a"}),
			members: []*member{m(0, "a")},
			blocked: true,
			want:    time.Minute,
		},
		"BlockedUntilADrainSettles": {
			reason:  "A proxy draining for 4 s is drained, if every replica saw it, when drainSettle passes: nothing announces that.",
			fleet:   fleetFor(1, []string{"a"}),
			members: []*member{m(0, "a", func(x *member) { x.DrainSince = t0.Add(-4 * time.Second) })},
			blocked: true,
			want:    drainSettle - 4*time.Second,
		},
		"DrainSettledLongAgo": {
			reason:  "A drain that settled before waits for the summaries, not for a time past.",
			fleet:   fleetFor(1, []string{"a"}),
			members: []*member{m(0, "a", func(x *member) { x.DrainSince = t0.Add(-time.Hour) })},
			blocked: true,
			want:    time.Minute,
		},
		"BlockedUntilTheSummariesChange": {
			reason:  "The summaries say otherwise in 25 s by time alone (one turns stale, a stale one's lease ends): composed again then.",
			fleet:   fleetFor(1, []string{"a"}),
			members: []*member{m(0, "a")},
			blocked: true,
			change:  t0.Add(25 * time.Second),
			want:    25 * time.Second,
		},
		"DrainSoonerThanTheSummaries": {
			reason:  "A drain settling in 6 s comes before the summaries' change in 25 s.",
			fleet:   fleetFor(1, []string{"a"}),
			members: []*member{m(0, "a", func(x *member) { x.DrainSince = t0.Add(-4 * time.Second) })},
			blocked: true,
			change:  t0.Add(25 * time.Second),
			want:    drainSettle - 4*time.Second,
		},
		"NotBlockedIgnoresTheSummaries": {
			reason:  "A fleet that waits on no lease is not composed again for its summaries' time.",
			fleet:   fleetFor(1, []string{"a"}),
			members: []*member{m(0, "a", func(x *member) { x.DrainSince = t0.Add(-4 * time.Second) })},
			change:  t0.Add(25 * time.Second),
			want:    time.Minute,
		},
		"NeverBusy": {
			reason:  "A deadline that is due now never asks for less than a second.",
			fleet:   fleetFor(1, []string{"a"}, maxAge(time.Hour)),
			members: []*member{m(0, "a", age(time.Hour-time.Millisecond))},
			want:    time.Second,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := &plan{leasesChange: tc.change}
			if tc.blocked {
				p.blocked, p.leaseWait = []string{"f-0 is leased"}, true
			}
			if diff := cmp.Diff(tc.want, requeueAfter(tc.fleet, tc.members, p, t0)); diff != "" {
				t.Errorf("%s\n-want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}
