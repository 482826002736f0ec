// Package devenv runs the whole product on one machine, on loopback, with
// real Crossplane: etcd and kube-apiserver, Crossplane core with the External
// package runtime, an in-process OCI registry serving the packages `make
// packages` built, the Configuration installed from it with `crossplane xpkg
// install` (Crossplane pulls the Provider and the Function as dependencies),
// then function-proxyfleet, provider-egressproxy and egress-discovery as
// local processes. `make run` and `make e2e` both bring it up with Up.
//
// State lives in one folder (.local/), so a second run reuses the cluster's
// etcd data, the ports and the discovery token. Down stops every process,
// every Squid and every listener it started.
//
// devenv.go holds the Stack, Up and Down, the saved state and the control
// plane; crossplane.go Crossplane core, the package registry, the
// Configuration's install, function-proxyfleet and the stand-in for
// Crossplane's package runtime; components.go the probe target,
// provider-egressproxy, egress-discovery and the examples; process.go the
// child processes and waits on them; certs.go the CAs and certificates of
// loopback servers; names.go the programs' names. The one-node cluster of
// `make cluster` (UpCluster) is in cluster.go (bring-up, prerequisites,
// DownCluster and the check of what it left behind), cluster_control.go
// (PKI, apiserver, controllers), cluster_node.go (network, guard,
// containerd, kubelet, kube-proxy, the sweep) and cluster_addons.go
// (registry, DNS, target host, Crossplane and the product as pods).
package devenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/local"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

const (
	crossplaneNamespace = "crossplane-system"
	// PackageVersion is the tag the packages are pushed with.
	PackageVersion = "v0.1.0"
	// TargetAddress is where the local HTTPS probe target listens; the
	// health check of examples/local/proxyfleet.yaml names it.
	TargetAddress = "127.0.0.1:18443"
	// FunctionName is what Crossplane names function-proxyfleet when it
	// installs it as a dependency of the Configuration.
	FunctionName = "kacerr-function-proxyfleet"
	// ConfigurationName is the Configuration package object.
	ConfigurationName = "configuration-proxyfleet"
	// ExampleNamespace holds the example fleet.
	ExampleNamespace = "crawl-team"

	upstreamHost   = "gitea.home.hrajfrisbee.cz"
	upstreamPrefix = upstreamHost + "/kacerr/"
)

// Options configure an environment.
type Options struct {
	// Root is the repository root: bin/, _output/ and examples/ are read
	// from it.
	Root string
	// StateDir holds everything the environment writes.
	StateDir string
	// Progress receives one line per step, with elapsed time.
	Progress io.Writer
	// ApplyExamples applies examples/local/ once everything runs.
	ApplyExamples bool
	// ProviderArgs are extra flags for provider-egressproxy.
	ProviderArgs []string
	// DiscoveryArgs are extra flags for egress-discovery.
	DiscoveryArgs []string
	// CrossplaneArgs are extra flags for `crossplane core start`.
	CrossplaneArgs []string
}

// Stack is a running environment.
type Stack struct {
	// Kubeconfig is the path of an administrator kubeconfig.
	Kubeconfig string
	// Config reaches the apiserver as an administrator.
	Config *rest.Config
	// Client has client-go's, apiextensions' and the product's types.
	Client client.Client
	// DiscoveryURL is egress-discovery's base URL, served over TLS.
	DiscoveryURL string
	// GatewayAddress is host:port of egress-discovery's gateway, an HTTPS
	// forward proxy (make run only).
	GatewayAddress string
	// SOCKS5Address is host:port of the gateway's SOCKS5 listener, in the
	// clear on loopback (make run only).
	SOCKS5Address string
	// DiscoveryCA is the PEM file of the CA of egress-discovery's
	// certificate, for apiv1.NewHTTPClient and EGRESS_DISCOVERY_CA_FILE.
	DiscoveryCA string
	// Token is a static discovery token for the example namespace.
	Token string
	// TargetURL is the local HTTPS IP-echo target, trusted through TargetCA.
	TargetURL string
	// TargetCA is the PEM file of the target's CA.
	TargetCA string
	// SquidDir is the provider's local-backend state folder.
	SquidDir string
	// Registry is host:port of the in-process OCI registry.
	Registry string
	// pushTo is host:port where the registry takes pushes.
	pushTo string
	// ExamplesApplied is when examples/local/ was applied.
	ExamplesApplied time.Time

	opts  Options
	began time.Time
	// clusterCA is the CA of make cluster's cluster (UpCluster), and host
	// the names it takes on this machine.
	clusterCA *authority
	host      hostNames
	// The runtimes of the packages, for their revisions' RuntimeHealthy.
	functionProc, providerProc atomic.Pointer[process]
	state                      persisted
	env                        *envtest.Environment
	cleanups                   []cleanup
	procs                      []*process
	cancel                     context.CancelFunc
}

