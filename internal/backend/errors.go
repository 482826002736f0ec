package backend

import (
	"fmt"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"k8s.io/apimachinery/pkg/types"
)

// Class sorts backend errors by what the reconciler should do about them.
type Class string

// Error classes. Each maps to a condition reason and a retry policy.
const (
	// ClassNotFound means the instance does not exist.
	ClassNotFound Class = "NotFound"
	// ClassTransient errors are retried with the controller's backoff.
	ClassTransient Class = "Transient"
	// ClassThrottled errors (rate limits) are transient, retried after a
	// short, growing backoff.
	ClassThrottled Class = "Throttled"
	// ClassStockout means the zone has no capacity for the instance right
	// now: transient, retried after a growing backoff. The error names the
	// zone.
	ClassStockout Class = "ZoneExhausted"
	// ClassAccessDenied means the backend refused access in a way that
	// often heals by itself: an API being enabled, an IAM grant still
	// propagating. It is retried with a growing backoff, and counts as
	// permanent after AccessDeniedAttempts failures in a row.
	ClassAccessDenied Class = "AccessDenied"
	// ClassQuota errors are retried no sooner than a long, growing backoff.
	ClassQuota Class = "QuotaExceeded"
	// ClassPermanent errors latch until the Proxy's spec changes.
	ClassPermanent Class = "PermanentError"
)

// ErrHeldElsewhere is an Adopt refused because the instance (or something
// made for it) no longer belongs to the Proxy it is adopted from: another
// Proxy imported it first. It is transient: the importer retries, and its
// record then says whose it is.
var ErrHeldElsewhere = errors.New("held by another Proxy")

// HeldElsewhere is the error of an Adopt of what, which belongs to Proxy
// uid holder rather than from: it is ErrHeldElsewhere (errors.Is), and
// says whose it is.
func HeldElsewhere(what string, holder, from types.UID) error {
	return &Error{Class: ClassTransient, Err: heldElsewhere(fmt.Sprintf("%s belongs to Proxy uid %s now, not %s", what, holder, from))}
}

// heldElsewhere is ErrHeldElsewhere with its particulars.
type heldElsewhere string

func (e heldElsewhere) Error() string        { return string(e) }
func (e heldElsewhere) Is(target error) bool { return target == ErrHeldElsewhere }

// Error is a backend error with its class.
type Error struct {
	Class Class
	Err   error
}

func (e *Error) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// Wrap classifies err; a nil err stays nil.
func Wrap(c Class, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Class: c, Err: err}
}

// Errorf returns a classified error.
func Errorf(c Class, format string, args ...any) error {
	return &Error{Class: c, Err: errors.Errorf(format, args...)}
}

// ClassOf returns the class of err. It looks through wrapping and joined
// errors (errors.As follows multi-error Unwrap) and picks the most severe
// class found, so a joined quota and transient error counts as quota.
// Unclassified errors are transient.
func ClassOf(err error) Class {
	if err == nil {
		return ""
	}
	best := Class("")
	var walk func(error)
	walk = func(e error) {
		var be *Error
		if errors.As(e, &be) && severity(be.Class) > severity(best) {
			best = be.Class
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, inner := range j.Unwrap() {
				walk(inner)
			}
		}
	}
	walk(err)
	if best == "" {
		return ClassTransient
	}
	return best
}

// AccessDeniedAttempts is how many AccessDenied failures in a row are
// waited out, about a quarter of an hour with Backoff, before the error
// counts as permanent.
const AccessDeniedAttempts = 6

func severity(c Class) int {
	return map[Class]int{
		ClassNotFound: 1, ClassTransient: 2, ClassThrottled: 3, ClassStockout: 4,
		ClassAccessDenied: 5, ClassQuota: 6, ClassPermanent: 7,
	}[c]
}

// IsNotFound reports whether err says the instance does not exist.
func IsNotFound(err error) bool { return err != nil && ClassOf(err) == ClassNotFound }

// Backoff says how long to wait before retrying a create that failed
// failures times in a row with an error of class c. Transient errors are left
// to the controller's own rate limiter (zero); rate limits wait 10s, doubling
// to 2 minutes; stockouts, access and quota errors wait 30s, doubling to a 5
// minute cap; permanent errors wait until the spec changes, which the caller
// handles, so Backoff returns the cap for them.
func Backoff(c Class, failures int) time.Duration {
	base, limit := 30*time.Second, 5*time.Minute
	switch c {
	case ClassThrottled:
		base, limit = 10*time.Second, 2*time.Minute
	case ClassStockout, ClassAccessDenied, ClassQuota, ClassPermanent:
	default:
		return 0
	}
	d := base
	for i := 1; i < failures && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// A PartialList is ListOwned's error when part of what it lists could not
// be read: a cloud's openings without the permission to list them (GCP's
// firewall rules without compute.firewalls.list, EC2's security groups
// without ec2:DescribeSecurityGroups: cloudvm.OpeningsUnlisted), or a GCP
// zone in an outage. The instances it returns with it are all the others,
// complete, and may be collected; Skipped names what was not listed. Any
// other error of ListOwned means its list is not to be used.
type PartialList struct {
	Skipped string
	Err     error
}

func (e *PartialList) Error() string { return e.Skipped + " not listed: " + e.Err.Error() }

// Unwrap returns the error that kept part of the list unread.
func (e *PartialList) Unwrap() error { return e.Err }
