package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/google/go-cmp/cmp"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/cli/clitest"
)

func parser(t testing.TB, c *CLI) *kong.Kong { return clitest.New(t, "egressctl", description, c) }

func TestHelp(t *testing.T) {
	k := parser(t, &CLI{})
	// Crawlers, the docs (docs/discovery.md, docs/gateway.md) and e2e run egressctl with these names.
	want := []clitest.Setting{
		{Flag: "server", Env: "EGRESS_DISCOVERY_URL", Default: "required"},
		{Flag: "token", Env: "EGRESS_DISCOVERY_TOKEN", Default: `""`},
		{Flag: "token-file", Env: "EGRESS_DISCOVERY_TOKEN_FILE", Default: `""`},
		{Flag: "ca-file", Env: "EGRESS_DISCOVERY_CA_FILE", Default: `""`},
		{Command: "lease", Flag: "fleet", Default: "required"},
		{Command: "lease", Flag: "zone", Default: `""`},
		{Command: "lease", Flag: "ttl", Default: `""`},
		{Command: "lease", Flag: "holder", Default: `""`},
		{Command: "lease", Flag: "sticky-key", Default: `""`},
		{Command: "lease", Flag: "domain", Default: `""`},
		{Command: "lease", Flag: "kill-grace", Default: "10s"},
		{Command: "lease", Flag: "wait", Default: "0s"},
		{Command: "proxies", Flag: "fleet", Default: "required"},
		{Command: "proxies", Flag: "zone", Default: `""`},
		{Command: "gateway-url", Flag: "fleet", Default: "required"},
		{Command: "gateway-url", Flag: "zone", Default: `""`},
		{Command: "gateway-url", Flag: "session", Default: `""`},
		{Command: "gateway-url", Flag: "gateway", Env: "EGRESS_GATEWAY_URL", Default: "required"},
	}
	clitest.CheckSettings(t, k, want)
}

func TestSettings(t *testing.T) {
	cases := map[string]clitest.Case[CLI]{
		"Env": {
			Reason: "The server, token and CA bundle come from the environment when no flag sets them.",
			Env:    map[string]string{"EGRESS_DISCOVERY_URL": "https://env", "EGRESS_DISCOVERY_TOKEN": "env-token", "EGRESS_DISCOVERY_CA_FILE": "/etc/ca.crt"},
			Args:   []string{"proxies", "--fleet", "ns/crawlers", "--zone=a"},
			Want:   CLI{Server: "https://env", Token: "env-token", CAFile: "/etc/ca.crt", Lease: leaseCmd{KillGrace: 10 * time.Second}, Proxies: proxiesCmd{fleetFlags{Fleet: "ns/crawlers", Zone: "a"}}},
		},
		"TokenFileEnv": {
			Reason: "The token file comes from the environment too.",
			Env:    map[string]string{"EGRESS_DISCOVERY_URL": "https://env", "EGRESS_DISCOVERY_TOKEN_FILE": "/var/run/secrets/egress-discovery/token"},
			Args:   []string{"proxies", "--fleet", "ns/crawlers"},
			Want:   CLI{Server: "https://env", TokenFile: "/var/run/secrets/egress-discovery/token", Lease: leaseCmd{KillGrace: 10 * time.Second}, Proxies: proxiesCmd{fleetFlags{Fleet: "ns/crawlers"}}},
		},
		"FlagWinsOverEnv": {
			Reason: "A flag wins over the environment, and after -- everything is the command; kong keeps the --, and command() drops it.",
			Env:    map[string]string{"EGRESS_DISCOVERY_URL": "http://env", "EGRESS_DISCOVERY_TOKEN": "env-token"},
			Args:   []string{"lease", "--fleet", "ns/crawlers", "--server", "http://flag", "--token=flag-token", "--ttl", "10m", "--kill-grace=30s", "--", "sh", "-c", "exit 3"},
			Want: CLI{Server: "http://flag", Token: "flag-token", Lease: leaseCmd{
				fleetFlags: fleetFlags{Fleet: "ns/crawlers"}, TTL: "10m", KillGrace: 30 * time.Second, Command: []string{"--", "sh", "-c", "exit 3"},
			}},
		},
		"CommandWithoutDashes": {
			Reason: "Flags end at the command, so that the command's own flags pass through.",
			Args:   []string{"lease", "--server=http://flag", "--fleet", "ns/crawlers", "curl", "-s", "--max-time", "5", "https://example.com"},
			Want: CLI{Server: "http://flag", Lease: leaseCmd{
				fleetFlags: fleetFlags{Fleet: "ns/crawlers"}, KillGrace: 10 * time.Second, Command: []string{"curl", "-s", "--max-time", "5", "https://example.com"},
			}},
		},
	}
	clitest.CheckCases(t, parser, cases, cmp.AllowUnexported(leaseCmd{}, proxiesCmd{}, gatewayURLCmd{}))
}

