package aws

import (
	"github.com/aws/smithy-go"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
)

// code is the EC2 error code of err, empty when it has none.
func code(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// classes sorts EC2's error codes into the backend's classes; a code not
// listed is transient.
var classes = map[string]backend.Class{
	"InvalidInstanceID.NotFound": backend.ClassNotFound,
	"InvalidGroup.NotFound":      backend.ClassNotFound,
	// No capacity for the type in the zone now: another zone, or later.
	"InsufficientInstanceCapacity":       backend.ClassStockout,
	"InsufficientHostCapacity":           backend.ClassStockout,
	"InsufficientCapacity":               backend.ClassStockout,
	"InstanceLimitExceeded":              backend.ClassQuota,
	"VcpuLimitExceeded":                  backend.ClassQuota,
	"AddressLimitExceeded":               backend.ClassQuota,
	"SecurityGroupLimitExceeded":         backend.ClassQuota,
	"RulesPerSecurityGroupLimitExceeded": backend.ClassQuota,
	"VolumeLimitExceeded":                backend.ClassQuota,
	"MaxSpotInstanceCountExceeded":       backend.ClassQuota,
	// What the SDK's retryer gave up on.
	"RequestLimitExceeded": backend.ClassThrottled,
	"Throttling":           backend.ClassThrottled,
	"ThrottlingException":  backend.ClassThrottled,
	// IAM grants propagate, accounts get verified: waited out a while.
	"UnauthorizedOperation": backend.ClassAccessDenied,
	"AuthFailure":           backend.ClassAccessDenied,
	"PendingVerification":   backend.ClassAccessDenied,
	"Blocked":               backend.ClassAccessDenied,
	// What no retry fixes until the spec or the account changes.
	"InvalidParameterValue":       backend.ClassPermanent,
	"InvalidParameterCombination": backend.ClassPermanent,
	"InvalidParameter":            backend.ClassPermanent,
	"MissingParameter":            backend.ClassPermanent,
	"InvalidAMIID.Malformed":      backend.ClassPermanent,
	"InvalidAMIID.NotFound":       backend.ClassPermanent,
	"InvalidAMIID.Unavailable":    backend.ClassPermanent,
	"InvalidSubnetID.NotFound":    backend.ClassPermanent,
	"InvalidSubnetID.Malformed":   backend.ClassPermanent,
	"InvalidVpcID.NotFound":       backend.ClassPermanent,
	"InvalidGroupId.Malformed":    backend.ClassPermanent,
	"Unsupported":                 backend.ClassPermanent,
	"OptInRequired":               backend.ClassPermanent,
	"TagLimitExceeded":            backend.ClassPermanent,
	"InvalidUserData.Malformed":   backend.ClassPermanent,
	"IdempotentParameterMismatch": backend.ClassTransient,
}

// Classify sorts an EC2 API error into the backend taxonomy, keeping
// EC2's code and message; errors without a code are transient.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	c, ok := classes[code(err)]
	if !ok {
		c = backend.ClassTransient
	}
	return backend.Wrap(c, err)
}
