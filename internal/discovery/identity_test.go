package discovery_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
)

// TestLeasesBoundToIdentity: a lease ID is not a bearer capability. A
// caller of another identity, even one allowed to use the fleet, who learns
// the ID cannot renew, release or report through it: 403, and the lease
// stays its holder's.
func TestLeasesBoundToIdentity(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "shared", 1, 2, nil)
	srv := server(t, "alice-token "+ns+"\nbob-token "+ns+"\n")
	ctx := context.Background()
	alice := &apiv1.Client{BaseURL: srv.URL, Token: "alice-token"}
	bob := &apiv1.Client{BaseURL: srv.URL, Token: "bob-token"}
	held, err := alice.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/shared", Holder: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	var ae *apiv1.APIError
	if _, err := bob.Renew(ctx, held.LeaseID, "5m"); !asAPIError(err, &ae) || ae.Status != http.StatusForbidden {
		t.Errorf("renew by another identity: want 403, got %v", err)
	}
	if err := bob.Release(ctx, held.LeaseID); !asAPIError(err, &ae) || ae.Status != http.StatusForbidden {
		t.Errorf("release by another identity: want 403, got %v", err)
	}
	if err := bob.Report(ctx, held.LeaseID, apiv1.ReportRequest{Domain: "example.com", Outcome: "banned"}); !asAPIError(err, &ae) || ae.Status != http.StatusForbidden {
		t.Errorf("report by another identity: want 403, got %v", err)
	}
	if _, err := alice.Renew(ctx, held.LeaseID, "5m"); err != nil {
		t.Errorf("the holder's lease survives the attempts: %v", err)
	}
	if err := alice.Release(ctx, held.LeaseID); err != nil {
		t.Errorf("release by the holder: %v", err)
	}
	// A name no fleet can have is not found, before any review.
	for _, path := range []string{"/v1/fleets/" + ns + "/" + strings.Repeat("x", 300) + "/proxies", "/v1/fleets/" + ns + "/Not_A_Name/proxies.txt", "/v1/fleets/NS/shared/proxies"} {
		if code, _, body := call(t, srv, "alice-token", "GET", path, ""); code != http.StatusNotFound {
			t.Errorf("GET %.60s...: want 404, got %d %s", path, code, body)
		}
	}
}
