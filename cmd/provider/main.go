// Command provider runs provider-egressproxy: the Crossplane provider that
// runs each Proxy on a backend (local Squid processes, Squid pods, GCP or
// AWS VMs) and probes through it.
package main

import (
	"context"
	"crypto/x509"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/alecthomas/kong"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"google.golang.org/api/option"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/feature"
	"github.com/crossplane/crossplane-runtime/v2/pkg/ratelimiter"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/statemetrics"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis"
	awsbackend "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/aws"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/local"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/cli"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/cli/runner"
	xcontroller "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/gc"
	pmetrics "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe/pool"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/reach"
)

// defaults are the defaults the packages keep, as the flags show and pass
// them: each is written once, in its package.
func defaults() kong.Vars {
	return kong.Vars{
		"gcp_operation_timeout": cli.Duration(gcp.DefaultOperationTimeout),
		"refused_grace":         cli.Duration(proxy.DefaultRefusedGrace),
		"local_restart_delay":   cli.Duration(local.DefaultRestartDelay),
		"probe_concurrency":     strconv.Itoa(pool.DefaultConcurrency),
	}
}

// description is what --help says the provider does.
const description = `provider-egressproxy runs Proxy managed resources on local Squid processes, Squid pods, or GCP and AWS VMs, and probes through each proxy to decide whether it is Ready.`

// CLI is the provider's settings; each can also come from the environment.
type CLI struct {
	Debug                   bool          `help:"Log at debug level." default:"false" env:"DEBUG"`
	LeaderElection          bool          `help:"Elect a leader, so that only one of several replicas reconciles." default:"false" env:"LEADER_ELECTION"`
	Poll                    time.Duration `help:"How often a steadily healthy Proxy's instance is checked for drift that leaves it serving (an edited firewall rule) and its passing probes folded in; at each probe when probes are further apart. Probes run at each Proxy's healthCheck.interval, and one that changes the verdict (an instance gone or not serving, an open proxy) brings its Proxy back at once." default:"5m" env:"POLL_INTERVAL"`
	StateMetricsInterval    time.Duration `help:"How often the managed-resource state metrics are recomputed." default:"30s" env:"STATE_METRICS_INTERVAL"`
	GCInterval              time.Duration `name:"gc-interval" help:"How often the orphan collector looks for instances whose Proxy is gone." default:"10m" env:"GC_INTERVAL"`
	GCGracePeriod           time.Duration `name:"gc-grace-period" help:"How old an orphaned instance must be before it is deleted." default:"15m" env:"GC_GRACE_PERIOD"`
	GCDryRun                bool          `name:"gc-dry-run" help:"Only log, count and record events for orphans; delete nothing." default:"false" env:"GC_DRY_RUN"`
	GCPOperationTimeout     time.Duration `name:"gcp-operation-timeout" help:"How long a GCP create waits for its VM insert operation, where Compute Engine reports quota errors and stockouts it finds at once; never past the reconcile's deadline. An insert still running then is handed off: the next create checks how it ended. Longer waits hold reconcile workers during scale-ups." default:"${gcp_operation_timeout}" env:"GCP_OPERATION_TIMEOUT"`
	RefusedGrace            time.Duration `name:"refused-grace" help:"How long an instance its ProviderConfig's policy no longer permits keeps running, not handed out, before it is deleted; 0 deletes it at once." default:"${refused_grace}" env:"REFUSED_GRACE"`
	MaxReconcileRate        int           `help:"The most reconciles per second across all Proxies, and the number of concurrent reconciles." default:"10" env:"MAX_RECONCILE_RATE"`
	StateDir                string        `help:"Where local-backend proxies keep their files when a ProviderConfig names no stateDir." default:"/var/lib/provider-egressproxy" env:"STATE_DIR"`
	LocalRestartDelay       time.Duration `help:"How long a local-backend Squid that died stays down before it is restarted." default:"${local_restart_delay}" env:"LOCAL_RESTART_DELAY"`
	ClusterID               string        `name:"cluster-id" help:"Names this control plane on every instance it creates; empty means the UID of the kube-system namespace." default:"" env:"CLUSTER_ID"`
	ProbeConcurrency        int           `name:"probe-concurrency" help:"How many probes run at once, on workers of their own: a proxy that never answers holds one for its timeout, never a reconcile worker. The default suits 1000 proxies probed every 30s with a tenth of them black-holed." default:"${probe_concurrency}" env:"PROBE_CONCURRENCY"`
	ProbeCABundle           string        `name:"probe-ca-bundle" help:"PEM file of extra CAs trusted when probing https targets behind a private CA." default:"" env:"PROBE_CA_BUNDLE"`
	TenantPrivateNetworks   []string      `name:"tenant-private-networks" help:"Private networks (CIDRs, comma-separated; loopback too) the probe may dial a proxy in whose address its tenant chose: an External Proxy's endpoint, or the address a namespaced ProviderConfig's backend reports. Empty: public addresses only. Link-local and metadata addresses are never dialed." default:"" env:"TENANT_PRIVATE_NETWORKS"`
	MetricsBindAddress      string        `help:"Address of the /metrics endpoint." default:":8080" env:"METRICS_BIND_ADDRESS"`
	HealthProbeBindAddress  string        `help:"Address of the /healthz and /readyz endpoints." default:":8081" env:"HEALTH_PROBE_BIND_ADDRESS"`
	PprofBindAddress        string        `help:"Address of Go's profiler (/debug/pprof/), to diagnose where time goes; empty (the default) turns it off. It asks for no credentials: bind it to loopback." default:"" env:"PPROF_BIND_ADDRESS"`
	LeaderElectionNamespace string        `help:"Namespace of the leader election lease." default:"crossplane-system" env:"POD_NAMESPACE"`
	// GCPTestEndpoint points every Compute API client at a fake of the
	// API on this host, without credentials, for the fault tests that kill
	// the provider process: hidden from --help and the docs, and
	// refused for anything but plain HTTP on loopback.
	GCPTestEndpoint string `name:"gcp-test-endpoint" hidden:"" default:"" env:"EGRESS_PROVIDER_TEST_GCP_ENDPOINT"`
	// AWSTestEndpoint points every EC2 client at a fake of the EC2 Query
	// API on this host, for the same tests, and under the same rules.
	AWSTestEndpoint string `name:"aws-test-endpoint" hidden:"" default:"" env:"EGRESS_PROVIDER_TEST_AWS_ENDPOINT"`
}

