// Command discovery runs egress-discovery: the HTTP API crawlers use to list
// and lease the healthy proxies of ProxyFleets. Any number of replicas can
// serve; the API server holds every lease.
//
// main.go holds the settings and their checks, the controller manager and
// the servers it runs (the API, the gateway over HTTP and SOCKS5);
// metrics.go serves /metrics from the controller-runtime registry.
package main

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/alecthomas/kong"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/cli"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/cli/runner"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/gateway"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/egressip"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	dmetrics "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/reach"
)

// defaults are the defaults the packages keep (the gateway's, the token
// reviewer's, the allocator's), as the flags show and pass them: each is
// written once, in its package.
func defaults() kong.Vars {
	return kong.Vars{
		"gateway_idle":                    cli.Duration(gateway.DefaultIdle),
		"gateway_tunnel_idle":             cli.Duration(gateway.DefaultTunnelIdle),
		"gateway_max_conns":               strconv.Itoa(gateway.DefaultMaxConns),
		"gateway_max_conns_per_identity":  strconv.Itoa(gateway.DefaultMaxConnsPerIdentity),
		"gateway_max_conns_per_namespace": strconv.Itoa(gateway.DefaultMaxConnsPerNamespace),
		"gateway_max_seats":               strconv.Itoa(gateway.DefaultMaxSeats),
		"token_audience":                  auth.DefaultAudience,
		"auth_cache_size":                 strconv.Itoa(auth.DefaultAuthCacheSize),
		"max_waiting":                     strconv.Itoa(allocator.DefaultMaxWaiting),
		"max_waiting_per_identity":        strconv.Itoa(allocator.DefaultMaxWaitingPerIdentity),
	}
}

// description is what --help says discovery does.
const description = "egress-discovery serves the API crawlers use to list and lease the healthy proxies of ProxyFleets."

