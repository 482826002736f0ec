package v1

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
)

// TestNewHTTPClient: a client made with a CA bundle reaches a server whose
// certificate that CA signed; one without it does not, as the system's CAs
// do not know a private CA; a bundle that cannot be read or holds no
// certificate is an error, not a client that trusts nothing or everything.
func TestNewHTTPClient(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"items":[]}`))
	}))
	defer srv.Close()
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// httptest's certificate is self-signed: it is its own CA.
	ca := write("ca.crt", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	cases := map[string]struct {
		reason    string
		caFile    string
		newErr    bool
		reachable bool
	}{
		"CABundle": {
			reason: "A client trusting the server's CA reaches it.",
			caFile: ca, reachable: true,
		},
		"SystemCAs": {
			reason: "Without a bundle the system's CAs are trusted, which do not know the server's.",
		},
		"Missing": {
			reason: "A bundle that is not there is an error.",
			caFile: filepath.Join(dir, "none.crt"), newErr: true,
		},
		"NotPEM": {
			reason: "A bundle without a PEM certificate is an error.",
			caFile: write("junk.crt", []byte("junk")), newErr: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h, err := NewHTTPClient(tc.caFile)
			if (err != nil) != tc.newErr {
				t.Fatalf("%s\nNewHTTPClient: %v", tc.reason, err)
			}
			if err != nil {
				return
			}
			c := &Client{BaseURL: srv.URL, Token: "t", HTTP: h}
			if _, err := c.Fleets(context.Background()); (err == nil) != tc.reachable {
				t.Errorf("%s\nFleets: %v", tc.reason, err)
			}
		})
	}
}