type cleanup struct {
	name string
	fn   func() error
}

// persisted is what a second run reuses.
type persisted struct {
	Ports map[string]int `json:"ports"`
	Token string         `json:"token"`
}

// Binaries the environment runs, all under bin/.
var binaries = []string{
	binEtcd, binAPIServer, binKCM, "kubectl", binCrossplane, "crossplane-core",
	binProvider, binFunction, binDiscovery, "egressctl",
}

// Packages the environment serves, all under _output/.
var packages = []string{binProvider, binFunction, "configuration-proxyfleet"}

// Up brings the environment up. On failure everything already started is
// stopped again, and the error names the step.
func Up(ctx context.Context, o Options) (*Stack, error) {
	s := &Stack{opts: o, began: time.Now()}
	if s.opts.Progress == nil {
		s.opts.Progress = io.Discard
	}
	ctx, s.cancel = context.WithCancel(ctx)
	steps := []namedStep{
		{"checking binaries, packages and state in " + o.StateDir, s.prepare},
		{"starting etcd and kube-apiserver", s.startControlPlane},
		{"starting kube-controller-manager (garbage collector, namespaces)", s.startControllerManager},
		{"initialising and starting Crossplane core", s.startCrossplane},
		{"serving the packages from an in-process OCI registry", s.startRegistry},
		{"starting function-proxyfleet with mTLS from Crossplane's CA", s.startFunction},
		{"installing the Configuration with crossplane xpkg install", s.installConfiguration},
		{"starting the local HTTPS probe target on " + TargetAddress, s.startTarget},
		{"starting provider-egressproxy (local backend)", s.startProvider},
		{"starting egress-discovery", s.startDiscovery},
	}
	if o.ApplyExamples {
		steps = append(steps, namedStep{"applying examples/local/", s.applyExamples})
	}
	if err := s.runSteps(ctx, steps); err != nil {
		return nil, err
	}
	return s, nil
}

// namedStep is one step of a bring-up.
type namedStep struct {
	name string
	fn   func(context.Context) error
}

// runSteps runs the steps in order, logging each with its time; on a
// failure it stops everything already started and names the step.
func (s *Stack) runSteps(ctx context.Context, steps []namedStep) error {
	for _, st := range steps {
		if err := s.step(st.name, func() error { return st.fn(ctx) }); err != nil {
			s.Down()
			return err
		}
	}
	return nil
}

// Logf prints a progress line with the elapsed time.
func (s *Stack) Logf(format string, args ...any) {
	fmt.Fprintf(s.opts.Progress, "[%6.1fs] %s\n", time.Since(s.began).Seconds(), fmt.Sprintf(format, args...))
}

func (s *Stack) step(name string, fn func() error) error {
	s.Logf("%s ...", name)
	t := time.Now()
	if err := fn(); err != nil {
		s.Logf("FAILED: %s: %v", name, err)
		return errors.Wrap(err, name)
	}
	s.Logf("ok (%.1fs)", time.Since(t).Seconds())
	return nil
}

// Down stops everything Up started, in reverse order, and every Squid the
// provider ran: a provider exiting leaves them for its successor, but here
// nobody follows.
func (s *Stack) Down() {
	if s.cancel != nil {
		s.cancel()
	}
	for i := len(s.cleanups) - 1; i >= 0; i-- {
		c := s.cleanups[i]
		if err := c.fn(); err != nil {
			s.Logf("stopping %s: %v", c.name, err)
		}
	}
	s.cleanups = nil
	if s.SquidDir != "" {
		if n := local.StopAll(s.SquidDir); n > 0 {
			s.Logf("stopped %d Squid processes", n)
		}
	}
}

