// Package problem is how egress-discovery says no: an Error carries the
// HTTP status, the stable reason code (apiv1.Reason*), the field at fault
// and Retry-After, decided where the error arises; ToAPIError maps any
// other error to its answer (only the API server failing is a 503), and
// WriteError writes it as apiv1.Error JSON. The API, the gateway and
// authentication answer through it. One file: problem.go.
package problem

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	kerrors "k8s.io/apimachinery/pkg/api/errors"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// Error is an answer decided where the error arises: its status, its
// stable reason code, and Retry-After when the caller should come back.
type Error struct {
	Code       int
	Reason     string
	Field      string
	Msg        string
	RetryAfter int
}

func (e *Error) Error() string { return e.Msg }

// BadRequest is a 400 naming the field.
type BadRequest struct{ Field, Msg string }

func (b *BadRequest) Error() string { return b.Field + ": " + b.Msg }

// ErrFleetNotFound is a fleet with no proxies, or none the caller may see.
var ErrFleetNotFound = errors.New("fleet not found (or it has no proxies)")

// Errors of authentication and authorisation, answered 401 and 403.
var (
	ErrUnauthenticated = errors.New("missing or invalid bearer token")
	ErrForbidden       = errors.New("not allowed to use this fleet")
	// ErrWrongAudience is a valid token issued for another audience, such
	// as the API server's; it is answered 401 too, but says so.
	ErrWrongAudience = errors.New("the bearer token was not issued for egress-discovery's audience: ask for one with kubectl create token <sa> --audience egress-discovery, or mount a projected token with that audience")
)

// WriteJSON writes v as JSON with status code.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// WriteError answers e: its status, Retry-After, a Bearer challenge to
// a 401, and the apiv1.Error body.
func WriteError(w http.ResponseWriter, e *Error) {
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	if e.Code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="egress-discovery"`)
	}
	WriteJSON(w, e.Code, apiv1.Error{Error: apiv1.ErrorDetail{Code: e.Code, Reason: e.Reason, Message: e.Msg, Field: e.Field}})
}

// ToAPIError maps an error to its answer. Only the API server failing is a
// 503; an error the caller or the fleet's owner must put right is a 4xx
// that says so.
func ToAPIError(err error) *Error {
	var ae *Error
	var br *BadRequest
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &br):
		return &Error{Code: http.StatusBadRequest, Reason: apiv1.ReasonInvalid, Field: br.Field, Msg: br.Error()}
	case errors.As(err, &mbe):
		return &Error{Code: http.StatusRequestEntityTooLarge, Reason: apiv1.ReasonBodyTooLarge, Msg: fmt.Sprintf("request body larger than %d bytes", mbe.Limit)}
	case errors.Is(err, ErrWrongAudience):
		return &Error{Code: http.StatusUnauthorized, Reason: apiv1.ReasonWrongAudience, Msg: err.Error()}
	case errors.Is(err, ErrUnauthenticated):
		return &Error{Code: http.StatusUnauthorized, Reason: apiv1.ReasonUnauthenticated, Msg: "authenticate with a bearer token: a ServiceAccount token or a static token"}
	case errors.Is(err, lease.ErrNotYours):
		return &Error{Code: http.StatusForbidden, Reason: apiv1.ReasonNotYourLease, Msg: err.Error()}
	case errors.Is(err, ErrForbidden):
		return &Error{Code: http.StatusForbidden, Reason: apiv1.ReasonForbidden, Msg: err.Error() + ": ask for verb \"use\" on " + fleetv1alpha1.ProxyFleetResource + "." + fleetv1alpha1.Group + " in the fleet's namespace"}
	case errors.Is(err, lease.ErrInvalidTTL):
		return &Error{Code: http.StatusBadRequest, Reason: apiv1.ReasonInvalid, Field: "ttl", Msg: err.Error()}
	case errors.Is(err, lease.ErrNotFound):
		return &Error{Code: http.StatusNotFound, Reason: apiv1.ReasonLeaseNotFound, Msg: err.Error() + ": it expired, was released or was taken over; take a new one"}
	case errors.Is(err, ErrFleetNotFound):
		return &Error{Code: http.StatusNotFound, Reason: apiv1.ReasonFleetNotFound, Msg: err.Error()}
	case errors.As(err, new(*catalog.SecretError)):
		// The fleet's owner must fix it; retrying changes nothing.
		return &Error{Code: http.StatusNotFound, Reason: apiv1.ReasonSecretNotFound, Msg: err.Error()}
	case kerrors.IsForbidden(err) || kerrors.IsUnauthorized(err):
		// The API server refuses discovery itself: its RBAC is wrong,
		// which a retry does not mend. The details (its ServiceAccount,
		// what it was refused) are logged, not told to the caller.
		return &Error{Code: http.StatusInternalServerError, Reason: apiv1.ReasonInternal, Msg: "egress-discovery's own ServiceAccount is refused by the Kubernetes API server: tell the platform team, who will find the details in its log"}
	default:
		// What failed, and where, is logged: the API server's addresses
		// and errors are nothing a caller, authenticated or not, needs.
		return &Error{Code: http.StatusServiceUnavailable, Reason: apiv1.ReasonAPIServerUnavailable, RetryAfter: 1, Msg: "the Kubernetes API server is unreachable or failing; try again" + apiErrorSummary(err)}
	}
}

func apiErrorSummary(err error) string {
	if kerrors.IsTimeout(err) || kerrors.IsServerTimeout(err) || errors.Is(err, context.DeadlineExceeded) {
		return ": timeout"
	}
	return ""
}

// ReasonOf is the reason code an error is answered with, which metrics
// count refusals by.
func ReasonOf(err error) string {
	var r interface{ ProblemReason() string }
	if errors.As(err, &r) {
		return r.ProblemReason()
	}
	return ToAPIError(err).Reason
}

// The statuses the allocator refuses with, named here so that it needs no
// net/http: it decides what a refusal is, the API and the gateway how it
// is answered.
const (
	StatusConflict            = http.StatusConflict
	StatusTooManyRequests     = http.StatusTooManyRequests
	StatusInternalServerError = http.StatusInternalServerError
)
