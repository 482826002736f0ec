package cloudvm

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
)

// TestLineCacheHashesOncePerCredentials: a fleet's VMs share credentials,
// and creating many at once costs one SHA-512 crypt, not one each; the
// line still verifies, and new credentials are hashed afresh.
func TestLineCacheHashesOncePerCredentials(t *testing.T) {
	var calls atomic.Int32
	c := newLineCache(func(u, p, salt string) ([]byte, error) {
		calls.Add(1)
		return squid.HtpasswdSHA512(u, p, salt)
	})
	lines := make([][]byte, 40)
	var wg sync.WaitGroup
	for i := range lines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.get("crawler", "s3cret", fmt.Sprintf("salt%d", i))
			if err != nil {
				t.Error(err)
			}
			lines[i] = l
		}()
	}
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Fatalf("40 VMs with the same credentials hashed %d times, want once", n)
	}
	for i, l := range lines {
		if string(l) != string(lines[0]) {
			t.Errorf("VM %d got another line: %q, want %q", i, l, lines[0])
		}
	}
	if !squid.HtpasswdMatches(lines[0], "crawler", "s3cret") {
		t.Errorf("the shared line %q does not accept the password", lines[0])
	}

	rotated, err := c.get("crawler", "n3w", "saltx")
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 2 || !squid.HtpasswdMatches(rotated, "crawler", "n3w") || squid.HtpasswdMatches(rotated, "crawler", "s3cret") {
		t.Errorf("a new password was not hashed afresh (%d hashes): %q", calls.Load(), rotated)
	}
	other, err := c.get("other", "s3cret", "salty")
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 3 || !squid.HtpasswdMatches(other, "other", "s3cret") {
		t.Errorf("another username with the same password was not hashed afresh (%d hashes): %q", calls.Load(), other)
	}
}

// TestLineCacheForgetsFailures: a failed hash is tried again next time, and
// the cache stays bounded.
func TestLineCacheForgetsFailures(t *testing.T) {
	fail := true
	calls := 0
	c := newLineCache(func(u, p, _ string) ([]byte, error) {
		calls++
		if fail {
			return nil, errors.New("no")
		}
		return []byte(u + ":" + p + "\n"), nil
	})
	if _, err := c.get("u", "p", "s"); err == nil {
		t.Fatal("the hash's error was lost")
	}
	fail = false
	if l, err := c.get("u", "p", "s"); err != nil || string(l) != "u:p\n" || calls != 2 {
		t.Errorf("after a failure: %q, %v, %d hashes; want the line from a second hash", l, err, calls)
	}
	for i := range 3 * maxLines {
		if _, err := c.get("u", fmt.Sprint(i), "s"); err != nil {
			t.Fatal(err)
		}
	}
	if len(c.lines) > maxLines {
		t.Errorf("%d lines remembered, want at most %d", len(c.lines), maxLines)
	}
}

// TestLineCacheKeysHoldNoPassword: two processes key the same credentials
// differently, so a key is not a password's unsalted hash.
func TestLineCacheKeysHoldNoPassword(t *testing.T) {
	hash := func(u, p, _ string) ([]byte, error) { return []byte(u + p), nil }
	a, b := newLineCache(hash), newLineCache(hash)
	for _, c := range []*lineCache{a, b} {
		if _, err := c.get("crawler", "s3cret", "s"); err != nil {
			t.Fatal(err)
		}
	}
	for k := range a.lines {
		if _, same := b.lines[k]; same {
			t.Error("two processes' caches key the same credentials alike")
		}
	}
}
