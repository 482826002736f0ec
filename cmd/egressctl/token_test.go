package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// rotatingToken stands in for a projected ServiceAccount token: the fake
// server accepts only the token its file holds now, and after each
// renewal it accepts it writes a new one, as the kubelet rewrites the file
// before the old token expires.
type rotatingToken struct {
	file string

	mu       sync.Mutex
	n        int
	rejected []string
}

func (rt *rotatingToken) write(t *testing.T) {
	t.Helper()
	if err := rt.rotate(); err != nil {
		t.Fatal(err)
	}
}

// rotate writes the next token, through a rename as the kubelet swaps the
// file, so that no reader sees it half written.
func (rt *rotatingToken) rotate() error {
	rt.n++
	tmp := rt.file + ".tmp"
	if err := os.WriteFile(tmp, []byte("token-"+strconv.Itoa(rt.n)), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, rt.file)
}

func (rt *rotatingToken) auth(r *http.Request) int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if got := r.Header.Get("Authorization"); got != "Bearer token-"+strconv.Itoa(rt.n) {
		rt.rejected = append(rt.rejected, r.Method+" "+r.URL.Path+" with "+got)
		return http.StatusUnauthorized
	}
	// Rotated before the answer, so before egressctl's next request.
	if strings.HasSuffix(r.URL.Path, "/renew") {
		if err := rt.rotate(); err != nil {
			return http.StatusInternalServerError
		}
	}
	return 0
}

func TestLeaseReadsTokenFileForEveryRenewal(t *testing.T) {
	rt := &rotatingToken{file: filepath.Join(t.TempDir(), "token")}
	rt.write(t)
	// A TTL of 3s renews every second: about three times while the command
	// sleeps 3.5s, each with a token the previous renewal rotated.
	f := &fakeDiscovery{ttl: 3, auth: rt.auth}
	r := runLease(t, f, []string{"--token-file", rt.file}, "sleep", "3.5")

	rt.mu.Lock()
	defer rt.mu.Unlock()
	if r.code != 0 || len(rt.rejected) != 0 {
		t.Errorf("want every request sent with the token the file holds then, and the command to run to its end, got exit code %d, rejected %q:\n%s", r.code, rt.rejected, r.stderr)
	}
	if n := len(f.calls()); n < 2 || rt.n != n+1 {
		t.Errorf("want at least 2 renewals, each after the token was rotated, got %d renewals and %d tokens:\n%s", n, rt.n, r.stderr)
	}
}