// CLI is discovery's settings; each can also come from the environment.
type CLI struct {
	Address                    string        `help:"Address of the API, the status page and /metrics." default:":8080" env:"ADDRESS"`
	TLSCertFile                string        `name:"tls-cert-file" help:"PEM certificate (chain) to serve the API over HTTPS with, read again when it changes; with --tls-key-file. Empty serves plain HTTP." default:"" env:"TLS_CERT_FILE"`
	TLSKeyFile                 string        `name:"tls-key-file" help:"PEM private key of --tls-cert-file." default:"" env:"TLS_KEY_FILE"`
	HealthProbeBindAddress     string        `help:"Address of /healthz and /readyz." default:":8081" env:"HEALTH_PROBE_BIND_ADDRESS"`
	PprofBindAddress           string        `help:"Address of Go's profiler (/debug/pprof/), to diagnose where time goes; empty (the default) turns it off. It asks for no credentials: bind it to loopback." default:"" env:"PPROF_BIND_ADDRESS"`
	TokenFile                  string        `help:"Optional file of static tokens for crawlers outside the cluster: \"<token> <namespace>[,<namespace>...]\" per line." default:"" env:"TOKEN_FILE"`
	SweepInterval              time.Duration `help:"How often expired leases and the leases of deleted proxies are deleted." default:"30s" env:"SWEEP_INTERVAL"`
	TokenAudience              string        `help:"Audience a ServiceAccount token must be issued for (kubectl create token <sa> --audience egress-discovery, or a projected token volume with it); a token for the API server is refused. Empty accepts any." default:"${token_audience}" env:"TOKEN_AUDIENCE"`
	AuthCacheSize              int           `help:"How many token reviews, and how many access reviews, are remembered (30s each); the least recently used go first." default:"${auth_cache_size}" env:"AUTH_CACHE_SIZE"`
	MaxInFlight                int           `help:"How many API requests are served at once; more are answered 503 with Retry-After." default:"256" env:"MAX_IN_FLIGHT"`
	RatePerIdentity            float64       `help:"Requests a second each caller identity may make on average (a token bucket); more are answered 429 with Retry-After. 0 sets no limit." default:"100" env:"RATE_PER_IDENTITY"`
	BurstPerIdentity           int           `help:"Requests each caller identity may make at once, above its rate." default:"200" env:"BURST_PER_IDENTITY"`
	MaxBansPerFleet            int           `help:"Live domain bans crawlers may report in a fleet; a report over it is answered 429. Bans the gateway takes from origins' answers have a bound of their own, a quarter of this. 0 sets no bound." default:"5000" env:"MAX_BANS_PER_FLEET"`
	MaxBansPerIdentity         int           `help:"Live domain bans one caller identity may hold in a fleet; a report over it is answered 429. 0 sets no bound." default:"1000" env:"MAX_BANS_PER_IDENTITY"`
	MaxWaiting                 int           `help:"Acquisitions that may wait for a slot (spec.leases.admission.maxWait) on this replica at once; a waiting one gives its in-flight slot back. More are refused at once." default:"${max_waiting}" env:"MAX_WAITING"`
	MaxWaitingPerIdentity      int           `help:"Acquisitions one caller identity may have waiting on this replica at once; more are refused at once." default:"${max_waiting_per_identity}" env:"MAX_WAITING_PER_IDENTITY"`
	GatewayAddress             string        `help:"Address of the rotating gateway, an HTTP forward proxy for crawlers: user <namespace>_<fleet>[_session_<key>][_zone_<zone>], password a discovery token. It serves TLS with --tls-cert-file. Empty turns it off." default:"" env:"GATEWAY_ADDRESS"`
	GatewayPlainHTTP           bool          `name:"gateway-plain-http" help:"Serve the gateway over plain HTTP, tokens in the clear: for loopback and tests only." default:"false" env:"GATEWAY_PLAIN_HTTP"`
	SOCKS5Address              string        `name:"socks5-address" help:"Address of the gateway's SOCKS5 listener (RFC 1928 CONNECT, RFC 1929 username and password: the gateway's username grammar and a discovery token; no BIND or UDP ASSOCIATE), over TLS with --tls-cert-file as the HTTP gateway, or in the clear with --socks5-plain or --gateway-plain-http. Empty turns it off." default:"" env:"SOCKS5_ADDRESS"`
	SOCKS5Plain                bool          `name:"socks5-plain" help:"Serve SOCKS5 in the clear, tokens unencrypted (most SOCKS5 clients, curl and PySocks among them, speak no TLS to a proxy): for loopback, or a network the platform trusts." default:"false" env:"SOCKS5_PLAIN"`
	GatewayIdle                time.Duration `help:"How long a gateway session keeps its lease, and so its proxy, after its last connection closes." default:"${gateway_idle}" env:"GATEWAY_IDLE"`
	GatewayMaxConns            int           `help:"Connections the gateway holds open at once; more are answered 503." default:"${gateway_max_conns}" env:"GATEWAY_MAX_CONNS"`
	GatewayMaxConnsPerIdentity int           `help:"Connections one caller identity holds open through the gateway at once; more are answered 429." default:"${gateway_max_conns_per_identity}" env:"GATEWAY_MAX_CONNS_PER_IDENTITY"`
	GatewayMaxConnsPerNS       int           `name:"gateway-max-conns-per-namespace" help:"Connections the callers of one namespace's fleets hold open through the gateway at once, sessions' included: one tenant cannot fill the gateway. More are answered 429." default:"${gateway_max_conns_per_namespace}" env:"GATEWAY_MAX_CONNS_PER_NAMESPACE"`
	GatewayMaxSeats            int           `name:"gateway-max-seats" help:"Seats (leases the gateway holds for connections without a session, one per proxy in use) per fleet and zone on this replica. Rotation reaches a larger fleet over time: at the bound, an idle seat gives way to another proxy at most every minute / this many." default:"${gateway_max_seats}" env:"GATEWAY_MAX_SEATS"`
	GatewayTunnelIdle          time.Duration `help:"How long a gateway tunnel may move nothing either way before it is closed; any traffic starts the wait again." default:"${gateway_tunnel_idle}" env:"GATEWAY_TUNNEL_IDLE"`
	TenantPrivateNetworks      []string      `name:"tenant-private-networks" help:"Private networks (CIDRs, comma-separated; loopback too) the gateway may dial a proxy in whose address its tenant chose (External, or of a namespaced ProviderConfig), as the provider's flag of the same name. Empty: public addresses only. Link-local and metadata addresses are never dialed." default:"" env:"TENANT_PRIVATE_NETWORKS"`
	ReviewsPerAddress          float64       `help:"New tokens a second each client address may have reviewed (a token bucket, before authentication); a token reviewed lately costs nothing. More are answered 429. 0 sets no limit." default:"10" env:"REVIEWS_PER_ADDRESS"`
	ReviewBurstPerAddress      int           `help:"New tokens each client address may have reviewed at once, above its rate." default:"100" env:"REVIEW_BURST_PER_ADDRESS"`
	StatusPagePlainHTTP        bool          `name:"status-page-plain-http" help:"Send the status page's sign-in cookie without Secure, for a browser reaching egress-discovery over plain HTTP (loopback and tests). By default it is Secure, also when TLS ends at an ingress in front." default:"false" env:"STATUS_PAGE_PLAIN_HTTP"`
	ASNDatabase                string        `name:"asn-database" help:"An IP-to-ASN database in the MaxMind DB format (GeoLite2-ASN, an IPinfo ASN export), read when starting: the fleet metrics and the status page count each fleet's ASNs. None is shipped; empty counts none." default:"" env:"ASN_DATABASE" placeholder:"FILE"`
	Debug                      bool          `help:"Log at debug level." default:"false" env:"DEBUG"`
	// ClockOffset runs the replica's clock off from the machine's, for
	// tests of clock skew only (Go reads the time through the vDSO, so
	// faketime cannot): hidden from --help and the docs.
	ClockOffset time.Duration `hidden:"" default:"0s" env:"EGRESS_DISCOVERY_TEST_CLOCK_OFFSET"`
	// PlatformLoopback lets the gateway dial platform GCP VMs at
	// reach.StandInVMs (127.1.0.0/16), for make scale only, whose stand-in
	// VMs the fake Compute API puts there: hidden from --help and the
	// docs, and refused inside a cluster.
	PlatformLoopback bool `hidden:"" default:"false" env:"EGRESS_DISCOVERY_TEST_PLATFORM_LOOPBACK"`
}

