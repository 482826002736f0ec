package v1

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestTokenFile: a client with TokenFile sends what the file holds at each
// request, so that a projected ServiceAccount token the kubelet rewrites
// keeps working; a file that cannot be read or holds nothing, or a Token
// besides it, is an error that sends nothing.
func TestTokenFile(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Authorization"))
		mu.Unlock()
		_, _ = w.Write([]byte(`{"items":[]}`))
	}))
	defer srv.Close()
	sent := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
	file := filepath.Join(t.TempDir(), "token")
	write := func(token string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(token), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	c := &Client{BaseURL: srv.URL, TokenFile: file}

	// The kubelet ends the file with no newline, a hand-written one often
	// with one: both are trimmed.
	write("first\n")
	if _, err := c.Fleets(ctx); err != nil {
		t.Fatal(err)
	}
	write("second")
	if _, err := c.Fleets(ctx); err != nil {
		t.Fatal(err)
	}
	if want := []string{"Bearer first", "Bearer second"}; strings.Join(sent(), ",") != strings.Join(want, ",") {
		t.Errorf("want each request to send the token the file holds then, %q, got %q", want, sent())
	}

	cases := map[string]struct {
		reason string
		client *Client
		setup  func()
		want   string
	}{
		"Missing": {
			reason: "A token file that cannot be read is an error naming it.",
			client: &Client{BaseURL: srv.URL, TokenFile: file + ".none"},
			want:   file + ".none",
		},
		"Empty": {
			reason: "An empty token file is an error naming it, not a request without a token.",
			client: c,
			setup:  func() { write(" \n") },
			want:   file + " is empty",
		},
		"Both": {
			reason: "A Token besides a TokenFile is an error, as neither can be known to be the one meant.",
			client: &Client{BaseURL: srv.URL, Token: "static", TokenFile: file},
			setup:  func() { write("third") },
			want:   "both a token and the token file",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup()
			}
			before := len(sent())
			_, err := tc.client.Fleets(ctx)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s\nwant an error with %q, got %v", tc.reason, tc.want, err)
			}
			if n := len(sent()) - before; n != 0 {
				t.Errorf("%s\nwant no request sent, got %d", tc.reason, n)
			}
		})
	}
}
