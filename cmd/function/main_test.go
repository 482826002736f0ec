package main

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/alecthomas/kong"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/cli/clitest"
	proxyfleet "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/function"
)

func parser(t testing.TB, c *CLI) *kong.Kong {
	return clitest.New(t, "function", description, c, defaults())
}

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
		{Flag: "max-recv-message-size", Env: "MAX_RECV_MESSAGE_SIZE", Default: "16"},
		{Flag: "fixed-time", Env: "FIXED_TIME", Default: `""`},
		{Flag: "asn-database", Env: "ASN_DATABASE", Default: `""`},
		{Flag: "discovery-service-account", Env: "DISCOVERY_SERVICE_ACCOUNT", Default: `"egress-system/egress-discovery"`},
	}
	clitest.CheckSettings(t, k, want)
	clitest.CheckEnvs(t, k)
}

func TestBadEnv(t *testing.T) {
	cases := map[string]clitest.BadEnv{
		"Int":            {Env: "MAX_RECV_MESSAGE_SIZE", Value: "4MiB"},
		"Bool":           {Env: "FUNCTION_INSECURE", Value: "sure"},
		"Time":           {Env: "FIXED_TIME", Value: "yesterday"},
		"ServiceAccount": {Env: "DISCOVERY_SERVICE_ACCOUNT", Value: "egress-discovery"},
		// A database that does not open is no ASN counted, silently.
		"NoASNDatabase":   {Env: "ASN_DATABASE", Value: "/nonexistent/GeoLite2-ASN.mmdb"},
		"ASNNotADatabase": {Env: "ASN_DATABASE", Value: "/etc/hostname"},
	}
	clitest.CheckBadEnvs(t, parser, cases)
}

func TestSettings(t *testing.T) {
	defaults := CLI{Address: ":9443", MetricsAddress: ":8080", MaxRecvMessageSize: 16, DiscoveryAccount: "egress-system/egress-discovery"}
	fixed := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := map[string]clitest.Case[CLI]{
		"Defaults": {
			Reason: "With no flags and no environment every setting takes its default.",
			Want:   defaults,
		},
		"Env": {
			Reason: "A setting comes from its environment variable when no flag sets it.",
			Env:    map[string]string{"TLS_SERVER_CERTS_DIR": "/tls/server", "MAX_RECV_MESSAGE_SIZE": "8", "FUNCTION_INSECURE": "true", "FIXED_TIME": "2026-01-02T03:04:05Z"},
			Want: clitest.With(defaults, func(c *CLI) {
				c.TLSCertsDir, c.MaxRecvMessageSize, c.Insecure, c.FixedTime = "/tls/server", 8, true, instant{fixed}
			}),
		},
		"FlagWinsOverEnv": {
			Reason: "A flag on the command line wins over the environment.",
			Env:    map[string]string{"ADDRESS": ":1", "MAX_RECV_MESSAGE_SIZE": "8", "FUNCTION_INSECURE": "true", "FIXED_TIME": "2020-01-01T00:00:00Z"},
			Args:   []string{"--address", "127.0.0.1:9443", "--max-recv-message-size=16", "--insecure=false", "--fixed-time=2026-01-02T03:04:05Z"},
			Want: clitest.With(defaults, func(c *CLI) {
				c.Address, c.MaxRecvMessageSize, c.FixedTime = "127.0.0.1:9443", 16, instant{fixed}
			}),
		},
	}
	clitest.CheckCases(t, parser, cases)
}

// TestDiscoveryAccount: "none" and an empty setting grant egress-discovery
// nothing (a ServiceAccount with no name, the function's none), and a
// name is that ServiceAccount.
func TestDiscoveryAccount(t *testing.T) {
	for in, want := range map[string]types.NamespacedName{
		"none": {}, "": {},
		"egress-system/egress-discovery": proxyfleet.DefaultDiscoveryServiceAccount,
		"team/crawler":                   {Namespace: "team", Name: "crawler"},
	} {
		got, err := (&CLI{DiscoveryAccount: in}).discovery()
		if err != nil || got == nil || *got != want {
			t.Errorf("--discovery-service-account=%q: got %v, %v; want %v", in, got, err, want)
		}
	}
}

// TestDefaultsOnce: --discovery-service-account and
// --max-recv-message-size default to the function package's defaults.
func TestDefaultsOnce(t *testing.T) {
	c := &CLI{}
	clitest.CheckDefaults(t, parser(t, c), func() []any { return []any{c.DiscoveryAccount, c.MaxRecvMessageSize} },
		proxyfleet.DefaultDiscoveryServiceAccount.String(), proxyfleet.DefaultMaxRecvMessageMiB)
}
