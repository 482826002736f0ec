package gcp

import (
	"net/http"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"google.golang.org/api/googleapi"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
)

// TestErrorInfoRead: the reason and metadata of a google.rpc.ErrorInfo in
// a REST error's details (as the JSON decoder leaves them: maps) are read
// wherever the error is wrapped, and decide the class and the permission
// named, also when the message says nothing of them.
func TestErrorInfoRead(t *testing.T) {
	ge := &googleapi.Error{Code: http.StatusForbidden, Message: "Permission denied on the resource.", Details: []any{
		map[string]any{"@type": "type.googleapis.com/google.rpc.Help"},
		map[string]any{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "IAM_PERMISSION_DENIED", "domain": "iam.googleapis.com",
			"metadata": map[string]any{"permission": permUseExternalIP, "resource": "projects/host/regions/r/subnetworks/s"}},
	}}
	err := errors.Wrap(ge, "cannot insert VM x")
	reason, md := errorInfo(err)
	if reason != "IAM_PERMISSION_DENIED" || md["resource"] != "projects/host/regions/r/subnetworks/s" {
		t.Errorf("errorInfo: %q %v", reason, md)
	}
	if got := deniedPermission(err); got != permUseExternalIP {
		t.Errorf("the permission comes from the details, the message naming none: %q", got)
	}
	if got := insertError(ge, "cannot insert VM x"); backend.ClassOf(got) != backend.ClassAccessDenied || !errors.Is(got, ge) {
		t.Errorf("an IAM refusal is AccessDenied, wrapping GCP's error: %v", got)
	}
	throttled := &googleapi.Error{Code: http.StatusForbidden, Message: "Request throttled.", Details: []any{
		map[string]any{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED"},
	}}
	if c := backend.ClassOf(Classify(throttled)); c != backend.ClassThrottled {
		t.Errorf("a 403 whose details say RATE_LIMIT_EXCEEDED: %s, want Throttled", c)
	}
	if reason, md := errorInfo(&googleapi.Error{Code: 500, Message: "x"}); reason != "" || md != nil {
		t.Errorf("no details, no reason: %q %v", reason, md)
	}
}