// Validate refuses settings that parse but cannot work: a ticker of zero
// panics.
func (c *CLI) Validate() error {
	if err := egressip.CheckASNDB(c.ASNDatabase); err != nil {
		return errors.Wrap(err, "--asn-database (ASN_DATABASE)")
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errors.New("--tls-cert-file (TLS_CERT_FILE) and --tls-key-file (TLS_KEY_FILE) go together: set both or neither")
	}
	if c.PlatformLoopback && os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		return errors.New("EGRESS_DISCOVERY_TEST_PLATFORM_LOOPBACK is for make scale on one machine only: a VM is never on a pod's loopback; unset it")
	}
	if c.SweepInterval <= 0 {
		return errors.Errorf("--sweep-interval (SWEEP_INTERVAL) must be positive, not %s", c.SweepInterval)
	}
	if c.AuthCacheSize < 1 {
		return errors.Errorf("--auth-cache-size (AUTH_CACHE_SIZE) must be at least 1, not %d", c.AuthCacheSize)
	}
	if c.MaxInFlight < 1 {
		return errors.Errorf("--max-in-flight (MAX_IN_FLIGHT) must be at least 1, not %d", c.MaxInFlight)
	}
	if c.MaxWaiting < 1 || c.MaxWaitingPerIdentity < 1 {
		return errors.Errorf("--max-waiting (MAX_WAITING) and --max-waiting-per-identity (MAX_WAITING_PER_IDENTITY) must be at least 1, not %d and %d", c.MaxWaiting, c.MaxWaitingPerIdentity)
	}
	if c.MaxBansPerFleet < 0 || c.MaxBansPerIdentity < 0 {
		return errors.Errorf("--max-bans-per-fleet (MAX_BANS_PER_FLEET) and --max-bans-per-identity (MAX_BANS_PER_IDENTITY) must be 0 (no bound) or positive, not %d and %d", c.MaxBansPerFleet, c.MaxBansPerIdentity)
	}
	if err := c.validateGateway(); err != nil {
		return err
	}
	if c.RatePerIdentity < 0 || (c.RatePerIdentity > 0 && c.BurstPerIdentity < 1) {
		return errors.Errorf("--rate-per-identity (RATE_PER_IDENTITY) must be 0 (no limit) or positive with --burst-per-identity (BURST_PER_IDENTITY) at least 1, not %g and %d", c.RatePerIdentity, c.BurstPerIdentity)
	}
	return nil
}

