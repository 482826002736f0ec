package main

import (
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/cli/clitest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/gateway"
)

func parser(t testing.TB, c *CLI) *kong.Kong {
	return clitest.New(t, "discovery", description, c, defaults())
}

func TestHelp(t *testing.T) {
	k := parser(t, &CLI{})
	// cluster/discovery, devenv and e2e start discovery with these names.
	want := []clitest.Setting{
		{Flag: "address", Env: "ADDRESS", Default: `":8080"`},
		{Flag: "tls-cert-file", Env: "TLS_CERT_FILE", Default: `""`},
		{Flag: "tls-key-file", Env: "TLS_KEY_FILE", Default: `""`},
		{Flag: "health-probe-bind-address", Env: "HEALTH_PROBE_BIND_ADDRESS", Default: `":8081"`},
		{Flag: "pprof-bind-address", Env: "PPROF_BIND_ADDRESS", Default: `""`},
		{Flag: "token-file", Env: "TOKEN_FILE", Default: `""`},
		{Flag: "sweep-interval", Env: "SWEEP_INTERVAL", Default: "30s"},
		{Flag: "token-audience", Env: "TOKEN_AUDIENCE", Default: `"egress-discovery"`},
		{Flag: "auth-cache-size", Env: "AUTH_CACHE_SIZE", Default: "10000"},
		{Flag: "max-in-flight", Env: "MAX_IN_FLIGHT", Default: "256"},
		{Flag: "rate-per-identity", Env: "RATE_PER_IDENTITY", Default: "100"},
		{Flag: "burst-per-identity", Env: "BURST_PER_IDENTITY", Default: "200"},
		{Flag: "max-bans-per-fleet", Env: "MAX_BANS_PER_FLEET", Default: "5000"},
		{Flag: "max-bans-per-identity", Env: "MAX_BANS_PER_IDENTITY", Default: "1000"},
		{Flag: "max-waiting", Env: "MAX_WAITING", Default: "1024"},
		{Flag: "max-waiting-per-identity", Env: "MAX_WAITING_PER_IDENTITY", Default: "32"},
		{Flag: "gateway-address", Env: "GATEWAY_ADDRESS", Default: `""`},
		{Flag: "gateway-plain-http", Env: "GATEWAY_PLAIN_HTTP", Default: "false"},
		{Flag: "socks5-address", Env: "SOCKS5_ADDRESS", Default: `""`},
		{Flag: "socks5-plain", Env: "SOCKS5_PLAIN", Default: "false"},
		{Flag: "gateway-idle", Env: "GATEWAY_IDLE", Default: "1m"},
		{Flag: "gateway-max-conns", Env: "GATEWAY_MAX_CONNS", Default: "4096"},
		{Flag: "gateway-max-conns-per-identity", Env: "GATEWAY_MAX_CONNS_PER_IDENTITY", Default: "256"},
		{Flag: "gateway-max-conns-per-namespace", Env: "GATEWAY_MAX_CONNS_PER_NAMESPACE", Default: "1024"},
		{Flag: "gateway-max-seats", Env: "GATEWAY_MAX_SEATS", Default: "16"},
		{Flag: "gateway-tunnel-idle", Env: "GATEWAY_TUNNEL_IDLE", Default: "5m"},
		{Flag: "tenant-private-networks", Env: "TENANT_PRIVATE_NETWORKS", Default: `""`},
		{Flag: "reviews-per-address", Env: "REVIEWS_PER_ADDRESS", Default: "10"},
		{Flag: "review-burst-per-address", Env: "REVIEW_BURST_PER_ADDRESS", Default: "100"},
		{Flag: "status-page-plain-http", Env: "STATUS_PAGE_PLAIN_HTTP", Default: "false"},
		{Flag: "asn-database", Env: "ASN_DATABASE", Default: `""`},
		{Flag: "debug", Env: "DEBUG", Default: "false"},
	}
	clitest.CheckSettings(t, k, want)
	clitest.CheckEnvs(t, k)
}

