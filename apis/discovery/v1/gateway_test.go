package v1

import (
	"strings"
	"testing"
	"time"
)

// FuzzGatewayUser: whatever username parses writes back (String) as one
// that parses to the same options; none panics.
func FuzzGatewayUser(f *testing.F) {
	for _, s := range []string{
		"crawl-team_crawlers", "crawl-team_crawlers_session_s1_lifetime_90m_strict",
		"crawl-team_crawlers_strict_session_strict", "crawl-team_crawlers_lifetime_2m30s_session_a",
		"crawl-team_crawlers_zone_a_rotate_RANDOM", "a_b_session_x_lifetime_1h0m0s", "a_b__", "a_b_strict_strict",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		g, err := ParseGatewayUser(s)
		if err != nil {
			return
		}
		again, err := ParseGatewayUser(g.String())
		if err != nil || again != g {
			t.Fatalf("%q parsed to %+v, written %q, read back %+v, %v", s, g, g.String(), again, err)
		}
	})
}

// TestGatewayUserSessionOptions: lifetime and strict belong to a session;
// a value that is an option's name is still a value; bounds are named.
func TestGatewayUserSessionOptions(t *testing.T) {
	g, err := ParseGatewayUser("crawl-team_crawlers_strict_session_strict_lifetime_1h30m")
	if err != nil || !g.Strict || g.Session != "strict" || g.Lifetime != 90*time.Minute {
		t.Fatalf("got %+v, %v", g, err)
	}
	for in, want := range map[string]string{
		"crawl-team_crawlers_strict":                      "add session_<key>",
		"crawl-team_crawlers_lifetime_10m":                "add session_<key>",
		"crawl-team_crawlers_session_s_lifetime_30s":      "lifetime_30s must be a duration of 1m0s to 168h0m0s",
		"crawl-team_crawlers_session_s_lifetime_200h":     "lifetime_200h",
		"crawl-team_crawlers_session_s_lifetime_soon":     "lifetime_soon",
		"crawl-team_crawlers_session_s_lifetime":          `option "lifetime" has no value`,
		"crawl-team_crawlers_session_s_strict_strict":     "given twice",
		"crawl-team_crawlers_session_s_lifetime_-5m":      "lifetime_-5m",
		"crawl-team_crawlers_session_s_lifetime_1.5h":     "lifetime_1.5h",
		"crawl-team_crawlers_session_s_lifetime_1000000h": "lifetime_1000000h",
	} {
		if _, err := ParseGatewayUser(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want an error saying %q", in, err, want)
		}
	}
}
