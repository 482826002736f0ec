// Package testbed starts a real kube-apiserver and etcd, built from source by
// `make tools`, through controller-runtime's envtest, with the product's CRDs
// and the CRDs Crossplane would derive from the ProxyFleet XRDs installed.
//
// Integration tests share one test bed per package, started by the first
// test that asks for it, so that the package's unit tests run without one:
//
//	var sharedBed testbed.Lazy
//
//	func TestMain(m *testing.M) { sharedBed.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		bed := sharedBed.Env(t)
//		...
//
// When the binaries are missing the tests that ask for the test bed fail
// with a message saying to run `make tools`; they never skip.
//
// testbed.go holds the Env (start, attach, stop, namespaces, replicas)
// and the fleet CRDs derived from the XRDs; fuzz.go lets fuzzing workers
// share their coordinator's test bed; mapper.go remembers REST mappings
// per replica; restart.go crashes and restarts a child such as the
// apiserver, and reserve.go keeps its ports from being taken meanwhile;
// manifests.go renders cluster/ manifests and impersonates
// ServiceAccounts; squid.go runs a real Squid; connectproxy.go holds
// in-process forward proxies for scale tests; target.go IP-echo probe
// targets; netns.go network namespaces with no way out; dropping.go an
// address whose dials time out; eventually.go waits on a condition;
// load.go runs calls concurrently and measures rate and p99; failure.go
// shows a checker failing on a broken input. PreviousRelease names the
// release the upgrade tests start from.
package testbed

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv1 "github.com/crossplane/crossplane/apis/v2/apiextensions/v1"
	corev1 "k8s.io/api/core/v1"
	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/crossplane/crossplane-runtime/v2/pkg/xcrd"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis"
)

// PreviousRelease is the last commit before fleets of ten thousand (issue
// 33): fleets of one level, whose function required every Lease of the
// fleet's namespace; the release after it adds pools and reads
// LeaseSummaries. The upgrade tests start from it: the function's, which
// renders a fleet with each release, and make e2e's, whose Stack starts at
// it and is upgraded in place.
const PreviousRelease = "229b8845f998ab03771fb41ba9fba1960ebeec96"

// Binaries the test bed needs in bin/, all built by `make tools`.
var requiredBinaries = []string{"kube-apiserver", "etcd"}

// Env is a running test bed.
type Env struct {
	// Root is the repository root.
	Root string
	// Config reaches the test apiserver as an administrator.
	Config *rest.Config
	// Client is a controller-runtime client with the product's types.
	Client client.Client
	// Scheme holds client-go's and the product's types.
	Scheme *runtime.Scheme

	env *envtest.Environment
}

// RepoRoot finds the repository root by walking up from the working
// directory to the folder holding go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", errors.Wrap(err, "cannot get working directory")
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the repository root: no go.mod above the working directory")
		}
		dir = parent
	}
}

// MissingBinaries lists the test-bed binaries absent from dir.
func MissingBinaries(dir string) []string {
	var missing []string
	for _, b := range requiredBinaries {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	return missing
}

// FleetCRDs derives, the way Crossplane does, the CRDs of every XRD under
// apis/fleet: the namespaced ProxyFleet, the LegacyCluster XProxyFleet and
// its ProxyFleetClaim, and the ProxyPool.
func FleetCRDs(root string) ([]*extv1.CustomResourceDefinition, error) {
	var crds []*extv1.CustomResourceDefinition
	for _, rel := range []string{"apis/fleet/definition.yaml", "apis/fleet/legacy/definition.yaml", "apis/fleet/pool/definition.yaml"} {
		raw, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return nil, errors.Wrapf(err, "cannot read %s", rel)
		}
		// The v2 XRD is a superset of v1 in what xcrd reads, and the Go type
		// keeps the scope, so one type serves both files.
		xrd := &xpv1.CompositeResourceDefinition{}
		if err := yaml.Unmarshal(raw, xrd); err != nil {
			return nil, errors.Wrapf(err, "cannot parse %s", rel)
		}
		crd, err := xcrd.ForCompositeResource(xrd)
		if err != nil {
			return nil, errors.Wrapf(err, "cannot derive the composite CRD of %s", rel)
		}
		crds = append(crds, crd)
		if xrd.Spec.ClaimNames != nil {
			claim, err := xcrd.ForCompositeResourceClaim(xrd)
			if err != nil {
				return nil, errors.Wrapf(err, "cannot derive the claim CRD of %s", rel)
			}
			crds = append(crds, claim)
		}
	}
	for _, crd := range crds {
		// The derived CRDs are owned by their XRD, which does not exist here.
		crd.SetOwnerReferences(nil)
	}
	return crds, nil
}

