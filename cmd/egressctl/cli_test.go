package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/google/go-cmp/cmp"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/cli/clitest"
)

func parser(t *testing.T, c *CLI) *kong.Kong { return clitest.New(t, "egressctl", description, c) }

func TestHelp(t *testing.T) {
	k := parser(t, &CLI{})
	// Crawlers, the README and e2e run egressctl with these names.
	want := []clitest.Setting{
		{Flag: "server", Env: "EGRESS_DISCOVERY_URL", Default: "required"},
		{Flag: "token", Env: "EGRESS_DISCOVERY_TOKEN", Default: `""`},
		{Command: "lease", Flag: "fleet", Default: "required"},
		{Command: "lease", Flag: "zone", Default: `""`},
		{Command: "lease", Flag: "ttl", Default: `""`},
		{Command: "lease", Flag: "holder", Default: `""`},
		{Command: "lease", Flag: "sticky-key", Default: `""`},
		{Command: "lease", Flag: "domain", Default: `""`},
		{Command: "proxies", Flag: "fleet", Default: "required"},
		{Command: "proxies", Flag: "zone", Default: `""`},
	}
	clitest.CheckSettings(t, k, want)
}

func TestSettings(t *testing.T) {
	cases := map[string]struct {
		reason string
		env    map[string]string
		args   []string
		want   CLI
	}{
		"Env": {
			reason: "The server and token come from the environment when no flag sets them.",
			env:    map[string]string{"EGRESS_DISCOVERY_URL": "http://env", "EGRESS_DISCOVERY_TOKEN": "env-token"},
			args:   []string{"proxies", "--fleet", "ns/crawlers", "--zone=a"},
			want:   CLI{Server: "http://env", Token: "env-token", Proxies: proxiesCmd{fleetFlags{Fleet: "ns/crawlers", Zone: "a"}}},
		},
		"FlagWinsOverEnv": {
			reason: "A flag wins over the environment, and after -- everything is the command; kong keeps the --, and command() drops it.",
			env:    map[string]string{"EGRESS_DISCOVERY_URL": "http://env", "EGRESS_DISCOVERY_TOKEN": "env-token"},
			args:   []string{"lease", "--fleet", "ns/crawlers", "--server", "http://flag", "--token=flag-token", "--ttl", "10m", "--", "sh", "-c", "exit 3"},
			want: CLI{Server: "http://flag", Token: "flag-token", Lease: leaseCmd{
				fleetFlags: fleetFlags{Fleet: "ns/crawlers"}, TTL: "10m", Command: []string{"--", "sh", "-c", "exit 3"},
			}},
		},
		"CommandWithoutDashes": {
			reason: "Flags end at the command, so that the command's own flags pass through.",
			args:   []string{"lease", "--server=http://flag", "--fleet", "ns/crawlers", "curl", "-s", "--max-time", "5", "https://example.com"},
			want: CLI{Server: "http://flag", Lease: leaseCmd{
				fleetFlags: fleetFlags{Fleet: "ns/crawlers"}, Command: []string{"curl", "-s", "--max-time", "5", "https://example.com"},
			}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := CLI{}
			clitest.Parse(t, parser(t, &got), tc.env, tc.args...)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(leaseCmd{}, proxiesCmd{})); diff != "" {
				t.Errorf("%s\n-want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}

func TestUsageErrors(t *testing.T) {
	cases := map[string]struct {
		reason string
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
		"FlagOfAnotherCommand": {
			reason: "A flag only lease takes is an error on proxies.",
			args:   []string{"proxies", "--server", "http://127.0.0.1:1", "--fleet", "ns/crawlers", "--ttl", "1m"},
			want:   "unknown flag --ttl",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			clitest.Unsetenv(t, parser(t, &CLI{}))
			var out bytes.Buffer
			if code := run(context.Background(), tc.args, &out, &out); code == 0 || !strings.Contains(out.String(), tc.want) {
				t.Errorf("%s\nwant a non-zero exit code and %q, got %d and:\n%s", tc.reason, tc.want, code, out.String())
			}
		})
	}
}
