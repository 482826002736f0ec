// Command discovery runs egress-discovery: the HTTP API crawlers use to list
// and lease the healthy proxies of ProxyFleets. Any number of replicas can
// serve; the API server holds every lease.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

func main() {
	fs := flag.NewFlagSet("discovery", flag.ContinueOnError)
	addr := fs.String("address", envOr("ADDRESS", ":8080"), "Address of the API, the status page and /metrics (env ADDRESS).")
	health := fs.String("health-probe-bind-address", envOr("HEALTH_PROBE_BIND_ADDRESS", ":8081"), "Address of /healthz and /readyz (env HEALTH_PROBE_BIND_ADDRESS).")
	tokens := fs.String("token-file", os.Getenv("TOKEN_FILE"), "Optional file of static tokens for crawlers outside the cluster: \"<token> <namespace>[,<namespace>...]\" per line (env TOKEN_FILE).")
	sweep := fs.Duration("sweep-interval", 30*time.Second, "How often expired leases and the leases of deleted proxies are deleted.")
	debug := fs.Bool("debug", false, "Log at debug level.")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		os.Exit(2)
	}
	if err := run(ctrl.SetupSignalHandler(), *addr, *health, *tokens, *sweep, *debug); err != nil {
		fmt.Fprintln(os.Stderr, "discovery:", err)
		os.Exit(1)
	}
}

func envOr(k, def string) string {
	if v, ok := os.LookupEnv(k); ok {
		return v
	}
	return def
}

func run(ctx context.Context, addr, health, tokenFile string, sweep time.Duration, debug bool) error {
	zl := zap.New(zap.UseDevMode(debug))
	ctrl.SetLogger(zl)
	log := logging.NewLogrLogger(zl.WithName("egress-discovery"))
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return err
	}
	if err := apis.AddToScheme(s); err != nil {
		return err
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("cannot get kubeconfig: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		Scheme: s, HealthProbeBindAddress: health,
		// The API serves /metrics itself, on the API address.
		Metrics: metricsserver.Options{BindAddress: "0"},
	})
	if err != nil {
		return fmt.Errorf("cannot create manager: %w", err)
	}
	_ = mgr.AddHealthzCheck("healthz", healthz.Ping)
	_ = mgr.AddReadyzCheck("readyz", func(r *http.Request) error {
		if !mgr.GetCache().WaitForCacheSync(r.Context()) {
			return errors.New("cache not synced")
		}
		return nil
	})
	// Watch Proxies and Leases: the catalogue and the lease view read the
	// cache; every write goes to the API server. Any change bumps the
	// version that listing snapshots are checked against.
	var version atomic.Uint64
	bump := func(any) { version.Add(1) }
	for _, o := range []client.Object{&v1alpha1.Proxy{}, &coordv1.Lease{}} {
		inf, err := mgr.GetCache().GetInformer(ctx, o)
		if err != nil {
			return fmt.Errorf("cannot watch %T: %w", o, err)
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: bump, DeleteFunc: bump, UpdateFunc: func(_, n any) { bump(n) },
		}); err != nil {
			return fmt.Errorf("cannot watch %T: %w", o, err)
		}
	}
	// Watch ProxyFleet XRs too when Crossplane has made their CRD; without
	// it, fleets are known from their proxies alone.
	var fleets client.Reader
	xr := &unstructured.Unstructured{}
	xr.SetGroupVersionKind(schema.GroupVersionKind{Group: "crawl.example.com", Version: "v1alpha1", Kind: "ProxyFleet"})
	if _, err := mgr.GetCache().GetInformer(ctx, xr, cache.BlockUntilSynced(false)); err != nil {
		log.Info("Not watching ProxyFleets (is the XRD installed?): fleets are known from their proxies", "error", err)
	} else {
		fleets = mgr.GetCache()
	}
	auth := &discovery.Kubernetes{Client: mgr.GetClient()}
	if tokenFile != "" {
		if auth.Static, err = discovery.LoadStaticTokens(tokenFile); err != nil {
			return err
		}
	}
	store := &lease.Store{Client: mgr.GetClient(), Cache: mgr.GetCache()}
	srv := &discovery.Server{
		Catalog: &discovery.Catalog{Cache: mgr.GetCache(), Direct: mgr.GetAPIReader(), Fleets: fleets},
		Leases:  store, Auth: auth, Metrics: discovery.NewMetrics(), Log: log,
		Version: version.Load,
	}
	metrics.Registry.MustRegister(srv.Metrics.Collectors()...)
	metrics.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "egress_discovery_active_leases", Help: "Unexpired leases held by crawlers."}, func() float64 {
			l := &coordv1.LeaseList{}
			if mgr.GetCache().List(context.Background(), l, client.MatchingLabels{ownership.LeaseKindLabel: ownership.LeaseKindSlot}) != nil {
				return 0
			}
			n := 0
			for i := range l.Items {
				if !lease.Expired(&l.Items[i], time.Now()) {
					n++
				}
			}
			return float64(n)
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "egress_discovery_catalog_proxies", Help: "Proxies in the catalogue."}, func() float64 {
			l := &v1alpha1.ProxyList{}
			if mgr.GetCache().List(context.Background(), l, client.HasLabels{ownership.FleetLabel}) != nil {
				return 0
			}
			return float64(len(l.Items))
		}),
	)

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttpHandler())
	mux.Handle("/", srv.Handler())
	httpSrv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		go func() {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = httpSrv.Shutdown(sctx)
		}()
		log.Info("Serving egress-discovery", "address", addr)
		if err := httpSrv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})); err != nil {
		return err
	}
	// Every replica sweeps; deletes are guarded by resourceVersion, so two
	// sweeping at once do no harm.
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		t := time.NewTicker(sweep)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				n, err := store.Sweep(ctx, func(ns, name string) bool {
					return mgr.GetCache().Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &v1alpha1.Proxy{}) == nil
				}, time.Minute)
				if err != nil {
					log.Info("Sweep incomplete", "error", err)
				} else if n > 0 {
					log.Debug("Swept leases", "deleted", n)
				}
			}
		}
	})); err != nil {
		return err
	}
	return mgr.Start(ctx)
}
