package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/pkg/errors"
	kerrors "k8s.io/apimachinery/pkg/api/errors"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// Error is an answer decided where the error arises: its status, its
// stable reason code, and Retry-After when the caller should come back.
type Error struct {
	code       int
	reason     string
	field      string
	msg        string
	retryAfter int
}

func (e *Error) Error() string { return e.msg }

// BadRequest is a 400 naming the field.
type BadRequest struct{ field, msg string }

func (b *BadRequest) Error() string { return b.field + ": " + b.msg }

var ErrFleetNotFound = errors.New("fleet not found (or it has no proxies)")

func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func WriteError(w http.ResponseWriter, e *Error) {
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	if e.code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="egress-discovery"`)
	}
	WriteJSON(w, e.code, apiv1.Error{Error: apiv1.ErrorDetail{Code: e.code, Reason: e.reason, Message: e.msg, Field: e.field}})
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
		return &Error{code: http.StatusBadRequest, reason: apiv1.ReasonInvalid, field: br.field, msg: br.Error()}
	case errors.As(err, &mbe):
		return &Error{code: http.StatusRequestEntityTooLarge, reason: apiv1.ReasonBodyTooLarge, msg: fmt.Sprintf("request body larger than %d bytes", mbe.Limit)}
	case errors.Is(err, ErrWrongAudience):
		return &Error{code: http.StatusUnauthorized, reason: apiv1.ReasonWrongAudience, msg: err.Error()}
	case errors.Is(err, ErrUnauthenticated):
		return &Error{code: http.StatusUnauthorized, reason: apiv1.ReasonUnauthenticated, msg: "authenticate with a bearer token: a ServiceAccount token or a static token"}
	case errors.Is(err, lease.ErrNotYours):
		return &Error{code: http.StatusForbidden, reason: apiv1.ReasonNotYourLease, msg: err.Error()}
	case errors.Is(err, ErrForbidden):
		return &Error{code: http.StatusForbidden, reason: apiv1.ReasonForbidden, msg: err.Error() + ": ask for verb \"use\" on " + fleetv1alpha1.ProxyFleetResource + "." + fleetv1alpha1.Group + " in the fleet's namespace"}
	case errors.Is(err, lease.ErrInvalidTTL):
		return &Error{code: http.StatusBadRequest, reason: apiv1.ReasonInvalid, field: "ttl", msg: err.Error()}
	case errors.Is(err, lease.ErrNotFound):
		return &Error{code: http.StatusNotFound, reason: apiv1.ReasonLeaseNotFound, msg: err.Error() + ": it expired, was released or was taken over; take a new one"}
	case errors.Is(err, ErrFleetNotFound):
		return &Error{code: http.StatusNotFound, reason: apiv1.ReasonFleetNotFound, msg: err.Error()}
	case errors.As(err, new(*catalog.SecretError)):
		// The fleet's owner must fix it; retrying changes nothing.
		return &Error{code: http.StatusNotFound, reason: apiv1.ReasonSecretNotFound, msg: err.Error()}
	case kerrors.IsForbidden(err) || kerrors.IsUnauthorized(err):
		// The API server refuses discovery itself: its RBAC is wrong,
		// which a retry does not mend. The details (its ServiceAccount,
		// what it was refused) are logged, not told to the caller.
		return &Error{code: http.StatusInternalServerError, reason: apiv1.ReasonInternal, msg: "egress-discovery's own ServiceAccount is refused by the Kubernetes API server: tell the platform team, who will find the details in its log"}
	default:
		// What failed, and where, is logged: the API server's addresses
		// and errors are nothing a caller, authenticated or not, needs.
		return &Error{code: http.StatusServiceUnavailable, reason: apiv1.ReasonAPIServerUnavailable, retryAfter: 1, msg: "the Kubernetes API server is unreachable or failing; try again" + apiErrorSummary(err)}
	}
}

// fail answers an error; one of discovery's own (5xx) is logged, unless
// the caller went away.
func (s *Server) fail(w http.ResponseWriter, err error) {
	e := ToAPIError(err)
	if e.code >= 500 && !errors.Is(err, context.Canceled) {
		s.Log.Info("Request failed", "error", err)
	}
	WriteError(w, e)
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
	var ge *gwError
	if errors.As(err, &ge) {
		return ge.reason
	}
	return ToAPIError(err).reason
}
