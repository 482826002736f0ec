package cloudvm

import (
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
)

// OpeningsUnlisted is the error of a listing of a cloud's openings (GCP
// firewall rules, EC2 security groups) that failed after the instances
// were listed. Refused for access (a role from before openings were
// collected), the instances are still collected and the skip is reported
// as a backend.PartialList naming skipped; anything else (a refused
// filter, a rate limit, a 5xx) fails the whole listing, so that the orphan
// collector never takes a gap for an empty list. err is already
// classified by the cloud; what names the openings in the error.
func OpeningsUnlisted(err error, skipped, what string) error {
	if backend.ClassOf(err) == backend.ClassAccessDenied {
		return &backend.PartialList{Skipped: skipped, Err: err}
	}
	return errors.Wrapf(err, "cannot list %s", what)
}

// WithOpenings is ListOwned's answer from the listed instances and the
// unused openings: both, with the PartialList when the openings were
// skipped; nothing, with the error, when their listing failed otherwise.
func WithOpenings(instances, openings []backend.Instance, err error) ([]backend.Instance, error) {
	var partial *backend.PartialList
	if err != nil && !errors.As(err, &partial) {
		return nil, err
	}
	return append(instances, openings...), err
}
