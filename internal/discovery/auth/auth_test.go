package auth

import (
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestBearer(t *testing.T) {
	cases := map[string]struct {
		reason string
		header string
		want   string
	}{
		"Token":       {reason: "A bearer token is read.", header: "Bearer abc.def", want: "abc.def"},
		"Spaces":      {reason: "Surrounding spaces are not part of it.", header: "Bearer   abc  ", want: "abc"},
		"None":        {reason: "No header, no token."},
		"Basic":       {reason: "Other schemes are no bearer token.", header: "Basic dXNlcjpwdw==", want: ""},
		"LowerCase":   {reason: "The scheme is matched as sent by clients: Bearer.", header: "bearer abc", want: ""},
		"SchemeAlone": {reason: "A scheme with no token is no token.", header: "Bearer ", want: ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/v1/fleets", nil)
			if tc.header != "" {
				r.Header.Set("Authorization", tc.header)
			}
			if got := Bearer(r); got != tc.want {
				t.Errorf("%s\nbearer(%q): want %q, got %q", tc.reason, tc.header, tc.want, got)
			}
		})
	}
}

func writeTokens(t *testing.T, content string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestStaticTokens(t *testing.T) {
	st, err := LoadStaticTokens(writeTokens(t, "# crawlers outside the cluster\n\nteam-a  team-a,shared\n  ops *  \nsecret-b team-b crawler-b\n"))
	if err != nil {
		t.Fatal(err)
	}
	k := NewKubernetes(KubernetesConfig{Static: st}) // no Client: static tokens never reach the API server
	ctx := context.Background()
	authn := func(token string) (*Identity, error) {
		r := httptest.NewRequest(http.MethodGet, "/v1/fleets", nil)
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		return k.Authenticate(ctx, r)
	}

	if _, err := authn(""); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("no token: want ErrUnauthenticated, got %v", err)
	}
	team, err := authn("team-a")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]bool{"team-a": true, "shared": true}, team.Namespaces); diff != "" {
		t.Errorf("a static token may use the namespaces of its line: -want, +got:\n%s", diff)
	}
	if !strings.HasPrefix(team.User, "static:") || strings.Contains(team.User, "team-a") {
		t.Errorf("a static identity is named by a hash, never by the token: %q", team.User)
	}
	if named, err := authn("secret-b"); err != nil || named.User != "static:crawler-b" {
		t.Errorf("a named static token's identity is static:<name>, for quotas to name: %+v, %v", named, err)
	}
	for _, tc := range []struct {
		id        *Identity
		namespace string
		want      error
	}{
		{team, "team-a", nil},
		{team, "shared", nil},
		{team, "team-b", ErrForbidden},
	} {
		if err := k.Authorize(ctx, tc.id, tc.namespace, "crawlers"); !errors.Is(err, tc.want) {
			t.Errorf("token team-a in namespace %s: want %v, got %v", tc.namespace, tc.want, err)
		}
	}
	ops, err := authn("ops")
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Authorize(ctx, ops, "anything", "crawlers"); err != nil {
		t.Errorf("a token for * may use every namespace: %v", err)
	}
}

func TestLoadStaticTokensErrors(t *testing.T) {
	cases := map[string]struct {
		reason  string
		content string
		want    string
	}{
		"TokenAlone": {reason: "A token needs its namespaces; the line is named.", content: "# header\nlonely\n", want: fmt.Sprintf(errFmtTokenLine, 2)},
		"FourFields": {reason: "Namespaces are comma-separated, not spaced.", content: "t a b c\n", want: fmt.Sprintf(errFmtTokenLine, 1)},
		"BadName": {reason: "A token's name is a DNS label, as quota overrides name it.", content: "t a Team_A\n",
			want: fmt.Sprintf(errFmtTokenName, 1, "Team_A", strings.Join(validation.IsDNS1123Label("Team_A"), "; "))},
		"SameName":     {reason: "Two tokens of one name would share their leases and quota.", content: "t a team-a\nu b team-a\n", want: fmt.Sprintf(errFmtSameIdentity, 2, "static:team-a", 1)},
		"SameToken":    {reason: "One token on two lines would name two identities.", content: "t a\nt b\n", want: fmt.Sprintf(errFmtTokenReused, 2)},
		"BadNamespace": {reason: "A namespace is a DNS label or *.", content: "t a,B_C\n", want: fmt.Sprintf(errFmtTokenNamespace, 1, "B_C")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := LoadStaticTokens(writeTokens(t, tc.content))
			if err == nil || err.Error() != tc.want {
				t.Errorf("%s\nwant the error %q, got %v", tc.reason, tc.want, err)
			}
			if err != nil && strings.Contains(err.Error(), "lonely") {
				t.Errorf("%s\nthe error must not show the token: %v", tc.reason, err)
			}
		})
	}
	if _, err := LoadStaticTokens(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing token file is an error, saying so: %v", err)
	}
}