// validateGateway refuses gateway settings that cannot work.
func (c *CLI) validateGateway() error {
	if c.SOCKS5Address != "" && c.TLSCertFile == "" && !c.GatewayPlainHTTP && !c.SOCKS5Plain {
		return errors.New("--socks5-address (SOCKS5_ADDRESS) serves TLS with --tls-cert-file (TLS_CERT_FILE), which is unset: set it, or --socks5-plain to serve it in the clear")
	}
	if c.GatewayAddress != "" && c.TLSCertFile == "" && !c.GatewayPlainHTTP {
		return errors.New("--gateway-address (GATEWAY_ADDRESS) serves TLS with --tls-cert-file (TLS_CERT_FILE), which is unset: set it, or --gateway-plain-http for loopback and tests")
	}
	if c.GatewayMaxSeats < 1 {
		return errors.Errorf("--gateway-max-seats (GATEWAY_MAX_SEATS) must be at least 1, not %d", c.GatewayMaxSeats)
	}
	if c.GatewayMaxConns < 1 || c.GatewayMaxConnsPerIdentity < 1 || c.GatewayMaxConnsPerNS < 1 {
		return errors.Errorf("--gateway-max-conns (GATEWAY_MAX_CONNS), --gateway-max-conns-per-identity (GATEWAY_MAX_CONNS_PER_IDENTITY) and --gateway-max-conns-per-namespace (GATEWAY_MAX_CONNS_PER_NAMESPACE) must be at least 1, not %d, %d and %d", c.GatewayMaxConns, c.GatewayMaxConnsPerIdentity, c.GatewayMaxConnsPerNS)
	}
	if c.GatewayIdle <= 0 {
		return errors.Errorf("--gateway-idle (GATEWAY_IDLE) must be positive, not %s", c.GatewayIdle)
	}
	if c.GatewayTunnelIdle <= 0 {
		return errors.Errorf("--gateway-tunnel-idle (GATEWAY_TUNNEL_IDLE) must be positive, not %s", c.GatewayTunnelIdle)
	}
	if _, err := reach.ParseNetworks(c.TenantPrivateNetworks); err != nil {
		return errors.Wrap(err, "--tenant-private-networks (TENANT_PRIVATE_NETWORKS)")
	}
	if c.ReviewsPerAddress < 0 || (c.ReviewsPerAddress > 0 && c.ReviewBurstPerAddress < 1) {
		return errors.Errorf("--reviews-per-address (REVIEWS_PER_ADDRESS) must be 0 (no limit) or positive with --review-burst-per-address (REVIEW_BURST_PER_ADDRESS) at least 1, not %g and %d", c.ReviewsPerAddress, c.ReviewBurstPerAddress)
	}
	return nil
}

func main() {
	ctx := cli.Parse("discovery", description, &CLI{}, defaults())
	ctx.FatalIfErrorf(ctx.Run())
}