func TestBadEnv(t *testing.T) {
	cases := map[string]clitest.BadEnv{
		"Duration": {Env: "SWEEP_INTERVAL", Value: "30"},
		// A database that does not open is no ASN counted, silently.
		"NoASNDatabase":   {Env: "ASN_DATABASE", Value: "/nonexistent/GeoLite2-ASN.mmdb"},
		"ASNNotADatabase": {Env: "ASN_DATABASE", Value: "/etc/hostname"},
		"Bool":            {Env: "DEBUG", Value: "verbose"},
		// A zero ticker panics.
		"ZeroSweep": {Env: "SWEEP_INTERVAL", Value: "0s"},
		// An empty cache or no request at all could not work.
		"ZeroCache":    {Env: "AUTH_CACHE_SIZE", Value: "0"},
		"ZeroInFlight": {Env: "MAX_IN_FLIGHT", Value: "0"},
		"NegativeRate": {Env: "RATE_PER_IDENTITY", Value: "-1"},
		"ZeroBurst":    {Env: "BURST_PER_IDENTITY", Value: "0"},
		"NegativeBans": {Env: "MAX_BANS_PER_FLEET", Value: "-1"},
		// A CIDR that does not parse would open nothing, silently.
		"BadPrivateNetwork":  {Env: "TENANT_PRIVATE_NETWORKS", Value: "10.0.0.0/33"},
		"ZeroTunnelIdle":     {Env: "GATEWAY_TUNNEL_IDLE", Value: "0s"},
		"NegativeReviews":    {Env: "REVIEWS_PER_ADDRESS", Value: "-1"},
		"ZeroNamespaceConns": {Env: "GATEWAY_MAX_CONNS_PER_NAMESPACE", Value: "0"},
	}
	clitest.CheckBadEnvs(t, parser, cases)
}

// TestValidateTLS: a certificate without its key, or a key without its
// certificate, cannot serve TLS and must not fall back to plain HTTP, so
// discovery refuses to start, naming both settings.
func TestValidateTLS(t *testing.T) {
	cases := map[string]struct {
		reason string
		env    map[string]string
		ok     bool
	}{
		"Neither": {
			reason: "Without a certificate and key discovery serves plain HTTP.",
			ok:     true,
		},
		"Both": {
			reason: "A certificate and its key serve TLS.",
			env:    map[string]string{"TLS_CERT_FILE": "/tls/tls.crt", "TLS_KEY_FILE": "/tls/tls.key"},
			ok:     true,
		},
		"CertOnly": {
			reason: "A certificate without its key is refused.",
			env:    map[string]string{"TLS_CERT_FILE": "/tls/tls.crt"},
		},
		"KeyOnly": {
			reason: "A key without its certificate is refused.",
			env:    map[string]string{"TLS_KEY_FILE": "/tls/tls.key"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			k := parser(t, &CLI{})
			clitest.Unsetenv(t, k)
			for env, v := range tc.env {
				t.Setenv(env, v)
			}
			printed, code := clitest.Run(t, k)
			if tc.ok && code != -1 {
				t.Errorf("%s\nwant discovery to run, got exit code %d:\n%s", tc.reason, code, printed)
			}
			if !tc.ok && (code <= 0 || !strings.Contains(printed, "TLS_CERT_FILE") || !strings.Contains(printed, "TLS_KEY_FILE")) {
				t.Errorf("%s\nwant a non-zero exit code and an error naming TLS_CERT_FILE and TLS_KEY_FILE, got %d:\n%s", tc.reason, code, printed)
			}
		})
	}
}

