package cloudvm

import (
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
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
	const fleet = "cluster/team-a/fleet/crawlers"
	lines := make([][]byte, 40)
	var wg sync.WaitGroup
	for i := range lines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.get(fleet, "crawler", "s3cret")
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

	rotated, err := c.get(fleet, "crawler", "n3w")
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 2 || !squid.HtpasswdMatches(rotated, "crawler", "n3w") || squid.HtpasswdMatches(rotated, "crawler", "s3cret") {
		t.Errorf("a new password was not hashed afresh (%d hashes): %q", calls.Load(), rotated)
	}
	other, err := c.get(fleet, "other", "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 3 || !squid.HtpasswdMatches(other, "other", "s3cret") {
		t.Errorf("another username with the same password was not hashed afresh (%d hashes): %q", calls.Load(), other)
	}

	// Another process (a restarted provider) makes the very same line: a
	// VM's script does not depend on which VM came first.
	again, err := newLineCache(squid.HtpasswdSHA512).get(fleet, "crawler", "s3cret")
	if err != nil || string(again) != string(lines[0]) {
		t.Errorf("after a restart the line is %q (%v), want %q as before", again, err, lines[0])
	}
}

// TestLinesStayInTheirScope: two tenants, or two fleets, with the same
// credentials get different lines, each salted by its own scope, so that no
// VM carries a line another tenant's VM could be compared with.
func TestLinesStayInTheirScope(t *testing.T) {
	spec := func(o ownership.Owner) backend.Spec {
		return backend.Spec{Owner: o, Port: 3128, AllowedSourceRanges: []string{"203.0.113.0/24"},
			Credentials: &backend.Credentials{Username: "crawler", Password: "same-everywhere"}}
	}
	owners := map[string]ownership.Owner{
		"team-a fleet":        {ClusterID: "c1", Namespace: "team-a", Fleet: "crawlers", UID: "u1"},
		"team-a fleet, again": {ClusterID: "c1", Namespace: "team-a", Fleet: "crawlers", UID: "u2"},
		"team-b fleet":        {ClusterID: "c1", Namespace: "team-b", Fleet: "crawlers", UID: "u3"},
		"team-a other fleet":  {ClusterID: "c1", Namespace: "team-a", Fleet: "spiders", UID: "u4"},
		"team-a lone proxy":   {ClusterID: "c1", Namespace: "team-a", UID: "u5"},
		"another cluster":     {ClusterID: "c2", Namespace: "team-a", Fleet: "crawlers", UID: "u6"},
	}
	line := regexp.MustCompile(`crawler:\$6\$rounds=\d+\$([^$]+)\$\S+`)
	got := map[string]string{}
	for name, o := range owners {
		script, err := Script(spec(o), "own_addresses() { :; }")
		if err != nil {
			t.Fatal(err)
		}
		m := line.FindStringSubmatch(script)
		if m == nil {
			t.Fatalf("%s: no htpasswd line in the script", name)
		}
		if m[1] != scopeSalt(htpasswdScope(o)) {
			t.Errorf("%s: salted with %q, not its scope's %q", name, m[1], scopeSalt(htpasswdScope(o)))
		}
		got[name] = m[0]
	}
	if got["team-a fleet"] != got["team-a fleet, again"] {
		t.Errorf("two VMs of one fleet got different lines: %q, %q", got["team-a fleet"], got["team-a fleet, again"])
	}
	seen := map[string]string{}
	for name, l := range got {
		if name == "team-a fleet, again" {
			continue
		}
		if prev, dup := seen[l]; dup {
			t.Errorf("%s and %s share a line", prev, name)
		}
		seen[l] = name
	}
}

// TestLineCacheForgetsFailures: a failed hash is tried again next time,
// credentials that differ only in where a NUL falls are not confused, and
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
	if _, err := c.get("s", "u", "p"); err == nil {
		t.Fatal("the hash's error was lost")
	}
	fail = false
	if l, err := c.get("s", "u", "p"); err != nil || string(l) != "u:p\n" || calls != 2 {
		t.Errorf("after a failure: %q, %v, %d hashes; want the line from a second hash", l, err, calls)
	}
	a, _ := c.get("s", "a\x00b", "c")
	b, _ := c.get("s", "a", "b\x00c")
	if string(a) == string(b) {
		t.Errorf("(a\\0b, c) and (a, b\\0c) got the same line %q", a)
	}
	for i := range 3 * maxLines {
		if _, err := c.get("s", "u", fmt.Sprint(i)); err != nil {
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
		if _, err := c.get("s", "crawler", "s3cret"); err != nil {
			t.Fatal(err)
		}
	}
	for k := range a.lines {
		if _, same := b.lines[k]; same {
			t.Error("two processes' caches key the same credentials alike")
		}
	}
}
