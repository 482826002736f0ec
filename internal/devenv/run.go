package devenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/local"
)

// Stack is the environment of make run and make e2e: the control plane
// in-process through envtest, and every part of the product a local process.
type Stack struct {
	core
	// SOCKS5Address is host:port of the gateway's SOCKS5 listener, in the
	// clear on loopback.
	SOCKS5Address string
	// Token is a static discovery token for the example namespace.
	Token string
	// SquidDir is the provider's local-backend state folder.
	SquidDir string
	// ExamplesApplied is when examples/local/ was applied.
	ExamplesApplied time.Time

	env *envtest.Environment
	// The runtimes of the packages, for their revisions' RuntimeHealthy
	// and endpoints: the provider's process, and function-proxyfleet's
	// processes by the package version each serves.
	providerProc atomic.Pointer[process]
	fnMu         sync.Mutex
	functions    map[string]*functionRuntime
	fnVersion    string // the newest version served
}

// Binaries the environment runs, all under bin/.
var binaries = []string{
	binEtcd, binAPIServer, binKCM, "kubectl", binCrossplane, "crossplane-core",
	binProvider, binFunction, binDiscovery, "egressctl",
}

// Packages the environment serves, all under Options.Packages.
var packages = []string{binProvider, binFunction, "configuration-proxyfleet"}

// Up brings the environment up. On failure everything already started is
// stopped again, and the error names the step.
func Up(ctx context.Context, o Options) (*Stack, error) {
	s := &Stack{core: newCore(o)}
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
	if err := s.runSteps(ctx, steps, s.Down); err != nil {
		return nil, err
	}
	return s, nil
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
		if _, err := os.Stat(filepath.Join(s.opts.Packages, p+".xpkg")); err != nil {
			missing = append(missing, filepath.Join(s.opts.Packages, p+".xpkg"))
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

// MetricsURL is the Prometheus endpoint of component: crossplane,
// function-proxyfleet or provider-egressproxy.
func (s *Stack) MetricsURL(component string) (string, error) {
	name := map[string]string{binCrossplane: "crossplane-metrics", binFunction: functionPorts(s.functionVersion())[1], binProvider: "provider-metrics"}[component]
	port, ok := s.state.Ports[name]
	if name == "" || !ok {
		return "", errors.Errorf("no metrics endpoint for %q", component)
	}
	return fmt.Sprintf("http://127.0.0.1:%d/metrics", port), nil
}

// Down stops everything Up started, in reverse order, and every Squid the
// provider ran: a provider exiting leaves them for its successor, but here
// nobody follows.
func (s *Stack) Down() {
	s.core.Down()
	if s.SquidDir != "" {
		if n := local.StopAll(s.SquidDir); n > 0 {
			s.Logf("stopped %d Squid processes", n)
		}
	}
}
