// Command provider runs provider-egressproxy: the Crossplane provider that
// runs each Proxy on a backend (local Squid processes, Squid pods) and probes
// through it.
package main

import (
	"context"
	"crypto/x509"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/feature"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/ratelimiter"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/statemetrics"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis"
	xcontroller "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/gc"
	pmetrics "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
)

// flags are the provider's settings; each can also come from the environment.
type flags struct {
	gcInterval, gcGrace           time.Duration
	gcDryRun                      bool
	debug, leaderElection         bool
	poll, stateMetricsInterval    time.Duration
	restartDelay                  time.Duration
	maxReconcileRate              int
	stateDir, clusterID, caBundle string
	metricsAddr, healthAddr, leNS string
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func parseFlags(args []string) (*flags, error) {
	fs := flag.NewFlagSet("provider", flag.ContinueOnError)
	f := &flags{}
	boolEnv := func(p *bool, name, envName string, def bool, usage string) {
		d, _ := strconv.ParseBool(env(envName, strconv.FormatBool(def)))
		fs.BoolVar(p, name, d, fmt.Sprintf("%s (env %s)", usage, envName))
	}
	durEnv := func(p *time.Duration, name, envName string, def time.Duration, usage string) {
		d, err := time.ParseDuration(env(envName, def.String()))
		if err != nil {
			d = def
		}
		fs.DurationVar(p, name, d, fmt.Sprintf("%s (env %s)", usage, envName))
	}
	strEnv := func(p *string, name, envName, def, usage string) {
		fs.StringVar(p, name, env(envName, def), fmt.Sprintf("%s (env %s)", usage, envName))
	}
	boolEnv(&f.debug, "debug", "DEBUG", false, "Log at debug level.")
	boolEnv(&f.leaderElection, "leader-election", "LEADER_ELECTION", false, "Elect a leader, so that only one of several replicas reconciles.")
	durEnv(&f.poll, "poll", "POLL_INTERVAL", time.Minute, "How often a Proxy is checked for drift when its health check sets no interval; each Proxy's healthCheck.interval sets its own probe cadence.")
	durEnv(&f.stateMetricsInterval, "state-metrics-interval", "STATE_METRICS_INTERVAL", 30*time.Second, "How often the managed-resource state metrics are recomputed.")
	durEnv(&f.gcInterval, "gc-interval", "GC_INTERVAL", 10*time.Minute, "How often the orphan collector looks for instances whose Proxy is gone.")
	durEnv(&f.gcGrace, "gc-grace-period", "GC_GRACE_PERIOD", 15*time.Minute, "How old an orphaned instance must be before it is deleted.")
	boolEnv(&f.gcDryRun, "gc-dry-run", "GC_DRY_RUN", false, "Only log, count and record events for orphans; delete nothing.")
	rate, _ := strconv.Atoi(env("MAX_RECONCILE_RATE", "10"))
	fs.IntVar(&f.maxReconcileRate, "max-reconcile-rate", rate, "The most reconciles per second across all Proxies, and the number of concurrent reconciles (env MAX_RECONCILE_RATE).")
	strEnv(&f.stateDir, "state-dir", "STATE_DIR", "/var/lib/provider-egressproxy", "Where local-backend proxies keep their files when a ProviderConfig names no stateDir.")
	durEnv(&f.restartDelay, "local-restart-delay", "LOCAL_RESTART_DELAY", 2*time.Second, "How long a local-backend Squid that died stays down before it is restarted.")
	strEnv(&f.clusterID, "cluster-id", "CLUSTER_ID", "", "Names this control plane on every instance it creates; empty means the UID of the kube-system namespace.")
	strEnv(&f.caBundle, "probe-ca-bundle", "PROBE_CA_BUNDLE", "", "PEM file of extra CAs trusted when probing https targets behind a private CA.")
	strEnv(&f.metricsAddr, "metrics-bind-address", "METRICS_BIND_ADDRESS", ":8080", "Address of the /metrics endpoint.")
	strEnv(&f.healthAddr, "health-probe-bind-address", "HEALTH_PROBE_BIND_ADDRESS", ":8081", "Address of the /healthz and /readyz endpoints.")
	strEnv(&f.leNS, "leader-election-namespace", "POD_NAMESPACE", "crossplane-system", "Namespace of the leader election lease.")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: provider [flags]\n\nprovider-egressproxy runs Proxy managed resources on local Squid processes or Squid pods\nand probes through each proxy to decide whether it is Ready.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	return f, fs.Parse(args)
}

func main() {
	f, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		os.Exit(2)
	}
	if err := run(ctrl.SetupSignalHandler(), f); err != nil {
		fmt.Fprintln(os.Stderr, "provider:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, f *flags) error {
	zl := zap.New(zap.UseDevMode(f.debug))
	ctrl.SetLogger(zl)
	log := logging.NewLogrLogger(zl.WithName("provider-egressproxy"))

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return errors.Wrap(err, "cannot get kubeconfig")
	}
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return errors.Wrap(err, "cannot add client-go types")
	}
	if err := apis.AddToScheme(s); err != nil {
		return errors.Wrap(err, "cannot add product types")
	}
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		Scheme:                        s,
		LeaderElection:                f.leaderElection,
		LeaderElectionID:              "provider-egressproxy",
		LeaderElectionNamespace:       f.leNS,
		LeaderElectionReleaseOnCancel: true,
		Metrics:                       metricsserver.Options{BindAddress: f.metricsAddr},
		HealthProbeBindAddress:        f.healthAddr,
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

	clusterID := f.clusterID
	if clusterID == "" {
		if clusterID, err = defaultClusterID(ctx, mgr.GetAPIReader()); err != nil {
			return err
		}
	}
	var pool *x509.CertPool
	if f.caBundle != "" {
		pem, err := os.ReadFile(f.caBundle)
		if err != nil {
			return errors.Wrap(err, "cannot read probe CA bundle")
		}
		if pool, err = x509.SystemCertPool(); err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return errors.Errorf("no certificates in probe CA bundle %s", f.caBundle)
		}
	}

	mrMetrics := managed.NewMRMetricRecorder()
	stateMetrics := statemetrics.NewMRStateMetrics()
	pm := pmetrics.NewProvider()
	metrics.Registry.MustRegister(mrMetrics, stateMetrics)
	metrics.Registry.MustRegister(pm.Collectors()...)

	backends := &proxy.Backends{Kube: mgr.GetClient(), Config: cfg, ClusterID: clusterID, StateDir: f.stateDir, RestartDelay: f.restartDelay, Logger: log}
	// Leave local Squids running on exit: the next provider re-adopts them.
	defer backends.Close()

	o := proxy.Options{
		Options: controller.Options{
			Logger:                  log,
			GlobalRateLimiter:       ratelimiter.NewGlobal(f.maxReconcileRate),
			PollInterval:            f.poll,
			MaxConcurrentReconciles: f.maxReconcileRate,
			Features:                &feature.Flags{},
			MetricOptions: &controller.MetricOptions{
				PollStateMetricInterval: f.stateMetricsInterval,
				MRMetrics:               mrMetrics,
				MRStateMetrics:          stateMetrics,
			},
		},
		Backends: backends, ClusterID: clusterID, RootCAs: pool, Metrics: pm,
	}
	if err := xcontroller.Setup(mgr, o); err != nil {
		return err
	}
	collector := &gc.Collector{
		Sources:   proxy.CollectorSources{Kube: mgr.GetClient(), Backends: backends},
		ClusterID: clusterID, Grace: f.gcGrace, DryRun: f.gcDryRun, Interval: f.gcInterval, Now: time.Now,
		Log: log.WithValues("controller", "orphan-collector"), Metrics: pm,
		Record: event.NewAPIRecorder(mgr.GetEventRecorderFor("orphan-collector")), //nolint:staticcheck // crossplane-runtime's recorder takes the old events API.
	}
	if err := mgr.Add(collector); err != nil {
		return errors.Wrap(err, "cannot add orphan collector")
	}
	log.Info("Starting provider-egressproxy", "cluster-id", clusterID, "state-dir", f.stateDir)
	return errors.Wrap(mgr.Start(ctx), "cannot run manager")
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
