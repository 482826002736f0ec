package auth

import (
	"net/http"
	"net/url"
)

// TokenCookie holds the token a person signed in to the status page with:
// HttpOnly, SameSite=Strict, Secure unless the status page is configured
// as reached over plain HTTP (TLS ended at an ingress is no reason to
// send it in the clear), and read for the status page only, never for the
// API (which no browser may then be made to call with it).
const TokenCookie = "egress_discovery_token"

// Cookie keeps a signed-in token: HttpOnly, SameSite=Strict, and Secure
// unless plain HTTP is configured explicitly.
func Cookie(token string, plain bool) *http.Cookie {
	return &http.Cookie{Name: TokenCookie, Value: token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: !plain}
}

// ClearedCookie forgets the signed-in token.
func ClearedCookie(plain bool) *http.Cookie {
	return &http.Cookie{Name: TokenCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: !plain}
}

// SameOrigin refuses a form another site's page posts (login CSRF): a
// browser names the page's origin in Origin; a request without one (curl)
// passes.
func SameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// CookieSafe reports whether a token fits a cookie value (RFC 6265) as it
// is, so that it is kept whole.
func CookieSafe(v string) bool {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < 0x21 || c > 0x7e || c == '"' || c == ',' || c == ';' || c == '\\' {
			return false
		}
	}
	return true
}
