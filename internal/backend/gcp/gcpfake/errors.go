package gcpfake

import (
	"fmt"
	"net/http"
)

// GCP's legacy error reasons and codes the fake answers with.
const (
	reasonQuota         = "quotaExceeded"
	reasonRateLimit     = "rateLimitExceeded"
	reasonNotConfigured = "accessNotConfigured"
	reasonForbidden     = "forbidden"
	codeQuota           = "QUOTA_EXCEEDED"
	domainGoogleAPIs    = "googleapis.com"
)

// The failures below are Compute Engine's own answers, with the status,
// reason and message wording it uses, for tests to script with Fail (as an
// HTTP answer) or FailOperation (as the error of an accepted request's
// operation, where GCP puts an upper-case code in Reason).

// Stockout is a zone out of capacity, as an operation error.
func Stockout(project, zone string) Failure {
	return Failure{Code: http.StatusServiceUnavailable, Reason: "ZONE_RESOURCE_POOL_EXHAUSTED", Times: -1,
		Message: fmt.Sprintf("The zone 'projects/%s/zones/%s' does not have enough resources available to fulfill the request.  Try a different zone, or try again later.", project, zone)}
}

// StockoutWithDetails is the newer wording of a stockout.
func StockoutWithDetails(project, zone string) Failure {
	f := Stockout(project, zone)
	f.Reason = "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"
	f.Message = fmt.Sprintf("The zone 'projects/%s/zones/%s' does not have enough resources available to fulfill the request.  '(resource type:compute)'.", project, zone)
	return f
}

// QuotaInOperation is a quota exceeded, found after the insert was
// accepted.
func QuotaInOperation(metric, region string) Failure {
	return Failure{Code: http.StatusForbidden, Reason: codeQuota, Times: -1,
		Message: fmt.Sprintf("Quota '%s' exceeded.  Limit: 8.0 in region %s.", metric, region)}
}

// Quota is a quota exceeded, answered at once.
func Quota(metric, region string) Failure {
	return Failure{Code: http.StatusForbidden, Reason: reasonQuota, Times: -1,
		Message: fmt.Sprintf("Quota '%s' exceeded.  Limit: 8.0 in region %s.", metric, region)}
}

// OrgPolicyExternalIP is the organisation policy that forbids external
// IPs, which this backend's design needs.
func OrgPolicyExternalIP(project, zone, name string) Failure {
	return Failure{Code: http.StatusPreconditionFailed, Reason: reasonConditionNotMet, Times: -1,
		Message: fmt.Sprintf("Constraint constraints/compute.vmExternalIpAccess violated for project %s. Add instance projects/%s/zones/%s/instances/%s to the constraint to use external IP with it.", project, project, zone, name)}
}

// OrgPolicyShieldedVM is the organisation policy that demands Shielded VMs.
func OrgPolicyShieldedVM(project string) Failure {
	return Failure{Code: http.StatusPreconditionFailed, Reason: reasonConditionNotMet, Times: -1,
		Message: fmt.Sprintf("Constraint constraints/compute.requireShieldedVm violated for project %s. Secure Boot is not enabled in the 'shielded_instance_config' field.", project)}
}

// AccessNotConfigured is the Compute API not enabled in the project (or
// enabled a moment ago).
func AccessNotConfigured(projectNumber string) Failure {
	return Failure{Code: http.StatusForbidden, Reason: reasonNotConfigured, Times: -1,
		Message: fmt.Sprintf("Compute Engine API has not been used in project %s before or it is disabled. Enable it by visiting https://console.developers.google.com/apis/api/compute.googleapis.com/overview?project=%s then retry. If you enabled this API recently, wait a few minutes for the action to propagate to our systems and retry.", projectNumber, projectNumber)}
}

// IAMDenied is a permission the caller lacks, perhaps only until a grant
// propagates.
func IAMDenied(permission, resource string) Failure {
	return Failure{Code: http.StatusForbidden, Reason: reasonForbidden, Times: -1,
		Message: fmt.Sprintf("Required '%s' permission for '%s'", permission, resource)}
}

// RateLimited is the API's per-minute rate limit.
func RateLimited() Failure {
	return Failure{Code: http.StatusTooManyRequests, Reason: reasonRateLimit, Times: -1,
		Message: "Rate Limit Exceeded"}
}

// NotReady is a resource with an operation still running on it.
func NotReady(resource string) Failure {
	return Failure{Code: http.StatusBadRequest, Reason: "resourceNotReady", Times: -1,
		Message: fmt.Sprintf("The resource '%s' is not ready", resource)}
}