// Run serves the API until the process is signalled to stop.
func (c *CLI) Run() error {
	ctx, log := runner.Start("egress-discovery", c.Debug)
	mgr, err := c.newManager()
	if err != nil {
		return err
	}
	version, err := discovery.WatchVersion(ctx, mgr.GetCache())
	if err != nil {
		return err
	}
	if err := lease.IndexCache(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	// Watch ProxyFleet XRs too when Crossplane has made their CRD; without
	// it, fleets are known from their proxies alone.
	var fleets client.Reader
	xr := &unstructured.Unstructured{}
	xr.SetGroupVersionKind(fleetv1alpha1.SchemeGroupVersion.WithKind(fleetv1alpha1.ProxyFleetKind))
	if _, err := mgr.GetCache().GetInformer(ctx, xr, cache.BlockUntilSynced(false)); err != nil {
		log.Info("Not watching ProxyFleets (is the XRD installed?): fleets are known from their proxies", "error", err)
	} else {
		fleets = mgr.GetCache()
	}
	now := time.Now
	if off := c.ClockOffset; off != 0 {
		log.Info("Running with a skewed clock, for a test", "offset", off)
		now = func() time.Time { return time.Now().Add(off) }
	}
	authCfg := discovery.KubernetesConfig{Client: mgr.GetClient(), CacheSize: c.AuthCacheSize, Audience: c.TokenAudience, Now: now}
	if c.ReviewsPerAddress > 0 {
		authCfg.Reviews = &discovery.IdentityLimits{Rate: rate.Limit(c.ReviewsPerAddress), Burst: c.ReviewBurstPerAddress, Size: c.AuthCacheSize}
	}
	if c.TokenFile != "" {
		if authCfg.Static, err = discovery.LoadStaticTokens(c.TokenFile); err != nil {
			return errors.Wrap(err, "cannot load static tokens")
		}
	}
	auth := discovery.NewKubernetes(authCfg)
	// One name for this replica in all it publishes, and in its own count
	// of the replicas a fleet's pacing is shared by.
	replica := discovery.ReplicaName()
	store := lease.NewStore(lease.StoreConfig{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Cache: mgr.GetCache(), OwnerOf: discovery.ProxyOwner(mgr.GetCache()), FleetOwnerOf: discovery.ProxyController(mgr.GetCache(), fleets), Serving: discovery.ProxyServing(mgr.GetCache()), Now: now})
	var asn egressip.ASNLookup
	if c.ASNDatabase != "" {
		db, err := egressip.OpenASNDB(c.ASNDatabase)
		if err != nil {
			return errors.Wrap(err, "--asn-database (ASN_DATABASE)")
		}
		defer db.Close() //nolint:errcheck // Read only.
		asn = db
	}
	var limits *discovery.IdentityLimits
	if c.RatePerIdentity > 0 {
		limits = &discovery.IdentityLimits{Rate: rate.Limit(c.RatePerIdentity), Burst: c.BurstPerIdentity, Size: c.AuthCacheSize}
	}
	srv := discovery.NewServer(discovery.ServerConfig{
		ASN: asn, Limits: limits,
		Catalog: discovery.NewCatalog(discovery.CatalogConfig{Cache: mgr.GetCache(), Direct: mgr.GetAPIReader(), Fleets: fleets, Now: now}), Now: now,
		Leases: store, Auth: auth, Metrics: dmetrics.NewDiscovery(), Log: log,
		Version: version, MaxBansPerFleet: c.MaxBansPerFleet, MaxBansPerIdentity: c.MaxBansPerIdentity,
		MaxWaiting: c.MaxWaiting, MaxWaitingPerIdentity: c.MaxWaitingPerIdentity,
		PlainHTTPCookie: c.StatusPagePlainHTTP, Replicas: discovery.Replicas(mgr.GetCache(), now, replica), Replica: replica,
	})
	metrics.Registry.MustRegister(srv.Metrics.Collectors()...)
	metrics.Registry.MustRegister(discovery.CatalogGauges(mgr.GetCache())...)
	metrics.Registry.MustRegister(discovery.FleetCollector{Server: srv})
	if err := mgr.Add(c.apiServer(srv, log)); err != nil {
		return errors.Wrap(err, "cannot add the API server")
	}
	if err := c.addGateway(mgr, srv, log); err != nil {
		return err
	}
	if err := mgr.Add(&discovery.Sweeper{Leases: store, Proxies: mgr.GetCache(), Interval: c.SweepInterval, Log: log}); err != nil {
		return errors.Wrap(err, "cannot add the lease sweeper")
	}
	if fleets != nil {
		if err := mgr.Add(discovery.NewDemandPublisher(discovery.DemandPublisherConfig{Server: srv, Client: mgr.GetClient(), Fleets: fleets, Replica: replica, Log: log})); err != nil {
			return errors.Wrap(err, "cannot add the demand publisher")
		}
	}
	if err := mgr.Add(discovery.NewSummaryPublisher(discovery.SummaryPublisherConfig{Server: srv, Client: mgr.GetClient(), Replica: replica, Log: log})); err != nil {
		return errors.Wrap(err, "cannot add the lease summary publisher")
	}
	return errors.Wrap(mgr.Start(ctx), "cannot run manager")
}

// newManager makes the controller manager whose cache the API reads, with
// health and readiness checks.
func (c *CLI) newManager() (manager.Manager, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, errors.Wrap(err, "cannot add client-go types")
	}
	if err := apis.AddToScheme(s); err != nil {
		return nil, errors.Wrap(err, "cannot add product types")
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return nil, errors.Wrap(err, "cannot get kubeconfig")
	}
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		Scheme: s, HealthProbeBindAddress: c.HealthProbeBindAddress, PprofBindAddress: c.PprofBindAddress,
		// Only the Leases discovery makes, by their label: node
		// heartbeats and leader elections cost it nothing.
		Cache: discovery.CacheOptions(),
		// The API serves /metrics itself, on the API address.
		Metrics: metricsserver.Options{BindAddress: "0"},
	})
	if err != nil {
		return nil, errors.Wrap(err, "cannot create manager")
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, errors.Wrap(err, "cannot add health check")
	}
	if err := mgr.AddReadyzCheck("readyz", func(r *http.Request) error {
		if !mgr.GetCache().WaitForCacheSync(r.Context()) {
			return errors.New("cache not synced")
		}
		return nil
	}); err != nil {
		return nil, errors.Wrap(err, "cannot add ready check")
	}
	return mgr, nil
}