func TestUsageErrors(t *testing.T) {
	cases := map[string]struct {
		reason string
		env    map[string]string
		args   []string
		want   string
	}{
		"NoServer": {
			reason: "Without --server or its variable there is nothing to talk to.",
			args:   []string{"proxies", "--fleet", "ns/crawlers"},
			want:   "--server",
		},
		"NoCommand": {
			reason: "lease needs a command to run after --.",
			args:   []string{"lease", "--server", "http://127.0.0.1:1", "--fleet", "ns/crawlers", "--"},
			want:   "give the command to run after --",
		},
		"MissingCAFile": {
			reason: "A CA bundle that cannot be read is an error before anything is sent, not a fall back to the system's CAs.",
			args:   []string{"proxies", "--server", "https://127.0.0.1:1", "--ca-file", "/nonexistent/ca.crt", "--fleet", "ns/crawlers"},
			want:   "/nonexistent/ca.crt",
		},
		"TokenAndTokenFile": {
			reason: "A token and a token file exclude each other: either could be the stale one.",
			args:   []string{"proxies", "--server", "http://127.0.0.1:1", "--token", "t", "--token-file", "/var/run/secrets/egress-discovery/token", "--fleet", "ns/crawlers"},
			want:   "exclude each other",
		},
		"TokenEnvAndTokenFileFlag": {
			reason: "They exclude each other also when one comes from the environment.",
			env:    map[string]string{"EGRESS_DISCOVERY_TOKEN": "t"},
			args:   []string{"proxies", "--server", "http://127.0.0.1:1", "--token-file", "/var/run/secrets/egress-discovery/token", "--fleet", "ns/crawlers"},
			want:   "exclude each other",
		},
		"MissingTokenFile": {
			reason: "A token file that cannot be read is an error naming it, before anything is sent.",
			args:   []string{"proxies", "--server", "http://127.0.0.1:1", "--token-file", "/nonexistent/token", "--fleet", "ns/crawlers"},
			want:   "/nonexistent/token",
		},
		"FlagOfAnotherCommand": {
			reason: "A flag only lease takes is an error on proxies.",
			args:   []string{"proxies", "--server", "http://127.0.0.1:1", "--fleet", "ns/crawlers", "--ttl", "1m"},
			want:   "unknown flag --ttl",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			clitest.Unsetenv(t, parser(t, &CLI{}))
			for name, value := range tc.env {
				t.Setenv(name, value)
			}
			var out bytes.Buffer
			if code := run(context.Background(), tc.args, &out, &out); code == 0 || !strings.Contains(out.String(), tc.want) {
				t.Errorf("%s\nwant a non-zero exit code and %q, got %d and:\n%s", tc.reason, tc.want, code, out.String())
			}
		})
	}
}

// TestGatewayURL: gateway-url prints the gateway URL in the gateway's
// username grammar with the token as the password (escaped), from a token
// file too, and refuses what the gateway would.
func TestGatewayURL(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		want string
		code int
	}{
		{"session", []string{"--token", "t:0k/en", "gateway-url", "--fleet", "crawl-team/crawlers", "--session", "s1", "--gateway", "https://gw.example:8888"},
			"https://crawl-team_crawlers_session_s1:t%3A0k%2Fen@gw.example:8888\n", 0},
		{"zone and token file", []string{"--token-file", file, "gateway-url", "--fleet", "crawl-team/crawlers", "--zone", "local-a", "--gateway", "https://gw.example:8888/"},
			"https://crawl-team_crawlers_zone_local-a:from-file@gw.example:8888\n", 0},
		{"bad session key", []string{"--token", "t", "gateway-url", "--fleet", "crawl-team/crawlers", "--session", "a_b", "--gateway", "https://gw.example"}, "", 1},
		{"underscore in the fleet", []string{"--token", "t", "gateway-url", "--fleet", "crawl_team/crawlers", "--gateway", "https://gw.example"}, "", 1},
		{"no token", []string{"gateway-url", "--fleet", "crawl-team/crawlers", "--gateway", "https://gw.example"}, "", 1},
		{"not a URL", []string{"--token", "t", "gateway-url", "--fleet", "crawl-team/crawlers", "--gateway", "gw.example:8888"}, "", 1},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append([]string{"--server", "https://discovery.example"}, c.args...), &out, &errOut)
		if code != c.code || out.String() != c.want {
			t.Errorf("%s: exit %d, printed %q (%s); want exit %d and %q", c.name, code, out.String(), errOut.String(), c.code, c.want)
		}
	}
}
