// Package devenv runs the whole product on one machine with real
// Crossplane, in one of two environments that share a core (steps,
// processes, certificates, saved ports, waiting, the package registry):
//
//   - Stack (Up, for `make run` and `make e2e`): etcd and kube-apiserver
//     through envtest, Crossplane core with the External package runtime,
//     an in-process OCI registry serving the packages `make packages`
//     built, the Configuration installed from it with `crossplane xpkg
//     install` (Crossplane pulls the Provider and the Function as
//     dependencies), then function-proxyfleet, provider-egressproxy and
//     egress-discovery as local processes, all on loopback. Its state lives
//     in one folder (.local/), so a second run reuses the cluster's etcd
//     data, the ports and the discovery token. Down stops every process,
//     every Squid and every listener it started.
//   - Cluster (UpCluster and DownCluster, for `make cluster` and `make
//     e2e-cluster`): a one-node cluster with a real kubelet, on a bridge
//     private to this machine, running Crossplane, the provider, the
//     function and egress-discovery as pods. It changes the host
//     (iptables, sysctls, cgroups, mounts), and Down and DownCluster undo
//     every change.
//
// The shared core: core.go (Options, core, the steps, Down's cleanups,
// state and ports, waiting, Leases), process.go (child processes and the
// waits on them), certs.go (CAs and certificates), serve.go (the OCI
// registry, the HTTPS IP echo, pushing packages), packages.go (package
// references, install conditions, server-side apply, the image config) and
// names.go (the programs' names). make run's Stack: run.go (Stack, Up,
// Down, the checks, the control plane and the controller manager),
// run_crossplane.go (Crossplane core, the registry, the Configuration's
// install, function-proxyfleet by package version and the stand-in for
// Crossplane's package runtime), run_components.go (the probe target,
// provider-egressproxy, egress-discovery, the examples) and upgrade.go (an
// earlier release built from git, BuildRelease, and Stack.Upgrade, which
// moves a running Stack from it to this checkout as a platform team
// would). make cluster's Cluster: cluster.go
// (Cluster, UpCluster, prerequisites, DownCluster and the check of what it
// left behind), cluster_control.go (PKI, apiserver, controllers),
// cluster_node.go (network, guard, containerd, kubelet, kube-proxy, the
// sweep) and cluster_addons.go (registry, DNS, target host, Crossplane and
// the product as pods).
package devenv

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
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
	// Packages is the folder of the packages the registry serves at
	// PackageVersion (Root/_output, where make packages builds them).
	Packages string
	// Function is the function-proxyfleet binary that serves
	// PackageVersion (Root/bin/function-proxyfleet). With Packages, an
	// earlier release (BuildRelease) that Stack.Upgrade moves from.
	Function string
}

// core is what both environments hold: where they write, the processes
// and cleanups Down undoes, the saved ports, and what a caller reaches them
// by. Stack (make run) and Cluster (make cluster) embed it.
type core struct {
	// Kubeconfig is the path of an administrator kubeconfig.
	Kubeconfig string
	// Config reaches the apiserver as an administrator.
	Config *rest.Config
	// Client has client-go's, apiextensions' and the product's types.
	Client client.Client
	// DiscoveryURL is egress-discovery's base URL, served over TLS.
	DiscoveryURL string
	// GatewayAddress is host:port of egress-discovery's gateway, an HTTPS
	// forward proxy.
	GatewayAddress string
	// DiscoveryCA is the PEM file of the CA of egress-discovery's
	// certificate, for apiv1.NewHTTPClient and EGRESS_DISCOVERY_CA_FILE.
	DiscoveryCA string
	// TargetURL is the HTTPS IP-echo target, trusted through TargetCA.
	TargetURL string
	// TargetCA is the PEM file of the target's CA.
	TargetCA string
	// Registry is host:port of the in-process OCI registry.
	Registry string
	// pushTo is host:port where the registry takes pushes.
	pushTo string

	opts     Options
	began    time.Time
	state    persisted
	cleanups []cleanup
	procs    []*process
	cancel   context.CancelFunc
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

// namedStep is one step of a bring-up.
type namedStep struct {
	name string
	fn   func(context.Context) error
}

// newCore starts the clock of a bring-up; progress goes nowhere unless the
// options name a writer.
func newCore(o Options) core {
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Packages == "" {
		o.Packages = filepath.Join(o.Root, "_output")
	}
	if o.Function == "" {
		o.Function = filepath.Join(o.Root, "bin", binFunction)
	}
	return core{opts: o, began: time.Now()}
}

// runSteps runs the steps in order, logging each with its time; on a
// failure it calls down, which stops everything already started, and names
// the step.
func (s *core) runSteps(ctx context.Context, steps []namedStep, down func()) error {
	for _, st := range steps {
		if err := s.step(st.name, func() error { return st.fn(ctx) }); err != nil {
			down()
			return err
		}
	}
	return nil
}

// Logf prints a progress line with the elapsed time.
func (s *core) Logf(format string, args ...any) {
	fmt.Fprintf(s.opts.Progress, "[%6.1fs] %s\n", time.Since(s.began).Seconds(), fmt.Sprintf(format, args...))
}

func (s *core) step(name string, fn func() error) error {
	s.Logf("%s ...", name)
	t := time.Now()
	if err := fn(); err != nil {
		s.Logf("FAILED: %s: %v", name, err)
		return errors.Wrap(err, name)
	}
	s.Logf("ok (%.1fs)", time.Since(t).Seconds())
	return nil
}

// Down stops everything the bring-up started, in reverse order.
func (s *core) Down() {
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
}

func (s *core) onDown(name string, fn func() error) {
	s.cleanups = append(s.cleanups, cleanup{name: name, fn: fn})
}

func (s *core) bin(name string) string { return filepath.Join(s.opts.Root, "bin", name) }

func (s *core) path(elem ...string) string {
	return filepath.Join(append([]string{s.opts.StateDir}, elem...)...)
}

func (s *core) save() error {
	b, _ := json.MarshalIndent(s.state, "", "  ")
	return errors.Wrap(os.WriteFile(s.path("state.json"), b, 0o600), "cannot save the state")
}

// port returns the loopback port the named listener used last time, or a
// free one when that is taken (or on a first run), and remembers it.
func (s *core) port(name string) (int, error) {
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

// ports returns the ports of several listeners, as port does for one.
func (s *core) ports(names ...string) ([]int, error) {
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

// ensureNamespace creates a namespace unless it exists.
func (s *core) ensureNamespace(ctx context.Context, name string) error {
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
func (s *core) Leases(ctx context.Context, namespace, fleet string) ([]coordinationv1.Lease, error) {
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
