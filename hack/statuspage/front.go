package main

import (
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
)

// signIn signs in on the status page's form, as a person does, and returns
// the cookie it sets.
func signIn(target, token string) (*http.Cookie, error) {
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	rsp, err := c.PostForm(target+"/signin", url.Values{"token": {token}})
	if err != nil {
		return nil, errors.Wrap(err, "cannot sign in")
	}
	_ = rsp.Body.Close()
	for _, ck := range rsp.Cookies() {
		if ck.Name == discovery.TokenCookie && rsp.StatusCode == http.StatusSeeOther {
			return ck, nil
		}
	}
	return nil, errors.Errorf("signing in answered %s without the cookie", rsp.Status)
}

// cookieFront proxies to the discovery server, sending the sign-in cookie
// as the browser's cookie jar would: headless Chromium's --screenshot
// takes no cookie of its own.
func cookieFront(target string, ck *http.Cookie) http.Handler {
	u, _ := url.Parse(target)
	p := httputil.NewSingleHostReverseProxy(u)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set("Cookie", strings.TrimSpace(ck.Name+"="+ck.Value))
		p.ServeHTTP(w, r)
	})
}
