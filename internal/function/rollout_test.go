package function

import (
	"fmt"
	"testing"
	"time"
)

// secretChange, as a change in replayRollout, is a password change on a
// backend that cannot change it in place: every proxy running then is
// reported outdated, and those made after are not.
const secretChange = "secret"

// decider is decide, or a broken variant of it for the replay's checks.
type decider func(f *Fleet, observed []*member, leasesKnown bool, now time.Time) *plan

// replayRollout replays template changes the way Crossplane calls the
// function, a minute apart: new proxies turn Ready one call after they
// appear, leases end at the steps leaseEnds gives, and the template changes
// at the steps changes gives. It checks at every step that at least
// replicas - maxUnavailable proxies are Ready, that no more than replicas +
// maxSurge exist, and that no proxy goes while a lease names it; it returns
// the first violation, and the fleet it ends with.
func replayRollout(decide decider, f *Fleet, observed []*member, leaseEnds map[int]int, changes map[int]string, steps int) ([]*member, error) {
	now := t0
	for step := range steps {
		switch r, ok := changes[step]; {
		case ok && r == secretChange:
			// The provider reports every proxy then running outdated.
			for _, o := range observed {
				o.CredentialsOutdated = true
			}
		case ok:
			f.Revision = r
		}
		// What each observed proxy was made from, before the planner
		// (or a broken one) sees it.
		made := map[int]string{}
		for _, o := range observed {
			made[o.Ordinal] = o.Revision
		}
		for _, o := range observed {
			end, ok := leaseEnds[o.Ordinal]
			o.Leased = ok && step < end
		}
		p := decide(f, observed, true, now)
		kept := map[int]bool{}
		for _, k := range p.keep {
			kept[k.Ordinal] = true
		}
		for _, o := range observed {
			if o.Leased && !kept[o.Ordinal] {
				return observed, fmt.Errorf("step %d: %s went while a lease named it", step, o.Name)
			}
		}
		if len(p.keep) > f.Replicas+f.MaxSurge {
			return observed, fmt.Errorf("step %d: %d proxies, above replicas + maxSurge", step, len(p.keep))
		}
		prev := map[int]*member{}
		for _, o := range observed {
			prev[o.Ordinal] = o
		}
		// What the plan keeps that was Ready when it was made, and that
		// no kept proxy was rewritten to another template.
		ready := 0
		for _, k := range p.keep {
			o, ok := prev[k.Ordinal]
			if ok && o.Ready {
				ready++
			}
			if ok && k.Revision != made[k.Ordinal] {
				return observed, fmt.Errorf("step %d: %s rewritten from revision %s to %s in place", step, o.Name, made[k.Ordinal], k.Revision)
			}
		}
		if ready < f.Replicas-f.MaxUnavailable && step > 0 {
			return observed, fmt.Errorf("step %d: %d ready proxies kept, below replicas - maxUnavailable", step, ready)
		}
		// One call later, everything is Ready.
		observed, _ = apply(observed, p, now, func(o *member) { o.Ready, o.Healthy = true, true })
		now = now.Add(time.Minute)
	}
	return observed, nil
}

// apply carries a plan over to the next observation: kept members stay,
// settle (when set) changing them as time would, and new ones appear, not
// Ready, at now. It returns the observation and how many were new.
func apply(observed []*member, p *plan, now time.Time, settle func(*member)) ([]*member, int) {
	prev := make(map[int]*member, len(observed))
	for _, o := range observed {
		prev[o.Ordinal] = o
	}
	next := make([]*member, 0, len(p.keep))
	created := 0
	for _, k := range p.keep {
		if o, ok := prev[k.Ordinal]; ok {
			if settle != nil {
				settle(o)
			}
			// As the composition labels it: a member draining keeps
			// the time it began, which every discovery replica has
			// seen by the next call (a minute later); one that no
			// longer drains loses it.
			switch {
			case !k.Draining:
				o.DrainSince, o.DrainSeen = time.Time{}, false
			case o.DrainSince.IsZero():
				o.DrainSince, o.DrainSeen = now, true
			default:
				o.DrainSeen = true
			}
			next = append(next, o)
			continue
		}
		c := *k
		c.Name, c.Since, c.Ready = fmt.Sprintf("f-%d", c.Ordinal), now, false
		next = append(next, &c)
		created++
	}
	return next, created
}

