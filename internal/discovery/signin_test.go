package discovery_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
)

// TestStatusPageSignIn: a person opens the status page in a browser, which
// sends no bearer header: without a token it is a sign-in form; a token
// posted there is checked and kept in an HttpOnly, SameSite=Strict cookie
// (Secure unless plain HTTP is configured), the page then lists the token's fleets, refreshes by
// itself and offers sign-out, which forgets it. A refused token keeps no
// cookie; the cookie opens only the page, never the API; a form posted
// from another site's page is refused.
func TestStatusPageSignIn(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "crawlers", 2, 1, nil)
	static := "team-token " + ns + "\nbad,token " + ns + "\n"
	plain := httptest.NewServer(replicaHandler(t, ns, static, func(s *discovery.ServerConfig) { s.PlainHTTPCookie = true }))
	t.Cleanup(plain.Close)
	srv := plain
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}

	rsp, body := get(t, browser, srv.URL+"/")
	if rsp.StatusCode != http.StatusOK || !strings.Contains(body, `action="/signin"`) || !strings.Contains(body, "--audience egress-discovery") {
		t.Fatalf("the page without a token: %d, want the sign-in form:\n%s", rsp.StatusCode, body)
	}

	rsp, body = post(t, browser, srv.URL+"/signin", url.Values{"token": {"nope"}}, "")
	if rsp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "refused") || len(jar.Cookies(mustURL(srv.URL))) != 0 {
		t.Errorf("a bad token: %d, cookies %v, want 401 with the form and no cookie:\n%s", rsp.StatusCode, jar.Cookies(mustURL(srv.URL)), body)
	}
	rsp, _ = post(t, browser, srv.URL+"/signin", url.Values{"token": {"bad,token"}}, "")
	if rsp.StatusCode != http.StatusBadRequest {
		t.Errorf("a token a cookie cannot carry whole: %d, want 400", rsp.StatusCode)
	}
	rsp, _ = post(t, browser, srv.URL+"/signin", url.Values{"token": {"team-token"}}, "https://evil.example")
	if rsp.StatusCode != http.StatusForbidden || len(jar.Cookies(mustURL(srv.URL))) != 0 {
		t.Errorf("a sign-in posted from another site: %d, want 403 and no cookie", rsp.StatusCode)
	}

	// Signing in sets the cookie, and the redirect lands on the page.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	rsp, _ = post(t, noFollow, srv.URL+"/signin", url.Values{"token": {"team-token"}}, srv.URL)
	set := rsp.Header.Get("Set-Cookie")
	if rsp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(set, discovery.TokenCookie+"=team-token") ||
		!strings.Contains(set, "HttpOnly") || !strings.Contains(set, "SameSite=Strict") || strings.Contains(set, "Secure") {
		t.Fatalf("sign-in over plain HTTP: %d Set-Cookie %q; want 303 and an HttpOnly SameSite=Strict cookie", rsp.StatusCode, set)
	}
	rsp, body = post(t, browser, srv.URL+"/signin", url.Values{"token": {"team-token"}}, srv.URL)
	if rsp.StatusCode != http.StatusOK || !strings.Contains(body, ns+"/crawlers") || !strings.Contains(body, `http-equiv="refresh"`) || !strings.Contains(body, `action="/signout"`) {
		t.Fatalf("signed in: %d, want the page with the fleet, a refresh and sign-out:\n%s", rsp.StatusCode, body)
	}

	// The cookie opens the page only: the API still wants the header.
	rsp, _ = get(t, browser, srv.URL+"/v1/fleets")
	if rsp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the API with only the page's cookie: %d, want 401", rsp.StatusCode)
	}

	rsp, body = post(t, browser, srv.URL+"/signout", nil, srv.URL)
	if rsp.StatusCode != http.StatusOK || !strings.Contains(body, `action="/signin"`) || len(jar.Cookies(mustURL(srv.URL))) != 0 {
		t.Errorf("signed out: %d, cookies %v; want the form and no cookie", rsp.StatusCode, jar.Cookies(mustURL(srv.URL)))
	}

	// A cookie whose token no longer passes gets the form, and is cleared.
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
	req.AddCookie(&http.Cookie{Name: discovery.TokenCookie, Value: "revoked"})
	rsp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = rsp.Body.Close()
	if rsp.StatusCode != http.StatusUnauthorized || !strings.Contains(rsp.Header.Get("Set-Cookie"), "Max-Age=0") {
		t.Errorf("a refused cookie: %d Set-Cookie %q; want 401 and the cookie cleared", rsp.StatusCode, rsp.Header.Get("Set-Cookie"))
	}

	// Over TLS the cookie is Secure, and over plain HTTP not configured as
	// such too: that is a TLS-terminating ingress's backend, and the
	// browser is on HTTPS.
	tlsSrv := httptest.NewTLSServer(replicaHandler(t, ns, static))
	t.Cleanup(tlsSrv.Close)
	c := tlsSrv.Client()
	c.CheckRedirect = noFollow.CheckRedirect
	behindIngress := replicaServer(t, ns, static)
	for name, u := range map[string]string{"over TLS": tlsSrv.URL, "behind an ingress": behindIngress.URL} {
		rsp, _ = post(t, c, u+"/signin", url.Values{"token": {"team-token"}}, "")
		if set := rsp.Header.Get("Set-Cookie"); rsp.StatusCode != http.StatusSeeOther || !strings.Contains(set, "Secure") {
			t.Errorf("sign-in %s: %d Set-Cookie %q; want a Secure cookie", name, rsp.StatusCode, set)
		}
		rsp, _ = post(t, c, u+"/signout", nil, "")
		if set := rsp.Header.Get("Set-Cookie"); !strings.Contains(set, "Secure") {
			t.Errorf("sign-out %s: Set-Cookie %q; want the clearing cookie Secure too", name, set)
		}
	}
}

func get(t *testing.T, c *http.Client, u string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	return send(t, c, req)
}

func post(t *testing.T, c *http.Client, u string, form url.Values, origin string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	return send(t, c, req)
}

// send does req and returns the answer and its body, read to the end.
func send(t *testing.T, c *http.Client, req *http.Request) (*http.Response, string) {
	t.Helper()
	rsp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer rsp.Body.Close() //nolint:errcheck // A test.
	b, _ := io.ReadAll(rsp.Body)
	return rsp, string(b)
}

func mustURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return u
}
