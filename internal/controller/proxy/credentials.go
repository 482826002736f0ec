package proxy

import (
	"context"
	"fmt"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/pkg/errors"
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
func (e *external) syncCredentials(ctx context.Context, p *v1alpha1.Proxy, inst *backend.Instance, want backend.Spec) (credentialsVerdict, error) {
	if want.Credentials == nil || inst.Phase == v1alpha1.InstancePhaseTerminated {
		return credentialsCurrent, nil
	}
	want = repairSpec(p, inst, want)
	want.CredentialsSum = credentialsSum(want.Credentials, inst.Name)
	rot, inPlace := e.backend.(backend.CredentialRotator)
	now := e.now()
	switch {
	case inst.CredentialsSum == want.CredentialsSum:
		if !inPlace || inst.PreviousCredentialsUntil.IsZero() || now.Before(inst.PreviousCredentialsUntil) || !allows(p, xpv2.ManagementActionUpdate) {
			return credentialsCurrent, nil
		}
		// The grace is over. The helper refuses the previous ones by
		// itself from the deadline on; this removes them.
		err := rot.RotateCredentials(ctx, want, time.Time{})
		e.countError("rotate", err)
		if err != nil {
			return credentialsCurrent, errors.Wrapf(err, "cannot drop the previous credentials of instance %s", inst.ProviderID)
		}
		inst.PreviousCredentialsUntil = time.Time{}
		e.record.Event(p, event.Normal(ReasonPreviousCredentialsRetired, fmt.Sprintf("instance %s accepts only the current credentials now", inst.ProviderID)))
		return credentialsCurrent, nil
	case inPlace:
		if !allows(p, xpv2.ManagementActionUpdate) {
			return credentialsReplace, nil
		}
		var until time.Time
		if g := p.Spec.ForProvider.GracePeriod(); g > 0 {
			until = now.Add(g).Truncate(time.Second)
		}
		err := rot.RotateCredentials(ctx, want, until)
		e.countError("rotate", err)
		if err != nil {
			if backend.ClassOf(err) == backend.ClassPermanent {
				// Made before its credentials could rotate (an imported
				// instance, say): replaced instead, as the diff says.
				return credentialsReplace, nil
			}
			err = errors.Wrapf(err, "cannot change the credentials of instance %s in place", inst.ProviderID)
			e.record.Event(p, event.Warning(ReasonCannotRotateCredentials, err))
			return credentialsCurrent, err
		}
		inst.CredentialsSum, inst.PreviousCredentialsUntil = want.CredentialsSum, until
		msg := fmt.Sprintf("instance %s accepts the new credentials, and no longer the previous ones", inst.ProviderID)
		if !until.IsZero() {
			msg = fmt.Sprintf("instance %s accepts the new credentials, and the previous ones until %s", inst.ProviderID, until.UTC().Format(time.RFC3339))
		}
		e.record.Event(p, event.Normal(ReasonCredentialsRotated, msg))
		return credentialsCurrent, nil
	case fleetv1alpha1.FleetName(p) != "":
		if !p.Status.AtProvider.CredentialsOutdated {
			e.record.Event(p, event.Normal(ReasonCredentialsOutdated, fmt.Sprintf(
				"instance %s accepts the previous credentials only and cannot change them in place: it serves the crawlers that hold it until its fleet replaces it", inst.ProviderID)))
		}
		return credentialsOutdated, nil
	default:
		return credentialsReplace, nil
	}
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
