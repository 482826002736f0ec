package main

import (
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/google/go-cmp/cmp"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/cli/clitest"
)

func parser(t *testing.T, c *CLI) *kong.Kong { return clitest.New(t, "function", description, c) }

func TestHelp(t *testing.T) {
	k := parser(t, &CLI{})
	// Crossplane, crossplane render, devenv and hack/render.sh start the
	// function with these names.
	want := []clitest.Setting{
		{Flag: "debug", Env: "DEBUG", Default: "false"},
		{Flag: "insecure", Env: "FUNCTION_INSECURE", Default: "false"},
		{Flag: "tls-certs-dir", Env: "TLS_SERVER_CERTS_DIR", Default: `""`},
		{Flag: "address", Env: "ADDRESS", Default: `":9443"`},
		{Flag: "metrics-address", Env: "METRICS_ADDRESS", Default: `":8080"`},
		{Flag: "max-recv-message-size", Env: "MAX_RECV_MESSAGE_SIZE", Default: "4"},
		{Flag: "fixed-time", Env: "FIXED_TIME", Default: `""`},
		{Flag: "asn-database", Env: "ASN_DATABASE", Default: `""`},
		{Flag: "discovery-service-account", Env: "DISCOVERY_SERVICE_ACCOUNT", Default: `"egress-system/egress-discovery"`},
	}
	clitest.CheckSettings(t, k, want)
	clitest.CheckEnvs(t, k)
}

func TestBadEnv(t *testing.T) {
	cases := map[string]struct {
		env, value string
	}{
		"Int":            {env: "MAX_RECV_MESSAGE_SIZE", value: "4MiB"},
		"Bool":           {env: "FUNCTION_INSECURE", value: "sure"},
		"Time":           {env: "FIXED_TIME", value: "yesterday"},
		"ServiceAccount": {env: "DISCOVERY_SERVICE_ACCOUNT", value: "egress-discovery"},
		// A database that does not open is no ASN counted, silently.
		"NoASNDatabase":   {env: "ASN_DATABASE", value: "/nonexistent/GeoLite2-ASN.mmdb"},
		"ASNNotADatabase": {env: "ASN_DATABASE", value: "/etc/hostname"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			clitest.CheckBadEnv(t, parser(t, &CLI{}), tc.env, tc.value)
		})
	}
}

func TestSettings(t *testing.T) {
	defaults := CLI{Address: ":9443", MetricsAddress: ":8080", MaxRecvMessageSize: 4, DiscoveryAccount: "egress-system/egress-discovery"}
	fixed := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	with := func(f func(c *CLI)) CLI {
		c := defaults
		f(&c)
		return c
	}
	cases := map[string]struct {
		reason string
		env    map[string]string
		args   []string
		want   CLI
	}{
		"Defaults": {
			reason: "With no flags and no environment every setting takes its default.",
			want:   defaults,
		},
		"Env": {
			reason: "A setting comes from its environment variable when no flag sets it.",
			env:    map[string]string{"TLS_SERVER_CERTS_DIR": "/tls/server", "MAX_RECV_MESSAGE_SIZE": "8", "FUNCTION_INSECURE": "true", "FIXED_TIME": "2026-01-02T03:04:05Z"},
			want: with(func(c *CLI) {
				c.TLSCertsDir, c.MaxRecvMessageSize, c.Insecure, c.FixedTime = "/tls/server", 8, true, instant{fixed}
			}),
		},
		"FlagWinsOverEnv": {
			reason: "A flag on the command line wins over the environment.",
			env:    map[string]string{"ADDRESS": ":1", "MAX_RECV_MESSAGE_SIZE": "8", "FUNCTION_INSECURE": "true", "FIXED_TIME": "2020-01-01T00:00:00Z"},
			args:   []string{"--address", "127.0.0.1:9443", "--max-recv-message-size=16", "--insecure=false", "--fixed-time=2026-01-02T03:04:05Z"},
			want: with(func(c *CLI) {
				c.Address, c.MaxRecvMessageSize, c.FixedTime = "127.0.0.1:9443", 16, instant{fixed}
			}),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := CLI{}
			clitest.Parse(t, parser(t, &got), tc.env, tc.args...)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("%s\n-want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}
