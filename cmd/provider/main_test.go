package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/go-logr/logr/funcr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/local"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/cli/clitest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe/pool"
)

func parser(t testing.TB, c *CLI) *kong.Kong {
	return clitest.New(t, "provider", description, c, defaults())
}

func TestHelp(t *testing.T) {
	k := parser(t, &CLI{})
	// Manifests, devenv and docs/provider.md start the provider with these names.
	want := []clitest.Setting{
		{Flag: "debug", Env: "DEBUG", Default: "false"},
		{Flag: "leader-election", Env: "LEADER_ELECTION", Default: "false"},
		{Flag: "poll", Env: "POLL_INTERVAL", Default: "5m"},
		{Flag: "state-metrics-interval", Env: "STATE_METRICS_INTERVAL", Default: "30s"},
		{Flag: "gc-interval", Env: "GC_INTERVAL", Default: "10m"},
		{Flag: "gc-grace-period", Env: "GC_GRACE_PERIOD", Default: "15m"},
		{Flag: "gc-dry-run", Env: "GC_DRY_RUN", Default: "false"},
		{Flag: "gcp-operation-timeout", Env: "GCP_OPERATION_TIMEOUT", Default: "5s"},
		{Flag: "refused-grace", Env: "REFUSED_GRACE", Default: "5m"},
		{Flag: "max-reconcile-rate", Env: "MAX_RECONCILE_RATE", Default: "10"},
		{Flag: "state-dir", Env: "STATE_DIR", Default: `"/var/lib/provider-egressproxy"`},
		{Flag: "local-restart-delay", Env: "LOCAL_RESTART_DELAY", Default: "2s"},
		{Flag: "cluster-id", Env: "CLUSTER_ID", Default: `""`},
		{Flag: "probe-concurrency", Env: "PROBE_CONCURRENCY", Default: "128"},
		{Flag: "probe-ca-bundle", Env: "PROBE_CA_BUNDLE", Default: `""`},
		{Flag: "tenant-private-networks", Env: "TENANT_PRIVATE_NETWORKS", Default: `""`},
		{Flag: "metrics-bind-address", Env: "METRICS_BIND_ADDRESS", Default: `":8080"`},
		{Flag: "health-probe-bind-address", Env: "HEALTH_PROBE_BIND_ADDRESS", Default: `":8081"`},
		{Flag: "pprof-bind-address", Env: "PPROF_BIND_ADDRESS", Default: `""`},
		{Flag: "leader-election-namespace", Env: "POD_NAMESPACE", Default: `"crossplane-system"`},
	}
	clitest.CheckSettings(t, k, want)
	clitest.CheckEnvs(t, k)
}

func TestBadEnv(t *testing.T) {
	cases := map[string]clitest.BadEnv{
		"Duration": {Env: "POLL_INTERVAL", Value: "abc"},
		"Int":      {Env: "MAX_RECONCILE_RATE", Value: "ten"},
		"Bool":     {Env: "GC_DRY_RUN", Value: "maybe"},
		// Values that parse but cannot work: a zero ticker panics.
		"ZeroGCInterval":   {Env: "GC_INTERVAL", Value: "0s"},
		"NegativePoll":     {Env: "POLL_INTERVAL", Value: "-1m"},
		"ZeroRate":         {Env: "MAX_RECONCILE_RATE", Value: "0"},
		"NegativeGrace":    {Env: "GC_GRACE_PERIOD", Value: "-1s"},
		"ZeroRestartDelay": {Env: "LOCAL_RESTART_DELAY", Value: "0s"},
		"ZeroGCPWait":      {Env: "GCP_OPERATION_TIMEOUT", Value: "0s"},
		"NoProbeWorkers":   {Env: "PROBE_CONCURRENCY", Value: "0"},
		// The fault tests' fake Compute API: never off this host.
		"RemoteGCPEndpoint": {Env: "EGRESS_PROVIDER_TEST_GCP_ENDPOINT", Value: "https://compute.googleapis.com"},
		"GCPEndpointByName": {Env: "EGRESS_PROVIDER_TEST_GCP_ENDPOINT", Value: "http://localhost.example.com:8080"},
		"RemoteAWSEndpoint": {Env: "EGRESS_PROVIDER_TEST_AWS_ENDPOINT", Value: "https://ec2.us-east-1.amazonaws.com"},
		"AWSEndpointByName": {Env: "EGRESS_PROVIDER_TEST_AWS_ENDPOINT", Value: "http://localhost.example.com:8080"},
	}
	clitest.CheckBadEnvs(t, parser, cases)
}