// Start starts a test bed. Stop it with Stop.
func Start() (*Env, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(root, "bin")
	if missing := MissingBinaries(bin); len(missing) > 0 {
		return nil, errors.Errorf("the test bed needs %s in %s: run `make tools` (it builds them from the Go module proxy)", strings.Join(missing, " and "), bin)
	}

	fleet, err := FleetCRDs(root)
	if err != nil {
		return nil, err
	}

	s, err := scheme()
	if err != nil {
		return nil, err
	}

	env := &envtest.Environment{
		BinaryAssetsDirectory: bin,
		CRDDirectoryPaths:     []string{filepath.Join(root, "package", "provider", "crds")},
		CRDs:                  fleet,
		ErrorIfCRDPathMissing: true,
		Scheme:                s,
	}
	// A second test package starting in parallel on a loaded 2-core machine
	// can be slow to bring etcd up.
	env.ControlPlane.GetAPIServer().StartTimeout = 2 * time.Minute

	cfg, err := env.Start()
	if err != nil {
		return nil, errors.Wrap(err, "cannot start kube-apiserver and etcd")
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		_ = env.Stop()
		return nil, errors.Wrap(err, "cannot create client")
	}
	return &Env{Root: root, Config: cfg, Client: c, Scheme: s, env: env}, nil
}

func scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, errors.Wrap(err, "cannot add client-go types to scheme")
	}
	if err := apis.AddToScheme(s); err != nil {
		return nil, errors.Wrap(err, "cannot add product types to scheme")
	}
	if err := extv1.AddToScheme(s); err != nil {
		return nil, errors.Wrap(err, "cannot add apiextensions types to scheme")
	}
	return s, nil
}

// SharedKubeconfig names, in the environment, the kubeconfig of a test bed
// that a process attaches to instead of starting its own: a fuzzing
// coordinator starts one for its workers, which it may kill at any
// moment, leaving an apiserver of their own behind.
const SharedKubeconfig = "EGRESS_TESTBED_KUBECONFIG"

// Attach returns a test bed running already, from its kubeconfig; its
// Stop does nothing.
func Attach(kubeconfig string) (*Env, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read the shared test bed's kubeconfig")
	}
	// As envtest's own config: client-go's default of 5 requests a second
	// would throttle the tests, not the apiserver.
	cfg.QPS, cfg.Burst = 1000, 2000
	s, err := scheme()
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return nil, errors.Wrap(err, "cannot create client")
	}
	return &Env{Root: root, Config: cfg, Client: c, Scheme: s}, nil
}

// WriteKubeconfig writes a kubeconfig that Attach reads.
func (e *Env) WriteKubeconfig(path string) error {
	const name = "testbed"
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{Server: e.Config.Host, CertificateAuthorityData: e.Config.CAData}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificateData: e.Config.CertData, ClientKeyData: e.Config.KeyData, Token: e.Config.BearerToken}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	kc.CurrentContext = name
	return errors.Wrap(clientcmd.WriteToFile(*kc, path), "cannot write the test bed's kubeconfig")
}

// Stop stops the apiserver and etcd and removes their data; a test bed
// attached to is left running.
func (e *Env) Stop() error {
	if e.env == nil {
		return nil
	}
	StopRestarted()
	return errors.Wrap(e.env.Stop(), "cannot stop test bed")
}

// Namespace creates a fresh namespace for one test and returns its name.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	name := strings.ToLower(fmt.Sprintf("t-%d", time.Now().UnixNano()))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := e.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("cannot create namespace %s: %v", name, err)
	}
	return name
}

// Lazy is a test package's shared test bed, started on first use.
type Lazy struct {
	once sync.Once
	env  *Env
	err  error
}

// Env returns the test bed, starting it for the first test that asks. When
// it cannot start, every test that asks fails with the reason.
func (l *Lazy) Env(t testing.TB) *Env {
	t.Helper()
	l.once.Do(func() {
		if kc := os.Getenv(SharedKubeconfig); kc != "" {
			l.env, l.err = Attach(kc)
			return
		}
		l.env, l.err = Start()
	})
	if l.err != nil {
		t.Fatalf("test bed: %v", l.err)
	}
	return l.env
}

// Main runs a test package's tests and stops the test bed if one started it.
func (l *Lazy) Main(m *testing.M) {
	code := m.Run()
	// No test runs any more: this only orders the read of env after the
	// start, and keeps a stray late caller from starting another.
	l.once.Do(func() {})
	if l.env != nil {
		if err := l.env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "test bed:", err)
		}
	}
	os.Exit(code)
}

// Replica returns a fresh client and a started, synced cache of objs in
// namespace, as one replica of a controller or server would have: tests of
// several replicas give each its own.
func (e *Env) Replica(t testing.TB, namespace string, objs ...client.Object) (client.Client, cache.Cache) {
	t.Helper()
	c, err := client.New(e.Config, client.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper, err := newMemoMapper(e.Config, hc)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := cache.New(e.Config, cache.Options{Scheme: e.Scheme, HTTPClient: hc, Mapper: mapper, DefaultNamespaces: map[string]cache.Config{namespace: {}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = ca.Start(ctx) }()
	for _, o := range objs {
		if _, err := ca.GetInformer(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if !ca.WaitForCacheSync(ctx) {
		t.Fatal("the replica's cache did not sync")
	}
	return c, ca
}