func (s *Stack) onDown(name string, fn func() error) {
	s.cleanups = append(s.cleanups, cleanup{name: name, fn: fn})
}

func (s *Stack) bin(name string) string { return filepath.Join(s.opts.Root, "bin", name) }

func (s *Stack) path(elem ...string) string {
	return filepath.Join(append([]string{s.opts.StateDir}, elem...)...)
}

func (s *Stack) prepare(_ context.Context) error {
	var missing []string
	for _, b := range binaries {
		if _, err := os.Stat(s.bin(b)); err != nil {
			missing = append(missing, "bin/"+b)
		}
	}
	if _, err := os.Stat(s.bin("crossplane-crds")); err != nil {
		missing = append(missing, "bin/crossplane-crds")
	}
	for _, p := range packages {
		if _, err := os.Stat(filepath.Join(s.opts.Root, "_output", p+".xpkg")); err != nil {
			missing = append(missing, "_output/"+p+".xpkg")
		}
	}
	if len(missing) > 0 {
		return errors.Errorf("missing %s: run make run (it builds them), or make tools packages binaries", strings.Join(missing, ", "))
	}
	if _, err := exec.LookPath("squid"); err != nil {
		if _, err := os.Stat("/usr/sbin/squid"); err != nil {
			return errors.New("squid is not installed: apt-get install -y squid")
		}
	}
	// Squid drops root to its own user, which must reach its state folder.
	for _, d := range []string{s.opts.StateDir, s.path("squid"), s.path("logs"), s.path(binCrossplane)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return errors.Wrap(err, "cannot create the state folder")
		}
		if err := os.Chmod(d, 0o755); err != nil {
			return errors.Wrap(err, "cannot open the state folder to Squid's user")
		}
	}
	s.SquidDir = s.path("squid")
	if b, err := os.ReadFile(s.path("state.json")); err == nil {
		if err := json.Unmarshal(b, &s.state); err != nil {
			return errors.Wrapf(err, "cannot read %s; delete it to start afresh", s.path("state.json"))
		}
	}
	if s.state.Ports == nil {
		s.state.Ports = map[string]int{}
	}
	if s.state.Token == "" {
		b := make([]byte, 24)
		_, _ = rand.Read(b)
		s.state.Token = hex.EncodeToString(b)
	}
	s.Token = s.state.Token
	return s.save()
}

func (s *Stack) save() error {
	b, _ := json.MarshalIndent(s.state, "", "  ")
	return errors.Wrap(os.WriteFile(s.path("state.json"), b, 0o600), "cannot save the state")
}

// port returns the loopback port the named listener used last time, or a
// free one when that is taken (or on a first run), and remembers it.
func (s *Stack) port(name string) (int, error) {
	if p, ok := s.state.Ports[name]; ok && free(p) {
		return p, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, errors.Wrap(err, "cannot find a free port")
	}
	p := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	s.state.Ports[name] = p
	return p, s.save()
}

// Listeners returns the loopback addresses the environment listens on
// (beside the apiserver's and etcd's, which envtest picks), so a caller can
// check that Down left none behind.
func (s *Stack) Listeners() []string {
	out := []string{TargetAddress}
	for _, p := range s.state.Ports {
		out = append(out, fmt.Sprintf("127.0.0.1:%d", p))
	}
	sort.Strings(out)
	return out
}

// ports returns the ports of several listeners, as port does for one.
func (s *Stack) ports(names ...string) ([]int, error) {
	out := make([]int, len(names))
	for i, n := range names {
		p, err := s.port(n)
		if err != nil {
			return nil, err
		}
		out[i] = p
	}
	return out, nil
}

func free(p int) bool {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
	if err != nil {
		return false
	}
	_ = ln.Close()
	return true
}

