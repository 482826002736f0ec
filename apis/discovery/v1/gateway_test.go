package v1

import (
	"fmt"
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
	lifetime := func(v string) string { return fmt.Sprintf(errFmtUserLifetime, "%s", v, "1m0s", "168h0m0s") }
	for in, want := range map[string]string{
		"crawl-team_crawlers_strict":                      errFmtUserSessionOnly,
		"crawl-team_crawlers_lifetime_10m":                errFmtUserSessionOnly,
		"crawl-team_crawlers_session_s_lifetime_30s":      lifetime("30s"),
		"crawl-team_crawlers_session_s_lifetime_200h":     lifetime("200h"),
		"crawl-team_crawlers_session_s_lifetime_soon":     lifetime("soon"),
		"crawl-team_crawlers_session_s_lifetime":          fmt.Sprintf(errFmtUserNoValue, "%s", "lifetime", "lifetime"),
		"crawl-team_crawlers_session_s_strict_strict":     fmt.Sprintf(errFmtUserTwice, "%s", "strict"),
		"crawl-team_crawlers_session_s_lifetime_-5m":      lifetime("-5m"),
		"crawl-team_crawlers_session_s_lifetime_1.5h":     lifetime("1.5h"),
		"crawl-team_crawlers_session_s_lifetime_1000000h": lifetime("1000000h"),
	} {
		// Each refusal names the username first (the %s left in want).
		if _, err := ParseGatewayUser(in); err == nil || err.Error() != fmt.Sprintf(want, in) {
			t.Errorf("%q: %v; want the error %q", in, err, fmt.Sprintf(want, in))
		}
	}
}

// TestGatewayUserRefusals: a malformed username is refused saying what is
// wrong with it, naming it.
func TestGatewayUserRefusals(t *testing.T) {
	for in, want := range map[string]string{
		"crawlers":                                               fmt.Sprintf(errFmtUserShape, "%s", gatewayUsage),
		"Crawl_crawlers":                                         fmt.Sprintf(errFmtUserNamespace, "%s", "Crawl"),
		"crawl-team_crawlers_session":                            fmt.Sprintf(errFmtUserNoValue, "%s", "session", "session"),
		"crawl-team_crawlers_session_a_session_b":                fmt.Sprintf(errFmtUserTwice, "%s", "session"),
		"crawl-team_crawlers_country_de":                         fmt.Sprintf(errFmtUserOption, "%s", "country"),
		"crawl-team_crawlers_session_a:b":                        fmt.Sprintf(errFmtUserSessionKey, "%s", "a:b"),
		"crawl-team_crawlers_session_" + strings.Repeat("k", 65): fmt.Sprintf(errFmtUserSessionKey, "%s", strings.Repeat("k", 65)),
		"crawl-team__crawlers":                                   fmt.Sprintf(errFmtUserFleet, "%s", ""),
		"crawl-team_crawlers_zone_local:a":                       fmt.Sprintf(errFmtUserZone, "%s", "local:a"),
		"crawl-team_crawlers_rotate_fastest":                     fmt.Sprintf(errFmtUserRotate, "%s", "fastest", "leastRecentlyUsed, roundRobin, random, leastConnections"),
		"crawl-team_crawlers_rotate_random_rotate_random":        fmt.Sprintf(errFmtUserTwice, "%s", "rotate"),
	} {
		if _, err := ParseGatewayUser(in); err == nil || err.Error() != fmt.Sprintf(want, in) {
			t.Errorf("%q: %v; want the error %q", in, err, fmt.Sprintf(want, in))
		}
	}
}
