package discovery

import (
	_ "embed"
	"html/template"
	"net/http"
	"net/url"
	"strings"

	"github.com/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
)

// TokenCookie holds the token a person signed in to the status page with:
// HttpOnly, SameSite=Strict, Secure unless Server.PlainHTTPCookie says the
// page is reached over plain HTTP (TLS ended at an ingress is no reason to
// send it in the clear), and read for the status page only, never for the
// API (which no browser may then be made to call with it).
const TokenCookie = "egress_discovery_token"

//go:embed signin.html
var signInHTML string

var signInTemplate = template.Must(template.New("signin").Parse(signInHTML))

// statusPage serves GET /: the status page for a bearer token, as before,
// or for the token a person signed in with; without either, the sign-in
// form.
func (s *Server) statusPage(w http.ResponseWriter, r *http.Request) {
	if auth.Bearer(r) != "" {
		s.authed(s.status)(w, r)
		return
	}
	c, err := r.Cookie(TokenCookie)
	if err != nil || c.Value == "" {
		s.signInForm(w, http.StatusOK, "")
		return
	}
	id, err := s.Auth.AuthenticateToken(auth.WithClientAddress(r.Context(), r.RemoteAddr), c.Value)
	if errors.Is(err, auth.ErrUnauthenticated) || errors.Is(err, auth.ErrWrongAudience) {
		http.SetCookie(w, s.clearedCookie())
		s.signInForm(w, http.StatusUnauthorized, "Your sign-in was refused: the token expired, was revoked, or is not for egress-discovery. Sign in again.")
		return
	}
	if err == nil {
		err = s.limit(id)
	}
	if err == nil {
		err = s.status(w, r, id)
	}
	if err != nil {
		s.fail(w, err)
	}
}

// signIn takes a token from the form, checks it as the API would, and
// keeps it in the cookie.
func (s *Server) signIn(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		s.signInForm(w, http.StatusForbidden, "Sign-in from another site's page is refused.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseForm(); err != nil {
		s.signInForm(w, http.StatusBadRequest, "The form could not be read.")
		return
	}
	token := strings.TrimSpace(r.PostForm.Get("token"))
	if token == "" {
		s.signInForm(w, http.StatusBadRequest, "Paste a token: kubectl create token <serviceaccount> --audience egress-discovery")
		return
	}
	if !cookieSafe(token) {
		s.signInForm(w, http.StatusBadRequest, "This token holds characters a cookie cannot carry; use it in an Authorization header instead.")
		return
	}
	id, err := s.Auth.AuthenticateToken(auth.WithClientAddress(r.Context(), r.RemoteAddr), token)
	if err == nil {
		err = s.limit(id)
	}
	switch {
	case errors.Is(err, auth.ErrUnauthenticated) || errors.Is(err, auth.ErrWrongAudience):
		s.signInForm(w, http.StatusUnauthorized, "That token was refused: "+err.Error()+".")
		return
	case err != nil:
		s.fail(w, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: TokenCookie, Value: token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: !s.PlainHTTPCookie})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// signOut forgets the token.
func (s *Server) signOut(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		s.signInForm(w, http.StatusForbidden, "Sign-out from another site's page is refused.")
		return
	}
	http.SetCookie(w, s.clearedCookie())
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func (s *Server) clearedCookie() *http.Cookie {
	return &http.Cookie{Name: TokenCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: !s.PlainHTTPCookie}
}

// sameOrigin refuses a form another site's page posts (login CSRF): a
// browser names the page's origin in Origin; a request without one (curl)
// passes.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// cookieSafe reports whether a token fits a cookie value (RFC 6265) as it
// is, so that it is kept whole.
func cookieSafe(v string) bool {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < 0x21 || c > 0x7e || c == '"' || c == ',' || c == ';' || c == '\\' {
			return false
		}
	}
	return true
}

func (s *Server) signInForm(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	if err := signInTemplate.Execute(w, struct{ Message string }{msg}); err != nil {
		s.Log.Info("Cannot render the sign-in page", "error", err)
	}
}