func (s *Stack) startControlPlane(_ context.Context) error {
	sch := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apis.AddToScheme, extv1.AddToScheme} {
		if err := add(sch); err != nil {
			return errors.Wrap(err, "cannot build the scheme")
		}
	}
	// etcd's data persists in the state folder; the apiserver's certificates
	// are made afresh on every start, and so is the kubeconfig.
	etcdDir := s.path(binEtcd)
	if err := os.MkdirAll(etcdDir, 0o700); err != nil {
		return errors.Wrap(err, "cannot create etcd's data folder")
	}
	s.env = &envtest.Environment{BinaryAssetsDirectory: filepath.Join(s.opts.Root, "bin"), Scheme: sch}
	s.env.ControlPlane.Etcd = &envtest.Etcd{DataDir: etcdDir, StartTimeout: 2 * time.Minute}
	s.env.ControlPlane.GetAPIServer().StartTimeout = 2 * time.Minute
	cfg, err := s.env.Start()
	if err != nil {
		return errors.Wrap(err, "cannot start etcd and kube-apiserver")
	}
	s.onDown("kube-apiserver and etcd", s.env.Stop)
	cfg.QPS, cfg.Burst = 200, 400
	s.Config = cfg
	user, err := s.env.ControlPlane.AddUser(envtest.User{Name: "admin", Groups: []string{groupMasters}}, nil)
	if err != nil {
		return errors.Wrap(err, "cannot add an administrator")
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return errors.Wrap(err, "cannot write a kubeconfig")
	}
	s.Kubeconfig = s.path("kubeconfig")
	if err := os.WriteFile(s.Kubeconfig, kc, 0o600); err != nil {
		return errors.Wrap(err, "cannot write the kubeconfig")
	}
	s.Client, err = client.New(cfg, client.Options{Scheme: sch})
	return errors.Wrap(err, "cannot create a client")
}

// startControllerManager runs the controllers Crossplane relies on but
// envtest leaves out: the garbage collector deletes a deleted fleet's
// Proxies through their owner references, and the namespace controller
// empties deleted namespaces.
func (s *Stack) startControllerManager(ctx context.Context) error {
	port, err := s.port(binKCM)
	if err != nil {
		return err
	}
	p, err := s.start(binKCM, s.bin(binKCM), append([]string{
		"--kubeconfig=" + s.Kubeconfig,
		"--authentication-kubeconfig=" + s.Kubeconfig,
		"--authorization-kubeconfig=" + s.Kubeconfig,
		"--controllers=garbagecollector,namespace",
		"--use-service-account-credentials=false",
		fmt.Sprintf("--secure-port=%d", port),
	}, delegatedServing...))
	if err != nil {
		return err
	}
	return waitTCP(ctx, p, fmt.Sprintf("127.0.0.1:%d", port), time.Minute)
}

// ensureNamespace creates a namespace unless it exists.
func (s *Stack) ensureNamespace(ctx context.Context, name string) error {
	err := s.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if kerrors.IsAlreadyExists(err) {
		return nil
	}
	return errors.Wrapf(err, "cannot create namespace %s", name)
}

// wait polls cond every 250ms until it holds, fails, or timeout passes; the
// last reason cond gave is in the timeout error.
func wait(ctx context.Context, timeout time.Duration, what string, cond func() (bool, string, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		ok, why, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		last = why
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return errors.Errorf("%s: interrupted: %s", what, last)
			}
			return errors.Errorf("%s: not done after %s: %s", what, timeout, last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Leases lists the Lease objects egress-discovery keeps for a fleet.
func (s *Stack) Leases(ctx context.Context, namespace, fleet string) ([]coordinationv1.Lease, error) {
	l := &coordinationv1.LeaseList{}
	if err := s.Client.List(ctx, l, client.InNamespace(namespace), client.MatchingLabels{fleetv1alpha1.LabelFleet: ownership.LabelValue(fleet)}); err != nil {
		return nil, errors.Wrap(err, "cannot list leases")
	}
	// A long name's label is a hash prefix: the exact name decides.
	out := l.Items[:0]
	for _, le := range l.Items {
		if fleetv1alpha1.FleetName(&le) == fleet {
			out = append(out, le)
		}
	}
	return out, nil
}
