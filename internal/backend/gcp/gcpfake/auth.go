package gcpfake

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// tokenPath is where the fake's OAuth token endpoint listens; a key from
// RequireAuth names it as its token_uri.
const tokenPath = "/token"

// authority is a service account the fake trusts: requests must carry a
// bearer token it issued for that account's signed assertion, or a JWT the
// account's key signed itself (what Google's client libraries send for
// service-account keys when they can).
type authority struct {
	email  string
	key    *rsa.PrivateKey
	issued map[string]bool
}

// RequireAuth makes the fake refuse every API request without valid
// credentials, and returns a service-account JSON key that has them.
func (s *Server) RequireAuth() ([]byte, error) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.auth = &authority{email: "egress@crawl-proj.iam.gserviceaccount.com", key: k, issued: map[string]bool{}}
	return json.Marshal(map[string]string{
		"type": "service_account", "project_id": "crawl-proj", "private_key_id": "fake-key-1",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": s.auth.email, "client_id": "1", "token_uri": s.URL + tokenPath,
		"auth_uri": "https://accounts.google.com/o/oauth2/auth",
	})
}

// Authenticated returns how many API requests carried valid credentials.
func (s *Server) Authenticated() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls["authenticated"]
}

func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	if s.auth == nil {
		return true
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if ok && (s.auth.issued[tok] || s.auth.verify(tok, "") == nil) {
		s.calls["authenticated"]++
		return true
	}
	writeError(w, http.StatusUnauthorized, "required", "",
		"Request is missing required authentication credential. Expected OAuth 2 access token, login cookie or other valid authentication credential.")
	return false
}

// token answers the JWT-bearer grant of RFC 7523 for the trusted account.
func (s *Server) token(w http.ResponseWriter, r *http.Request) {
	if s.auth == nil || r.Method != http.MethodPost || r.ParseForm() != nil ||
		r.PostForm.Get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
		http.Error(w, `{"error":"unsupported_grant_type"}`, http.StatusBadRequest)
		return
	}
	if err := s.auth.verify(r.PostForm.Get("assertion"), s.URL+tokenPath); err != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": "invalid_grant", "error_description": err.Error()})
		return
	}
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	tok := "ya29.fake-" + base64.RawURLEncoding.EncodeToString(b)
	s.auth.issued[tok] = true
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"access_token": tok, "token_type": "Bearer", "expires_in": 3600})
}

// verify checks a JWT signed with the account's key, issued by the account,
// not expired, and for audience aud when aud is set.
func (a *authority) verify(jwt, aud string) error {
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return errors.Errorf("not a JWT")
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return errors.Errorf("bad signature encoding")
	}
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if err := rsa.VerifyPKCS1v15(&a.key.PublicKey, crypto.SHA256, sum[:], sig); err != nil {
		return errors.Errorf("bad signature")
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return errors.Errorf("bad claims encoding")
	}
	var c struct {
		Iss string `json:"iss"`
		Aud string `json:"aud"`
		Exp int64  `json:"exp"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return errors.Errorf("bad claims")
	}
	switch {
	case c.Iss != a.email:
		return errors.Errorf("issuer %q is not the trusted account", c.Iss)
	case time.Unix(c.Exp, 0).Before(time.Now()):
		return errors.Errorf("expired")
	case aud != "" && c.Aud != aud:
		return errors.Errorf("audience %q is not %q", c.Aud, aud)
	}
	return nil
}
