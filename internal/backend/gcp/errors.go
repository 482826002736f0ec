package gcp

import (
	"net/http"
	"regexp"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/googleapis/gax-go/v2/apierror"
	"google.golang.org/api/googleapi"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
)

// Classify sorts a Compute API error into the backend taxonomy. Errors that
// arrive in an operation (the client library turns them into the same
// error type, with the operation's codes in the message) are sorted alike:
//
//   - a stockout (ZONE_RESOURCE_POOL_EXHAUSTED*, 503) is ZoneExhausted;
//   - not found is NotFound (Create turns it into Permanent: on an insert
//     it names a missing network, image or subnetwork);
//   - quota (quotaExceeded, QUOTA_EXCEEDED, any *_QUOTA) is QuotaExceeded;
//   - 429 and rate limits are Throttled;
//   - 400 resourceNotReady (an operation still running) is Transient;
//   - 412 conditionNotMet (an organisation policy) is Permanent;
//   - 401 and 403 (API not enabled, IAM not yet propagated) are
//     AccessDenied, which turns permanent after some tries;
//   - other 5xx are Transient, other 4xx Permanent.
//
// GCP's own message is kept.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	code, reasons, msg := 0, "", err.Error()
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		code = ge.Code
		for _, e := range ge.Errors {
			reasons += " " + e.Reason
		}
		if ge.Message != "" && !strings.Contains(msg, ge.Message) {
			msg += ": " + ge.Message
		}
	}
	var ae *apierror.APIError
	if errors.As(err, &ae) && code == 0 {
		code = ae.HTTPCode()
	}
	info, _ := errorInfo(err)
	reasons += " " + info
	lower := strings.ToLower(reasons + " " + msg)
	has := func(subs ...string) bool {
		for _, sub := range subs {
			if strings.Contains(lower, sub) {
				return true
			}
		}
		return false
	}
	var c backend.Class
	switch {
	case has("zone_resource_pool_exhausted", "does not have enough resources available"):
		c = backend.ClassStockout
	case code == http.StatusNotFound:
		c = backend.ClassNotFound
	case has("quotaexceeded", "quota_exceeded", "_quota", "quota '"):
		c = backend.ClassQuota
	case code == http.StatusTooManyRequests, has("ratelimitexceeded", "rate_limit_exceeded"):
		c = backend.ClassThrottled
	case has("resourcenotready", "is not ready"):
		c = backend.ClassTransient
	case code == http.StatusPreconditionFailed:
		c = backend.ClassPermanent
	case code == http.StatusUnauthorized, code == http.StatusForbidden:
		c = backend.ClassAccessDenied
	case code >= 500, code == 0:
		c = backend.ClassTransient
	default:
		c = backend.ClassPermanent
	}
	return backend.Wrap(c, err)
}

// insertError classifies an error of an insert: not found there means a
// resource the request refers to is missing, which retrying cannot fix.
func insertError(err error, what string) error {
	c := Classify(err)
	if backend.ClassOf(c) == backend.ClassNotFound {
		return backend.Wrap(backend.ClassPermanent, errors.Wrapf(err, "%s: a resource it refers to does not exist", what))
	}
	if backend.ClassOf(c) == backend.ClassStockout {
		return errors.Wrapf(c, "%s: the zone has no capacity for it now; it is retried later, or move the proxy to another zone", what)
	}
	if p := deniedPermission(err); p == permUseExternalIP {
		// Every proxy VM leaves through an external address of its own,
		// whichever address it publishes: the grant is the only way.
		return errors.Wrapf(c, errFmtNoExternalIPGrant, what, permUseExternalIP)
	}
	return errors.Wrap(c, what)
}

// errorInfo is the reason and metadata of the google.rpc.ErrorInfo in an
// error's details. The REST client answers a *googleapi.Error whose body
// also holds the legacy errors[] list, which apierror's strict parse of
// the body refuses, so the details are read here, as the JSON decoded
// them; an error of another kind goes through apierror.
func errorInfo(err error) (string, map[string]string) {
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		for _, d := range ge.Details {
			m, ok := d.(map[string]any)
			if !ok || m["@type"] != "type.googleapis.com/google.rpc.ErrorInfo" {
				continue
			}
			reason, _ := m["reason"].(string)
			md := map[string]string{}
			if raw, ok := m["metadata"].(map[string]any); ok {
				for k, v := range raw {
					if s, ok := v.(string); ok {
						md[k] = s
					}
				}
			}
			return reason, md
		}
		return "", nil
	}
	if ae, ok := apierror.FromError(err); ok {
		return ae.Reason(), ae.Metadata()
	}
	return "", nil
}

// errFmtNoExternalIPGrant wraps an insert refused for want of
// permUseExternalIP: what was inserted, the permission.
const errFmtNoExternalIPGrant = "%s: the provider's service account may not give a VM an external address in this subnetwork, " +
	"which every proxy VM needs as its egress address; grant %s on it (in a Shared VPC, in the host project: roles/compute.networkUser holds it)"

// permUseExternalIP is the permission a VM with an external address needs
// on its subnetwork, which a Shared VPC's host project grants separately.
const permUseExternalIP = "compute.subnetworks.useExternalIp"

// deniedPermission is the permission an IAM refusal names: from its
// google.rpc.ErrorInfo, or from the message's "Required 'P' permission"
// where the body carries none.
func deniedPermission(err error) string {
	if _, md := errorInfo(err); md["permission"] != "" {
		return md["permission"]
	}
	if m := requiredPermission.FindStringSubmatch(err.Error()); m != nil {
		return m[1]
	}
	return ""
}

var requiredPermission = regexp.MustCompile(`Required '([^']+)' permission`)

func isConflict(err error) bool {
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		return ge.Code == http.StatusConflict
	}
	var ae *apierror.APIError
	return errors.As(err, &ae) && ae.HTTPCode() == http.StatusConflict
}

// labelError classifies an error of setLabels: a 412 there is the label
// fingerprint having moved since the VM was read (another writer, a race
// of two imports), which the next try reads afresh; Classify takes any
// other 412 for an organisation policy, which no retry fixes.
func labelError(err error) error {
	c := Classify(err)
	if err != nil && backend.ClassOf(c) == backend.ClassPermanent && strings.Contains(strings.ToLower(err.Error()), "fingerprint") {
		var ge *googleapi.Error
		var ae *apierror.APIError
		if (errors.As(err, &ge) && ge.Code == http.StatusPreconditionFailed) || (errors.As(err, &ae) && ae.HTTPCode() == http.StatusPreconditionFailed) {
			return backend.Wrap(backend.ClassTransient, errors.Wrap(err, "the VM's labels changed since they were read: retrying"))
		}
	}
	return c
}