// Validate refuses settings that parse but cannot work: a ticker of zero
// panics, a rate of zero reconciles nothing.
func (c *CLI) Validate() error {
	if _, err := reach.ParseNetworks(c.TenantPrivateNetworks); err != nil {
		return errors.Wrap(err, "--tenant-private-networks (TENANT_PRIVATE_NETWORKS)")
	}
	for name, d := range map[string]time.Duration{
		"--poll (POLL_INTERVAL)": c.Poll, "--state-metrics-interval (STATE_METRICS_INTERVAL)": c.StateMetricsInterval,
		"--gc-interval (GC_INTERVAL)": c.GCInterval, "--local-restart-delay (LOCAL_RESTART_DELAY)": c.LocalRestartDelay,
		"--gcp-operation-timeout (GCP_OPERATION_TIMEOUT)": c.GCPOperationTimeout,
	} {
		if d <= 0 {
			return errors.Errorf("%s must be positive, not %s", name, d)
		}
	}
	if c.GCGracePeriod < 0 {
		return errors.Errorf("--gc-grace-period (GC_GRACE_PERIOD) must not be negative, not %s", c.GCGracePeriod)
	}
	if c.MaxReconcileRate < 1 {
		return errors.Errorf("--max-reconcile-rate (MAX_RECONCILE_RATE) must be at least 1, not %d", c.MaxReconcileRate)
	}
	if c.ProbeConcurrency < 1 {
		return errors.Errorf("--probe-concurrency (PROBE_CONCURRENCY) must be at least 1, not %d", c.ProbeConcurrency)
	}
	for env, e := range map[string]string{"EGRESS_PROVIDER_TEST_GCP_ENDPOINT": c.GCPTestEndpoint, "EGRESS_PROVIDER_TEST_AWS_ENDPOINT": c.AWSTestEndpoint} {
		if e == "" {
			continue
		}
		if u, err := url.Parse(e); err != nil || u.Scheme != "http" || !loopback(u.Hostname()) {
			return errors.Errorf("%s must be an http:// URL on loopback (a test's fake of the cloud's API), not %q", env, e)
		}
	}
	return nil
}

