package function

import (
	"fmt"
	"slices"
	"strings"
	"time"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/response"
	"google.golang.org/protobuf/types/known/structpb"
)

// ConditionRolloutStalled is the XR condition that says a rollout has made
// no progress for spec.rollout.progressDeadline.
const ConditionRolloutStalled = "RolloutStalled"

// rollout is the progress of a rollout under way.
type rollout struct {
	// remaining counts the members of an old revision or a removed zone;
	// updatedReady those of the current revision that are Ready.
	remaining, updatedReady int
	// since is when remaining last fell or updatedReady last rose.
	since time.Time
}

// current reports whether a member is of the fleet's current template and
// zones.
func (f *Fleet) current(m *member) bool { return f.outdated(m) == "" }

// outdated says why a member is not of the fleet's current template: a
// zone removed from spec.zones, another template revision, or credentials
// its instance cannot change in place; "" when it is current.
func (f *Fleet) outdated(m *member) string {
	switch {
	case !slices.Contains(f.Zones, m.Zone):
		return fmt.Sprintf("zone %s was removed from spec.zones", m.Zone)
	case m.Revision != f.Revision:
		return fmt.Sprintf("template revision %s is replaced by %s", m.Revision, f.Revision)
	case m.CredentialsOutdated:
		return "its instance accepts the auth Secret's previous credentials only, and cannot change them in place"
	}
	return ""
}

// progress computes the rollout under way from the members and the one the
// XR's status recorded (status.rollout); nil when none is under way. Its
// time moves only on progress, so the status does not change while nothing
// does.
func progress(f *Fleet, members []*member, xrStatus *structpb.Struct, now time.Time) *rollout {
	r := &rollout{since: now}
	for _, m := range members {
		switch {
		case !f.current(m):
			r.remaining++
		case m.Ready:
			r.updatedReady++
		}
	}
	if r.remaining == 0 {
		return nil
	}
	prev := field(xrStatus, "rollout").GetStructValue()
	at, err := time.Parse(time.RFC3339, str(prev, "lastProgressTime"))
	if prev == nil || err != nil || at.After(now) {
		// A rollout starting, or a record that cannot be trusted (a time
		// in the future): from now.
		return r
	}
	if r.remaining >= int(field(prev, "remaining").GetNumberValue()) && r.updatedReady <= int(field(prev, "updatedReady").GetNumberValue()) {
		r.since = at
	}
	return r
}

// setRollout writes the rollout under way to the desired XR's status,
// which then no longer carries one when none is.
func setRollout(status *structpb.Struct, r *rollout) {
	if r == nil {
		return
	}
	status.Fields["rollout"] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
		"remaining":        structpb.NewNumberValue(float64(r.remaining)),
		"updatedReady":     structpb.NewNumberValue(float64(r.updatedReady)),
		"lastProgressTime": structpb.NewStringValue(r.since.UTC().Format(time.RFC3339)),
	}})
}

// reportRollout sets RolloutStalled: True once a rollout has made no
// progress for the progress deadline, naming what blocks it; a paused
// rollout never stalls.
func reportRollout(rsp *fnv1.RunFunctionResponse, f *Fleet, members []*member, p *plan, r *rollout, now time.Time) {
	var c *response.ConditionOption
	switch {
	case r == nil:
		c = response.ConditionFalse(rsp, ConditionRolloutStalled, "Complete").WithMessage(fmt.Sprintf("every proxy is of template revision %s", f.Revision))
	case f.Paused:
		c = response.ConditionFalse(rsp, ConditionRolloutStalled, "Paused").WithMessage("spec.rollout.paused holds the rollout")
	case now.Sub(r.since) < f.ProgressDeadline:
		c = response.ConditionFalse(rsp, ConditionRolloutStalled, "Progressing").WithMessage(fmt.Sprintf("%d proxies left to replace", r.remaining))
	default:
		why := slices.Clone(p.blocked)
		for _, m := range members {
			if f.current(m) && !m.Ready {
				why = append(why, fmt.Sprintf("%s of the new template is not Ready", m.Name))
			}
		}
		if len(why) > 5 {
			why = append(why[:5], fmt.Sprintf("and %d more", len(why)-5))
		}
		msg := fmt.Sprintf("no progress since %s (spec.rollout.progressDeadline %s); %d proxies left to replace", r.since.UTC().Format(time.RFC3339), f.ProgressDeadline, r.remaining)
		if len(why) > 0 {
			msg += ": " + strings.Join(why, "; ")
		}
		c = response.ConditionTrue(rsp, ConditionRolloutStalled, "ProgressDeadlineExceeded").WithMessage(msg)
	}
	c.TargetCompositeAndClaim()
}

// setReady makes the XR Ready while at least replicas - maxUnavailable
// proxies are, rather than only while every composed Proxy is: a surge
// proxy booting during a rollout or a rotation does not make the fleet
// unready.
func setReady(desired *fnv1.State, f *Fleet, members []*member) {
	ready := 0
	for _, m := range members {
		if m.Ready {
			ready++
		}
	}
	desired.Composite.Ready = fnv1.Ready_READY_FALSE
	if ready >= f.servingFloor() {
		desired.Composite.Ready = fnv1.Ready_READY_TRUE
	}
}