// gatewayServer serves the gateway until the manager stops, over TLS with
// the API's certificate unless plain HTTP was asked for, then releases its
// sessions' leases.
func (c *CLI) gatewayServer(gw *discovery.Gateway, log logging.Logger) manager.Runnable {
	httpSrv := &http.Server{
		Addr: c.GatewayAddress, Handler: gw,
		// Tunnels live long: no read or write timeout, only for headers.
		ReadHeaderTimeout: discovery.ReadHeaderTimeout, MaxHeaderBytes: discovery.MaxHeaderBytes,
		IdleTimeout: discovery.IdleTimeout,
		// CONNECT is served over HTTP/1.1 only.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	return manager.RunnableFunc(func(ctx context.Context) error {
		go func() {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = httpSrv.Shutdown(sctx)
		}()
		var err error
		if c.TLSCertFile != "" && !c.GatewayPlainHTTP {
			kp, kerr := discovery.LoadKeyPair(c.TLSCertFile, c.TLSKeyFile)
			if kerr != nil {
				return kerr
			}
			go kp.Watch(ctx, discovery.KeyPairPollInterval, log)
			httpSrv.TLSConfig = kp.TLSConfig()
			httpSrv.TLSConfig.NextProtos = []string{"http/1.1"}
			log.Info("Serving the gateway over TLS", "address", c.GatewayAddress)
			err = httpSrv.ListenAndServeTLS("", "")
		} else {
			log.Info("Serving the gateway over plain HTTP: tokens cross it in the clear", "address", c.GatewayAddress)
			err = httpSrv.ListenAndServe()
		}
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return errors.Wrap(err, "gateway server failed")
	})
}

// addGateway adds the gateway, over HTTP, SOCKS5 or both, to mgr when
// either has an address.
func (c *CLI) addGateway(mgr manager.Manager, srv *discovery.Server, log logging.Logger) error {
	if c.GatewayAddress == "" && c.SOCKS5Address == "" {
		return nil
	}
	private, err := reach.ParseNetworks(c.TenantPrivateNetworks)
	if err != nil {
		return errors.Wrap(err, "--tenant-private-networks (TENANT_PRIVATE_NETWORKS)")
	}
	gw := discovery.NewGateway(discovery.GatewayConfig{Server: srv, Metrics: dmetrics.NewGateway(), Idle: c.GatewayIdle, TunnelIdle: c.GatewayTunnelIdle,
		MaxConns: c.GatewayMaxConns, MaxConnsPerIdentity: c.GatewayMaxConnsPerIdentity, MaxConnsPerNamespace: c.GatewayMaxConnsPerNS,
		MaxSeats: c.GatewayMaxSeats, TenantPrivateNetworks: private, PlatformLoopback: c.PlatformLoopback})
	metrics.Registry.MustRegister(gw.Metrics.Collectors()...)
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error { gw.Run(ctx); return nil })); err != nil {
		return errors.Wrap(err, "cannot add the gateway")
	}
	if c.GatewayAddress != "" {
		if err := mgr.Add(c.gatewayServer(gw, log)); err != nil {
			return errors.Wrap(err, "cannot add the gateway")
		}
	}
	if c.SOCKS5Address != "" {
		if err := mgr.Add(c.socksServer(gw, log)); err != nil {
			return errors.Wrap(err, "cannot add the SOCKS5 gateway")
		}
	}
	return nil
}

