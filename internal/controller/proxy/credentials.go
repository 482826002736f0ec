package proxy

import (
	"context"
	"fmt"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
)

// Event reasons of credential changes.
const (
	ReasonCredentialsRotated         event.Reason = "CredentialsRotated"
	ReasonPreviousCredentialsRetired event.Reason = "PreviousCredentialsRetired"
	ReasonCredentialsOutdated        event.Reason = "CredentialsOutdated"
	ReasonCannotRotateCredentials    event.Reason = "CannotRotateCredentials"
)

// credentialsVerdict is what a change of the auth Secret does to an
// instance whose spec is otherwise current.
type credentialsVerdict int

const (
	// credentialsCurrent: the instance accepts the Secret's credentials
	// (perhaps besides the previous ones, for their grace period).
	credentialsCurrent credentialsVerdict = iota
	// credentialsOutdated: it accepts the previous ones only and cannot
	// change in place, and its fleet replaces it as it rolls out a
	// template change; meanwhile it serves the crawlers holding it.
	credentialsOutdated
	// credentialsReplace: it accepts the previous ones only, cannot change
	// in place, and no fleet replaces it: the provider does.
	credentialsReplace
)

// syncCredentials brings the credentials the instance accepts in line with
// the Proxy's auth Secret. Where the backend can, they change in place: the
// instance accepts the new ones at once and the previous ones for the
// grace period, after which they are dropped. Elsewhere (a GCP VM, whose
// startup script runs only at boot) a fleet's Proxy is reported outdated,
// for the fleet to replace within its rollout budget, and any other is
// replaced. An imported instance keeps its own name and maker, from which
// its credentials' sum derives.
func (e *external) syncCredentials(ctx context.Context, p *v1alpha1.Proxy, inst *backend.Instance, want backend.Spec) credentialsVerdict {
	if want.Credentials == nil || inst.Phase == v1alpha1.InstancePhaseTerminated {
		return credentialsCurrent
	}
	want = repairSpec(p, inst, want)
	want.CredentialsSum = credentialsSum(want.Credentials, inst.Name)
	rot, inPlace := e.backend.(backend.CredentialRotator)
	switch {
	case inPlace && allows(p, xpv2.ManagementActionUpdate):
		return e.rotate(ctx, p, inst, want, rot)
	case inPlace && inst.CredentialsSum != want.CredentialsSum:
		// The management policies leave out Update: out of date, for
		// Crossplane to report; nothing for a fleet to replace.
		return credentialsReplace
	case inPlace:
		return credentialsCurrent
	}
	return e.fixed(p, inst, want)
}

// fixed judges an instance whose credentials cannot change in place (its
// backend cannot change them, or it was made before it could): current
// while it runs the auth Secret's; else outdated, for its fleet to replace
// within its budget; else out of date, for the provider to replace.
func (e *external) fixed(p *v1alpha1.Proxy, inst *backend.Instance, want backend.Spec) credentialsVerdict {
	switch {
	case inst.CredentialsSum == want.CredentialsSum:
		return credentialsCurrent
	case fleetv1alpha1.FleetName(p) != "":
		return e.outdated(p, inst)
	default:
		return credentialsReplace
	}
}

// specCurrent says whether the instance is of the Proxy's current spec. An
// instance made before credentials rotated in place (it records no
// credentials' sum) is current when its hash, which held the password,
// matches with the current one: it runs them. One whose hash matches
// neither cannot say whether its spec or its credentials changed; in a
// fleet, which never rewrites a Proxy's spec in place, it is reported
// outdated, for the fleet to replace within its budget.
func (e *external) specCurrent(p *v1alpha1.Proxy, inst *backend.Instance, want backend.Spec) (bool, credentialsVerdict) {
	switch {
	case inst.SpecHash == want.Hash:
		return true, credentialsCurrent
	case inst.CredentialsSum != "" || want.Credentials == nil || inst.Phase == v1alpha1.InstancePhaseTerminated:
		return false, credentialsCurrent
	case inst.SpecHash == legacySpecHash(repairSpec(p, inst, want)):
		inst.CredentialsSum = credentialsSum(want.Credentials, inst.Name)
		return true, credentialsCurrent
	case fleetv1alpha1.FleetName(p) != "":
		return false, e.outdated(p, inst)
	}
	return false, credentialsCurrent
}

