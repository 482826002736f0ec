package function

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func fleetFor(replicas int, zones []string, mods ...func(*Fleet)) *Fleet {
	f := &Fleet{Name: "f", Namespace: "ns", Replicas: replicas, Zones: zones, MaxSurge: 1, ReplaceUnhealthyAfter: 5 * time.Minute}
	for _, m := range mods {
		m(f)
	}
	return f
}

// m makes an observed member: ready, healthy, an hour old.
func m(ord int, zone string, mods ...func(*member)) *member {
	x := &member{Ordinal: ord, Name: fmt.Sprintf("f-%d", ord), Zone: zone, Created: t0.Add(-time.Hour), Ready: true, Healthy: true, Since: t0.Add(-time.Hour), Replaces: -1}
	for _, mod := range mods {
		mod(x)
	}
	return x
}

func sick(d time.Duration) func(*member) {
	return func(x *member) { x.Ready, x.Healthy, x.Since = false, false, t0.Add(-d) }
}

func age(d time.Duration) func(*member) { return func(x *member) { x.Created = t0.Add(-d) } }

func replaces(o int) func(*member) { return func(x *member) { x.Replaces = o } }

func leased(x *member) { x.Leased = true }

// drainedFor has a member drain for d, seen draining by every discovery
// replica.
func drainedFor(d time.Duration) func(*member) {
	return func(x *member) { x.DrainSince, x.DrainSeen = t0.Add(-d), true }
}

func rev(r string) func(*member) { return func(x *member) { x.Revision = r } }

func revision(r string) func(*Fleet) { return func(f *Fleet) { f.Revision = r } }

// summary renders kept members as "ordinal:zone" (with ">o" when replacing
// o), sorted, so cases read like the fleet they describe.
func summary(p *plan) string {
	var s []string
	for _, k := range p.keep {
		e := fmt.Sprintf("%d:%s", k.Ordinal, k.Zone)
		if k.Replaces >= 0 {
			e += fmt.Sprintf(">%d", k.Replaces)
		}
		s = append(s, e)
	}
	sort.Strings(s)
	return strings.Join(s, " ")
}