// TestRolloutReplay: two template changes in a row, the second while the
// first is under way, with crawlers holding leases on two old proxies for a
// while, end with every proxy of the newest template, and the bounds hold
// at every step. The checker itself is shown to catch a planner that drops
// a leased proxy, one that surges too far, and one that takes too many
// Ready proxies away.
func TestRolloutReplay(t *testing.T) {
	fleet := func() *Fleet {
		return fleetFor(4, []string{"a", "b"}, revision("r1"), func(f *Fleet) { f.MaxSurge, f.MaxUnavailable = 1, 1 })
	}
	start := func() []*member {
		return []*member{m(0, "a", rev("r1")), m(1, "b", rev("r1")), m(2, "a", rev("r1")), m(3, "b", rev("r1"))}
	}
	leases := map[int]int{0: 12, 3: 6}
	changes := map[int]string{1: "r2", 4: "r3"}
	for name, tc := range map[string]struct {
		changes map[int]string
		last    string
	}{
		"FarApart": {changes: changes, last: "r3"},
		// The second change comes while the first's replacement is not
		// Ready yet: it is overtaken.
		"Overtaking": {changes: map[int]string{1: "r2", 2: "r3"}, last: "r3"},
		"RolledBack": {changes: map[int]string{1: "r2", 5: "r1"}, last: "r1"},
	} {
		t.Run(name, func(t *testing.T) {
			end, err := replayRollout(decide, fleet(), start(), leases, tc.changes, 30)
			if err != nil {
				t.Fatal(err)
			}
			if len(end) != 4 {
				t.Errorf("the fleet settles at 4 proxies: %s", summary(&plan{keep: end}))
			}
			for _, o := range end {
				if o.Revision != tc.last {
					t.Errorf("every proxy is of the last template in the end: %s is of %s, want %s", o.Name, o.Revision, tc.last)
				}
			}
		})
	}

	broken := map[string]decider{
		"DropsLeased": func(f *Fleet, observed []*member, lk bool, now time.Time) *plan {
			p := decide(f, observed, lk, now)
			for i, k := range p.keep {
				if k.Leased {
					p.keep = append(p.keep[:i], p.keep[i+1:]...)
					break
				}
			}
			return p
		},
		"SurgesTooFar": func(f *Fleet, observed []*member, lk bool, now time.Time) *plan {
			g := *f
			g.MaxSurge = f.MaxSurge + 2
			return decide(&g, observed, lk, now)
		},
		"RewritesInPlace": func(f *Fleet, observed []*member, lk bool, now time.Time) *plan {
			p := decide(f, observed, lk, now)
			for _, k := range p.keep {
				k.Revision = f.Revision
			}
			return p
		},
		"TakesTooManyReady": func(f *Fleet, observed []*member, lk bool, now time.Time) *plan {
			g := *f
			g.MaxSurge, g.MaxUnavailable = 0, f.Replicas
			return decide(&g, observed, lk, now)
		},
	}
	for name, d := range broken {
		t.Run(name, func(t *testing.T) {
			if _, err := replayRollout(d, fleet(), start(), leases, changes, 30); err == nil {
				t.Error("the replay's checks must catch this broken planner")
			} else {
				t.Logf("caught: %v", err)
			}
		})
	}
}

// TestCredentialsRollout: a password change where proxies cannot change
// it in place (GCP VMs) rolls out as a template change does: every proxy
// is replaced, surge first, within the bounds, never while a lease names
// it. A planner blind to outdated credentials is caught: it leaves the
// fleet on the old password.
func TestCredentialsRollout(t *testing.T) {
	run := func(d decider) ([]*member, error) {
		f := fleetFor(4, []string{"a", "b"}, revision("r1"), func(f *Fleet) { f.MaxSurge, f.MaxUnavailable = 1, 0 })
		start := []*member{m(0, "a", rev("r1")), m(1, "b", rev("r1")), m(2, "a", rev("r1")), m(3, "b", rev("r1"))}
		return replayRollout(d, f, start, map[int]int{0: 12, 3: 6}, map[int]string{1: secretChange}, 30)
	}
	check := func(end []*member) error {
		if len(end) != 4 {
			return fmt.Errorf("the fleet settles at 4 proxies: %s", summary(&plan{keep: end}))
		}
		for _, o := range end {
			if o.CredentialsOutdated || o.Ordinal < 4 {
				return fmt.Errorf("every proxy is replaced by one with the new password: %s (outdated %v) remains", o.Name, o.CredentialsOutdated)
			}
		}
		return nil
	}
	end, err := run(decide)
	if err == nil {
		err = check(end)
	}
	if err != nil {
		t.Fatal(err)
	}
	blind := func(f *Fleet, observed []*member, lk bool, now time.Time) *plan {
		seen := make([]*member, 0, len(observed))
		for _, o := range observed {
			c := *o
			c.CredentialsOutdated = false
			seen = append(seen, &c)
		}
		return decide(f, seen, lk, now)
	}
	end, err = run(blind)
	if err == nil {
		err = check(end)
	}
	if err == nil {
		t.Error("the checks must catch a planner blind to outdated credentials")
	}
}

// TestNoReplacementStorm replays the review's storm: a backend whose proxies
// never turn Ready, maxSurge 0 and the shortest replaceUnhealthyAfter, for
// five minutes of fake time composed every ten seconds. Without the
// back-off and the in-flight limit a review counted 22 proxies made in five
// minutes; now it makes the 3
// of the fleet and 2 replacements: the first after 1m, its own replacement
// 2m later, the next would come 4m after that.
func TestNoReplacementStorm(t *testing.T) {
	for name, tc := range map[string]struct {
		surge, unavailable int
		want               int
	}{
		"NoSurge":  {surge: 0, unavailable: 1, want: 5},
		"OneSurge": {surge: 1, unavailable: 0, want: 5},
	} {
		t.Run(name, func(t *testing.T) {
			f := fleetFor(3, []string{"a", "b"}, func(f *Fleet) {
				f.MaxSurge, f.MaxUnavailable, f.ReplaceUnhealthyAfter = tc.surge, tc.unavailable, time.Minute
			})
			var observed []*member
			created := 0
			for now := t0; now.Before(t0.Add(5 * time.Minute)); now = now.Add(10 * time.Second) {
				var n int
				observed, n = apply(observed, decide(f, observed, true, now), now, nil) // never Ready
				created += n
			}
			if created != tc.want {
				t.Errorf("%d proxies created in 5 minutes on a backend that never runs one, want %d", created, tc.want)
			}
		})
	}
}