func loopback(host string) bool {
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

func main() {
	ctx := cli.Parse("provider", description, &CLI{}, defaults())
	ctx.FatalIfErrorf(ctx.Run())
}

// Run runs the provider until it is signalled to stop.
func (c *CLI) Run() error {
	ctx, log := runner.Start("provider-egressproxy", c.Debug)

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return errors.Wrap(err, "cannot get kubeconfig")
	}
	cfg.WarningHandlerWithContext = warnOnce()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return errors.Wrap(err, "cannot add client-go types")
	}
	if err := apis.AddToScheme(s); err != nil {
		return errors.Wrap(err, "cannot add product types")
	}
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		Scheme:                        s,
		LeaderElection:                c.LeaderElection,
		LeaderElectionID:              "provider-egressproxy",
		LeaderElectionNamespace:       c.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		Metrics:                       metricsserver.Options{BindAddress: c.MetricsBindAddress},
		HealthProbeBindAddress:        c.HealthProbeBindAddress,
		PprofBindAddress:              c.PprofBindAddress,
	})
	if err != nil {
		return errors.Wrap(err, "cannot create manager")
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return errors.Wrap(err, "cannot add health check")
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return errors.Wrap(err, "cannot add ready check")
	}

	clusterID := c.ClusterID
	if clusterID == "" {
		if clusterID, err = defaultClusterID(ctx, mgr.GetAPIReader()); err != nil {
			return err
		}
	}
	var pool *x509.CertPool
	if c.ProbeCABundle != "" {
		pem, err := os.ReadFile(c.ProbeCABundle)
		if err != nil {
			return errors.Wrap(err, "cannot read probe CA bundle")
		}
		if pool, err = x509.SystemCertPool(); err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return errors.Errorf("no certificates in probe CA bundle %s", c.ProbeCABundle)
		}
	}

	mrMetrics := managed.NewMRMetricRecorder()
	stateMetrics := statemetrics.NewMRStateMetrics()
	pm := pmetrics.NewProvider()
	metrics.Registry.MustRegister(mrMetrics, stateMetrics)
	metrics.Registry.MustRegister(pm.Collectors()...)

	bcfg := proxy.BackendsConfig{Kube: mgr.GetClient(), Config: cfg, ClusterID: clusterID, StateDir: c.StateDir, RestartDelay: c.LocalRestartDelay, Logger: log,
		GCPOperationTimeout: c.GCPOperationTimeout, AWSEndpoint: c.AWSTestEndpoint,
		// Observations share one listing of a region's instances, at
		// most half a poll old (10 s at most).
		AWSListingMaxAge: min(c.Poll/2, awsbackend.DefaultListingMaxAge)}
	if c.GCPTestEndpoint != "" {
		bcfg.GCPClientOptions = []option.ClientOption{option.WithEndpoint(c.GCPTestEndpoint), option.WithoutAuthentication()}
	}
	backends := proxy.NewBackends(bcfg)
	// Leave local Squids running on exit: the next provider re-adopts them.
	defer backends.Close()

	// Proxies honour spec.managementPolicies (Observe-only, keeping the
	// instance when the Proxy goes): crossplane-runtime obeys them only
	// with this flag.
	features := &feature.Flags{}
	features.Enable(feature.EnableBetaManagementPolicies)
	o := proxy.Options{
		Options: controller.Options{
			Logger:                  log,
			GlobalRateLimiter:       ratelimiter.NewGlobal(c.MaxReconcileRate),
			PollInterval:            c.Poll,
			MaxConcurrentReconciles: c.MaxReconcileRate,
			Features:                features,
			MetricOptions: &controller.MetricOptions{
				PollStateMetricInterval: c.StateMetricsInterval,
				MRMetrics:               mrMetrics,
				MRStateMetrics:          stateMetrics,
			},
		},
		Backends: backends, ClusterID: clusterID, RootCAs: pool, Metrics: pm, RefusedGrace: c.RefusedGrace,
		ProbeConcurrency: c.ProbeConcurrency,
	}
	if o.TenantPrivateNetworks, err = reach.ParseNetworks(c.TenantPrivateNetworks); err != nil {
		return errors.Wrap(err, "--tenant-private-networks (TENANT_PRIVATE_NETWORKS)")
	}
	if c.RefusedGrace <= 0 {
		o.RefusedGrace = -1 // at once; zero would mean the default
	}
	if err := xcontroller.Setup(mgr, o); err != nil {
		return err
	}
	collector := &gc.Collector{
		Sources:   proxy.CollectorSources{Kube: mgr.GetClient(), Backends: backends},
		ClusterID: clusterID, Grace: c.GCGracePeriod, DryRun: c.GCDryRun, Interval: c.GCInterval, Now: time.Now,
		Log: log.WithValues("controller", "orphan-collector"), Metrics: pm,
		Record: event.NewAPIRecorder(mgr.GetEventRecorderFor("orphan-collector")), //nolint:staticcheck // crossplane-runtime's recorder takes the old events API.
	}
	if err := mgr.Add(collector); err != nil {
		return errors.Wrap(err, "cannot add orphan collector")
	}
	log.Info("Starting provider-egressproxy", "cluster-id", clusterID, "state-dir", c.StateDir)
	return errors.Wrap(mgr.Start(ctx), "cannot run manager")
}

// warnOnce logs each distinct warning of the API server once. Every write
// of a Proxy draws the same warning about crossplane-runtime's finalizer
// names: unchecked, 712 log lines in the first minute of bringing up
// 10 000 proxies (make scale), and little else in the log.
func warnOnce() rest.WarningHandlerWithContext {
	return ctrllog.NewKubeAPIWarningLogger(ctrllog.KubeAPIWarningLoggerOptions{Deduplicate: true})
}

// defaultClusterID names the control plane by its kube-system namespace,
// which lives as long as the cluster does.
func defaultClusterID(ctx context.Context, c client.Reader) (string, error) {
	ns := &corev1.Namespace{}
	if err := c.Get(ctx, types.NamespacedName{Name: "kube-system"}, ns); err != nil {
		return "", errors.Wrap(err, "cannot read the kube-system namespace to derive a cluster ID: set --cluster-id")
	}
	return string(ns.UID), nil
}
