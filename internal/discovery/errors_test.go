package discovery

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/google/go-cmp/cmp"
	"github.com/pkg/errors"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

func TestFail(t *testing.T) {
	type want struct {
		code          int
		field         string
		authenticate  bool   // a WWW-Authenticate challenge
		reasonCounted string // the denial reason acquire counts
	}
	cases := map[string]struct {
		reason      string
		err         error
		want        want
		wantMessage string // a part of it
	}{
		"BadRequest": {
			reason:      "A bad request is 400 naming its field.",
			err:         &badRequest{"ttl", "must be at least 1s"},
			want:        want{code: http.StatusBadRequest, field: "ttl", reasonCounted: "error"},
			wantMessage: "ttl: must be at least 1s",
		},
		"WrappedBadRequest": {
			reason:      "A bad request is found through wrapping.",
			err:         fmt.Errorf("reading: %w", &badRequest{"holder", "is required"}),
			want:        want{code: http.StatusBadRequest, field: "holder", reasonCounted: "error"},
			wantMessage: "holder: is required",
		},
		"TooLarge": {
			reason:      "A body over the limit is 413 and says the limit.",
			err:         &http.MaxBytesError{Limit: maxBody},
			want:        want{code: http.StatusRequestEntityTooLarge, reasonCounted: "error"},
			wantMessage: fmt.Sprint(maxBody),
		},
		"Unauthenticated": {
			reason:      "No valid token is 401 with a Bearer challenge.",
			err:         ErrUnauthenticated,
			want:        want{code: http.StatusUnauthorized, authenticate: true, reasonCounted: "error"},
			wantMessage: "bearer token",
		},
		"Forbidden": {
			reason:      "A fleet the caller may not use is 403 and says which permission to ask for.",
			err:         errors.Wrap(ErrForbidden, "team-b/crawlers"),
			want:        want{code: http.StatusForbidden, reasonCounted: "forbidden"},
			wantMessage: `verb "use" on proxyfleets`,
		},
		"InvalidTTL": {
			reason:      "A TTL no Lease object can carry is the caller's fault, not the API server's.",
			err:         lease.ErrInvalidTTL,
			want:        want{code: http.StatusBadRequest, field: "ttl", reasonCounted: "error"},
			wantMessage: "between 1s",
		},
		"LeaseNotFound": {
			reason:      "A lease that is gone or not the caller's is 404.",
			err:         lease.ErrNotFound,
			want:        want{code: http.StatusNotFound, reasonCounted: "error"},
			wantMessage: lease.ErrNotFound.Error(),
		},
		"FleetNotFound": {
			reason:      "An unknown fleet is 404.",
			err:         errFleetNotFound,
			want:        want{code: http.StatusNotFound, reasonCounted: "not-found"},
			wantMessage: errFleetNotFound.Error(),
		},
		"APITimeout": {
			reason:      "An API server timeout is 503 saying timeout, not the raw error.",
			err:         kerrors.NewTimeoutError("etcd is slow", 1),
			want:        want{code: http.StatusServiceUnavailable, reasonCounted: "error"},
			wantMessage: "try again: timeout",
		},
		"APIServerTimeout": {
			reason:      "A server-side timeout is 503 saying timeout.",
			err:         kerrors.NewServerTimeout(schema.GroupResource{Resource: "leases"}, "create", 1),
			want:        want{code: http.StatusServiceUnavailable, reasonCounted: "error"},
			wantMessage: "try again: timeout",
		},
		"APIError": {
			reason:      "Any other error is 503 with what went wrong.",
			err:         errors.New("cannot list leases: connection refused"),
			want:        want{code: http.StatusServiceUnavailable, reasonCounted: "error"},
			wantMessage: "try again: cannot list leases: connection refused",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			(&Server{Log: logging.NewNopLogger()}).fail(rec, tc.err)
			var body apiv1.Error
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("%s\nerrors are JSON: %q", tc.reason, rec.Body)
			}
			got := want{
				code: rec.Code, field: body.Error.Field,
				authenticate: rec.Header().Get("WWW-Authenticate") != "", reasonCounted: reason(tc.err),
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("%s\n-want, +got:\n%s", tc.reason, diff)
			}
			if body.Error.Code != rec.Code {
				t.Errorf("%s\nthe body's code %d must be the status %d", tc.reason, body.Error.Code, rec.Code)
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