// rotate has the backend bring the credentials the instance accepts in line
// with want, at every observation: it compares with what the instance
// holds, so a rotation cut short, or a change reverted half-way, is put
// right. A failure other than the instance being unable to rotate is
// reported and retried, and the observation goes on: the probe says
// whether the proxy takes the new credentials.
func (e *external) rotate(ctx context.Context, p *v1alpha1.Proxy, inst *backend.Instance, want backend.Spec, rot backend.CredentialRotator) credentialsVerdict {
	now := e.now()
	var until time.Time
	if g := p.Spec.ForProvider.GracePeriod(); g > 0 {
		until = now.Add(g).Truncate(time.Second)
	}
	r, err := rot.RotateCredentials(ctx, want, until, now)
	if !errors.Is(err, backend.ErrNoRotation) {
		// An instance made before rotation is not a backend failure.
		e.countError("rotate", err)
	}
	switch {
	case errors.Is(err, backend.ErrNoRotation):
		return e.fixed(p, inst, want)
	case err != nil:
		e.record.Event(p, event.Warning(ReasonCannotRotateCredentials, errors.Wrapf(err, "cannot bring the credentials of instance %s in line with the auth Secret", inst.ProviderID)))
		if r == (backend.Rotation{}) {
			// Nothing was done: the instance is as observed.
			return credentialsCurrent
		}
	}
	inst.CredentialsSum, inst.PreviousCredentialsUntil = want.CredentialsSum, r.PreviousUntil
	switch {
	case r.Rotated && r.PreviousUntil.IsZero():
		e.record.Event(p, event.Normal(ReasonCredentialsRotated, fmt.Sprintf("instance %s accepts the new credentials, and no longer the previous ones", inst.ProviderID)))
	case r.Rotated:
		e.record.Event(p, event.Normal(ReasonCredentialsRotated, fmt.Sprintf("instance %s accepts the new credentials, and the previous ones until %s", inst.ProviderID, r.PreviousUntil.UTC().Format(time.RFC3339))))
	case r.Retired:
		e.record.Event(p, event.Normal(ReasonPreviousCredentialsRetired, fmt.Sprintf("instance %s accepts only the current credentials now", inst.ProviderID)))
	}
	return credentialsCurrent
}

// outdated reports an instance that accepts the previous credentials only
// and cannot change them in place, for its fleet to replace.
func (e *external) outdated(p *v1alpha1.Proxy, inst *backend.Instance) credentialsVerdict {
	if !p.Status.AtProvider.CredentialsOutdated {
		e.record.Event(p, event.Normal(ReasonCredentialsOutdated, fmt.Sprintf(
			"instance %s accepts the previous credentials only and cannot change them in place: it serves the crawlers that hold it until its fleet replaces it", inst.ProviderID)))
	}
	return credentialsOutdated
}

// recordCredentials writes what syncCredentials found into the status. A
// deadline already past is left out: the helper refuses those credentials
// by itself, whether or not they could be removed yet.
func recordCredentials(p *v1alpha1.Proxy, inst *backend.Instance, v credentialsVerdict, now time.Time) {
	ap := &p.Status.AtProvider
	ap.CredentialsOutdated = v == credentialsOutdated
	ap.PreviousCredentialsUntil = nil
	if now.Before(inst.PreviousCredentialsUntil) {
		ap.PreviousCredentialsUntil = &metav1.Time{Time: inst.PreviousCredentialsUntil}
	}
}