func TestDecide(t *testing.T) {
	ab := []string{"a", "b"}
	cases := map[string]struct {
		reason      string
		fleet       *Fleet
		observed    []*member
		leasesKnown bool
		want        string
		wantBlocked string
		// wantDraining lists the members that drain, when set.
		wantDraining string
	}{
		"FreshFleetSpreads": {
			reason: "Five new proxies spread over two zones as 3+2.",
			fleet:  fleetFor(5, ab), want: "0:a 1:b 2:a 3:b 4:a",
		},
		"ScaleUpKeepsNames": {
			reason:   "Adding replicas never renames existing proxies; new ones fill the emptiest zone.",
			fleet:    fleetFor(4, ab),
			observed: []*member{m(0, "a"), m(1, "b"), m(2, "a")},
			want:     "0:a 1:b 2:a 3:b",
		},
		"ScaleDownNewestFirst": {
			reason:   "Removing replicas removes the newest from the most crowded zone.",
			fleet:    fleetFor(2, ab),
			observed: []*member{m(0, "a"), m(1, "b"), m(2, "a"), m(3, "b")},
			want:     "0:a 1:b",
		},
		"ScaleDownUnhealthiestFirst": {
			reason:   "An unready proxy goes before healthy ones.",
			fleet:    fleetFor(2, ab),
			observed: []*member{m(0, "a", sick(time.Minute)), m(1, "b"), m(2, "a")},
			want:     "1:b 2:a",
		},
		"ScaleToZero": {
			reason:   "Zero replicas keeps nothing.",
			fleet:    fleetFor(0, nil),
			observed: []*member{m(0, "a"), m(1, "b")},
			want:     "",
		},
		"OldProxyGetsSurgeReplacement": {
			reason:   "A proxy older than maxAge gets a replacement in its zone; the old one stays until it is Ready.",
			fleet:    fleetFor(2, ab, func(f *Fleet) { f.MaxAge = 30 * time.Minute }),
			observed: []*member{m(0, "a"), m(1, "b", age(10*time.Minute))},
			want:     "0:a 1:b 2:a>0",
		},
		"SurgeBoundsRotation": {
			reason:   "With maxSurge 1 only one old proxy is replaced at a time.",
			fleet:    fleetFor(2, ab, func(f *Fleet) { f.MaxAge = 30 * time.Minute }),
			observed: []*member{m(0, "a"), m(1, "b")},
			want:     "0:a 1:b 2:a>0", wantBlocked: "f-1 waits for surge capacity (maxSurge 1)",
		},
		"ReplacementNotReadyKeepsOld": {
			reason:      "The old proxy is kept while its replacement is not Ready.",
			fleet:       fleetFor(2, ab, func(f *Fleet) { f.MaxAge = 30 * time.Minute }),
			observed:    []*member{m(0, "a"), m(1, "b", age(time.Minute)), m(2, "a", replaces(0), age(time.Minute), sick(time.Minute))},
			leasesKnown: true,
			want:        "0:a 1:b 2:a>0",
		},
		"ReadyReplacementRetiresDrainedOld": {
			reason:      "Once the replacement is Ready and nobody holds a lease on the old proxy, drained and seen draining, the old one goes.",
			fleet:       fleetFor(2, ab, func(f *Fleet) { f.MaxAge = 30 * time.Minute }),
			observed:    []*member{m(0, "a", drainedFor(time.Minute)), m(1, "b", age(time.Minute)), m(2, "a", replaces(0), age(time.Minute))},
			leasesKnown: true,
			want:        "1:b 2:a>0",
		},
		"ReadyReplacementDrainsOldFirst": {
			reason:      "A lease handed out since the summaries were written may be listed nowhere yet: the old proxy drains before it goes.",
			fleet:       fleetFor(2, ab, func(f *Fleet) { f.MaxAge = 30 * time.Minute }),
			observed:    []*member{m(0, "a"), m(1, "b", age(time.Minute)), m(2, "a", replaces(0), age(time.Minute))},
			leasesKnown: true,
			want:        "0:a 1:b 2:a>0", wantBlocked: "f-0 drains before it goes", wantDraining: "f-0",
		},
		"DrainNotSeenByEveryReplicaWaits": {
			reason:      "A proxy that drained long enough but that one discovery replica has not seen draining may still be handed out: it stays.",
			fleet:       fleetFor(2, ab, func(f *Fleet) { f.MaxAge = 30 * time.Minute }),
			observed:    []*member{m(0, "a", drainedFor(time.Hour), func(x *member) { x.DrainSeen = false }), m(1, "b", age(time.Minute)), m(2, "a", replaces(0), age(time.Minute))},
			leasesKnown: true,
			want:        "0:a 1:b 2:a>0", wantBlocked: "f-0 drains before it goes", wantDraining: "f-0",
		},
		"LeasedOldWaits": {
			reason:      "An old proxy with an active lease is not deleted, even with a Ready replacement.",
			fleet:       fleetFor(2, ab, func(f *Fleet) { f.MaxAge = 30 * time.Minute }),
			observed:    []*member{m(0, "a", leased), m(1, "b", age(time.Minute)), m(2, "a", replaces(0), age(time.Minute))},
			leasesKnown: true,
			want:        "0:a 1:b 2:a>0", wantBlocked: "f-0 waits for its leases to drain",
		},
		"UnknownLeasesWait": {
			reason:      "Until Crossplane has provided the Lease objects, leases are assumed held.",
			fleet:       fleetFor(2, ab, func(f *Fleet) { f.MaxAge = 30 * time.Minute }),
			observed:    []*member{m(0, "a"), m(1, "b", age(time.Minute)), m(2, "a", replaces(0), age(time.Minute))},
			leasesKnown: false,
			want:        "0:a 1:b 2:a>0", wantBlocked: "f-0 waits for its leases to drain",
		},
		"UnhealthyReplaced": {
			reason:      "A proxy unavailable for longer than replaceUnhealthyAfter gets a replacement.",
			fleet:       fleetFor(2, ab),
			observed:    []*member{m(0, "a", sick(10*time.Minute)), m(1, "b")},
			leasesKnown: true,
			want:        "0:a 1:b 2:a>0",
		},
		"BrieflyUnhealthyKept": {
			reason:      "A proxy unavailable for less than replaceUnhealthyAfter is left to recover.",
			fleet:       fleetFor(2, ab),
			observed:    []*member{m(0, "a", sick(time.Minute)), m(1, "b")},
			leasesKnown: true,
			want:        "0:a 1:b",
		},
		"UnhealthyGoesDespiteLeases": {
			reason:      "A broken proxy is retired once its replacement is Ready, leases or not: it serves nobody.",
			fleet:       fleetFor(2, ab),
			observed:    []*member{m(0, "a", sick(10*time.Minute), leased), m(1, "b"), m(2, "a", replaces(0), age(time.Minute))},
			leasesKnown: true,
			want:        "1:b 2:a>0",
		},
		"UnreadyHolderDrainsBeforeItGoes": {
			reason:      "A holder that just turned unready, which no summary lists as leased, may carry a lease handed out just before it failed and listed nowhere yet: it drains before it goes, though its replacement is Ready.",
			fleet:       fleetFor(2, ab),
			observed:    []*member{m(0, "a", sick(30*time.Second)), m(1, "b"), m(2, "a", replaces(0), age(time.Minute))},
			leasesKnown: true,
			want:        "0:a 1:b 2:a>0", wantBlocked: "f-0 drains before it goes", wantDraining: "f-0",
		},
		"UnreadyDrainedHolderGoes": {
			reason:      "An unready holder that drained, seen draining by every discovery replica, goes once its replacement is Ready.",
			fleet:       fleetFor(2, ab),
			observed:    []*member{m(0, "a", sick(30*time.Second), drainedFor(20*time.Second)), m(1, "b"), m(2, "a", replaces(0), age(time.Minute))},
			leasesKnown: true,
			want:        "1:b 2:a>0",
		},
		"MaxUnavailableWithoutSurge": {
			reason:      "With maxSurge 0 and maxUnavailable 1, a drained old proxy is replaced in place.",
			fleet:       fleetFor(2, ab, func(f *Fleet) { f.MaxAge = 30 * time.Minute; f.MaxSurge = 0; f.MaxUnavailable = 1 }),
			observed:    []*member{m(0, "a", drainedFor(time.Minute)), m(1, "b", age(time.Minute))},
			leasesKnown: true,
			want:        "1:b 2:a",
		},
		"NoLongerDueHolderDrainsForItsReadyReplacement": {
			reason:      "A holder that is no longer due (it recovered, or the rollout paused) but whose replacement is Ready drains, so that it can go: else the fleet would stay a proxy over for good.",
			fleet:       fleetFor(2, ab),
			observed:    []*member{m(0, "a"), m(1, "b"), m(2, "a", replaces(0), age(time.Minute))},
			leasesKnown: true,
			want:        "0:a 1:b 2:a>0", wantBlocked: "f-0 drains before it goes", wantDraining: "f-0",
		},
		"UnreadyHolderKeptWhileLeasesUnknown": {
			reason:      "A holder that only flickered unready may still carry leases: while they are unknown it is not removed, though its replacement is Ready.",
			fleet:       fleetFor(2, ab),
			observed:    []*member{m(0, "a", sick(30*time.Second)), m(1, "b"), m(2, "a", replaces(0), age(time.Minute))},
			leasesKnown: false,
			want:        "0:a 1:b 2:a>0", wantBlocked: "f-0 waits for its leases to drain",
		},
		"MaxUnavailableWithoutSurgeDrainsFirst": {
			reason:      "With maxSurge 0, an unleased old proxy drains, within maxUnavailable, before it is replaced in place.",
			fleet:       fleetFor(2, ab, func(f *Fleet) { f.MaxAge = 30 * time.Minute; f.MaxSurge = 0; f.MaxUnavailable = 1 }),
			observed:    []*member{m(0, "a"), m(1, "b", age(time.Minute))},
			leasesKnown: true,
			want:        "0:a 1:b", wantBlocked: "f-0 drains before it goes", wantDraining: "f-0",
		},
		"MaxUnavailableZeroProtectsReady": {
			reason:      "Rotation never drops the fleet below replicas - maxUnavailable ready proxies.",
			fleet:       fleetFor(2, ab, func(f *Fleet) { f.MaxAge = 30 * time.Minute; f.MaxSurge = 1; f.MaxUnavailable = 0 }),
			observed:    []*member{m(0, "a"), m(1, "b", sick(time.Minute), age(time.Minute)), m(2, "a", replaces(0), age(time.Minute))},
			leasesKnown: true,
			want:        "0:a 1:b 2:a>0", wantBlocked: "f-0 waits: removing it would leave fewer than 2 ready proxies",
		},
		"TemplateChangeSurges": {
			reason:      "A template change replaces proxies one surge at a time, in their zones; none is rewritten in place.",
			fleet:       fleetFor(3, ab, revision("r2")),
			observed:    []*member{m(0, "a", rev("r1")), m(1, "b", rev("r1")), m(2, "a", rev("r1"))},
			leasesKnown: true,
			want:        "0:a 1:b 2:a 3:a>0", wantBlocked: "f-1 waits for surge capacity (maxSurge 1); f-2 waits for surge capacity (maxSurge 1)",
		},
		"TemplateChangeRetiresOnceReplacementReady": {
			reason:      "An old proxy goes once its replacement of the new template is Ready.",
			fleet:       fleetFor(3, ab, revision("r2")),
			observed:    []*member{m(0, "a", rev("r1"), drainedFor(time.Minute)), m(1, "b", rev("r1")), m(2, "a", rev("r1")), m(3, "a", rev("r2"), replaces(0), age(time.Minute))},
			leasesKnown: true,
			want:        "1:b 2:a 3:a>0", wantBlocked: "f-1 waits for surge capacity (maxSurge 1); f-2 waits for surge capacity (maxSurge 1)",
		},
		"TemplateChangeWaitsForLeases": {
			reason:      "An old proxy a crawler holds a lease on stays until the lease ends, its Ready replacement beside it.",
			fleet:       fleetFor(2, ab, revision("r2")),
			observed:    []*member{m(0, "a", rev("r1"), leased), m(1, "b", rev("r1")), m(2, "a", rev("r2"), replaces(0), age(time.Minute))},
			leasesKnown: true,
			want:        "0:a 1:b 2:a>0", wantBlocked: "f-1 waits for surge capacity (maxSurge 1); f-0 waits for its leases to drain",
		},
		"SecondChangeOvertakesFirst": {
			reason:      "A replacement of an older template that is not Ready yet makes way for one of the newest.",
			fleet:       fleetFor(2, ab, revision("r3")),
			observed:    []*member{m(0, "a", rev("r1")), m(1, "b", rev("r1")), m(2, "a", rev("r2"), replaces(0), sick(time.Minute), age(time.Minute))},
			leasesKnown: true,
			want:        "0:a 1:b 3:a>0", wantBlocked: "f-1 waits for surge capacity (maxSurge 1)",
		},
		"TemplateChangeMidRotation": {
			reason:      "A template change during an age rotation: the rotation's replacement of the old template, not Ready yet, makes way for one of the new template; the fleet stays within one surge.",
			fleet:       fleetFor(2, ab, revision("r2"), func(f *Fleet) { f.MaxAge = 30 * time.Minute }),
			observed:    []*member{m(0, "a", rev("r1")), m(1, "b", rev("r1")), m(2, "a", rev("r1"), replaces(0), sick(time.Minute), age(time.Minute))},
			leasesKnown: true,
			want:        "0:a 1:b 3:a>0", wantBlocked: "f-1 waits for surge capacity (maxSurge 1)",
		},
		"RotationOfNewTemplateAfterChange": {
			reason:      "A Ready replacement of the new template retires the aged old proxy it replaces; the other old one is next, one surge at a time.",
			fleet:       fleetFor(2, ab, revision("r2"), func(f *Fleet) { f.MaxAge = 30 * time.Minute }),
			observed:    []*member{m(0, "a", rev("r1"), drainedFor(time.Minute)), m(1, "b", rev("r1")), m(3, "a", rev("r2"), replaces(0), age(time.Minute))},
			leasesKnown: true,
			want:        "1:b 3:a>0", wantBlocked: "f-1 waits for surge capacity (maxSurge 1)",
		},
		"ZoneRemoved": {
			reason:      "A zone removed from spec.zones has its proxies replaced in the remaining zones, surge first.",
			fleet:       fleetFor(3, []string{"a", "c"}),
			observed:    []*member{m(0, "a"), m(1, "b"), m(2, "c")},
			leasesKnown: true,
			want:        "0:a 1:b 2:c 3:a>1",
		},
		"Paused": {
			reason:      "A paused rollout replaces nothing for a template change or a removed zone.",
			fleet:       fleetFor(2, []string{"a"}, revision("r2"), func(f *Fleet) { f.Paused = true }),
			observed:    []*member{m(0, "a", rev("r1")), m(1, "b", rev("r1"))},
			leasesKnown: true,
			want:        "0:a 1:b",
		},
		"PausedStillReplacesUnhealthy": {
			reason:      "A paused rollout still replaces a proxy that is down, from the current template.",
			fleet:       fleetFor(2, ab, revision("r2"), func(f *Fleet) { f.Paused = true }),
			observed:    []*member{m(0, "a", rev("r1"), sick(10*time.Minute)), m(1, "b", rev("r1"))},
			leasesKnown: true,
			want:        "0:a 1:b 2:a>0",
		},
		"RefusedOldTemplateReplaced": {
			reason:      "A proxy its ProviderConfig refuses is replaced when the template changes: the new one may be permitted.",
			fleet:       fleetFor(1, ab, revision("r2")),
			observed:    []*member{m(0, "a", rev("r1"), sick(time.Hour), func(x *member) { x.Refused = true })},
			leasesKnown: true,
			want:        "0:a 1:a>0",
		},
		"ReplacementFillsAddedZone": {
			reason:      "A zone added to spec.zones is filled by replacements as they come, not by moving running proxies.",
			fleet:       fleetFor(4, []string{"a", "b", "c"}, revision("r2")),
			observed:    []*member{m(0, "a", rev("r1")), m(1, "b", rev("r1")), m(2, "a", rev("r1")), m(3, "b", rev("r1"))},
			leasesKnown: true,
			want:        "0:a 1:b 2:a 3:b 4:c>0", wantBlocked: "f-1 waits for surge capacity (maxSurge 1); f-2 waits for surge capacity (maxSurge 1); f-3 waits for surge capacity (maxSurge 1)",
		},
		"DownMidRolloutReplacedInPlace": {
			reason:      "A proxy that goes down when no surge is left is replaced in place, so the rollout cannot wedge on it.",
			fleet:       fleetFor(3, ab, revision("r2")),
			observed:    []*member{m(0, "a", rev("r1")), m(1, "b", rev("r1")), m(2, "a", rev("r1"), sick(10*time.Minute)), m(3, "a", rev("r2"), replaces(0), age(time.Minute))},
			leasesKnown: true,
			want:        "0:a 1:b 3:a>0 4:b", wantBlocked: "f-1 waits for surge capacity (maxSurge 1); f-0 waits: removing it would leave fewer than 3 ready proxies",
		},
		"RolledBack": {
			reason:      "After a rollback, the replacement of the abandoned template goes, not the proxy it was to replace.",
			fleet:       fleetFor(2, ab, revision("r1")),
			observed:    []*member{m(0, "a", rev("r1")), m(1, "b", rev("r1")), m(2, "a", rev("r2"), replaces(0), age(time.Minute), drainedFor(time.Minute))},
			leasesKnown: true,
			want:        "0:a 1:b",
		},
		"FlickeringLeasedStays": {
			reason:      "An old proxy that only just turned unready keeps serving its leases until its Ready replacement may take over.",
			fleet:       fleetFor(2, ab, revision("r2")),
			observed:    []*member{m(0, "a", rev("r1"), sick(time.Minute), leased), m(1, "b", rev("r1")), m(2, "a", rev("r2"), replaces(0), age(time.Minute))},
			leasesKnown: true,
			want:        "0:a 1:b 2:a>0", wantBlocked: "f-1 waits for surge capacity (maxSurge 1); f-0 waits for its leases to drain",
		},
		"LeasedReplacedLast": {
			reason:      "A template change gives the surge to a proxy nobody leases first: a leased one would hold it until its leases end.",
			fleet:       fleetFor(2, ab, revision("r2")),
			observed:    []*member{m(0, "a", rev("r1"), leased), m(1, "b", rev("r1"))},
			leasesKnown: true,
			want:        "0:a 1:b 2:b>1", wantBlocked: "f-0 waits for surge capacity (maxSurge 1)",
		},
		"NoSurgeDrainsWithinBudget": {
			reason:      "With maxSurge 0, only as many leased proxies drain at once as may be unavailable; the others keep taking leases.",
			fleet:       fleetFor(3, ab, revision("r2"), func(f *Fleet) { f.MaxSurge, f.MaxUnavailable = 0, 1 }),
			observed:    []*member{m(0, "a", rev("r1"), leased), m(1, "b", rev("r1"), leased), m(2, "a", rev("r1"), leased)},
			leasesKnown: true,
			want:        "0:a 1:b 2:a", wantBlocked: "f-0 waits for its leases to drain; f-1 waits for its leases to drain; f-2 waits for its leases to drain",
			wantDraining: "f-0",
		},
		"DrainingKeptWhileReplacementFlickers": {
			reason:      "A holder that began to drain keeps draining when its replacement flickers unready, so its drain start does not restart.",
			fleet:       fleetFor(2, ab, revision("r2")),
			observed:    []*member{m(0, "a", rev("r1"), leased, func(x *member) { x.DrainSince = t0.Add(-time.Minute) }), m(1, "b", rev("r1")), m(2, "a", rev("r2"), replaces(0), sick(10*time.Second))},
			leasesKnown: true,
			want:        "0:a 1:b 2:a>0", wantBlocked: "f-1 waits for surge capacity (maxSurge 1)",
			wantDraining: "f-0",
		},
		"NoSurgeDrainingKeepsItsTurn": {
			reason:      "With maxSurge 0, a proxy already draining keeps its place in the unavailability budget; an unleased one waits behind it.",
			fleet:       fleetFor(3, ab, revision("r2"), func(f *Fleet) { f.MaxSurge, f.MaxUnavailable = 0, 1 }),
			observed:    []*member{m(0, "a", rev("r1"), leased), m(1, "b", rev("r1")), m(2, "a", rev("r1"), leased, func(x *member) { x.DrainSince = t0.Add(-time.Minute) })},
			leasesKnown: true,
			want:        "0:a 1:b 2:a", wantBlocked: "f-2 waits for its leases to drain; f-1 waits for surge capacity (maxSurge 0); f-0 waits for its leases to drain",
			wantDraining: "f-2",
		},
		"ReplacementDownGivesLeasesBack": {
			reason:      "A draining proxy whose replacement is down for good takes leases again.",
			fleet:       fleetFor(2, ab, revision("r2")),
			observed:    []*member{m(0, "a", rev("r1"), leased, func(x *member) { x.DrainSince = t0.Add(-time.Hour) }), m(1, "b", rev("r1")), m(2, "a", rev("r2"), replaces(0), sick(10*time.Minute), age(time.Hour))},
			leasesKnown: true,
			want:        "0:a 1:b 2:a>0", wantBlocked: "f-1 waits for surge capacity (maxSurge 1)",
			wantDraining: "-",
		},
		"RolledBackLeasedReplacementNoDrain": {
			reason:      "After a rollback, a current proxy whose leased replacement of the abandoned template is Ready does not drain; the replacement does, and goes when its leases end.",
			fleet:       fleetFor(2, ab, revision("r1")),
			observed:    []*member{m(0, "a", rev("r1")), m(1, "b", rev("r1")), m(2, "a", rev("r2"), replaces(0), leased, age(time.Minute))},
			leasesKnown: true,
			want:        "0:a 1:b 2:a>0", wantBlocked: "f-2, of an abandoned template, waits for its leases to drain",
			wantDraining: "f-2",
		},
		"ScaleDownOldTemplateFirst": {
			reason:      "Scaling down during a rollout removes proxies of the old template first.",
			fleet:       fleetFor(1, ab, revision("r2")),
			observed:    []*member{m(0, "a", rev("r1")), m(1, "b", rev("r2"))},
			leasesKnown: true,
			want:        "1:b",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := decide(tc.fleet, tc.observed, tc.leasesKnown, t0)
			if diff := cmp.Diff(tc.want, summary(p)); diff != "" {
				t.Errorf("%s\nkept: -want, +got:\n%s", tc.reason, diff)
			}
			if diff := cmp.Diff(tc.wantBlocked, strings.Join(p.blocked, "; ")); diff != "" {
				t.Errorf("%s\nblocked: -want, +got:\n%s", tc.reason, diff)
			}
			if tc.wantDraining != "" {
				var draining []string
				for _, k := range p.keep {
					if k.Draining {
						draining = append(draining, k.Name)
					}
				}
				if len(draining) == 0 {
					draining = []string{"-"}
				}
				if diff := cmp.Diff(tc.wantDraining, strings.Join(draining, " ")); diff != "" {
					t.Errorf("%s\ndraining: -want, +got:\n%s", tc.reason, diff)
				}
			}
		})
	}
}

