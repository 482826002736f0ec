package discovery

import (
	_ "embed"
	"html/template"
	"net/http"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
)

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
	c, err := r.Cookie(auth.TokenCookie)
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
	if !auth.SameOrigin(r) {
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
	if !auth.CookieSafe(token) {
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
	http.SetCookie(w, auth.Cookie(token, s.PlainHTTPCookie))
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// signOut forgets the token.
func (s *Server) signOut(w http.ResponseWriter, r *http.Request) {
	if !auth.SameOrigin(r) {
		s.signInForm(w, http.StatusForbidden, "Sign-out from another site's page is refused.")
		return
	}
	http.SetCookie(w, s.clearedCookie())
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func (s *Server) clearedCookie() *http.Cookie { return auth.ClearedCookie(s.PlainHTTPCookie) }

func (s *Server) signInForm(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	if err := signInTemplate.Execute(w, struct{ Message string }{msg}); err != nil {
		s.Log.Info("Cannot render the sign-in page", "error", err)
	}
}
