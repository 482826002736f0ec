package discovery

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/google/go-cmp/cmp"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

func TestFail(t *testing.T) {
	type want struct {
		code         int
		field        string
		authenticate bool   // a WWW-Authenticate challenge
		reason       string // the body's reason code
	}
	cases := map[string]struct {
		reason      string
		err         error
		want        want
		wantMessage string // a part of it
	}{
		"BadRequest": {
			reason:      "A bad request is 400 naming its field.",
			err:         &problem.BadRequest{Field: "ttl", Msg: "must be at least 1s"},
			want:        want{code: http.StatusBadRequest, field: "ttl", reason: "Invalid"},
			wantMessage: "ttl: must be at least 1s",
		},
		"WrappedBadRequest": {
			reason:      "A bad request is found through wrapping.",
			err:         fmt.Errorf("reading: %w", &problem.BadRequest{Field: "holder", Msg: "is required"}),
			want:        want{code: http.StatusBadRequest, field: "holder", reason: "Invalid"},
			wantMessage: "holder: is required",
		},
		"TooLarge": {
			reason:      "A body over the limit is 413 and says the limit.",
			err:         &http.MaxBytesError{Limit: maxBody},
			want:        want{code: http.StatusRequestEntityTooLarge, reason: "BodyTooLarge"},
			wantMessage: fmt.Sprint(maxBody),
		},
		"Unauthenticated": {
			reason:      "No valid token is 401 with a Bearer challenge.",
			err:         auth.ErrUnauthenticated,
			want:        want{code: http.StatusUnauthorized, authenticate: true, reason: "Unauthenticated"},
			wantMessage: "bearer token",
		},
		"Forbidden": {
			reason:      "A fleet the caller may not use is 403 and says which permission to ask for.",
			err:         errors.Wrap(auth.ErrForbidden, "team-b/crawlers"),
			want:        want{code: http.StatusForbidden, reason: "Forbidden"},
			wantMessage: `verb "use" on proxyfleets`,
		},
		"InvalidTTL": {
			reason:      "A TTL no Lease object can carry is the caller's fault, not the API server's.",
			err:         lease.ErrInvalidTTL,
			want:        want{code: http.StatusBadRequest, field: "ttl", reason: "Invalid"},
			wantMessage: "between 1s",
		},
		"LeaseNotFound": {
			reason:      "A lease that is gone or not the caller's is 404.",
			err:         lease.ErrNotFound,
			want:        want{code: http.StatusNotFound, reason: "LeaseNotFound"},
			wantMessage: lease.ErrNotFound.Error(),
		},
		"FleetNotFound": {
			reason:      "An unknown fleet is 404.",
			err:         problem.ErrFleetNotFound,
			want:        want{code: http.StatusNotFound, reason: "FleetNotFound"},
			wantMessage: problem.ErrFleetNotFound.Error(),
		},
		"WrongAudience": {
			reason:      "A token for another audience is 401 and says so.",
			err:         auth.ErrWrongAudience,
			want:        want{code: http.StatusUnauthorized, authenticate: true, reason: "WrongAudience"},
			wantMessage: "--audience egress-discovery",
		},
		"NotYourLease": {
			reason:      "Another identity's lease is 403.",
			err:         lease.ErrNotYours,
			want:        want{code: http.StatusForbidden, reason: "NotYourLease"},
			wantMessage: "another identity",
		},
		"SecretMissing": {
			reason:      "A fleet whose auth Secret is missing is 404 naming it, not 503: retrying does not mend it.",
			err:         &catalog.SecretError{Proxy: "crawlers-0", Reason: "Secret team-a/auth not found"},
			want:        want{code: http.StatusNotFound, reason: "SecretNotFound"},
			wantMessage: "Secret team-a/auth not found",
		},
		"DiscoveryRefused": {
			reason:      "The API server refusing discovery itself is 500: its RBAC is wrong, and a retry does not mend it.",
			err:         kerrors.NewForbidden(schema.GroupResource{Resource: "leases"}, "x", errors.New("no RBAC")),
			want:        want{code: http.StatusInternalServerError, reason: "Internal"},
			wantMessage: "ServiceAccount is refused",
		},
		"Decided": {
			reason:      "An answer decided where it arose keeps its code, reason and Retry-After.",
			err:         fmt.Errorf("wrapped: %w", &problem.Error{Code: http.StatusTooManyRequests, Reason: "QuotaExceeded", Msg: "over quota", RetryAfter: 5}),
			want:        want{code: http.StatusTooManyRequests, reason: "QuotaExceeded"},
			wantMessage: "over quota",
		},
		"APITimeout": {
			reason:      "An API server timeout is 503 saying timeout, not the raw error.",
			err:         kerrors.NewTimeoutError("etcd is slow", 1),
			want:        want{code: http.StatusServiceUnavailable, reason: "APIServerUnavailable"},
			wantMessage: "try again: timeout",
		},
		"APIServerTimeout": {
			reason:      "A server-side timeout is 503 saying timeout.",
			err:         kerrors.NewServerTimeout(schema.GroupResource{Resource: "leases"}, "create", 1),
			want:        want{code: http.StatusServiceUnavailable, reason: "APIServerUnavailable"},
			wantMessage: "try again: timeout",
		},
		"APIError": {
			reason:      "Any other error is 503, without the API server's address or error, which are logged.",
			err:         errors.New("cannot list leases: dial tcp 10.96.0.1:443: connection refused"),
			want:        want{code: http.StatusServiceUnavailable, reason: "APIServerUnavailable"},
			wantMessage: "unreachable or failing; try again",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			(NewServer(ServerConfig{Log: logging.NewNopLogger()})).fail(rec, tc.err)
			var body apiv1.Error
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("%s\nerrors are JSON: %q", tc.reason, rec.Body)
			}
			got := want{
				code: rec.Code, field: body.Error.Field,
				authenticate: rec.Header().Get("WWW-Authenticate") != "", reason: body.Error.Reason,
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("%s\n-want, +got:\n%s", tc.reason, diff)
			}
			if body.Error.Code != rec.Code {
				t.Errorf("%s\nthe body's code %d must be the status %d", tc.reason, body.Error.Code, rec.Code)
			}
			if strings.Contains(body.Error.Message, "10.96.0.1") || strings.Contains(body.Error.Message, "no RBAC") {
				t.Errorf("%s\nthe message tells the caller the API server's internals: %q", tc.reason, body.Error.Message)
			}
			if !strings.Contains(body.Error.Message, tc.wantMessage) {
				t.Errorf("%s\nthe message must say %q, got %q", tc.reason, tc.wantMessage, body.Error.Message)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("%s\nerrors are application/json, got %q", tc.reason, ct)
			}
		})
	}
}