func TestSettings(t *testing.T) {
	defaults := CLI{Address: ":8080", HealthProbeBindAddress: ":8081", SweepInterval: 30 * time.Second, TokenAudience: "egress-discovery", AuthCacheSize: 10000, MaxInFlight: 256, RatePerIdentity: 100, BurstPerIdentity: 200, MaxBansPerFleet: 5000, MaxBansPerIdentity: 1000, MaxWaiting: 1024, MaxWaitingPerIdentity: 32, GatewayIdle: time.Minute, GatewayMaxConns: 4096, GatewayMaxConnsPerIdentity: 256,
		GatewayMaxConnsPerNS: 1024, GatewayMaxSeats: 16, GatewayTunnelIdle: 5 * time.Minute, ReviewsPerAddress: 10, ReviewBurstPerAddress: 100}
	cases := map[string]clitest.Case[CLI]{
		"Defaults": {
			Reason: "With no flags and no environment every setting takes its default.",
			Want:   defaults,
		},
		"Env": {
			Reason: "A setting comes from its environment variable when no flag sets it.",
			Env:    map[string]string{"ADDRESS": ":9090", "TOKEN_FILE": "/etc/tokens", "SWEEP_INTERVAL": "1m", "DEBUG": "1"},
			Want: clitest.With(defaults, func(c *CLI) {
				c.Address, c.TokenFile, c.SweepInterval, c.Debug = ":9090", "/etc/tokens", time.Minute, true
			}),
		},
		"FlagWinsOverEnv": {
			Reason: "A flag on the command line wins over the environment.",
			Env:    map[string]string{"ADDRESS": ":9090", "SWEEP_INTERVAL": "1m", "DEBUG": "true"},
			Args:   []string{"--address=:8080", "--sweep-interval", "2s", "--debug=false"},
			Want: clitest.With(defaults, func(c *CLI) {
				c.SweepInterval = 2 * time.Second
			}),
		},
	}
	clitest.CheckCases(t, parser, cases)
}

// TestPlatformLoopbackOutsideClustersOnly: make scale's hidden flag, which
// lets the gateway dial platform VMs on loopback, is refused where
// discovery runs in a pod, naming it; on one machine it runs.
func TestPlatformLoopbackOutsideClustersOnly(t *testing.T) {
	for _, inCluster := range []bool{false, true} {
		k := parser(t, &CLI{})
		clitest.Unsetenv(t, k)
		t.Setenv("EGRESS_DISCOVERY_TEST_PLATFORM_LOOPBACK", "true")
		host := ""
		if inCluster {
			host = "10.96.0.1"
		}
		t.Setenv("KUBERNETES_SERVICE_HOST", host)
		printed, code := clitest.Run(t, k)
		switch {
		case inCluster && (code <= 0 || !strings.Contains(printed, "EGRESS_DISCOVERY_TEST_PLATFORM_LOOPBACK")):
			t.Errorf("in a pod: want a non-zero exit code and an error naming EGRESS_DISCOVERY_TEST_PLATFORM_LOOPBACK, got %d:\n%s", code, printed)
		case !inCluster && code != -1:
			t.Errorf("on one machine: want discovery to run, got exit code %d:\n%s", code, printed)
		}
	}
}

// TestDefaultsOnce: the flags whose defaults a package keeps (the
// gateway's, the token reviewer's, the allocator's) default to what it
// keeps.
func TestDefaultsOnce(t *testing.T) {
	c := &CLI{}
	clitest.CheckDefaults(t, parser(t, c), func() []any {
		return []any{c.GatewayIdle, c.GatewayTunnelIdle, c.GatewayMaxConns, c.GatewayMaxConnsPerIdentity, c.GatewayMaxConnsPerNS, c.GatewayMaxSeats,
			c.TokenAudience, c.AuthCacheSize, c.MaxWaiting, c.MaxWaitingPerIdentity}
	}, gateway.DefaultIdle, gateway.DefaultTunnelIdle, gateway.DefaultMaxConns, gateway.DefaultMaxConnsPerIdentity, gateway.DefaultMaxConnsPerNamespace, gateway.DefaultMaxSeats,
		auth.DefaultAudience, auth.DefaultAuthCacheSize, allocator.DefaultMaxWaiting, allocator.DefaultMaxWaitingPerIdentity)
}