// TestDecideConverges replays a rotation the way Crossplane would call the
// function, marking new proxies Ready a call later, and checks the bounds at
// every step and that the fleet ends fresh.
func TestDecideConverges(t *testing.T) {
	f := fleetFor(4, []string{"a", "b"}, func(f *Fleet) { f.MaxAge = 30 * time.Minute; f.MaxSurge = 1; f.MaxUnavailable = 1 })
	// Fewer steps than maxAge in minutes: one generation. The replay checks
	// the bounds at every step, Ready counted as the plan was made.
	observed, err := replayRollout(decide, f, []*member{m(0, "a"), m(1, "b"), m(2, "a"), m(3, "b")}, nil, nil, 20)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range observed {
		if o.Ordinal < 4 {
			t.Errorf("proxy %d should have been rotated out; fleet: %s", o.Ordinal, summary(&plan{keep: observed}))
		}
	}
	if len(observed) != f.Replicas {
		t.Errorf("the fleet must settle at %d proxies, got %d", f.Replicas, len(observed))
	}
}

func TestUnhealthyHold(t *testing.T) {
	f := fleetFor(1, []string{"a"}, func(f *Fleet) { f.ReplaceUnhealthyAfter = 5 * time.Minute })
	for streak, want := range map[int]time.Duration{0: 5 * time.Minute, 1: 10 * time.Minute, 3: 40 * time.Minute, 4: time.Hour, 1000: time.Hour} {
		if got := f.unhealthyHold(&member{Streak: streak}); got != want {
			t.Errorf("streak %d: hold %s, want %s", streak, got, want)
		}
	}
	slow := fleetFor(1, []string{"a"}, func(f *Fleet) { f.ReplaceUnhealthyAfter = 2 * time.Hour })
	if got := slow.unhealthyHold(&member{Streak: 2}); got != 2*time.Hour {
		t.Errorf("the cap never shortens replaceUnhealthyAfter itself: %s", got)
	}
}

// TestFailingLineDoesNotStarveOthers: two proxies go down at once; new
// proxies in zone a never turn Ready (a stockout), those in zone b do. The
// line in zone a keeps failing, but the one in zone b is replaced all the
// same, within half an hour, though only one replacement of an unhealthy
// proxy may be in flight at a time.
func TestFailingLineDoesNotStarveOthers(t *testing.T) {
	f := fleetFor(2, []string{"a", "b"})
	observed := []*member{m(0, "a", sick(0)), m(1, "b", sick(0))}
	fixed := false
	for now := t0; now.Before(t0.Add(30 * time.Minute)); now = now.Add(30 * time.Second) {
		// Replacements in zone b turn Ready a call after they appear.
		observed, _ = apply(observed, decide(f, observed, true, now), now, func(o *member) {
			if o.Zone == "b" && o.Ordinal > 1 && !o.Ready {
				o.Ready, o.Healthy, o.Since = true, true, now
			}
		})
		for _, o := range observed {
			fixed = fixed || o.Zone == "b" && o.Ready
		}
	}
	if !fixed {
		t.Errorf("the proxy in the healthy zone must be replaced while the other zone keeps failing: %s", summary(&plan{keep: observed}))
	}
}