func TestSettings(t *testing.T) {
	defaults := CLI{
		Poll: 5 * time.Minute, StateMetricsInterval: 30 * time.Second, GCInterval: 10 * time.Minute, GCGracePeriod: 15 * time.Minute,
		MaxReconcileRate: 10, StateDir: "/var/lib/provider-egressproxy", LocalRestartDelay: 2 * time.Second, RefusedGrace: 5 * time.Minute, GCPOperationTimeout: 5 * time.Second,
		ProbeConcurrency: 128, MetricsBindAddress: ":8080", HealthProbeBindAddress: ":8081", LeaderElectionNamespace: "crossplane-system",
	}
	cases := map[string]clitest.Case[CLI]{
		"Defaults": {
			Reason: "With no flags and no environment every setting takes its default.",
			Want:   defaults,
		},
		"Env": {
			Reason: "A setting comes from its environment variable when no flag sets it.",
			Env:    map[string]string{"POLL_INTERVAL": "7m", "MAX_RECONCILE_RATE": "3", "GC_DRY_RUN": "true", "POD_NAMESPACE": "egress"},
			Want: clitest.With(defaults, func(c *CLI) {
				c.Poll, c.MaxReconcileRate, c.GCDryRun, c.LeaderElectionNamespace = 7*time.Minute, 3, true, "egress"
			}),
		},
		"FlagWinsOverEnv": {
			Reason: "A flag on the command line wins over the environment.",
			Env:    map[string]string{"POLL_INTERVAL": "5m", "MAX_RECONCILE_RATE": "3", "GC_DRY_RUN": "true", "STATE_DIR": "/env"},
			Args:   []string{"--poll=2m", "--max-reconcile-rate", "7", "--gc-dry-run=false", "--state-dir=/flag"},
			Want: clitest.With(defaults, func(c *CLI) {
				c.Poll, c.MaxReconcileRate, c.StateDir = 2*time.Minute, 7, "/flag"
			}),
		},
	}
	clitest.CheckCases(t, parser, cases)
}

// TestWarnOnce: the API server's warnings reach the log once each, not on
// every write that draws them.
func TestWarnOnce(t *testing.T) {
	var lines []string
	ctx := ctrllog.IntoContext(context.Background(), funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{}))
	h := warnOnce()
	finalizer := `metadata.finalizers: "finalizer.managedresource.crossplane.io": prefer a domain-qualified finalizer name`
	for range 3 {
		h.HandleWarningHeaderWithContext(ctx, 299, "-", finalizer)
	}
	h.HandleWarningHeaderWithContext(ctx, 299, "-", "v1beta1 is deprecated")
	if len(lines) != 2 || !strings.Contains(lines[0], "finalizer") || !strings.Contains(lines[1], "deprecated") {
		t.Errorf("three of one warning and one of another logged %d lines, want one each: %q", len(lines), lines)
	}
}

// TestDefaultsOnce: the flags whose defaults a package keeps default to
// what it keeps.
func TestDefaultsOnce(t *testing.T) {
	c := &CLI{}
	clitest.CheckDefaults(t, parser(t, c), func() []any {
		return []any{c.GCPOperationTimeout, c.RefusedGrace, c.LocalRestartDelay, c.ProbeConcurrency}
	}, gcp.DefaultOperationTimeout, proxy.DefaultRefusedGrace, local.DefaultRestartDelay, pool.DefaultConcurrency)
}