// socksServer serves the gateway's SOCKS5 listener until the manager
// stops: over TLS with the API's certificate, or plain with
// --gateway-plain-http.
func (c *CLI) socksServer(gw *discovery.Gateway, log logging.Logger) manager.Runnable {
	return manager.RunnableFunc(func(ctx context.Context) error {
		l, err := net.Listen("tcp", c.SOCKS5Address)
		if err != nil {
			return errors.Wrap(err, "cannot listen for SOCKS5")
		}
		if c.TLSCertFile != "" && !c.GatewayPlainHTTP && !c.SOCKS5Plain {
			kp, err := discovery.LoadKeyPair(c.TLSCertFile, c.TLSKeyFile)
			if err != nil {
				_ = l.Close()
				return err
			}
			go kp.Watch(ctx, discovery.KeyPairPollInterval, log)
			l = tls.NewListener(l, kp.TLSConfig())
			log.Info("Serving SOCKS5 over TLS", "address", c.SOCKS5Address)
		} else {
			log.Info("Serving SOCKS5 in the clear: tokens cross it unencrypted", "address", c.SOCKS5Address)
		}
		return gw.ServeSOCKS5(ctx, l)
	})
}

// apiServer serves the API and /metrics until the manager stops.
func (c *CLI) apiServer(srv *discovery.Server, log logging.Logger) manager.Runnable {
	mux := http.NewServeMux()
	// Fleet-level series name every fleet: only a scraper allowed to get
	// /metrics reads them.
	if k, ok := srv.Auth.(*discovery.Kubernetes); ok {
		mux.Handle(discovery.MetricsPath, discovery.LimitInFlight(discovery.WithTimeout(k.MetricsAuth(promhttpHandler())), c.MaxInFlight))
	}
	mux.Handle("/", discovery.LimitInFlight(discovery.WithTimeout(srv.Handler()), c.MaxInFlight))
	httpSrv := &http.Server{
		Addr: c.Address, Handler: mux,
		ReadHeaderTimeout: discovery.ReadHeaderTimeout, ReadTimeout: discovery.ReadTimeout, MaxHeaderBytes: discovery.MaxHeaderBytes,
		WriteTimeout: discovery.WriteTimeout, IdleTimeout: discovery.IdleTimeout,
	}
	return manager.RunnableFunc(func(ctx context.Context) error {
		go func() {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = httpSrv.Shutdown(sctx)
		}()
		serve := httpSrv.ListenAndServe
		if c.TLSCertFile != "" {
			// Tokens and proxy passwords cross this API. The pair is read
			// again every few seconds, so a renewed Secret is served
			// without a restart.
			kp, err := discovery.LoadKeyPair(c.TLSCertFile, c.TLSKeyFile)
			if err != nil {
				return err
			}
			go kp.Watch(ctx, discovery.KeyPairPollInterval, log)
			httpSrv.TLSConfig = kp.TLSConfig()
			serve = func() error { return httpSrv.ListenAndServeTLS("", "") }
			log.Info("Serving egress-discovery over TLS", append([]any{"address", c.Address}, kp.Describe()...)...)
		} else {
			log.Info("Serving egress-discovery", "address", c.Address)
		}
		if err := serve(); !errors.Is(err, http.ErrServerClosed) {
			return errors.Wrap(err, "cannot serve the API")
		}
		return nil
	})
}
