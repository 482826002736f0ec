package discovery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
)

// TestBadRequests sends one bad request of each kind to a server on the
// real apiserver, with real ServiceAccount tokens: each is answered with
// its status, a body whose code is that status, its stable reason code,
// the field at fault for a 400 (and no field otherwise), and a message
// saying what to do.
func TestBadRequests(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	ctx := context.Background()
	fleet(t, ns, "crawlers", 1, 1, nil)
	fleet(t, ns, "nosecret", 1, 1, nil)
	fleetXR(t, ns, "crawlers", 1, map[string]any{"maxLeasesPerProxy": int64(1), "maxBanCooldown": "1h", "quotas": map[string]any{
		"overrides": []any{map[string]any{"staticToken": "capped", "maxLeases": int64(0)}},
	}})
	if err := bed.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nosecret-auth"}}); err != nil {
		t.Fatal(err)
	}
	kc := kubernetes.NewForConfigOrDie(bed.Config)
	for _, sa := range []string{"crawler", "gone"} {
		if _, err := kc.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := bed.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "use"}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{fleetv1alpha1.Group}, Resources: []string{fleetv1alpha1.ProxyFleetResource}, Verbs: []string{"use"}, ResourceNames: []string{"crawlers"},
	}}}); err != nil {
		t.Fatal(err)
	}
	if err := bed.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "use"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "use"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "crawler", Namespace: ns}, {Kind: "ServiceAccount", Name: "gone", Namespace: ns}}}); err != nil {
		t.Fatal(err)
	}
	token := func(sa string, audiences ...string) string {
		tr, err := kc.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(600)), Audiences: audiences}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	sa := token("crawler", discovery.DefaultAudience)
	// A token whose ServiceAccount was deleted is no longer valid, as an
	// expired one is not (the API server issues none shorter than 10m).
	revoked := token("gone", discovery.DefaultAudience)
	if err := kc.CoreV1().ServiceAccounts(ns).Delete(ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	srv := server(t, fmt.Sprintf("team %[1]s team\nother %[1]s other\ncapped %[1]s capped\n", ns), func(s *discovery.ServerConfig) {
		withAuth(s, func(k *discovery.KubernetesConfig) { k.Audience = discovery.DefaultAudience })
		s.MaxBansPerFleet = 1
	})
	team := &apiv1.Client{BaseURL: srv.URL, Token: "team"}
	held, err := team.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "h", TTL: "5m"})
	if err != nil {
		t.Fatal(err)
	}
	if err := team.Report(ctx, held.LeaseID, apiv1.ReportRequest{Domain: "a.example", Outcome: "banned"}); err != nil {
		t.Fatal(err)
	}
	leasePath := "/v1/leases/" + held.LeaseID
	acquire := func(extra string) string {
		return `{"fleet": "` + ns + `/crawlers", "holder": "h"` + extra + `}`
	}

	cases := map[string]struct {
		token, method, path, body string
		code                      int
		reason, field             string
		message                   string // a part of it
	}{
		"NoToken":        {"", "GET", "/v1/fleets", "", 401, apiv1.ReasonUnauthenticated, "", "bearer token"},
		"RevokedToken":   {revoked, "GET", "/v1/fleets", "", 401, apiv1.ReasonUnauthenticated, "", "bearer token"},
		"WrongAudience":  {token("crawler"), "GET", "/v1/fleets", "", 401, apiv1.ReasonWrongAudience, "", "--audience egress-discovery"},
		"OtherAudience":  {token("crawler", "another-service"), "GET", "/v1/fleets", "", 401, apiv1.ReasonWrongAudience, "", "--audience egress-discovery"},
		"ForbiddenFleet": {sa, "GET", "/v1/fleets/" + ns + "/nosecret/proxies", "", 403, apiv1.ReasonForbidden, "", `verb "use"`},
		"UnknownFleet":   {"team", "GET", "/v1/fleets/" + ns + "/nothing/proxies", "", 404, apiv1.ReasonFleetNotFound, "", "fleet not found"},
		"MissingSecret":  {"team", "POST", "/v1/leases", `{"fleet": "` + ns + `/nosecret", "holder": "h"}`, 404, apiv1.ReasonSecretNotFound, "", "nosecret-auth"},
		"NoEndpoint":     {"team", "GET", "/v2/anything", "", 404, apiv1.ReasonNoEndpoint, "", "/openapi.json"},
		"Truncated":      {"team", "POST", leasePath + "/renew", `{"ttl":"5m"`, 400, apiv1.ReasonInvalid, "body", "not valid JSON"},
		"TwoObjects":     {"team", "POST", leasePath + "/renew", `{"ttl":"5m"} {}`, 400, apiv1.ReasonInvalid, "body", "more than one"},
		"Oversized":      {"team", "POST", "/v1/leases", acquire(`, "stickyKey": "` + strings.Repeat("x", 20<<10) + `"`), 413, apiv1.ReasonBodyTooLarge, "", "larger than"},
		"UnknownField":   {"team", "POST", "/v1/leases", acquire(`, "tll": "5m"`), 400, apiv1.ReasonInvalid, "tll", "not a field"},
		"WrongType":      {"team", "POST", "/v1/leases", acquire(`, "ttl": 300`), 400, apiv1.ReasonInvalid, "ttl", "must be a string"},
		"TTLOverMax":     {"team", "POST", "/v1/leases", acquire(`, "ttl": "2h"`), 400, apiv1.ReasonInvalid, "ttl", "maxTTL"},
		"WaitOverMax":    {"team", "POST", "/v1/leases", acquire(`, "maxWait": "5s"`), 400, apiv1.ReasonInvalid, "maxWait", "maxWait"},
		"LongZone":       {"team", "POST", "/v1/leases", acquire(`, "zone": "` + strings.Repeat("z", 64) + `"`), 400, apiv1.ReasonInvalid, "zone", "63"},
		"BadFleet":       {"team", "POST", "/v1/leases", `{"fleet": "crawlers", "holder": "h"}`, 400, apiv1.ReasonInvalid, "fleet", "<namespace>/<name>"},
		"OverQuota":      {"capped", "POST", "/v1/leases", acquire(""), 429, apiv1.ReasonQuotaExceeded, "", "spec.leases.quotas.overrides[0]"},
		"NoFreeSlot":     {"other", "POST", "/v1/leases", acquire(""), 409, apiv1.ReasonNoFreeSlot, "", "no healthy proxy"},
		"WrongIdentity":  {"other", "POST", leasePath + "/renew", "", 403, apiv1.ReasonNotYourLease, "", "another identity"},
		"WrongReleaser":  {"other", "DELETE", leasePath, "", 403, apiv1.ReasonNotYourLease, "", "another identity"},
		"UnknownLease":   {"team", "DELETE", "/v1/leases/" + ns + "/crawlers-0-slot-0/not-the-uid", "", 404, apiv1.ReasonLeaseNotFound, "", "take a new one"},
		"OverBanCap":     {"team", "POST", leasePath + "/report", `{"domain": "b.example", "outcome": "banned"}`, 429, apiv1.ReasonBanLimit, "", "--max-bans-per-fleet"},
		"LongCooldown":   {"team", "POST", leasePath + "/report", `{"domain": "a.example", "outcome": "banned", "cooldown": "2h"}`, 400, apiv1.ReasonInvalid, "cooldown", "maxBanCooldown"},
		"BadOutcome":     {"team", "POST", leasePath + "/report", `{"domain": "a.example", "outcome": "meh"}`, 400, apiv1.ReasonInvalid, "outcome", "banned or ok"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			code, hdr, body := call(t, srv, tc.token, tc.method, tc.path, tc.body)
			var e apiv1.Error
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("want a JSON error body, got %d %q", code, body)
			}
			got := fmt.Sprintf("%d %s field=%q", code, e.Error.Reason, e.Error.Field)
			if want := fmt.Sprintf("%d %s field=%q", tc.code, tc.reason, tc.field); got != want {
				t.Errorf("want %s, got %s: %s", want, got, body)
			}
			if e.Error.Code != code || !strings.Contains(e.Error.Message, tc.message) {
				t.Errorf("the body's code must be the status and its message say %q: %s", tc.message, body)
			}
			if ct := hdr.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if (code == http.StatusTooManyRequests && tc.reason != apiv1.ReasonBanLimit) || code == http.StatusConflict {
				if hdr.Get("Retry-After") == "" {
					t.Errorf("a %d %s says when to come back: no Retry-After", code, tc.reason)
				}
			}
		})
	}
}
