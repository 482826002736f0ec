package backend

import (
	"time"

	"github.com/pkg/errors"
)

// Class sorts backend errors by what the reconciler should do about them.
type Class string

// Error classes. Each maps to a condition reason and a retry policy.
const (
	// ClassNotFound means the instance does not exist.
	ClassNotFound Class = "NotFound"
	// ClassTransient errors are retried with the controller's backoff.
	ClassTransient Class = "Transient"
	// ClassQuota errors are retried no sooner than a long, growing backoff.
	ClassQuota Class = "QuotaExceeded"
	// ClassPermanent errors latch until the Proxy's spec changes.
	ClassPermanent Class = "PermanentError"
)

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

func severity(c Class) int {
	switch c {
	case ClassNotFound:
		return 1
	case ClassTransient:
		return 2
	case ClassQuota:
		return 3
	case ClassPermanent:
		return 4
	}
	return 0
}

// IsNotFound reports whether err says the instance does not exist.
func IsNotFound(err error) bool { return err != nil && ClassOf(err) == ClassNotFound }

// Backoff says how long to wait before retrying a create that failed
// failures times in a row with an error of class c. Transient errors are left
// to the controller's own rate limiter (zero); quota errors wait 30s, doubling
// to a 5 minute cap; permanent errors wait until the spec changes, which the
// caller handles, so Backoff returns the cap for them.
func Backoff(c Class, failures int) time.Duration {
	const (
		quotaBase = 30 * time.Second
		quotaCap  = 5 * time.Minute
	)
	switch c {
	case ClassQuota, ClassPermanent:
		d := quotaBase
		for i := 1; i < failures && d < quotaCap; i++ {
			d *= 2
		}
		return min(d, quotaCap)
	default:
		return 0
	}
}
