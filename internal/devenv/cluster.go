package devenv

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The one-node cluster of `make cluster`. Its network is private to this
// machine: the node's address is the gateway of a bridge of its own (not
// any address of the machine's interfaces), pods get addresses on that
// bridge and routes to it and to Service addresses only (no default route,
// no masquerade), and a guard in the FORWARD chain drops whatever would
// still cross between the bridge and any other interface.
const (
	// NodeName is the node's name, and its kubelet's identity.
	NodeName = "egress-node"
	// NodeZone is the node's topology.kubernetes.io/zone.
	NodeZone = "node-a"
	// Bridge is the pod network's bridge, made before anything starts so
	// that the control plane can listen on NodeIP.
	Bridge = "egress0"
	// NodeIP is the node's address on Bridge, where the apiserver, the
	// kubelet and the registry listen, and what pods reach them at.
	NodeIP = "10.244.0.1"
	// PodCIDR holds NodeIP, the pods (podRangeStart to podRangeEnd) and
	// the test target host.
	PodCIDR       = "10.244.0.0/24"
	podRangeStart = "10.244.0.10"
	podRangeEnd   = "10.244.0.239"
	// ServiceCIDR holds the Services' cluster IPs.
	ServiceCIDR = "10.96.0.0/24"
	// DNSServiceIP is CoreDNS's Service, which the kubelet gives pods.
	DNSServiceIP = "10.96.0.10"
	// TargetHostIP is the test target host: a network namespace on the
	// pod network serving an HTTPS IP echo on TargetHostPort. It is a
	// private address to the proxies, which reach it only where a
	// ProviderConfig allows exactly it. The node's own address is not
	// usable as a target: every proxy pod denies its node's addresses.
	TargetHostIP   = "10.244.0.250"
	TargetHostPort = 8443
	// TargetNetns is the target host's network namespace.
	TargetNetns = "egress-target"
	// APIServerPort and RegistryPort are on NodeIP.
	APIServerPort = 6443
	RegistryPort  = 5000
	// DiscoveryNodePort is where egress-discovery's API is reached from the
	// node (and so from this machine): https://NodeIP:DiscoveryNodePort.
	DiscoveryNodePort = 30443
	// GatewayNodePort is where its gateway is: https://NodeIP:GatewayNodePort.
	GatewayNodePort = 30888
	// clusterDomain is the Services' DNS domain.
	clusterDomain = "cluster.local"
	// guardChain holds the FORWARD rules that keep the pod network on this
	// machine.
	guardChain = "EGRESS-CLUSTER-GUARD"
)

// ClusterBinaries are the programs make cluster runs from bin/.
var ClusterBinaries = []string{
	binEtcd, binAPIServer, binKCM, binScheduler, binKubelet, binKubeProxy,
	"kubectl", binCrossplane, "egressctl",
}

// ClusterImages are the image tarballs make cluster serves, from
// _output/images/, by file name.
var ClusterImages = []string{"pause", "coredns", binCrossplane, "squid", "discovery"}

// hostTools are the Debian packages' programs the node needs, and where
// they come from.
var hostTools = map[string]string{
	binContainerd:           binContainerd,
	"runc":                  "runc",
	"ctr":                   binContainerd,
	binIptables:             binIptables,
	binConntrack:            binConntrack,
	"ip":                    "iproute2",
	"/usr/lib/cni/bridge":   "containernetworking-plugins",
	"/usr/lib/cni/loopback": "containernetworking-plugins",
}

// Cluster is the one-node cluster of make cluster: a real kubelet node,
// with Crossplane, the provider, the function and egress-discovery as pods.
type Cluster struct {
	core
	// clusterCA is the cluster's CA, and host the names the cluster takes
	// on this machine.
	clusterCA *authority
	host      hostNames
}

// UpCluster brings up the one-node cluster of make cluster: a control
// plane, a node with containerd and kubelet, kube-proxy and CoreDNS, the
// project's images in a registry on the node, Crossplane core as a
// Deployment with its default (Deployment) package runtime, the
// Configuration installed from the registry (Crossplane runs the provider
// and the function as pods), and egress-discovery from cluster/discovery.
// It starts from nothing every time: the state folder is emptied first.
// On failure everything already started is stopped again.
func UpCluster(ctx context.Context, o Options) (*Cluster, error) {
	s := &Cluster{core: newCore(o), host: defaultHostNames()}
	ctx, s.cancel = context.WithCancel(ctx)
	steps := []namedStep{
		{"checking tools, images and packages; clearing " + o.StateDir, s.prepareCluster},
		{"making the pod network: bridge " + s.host.bridge + " at " + NodeIP + ", no route off this machine", s.startNetwork},
		{"issuing the cluster's certificates and kubeconfigs", s.issueClusterPKI},
		{"starting etcd and kube-apiserver on " + NodeIP, s.startClusterControlPlane},
		{"starting kube-controller-manager and kube-scheduler", s.startClusterControllers},
		{"starting containerd (CRI, overlayfs, runc)", s.startContainerd},
		{"starting kubelet and waiting for the node to be Ready", s.startKubelet},
		{"starting kube-proxy (iptables)", s.startKubeProxy},
		{"serving the images and packages from a registry on " + NodeIP, s.startClusterRegistry},
		{"starting CoreDNS", s.startDNS},
		{"starting the test target host " + TargetHostIP, s.startTargetHost},
		{"installing Crossplane core and its RBAC manager", s.startClusterCrossplane},
		{"installing the Configuration: Crossplane runs the provider and the function as pods", s.installClusterConfiguration},
		{"installing egress-discovery from cluster/discovery", s.startClusterDiscovery},
	}
	if err := s.runSteps(ctx, steps, s.Down); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Cluster) prepareCluster(ctx context.Context) error {
	if err := s.checkClusterPrereqs(); err != nil {
		return err
	}
	if err := s.checkStateDir(); err != nil {
		return err
	}
	prev, err := s.lockHost()
	if err != nil {
		return err
	}
	// A cluster that was not stopped (a killed make cluster) leaves its
	// processes, mounts, network and sysctls behind: clear them, then
	// the state.
	if prev != "" && prev != s.opts.StateDir {
		old := &Cluster{core: core{opts: s.opts}, host: s.host}
		old.opts.StateDir = prev
		old.sweepNode(ctx)
	}
	s.sweepNode(ctx)
	if err := os.RemoveAll(s.opts.StateDir); err != nil {
		return errors.Wrap(err, "cannot clear the state folder")
	}
	for _, d := range []string{s.opts.StateDir, s.path("logs"), s.path("pki")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return errors.Wrap(err, "cannot create the state folder")
		}
	}
	if err := os.WriteFile(s.path(stateMarker), []byte("make cluster's state; emptied at every start\n"), 0o644); err != nil { //nolint:gosec // Not secret.
		return errors.Wrap(err, "cannot mark the state folder")
	}
	s.state.Ports = map[string]int{}
	// The node is swept once more when everything else has stopped, and
	// the machine's settings restored.
	s.onDown("node", func() error { s.sweepNode(context.Background()); return nil })
	return nil
}

// checkClusterPrereqs checks for root, and for the binaries, images,
// packages and Debian tools the cluster needs, naming what is missing and
// how to get it.
func (s *Cluster) checkClusterPrereqs() error {
	if os.Geteuid() != 0 {
		return errors.New("make cluster runs containerd, kubelet and kube-proxy, and changes iptables: run it as root")
	}
	var missing []string
	for _, b := range ClusterBinaries {
		if _, err := os.Stat(s.bin(b)); err != nil {
			missing = append(missing, "bin/"+b)
		}
	}
	for _, im := range ClusterImages {
		if _, err := os.Stat(s.image(im)); err != nil {
			missing = append(missing, "_output/images/"+im+".tar")
		}
	}
	for _, p := range packages {
		if _, err := os.Stat(filepath.Join(s.opts.Packages, p+".xpkg")); err != nil {
			missing = append(missing, filepath.Join(s.opts.Packages, p+".xpkg"))
		}
	}
	if len(missing) > 0 {
		return errors.Errorf("missing %s: run make cluster (it builds them), or make tools packages binaries cluster-images", strings.Join(missing, ", "))
	}
	var apt []string
	for tool, pkg := range hostTools {
		if strings.HasPrefix(tool, "/") {
			if _, err := os.Stat(tool); err == nil {
				continue
			}
		} else if _, err := exec.LookPath(tool); err == nil {
			continue
		}
		apt = append(apt, pkg)
	}
	if len(apt) > 0 {
		return errors.Errorf("the node needs Debian packages: apt-get install -y %s", strings.Join(uniq(apt), " "))
	}
	return nil
}

// stateMarker marks a folder as make cluster's state, which it may empty.
const stateMarker = ".egress-cluster"

// checkStateDir refuses a state folder that is not make cluster's to
// empty: the root, the home folder, the repository, or a folder with files
// but no marker. It resolves symbolic links, as the mounts under it are
// listed by their real paths.
func (s *Cluster) checkStateDir() error {
	dir, err := filepath.Abs(s.opts.StateDir)
	if err != nil || s.opts.StateDir == "" {
		return errors.Errorf("the state folder %q is not a usable path", s.opts.StateDir)
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	home, _ := os.UserHomeDir()
	root, _ := filepath.Abs(s.opts.Root)
	for _, bad := range []string{"/", home, root, filepath.Dir(root)} {
		if bad != "" && filepath.Clean(bad) == dir {
			return errors.Errorf("refusing %s as the state folder: make cluster empties it", dir)
		}
	}
	entries, err := os.ReadDir(dir)
	if err == nil && len(entries) > 0 {
		if _, err := os.Stat(filepath.Join(dir, stateMarker)); err != nil {
			return errors.Errorf("refusing %s as the state folder: it holds files but no %s, and make cluster empties it", dir, stateMarker)
		}
	}
	s.opts.StateDir = dir
	return nil
}

// lockHost takes the machine-wide lock of make cluster (one cluster per
// machine: the bridge, the node address and the ports are fixed), writing
// this process's pid and state folder into it, and returns the state
// folder the lock named before, if any. The lock is released, by the
// kernel, when the process ends, and by Down.
func (s *Cluster) lockHost() (string, error) {
	if err := os.MkdirAll(s.host.runDir, 0o700); err != nil {
		return "", errors.Wrap(err, "cannot create the machine-wide lock folder")
	}
	f, err := os.OpenFile(filepath.Join(s.host.runDir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return "", errors.Wrap(err, "cannot open the machine-wide lock")
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := os.ReadFile(f.Name())
		_ = f.Close()
		pid, _, _ := strings.Cut(string(b), "\n")
		return "", errors.Errorf("another make cluster runs (pid %s): stop it with make cluster-down", pid)
	}
	b, _ := io.ReadAll(f)
	_, prev, _ := strings.Cut(string(b), "\n")
	if _, err := f.Seek(0, io.SeekStart); err == nil {
		_ = f.Truncate(0)
		_, err = fmt.Fprintf(f, "%d\n%s\n", os.Getpid(), s.opts.StateDir)
		if err != nil {
			_ = f.Close()
			return "", errors.Wrap(err, "cannot write the machine-wide lock")
		}
	}
	// Registered first, so released last.
	s.onDown("machine-wide lock", func() error { return f.Close() })
	return strings.TrimSpace(prev), nil
}

func uniq(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

func (s *Cluster) image(name string) string {
	return filepath.Join(s.opts.Root, "_output", "images", name+".tar")
}

// kubectl runs bin/kubectl as the cluster's administrator.
func (s *Cluster) kubectl(ctx context.Context, args ...string) error {
	return s.run(ctx, "kubectl", s.bin("kubectl"), args...)
}

// waitDeployment waits until a Deployment has all its replicas updated and
// available, naming what its pods wait for when it does not.
func (s *Cluster) waitDeployment(ctx context.Context, namespace, name string, timeout time.Duration) error {
	return wait(ctx, timeout, "Deployment "+namespace+"/"+name+" available", func() (bool, string, error) {
		d := &appsv1.Deployment{}
		if err := s.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, d); err != nil {
			return false, err.Error(), nil
		}
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		if d.Status.ObservedGeneration >= d.Generation && d.Status.UpdatedReplicas == want && d.Status.AvailableReplicas == want && d.Status.Replicas == want {
			return true, "", nil
		}
		return false, fmt.Sprintf("%d/%d available; %s", d.Status.AvailableReplicas, want, s.podTrouble(ctx, namespace, d.Spec.Selector.MatchLabels)), nil
	})
}

// podTrouble says why the pods a selector matches are not ready.
func (s *Cluster) podTrouble(ctx context.Context, namespace string, labels map[string]string) string {
	l := &corev1.PodList{}
	if err := s.Client.List(ctx, l, client.InNamespace(namespace), client.MatchingLabels(labels)); err != nil {
		return err.Error()
	}
	var out []string
	for _, p := range l.Items {
		why := string(p.Status.Phase)
		for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			switch {
			case cs.State.Waiting != nil:
				why += fmt.Sprintf(" %s waiting: %s %s", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
			case cs.State.Terminated != nil && cs.State.Terminated.ExitCode != 0:
				why += fmt.Sprintf(" %s exited %d: %s", cs.Name, cs.State.Terminated.ExitCode, cs.State.Terminated.Message)
			}
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status != corev1.ConditionTrue {
				why += " unscheduled: " + c.Message
			}
		}
		out = append(out, p.Name+" "+why)
	}
	if len(out) == 0 {
		return "no pods"
	}
	return strings.Join(out, "; ")
}

// DownCluster stops the make cluster that holds the machine-wide lock,
// waiting up to two minutes for it to stop everything, then sweeps what a
// killed one left behind: in the state folder the lock names, and in
// o.StateDir.
func DownCluster(o Options) error {
	s := &Cluster{core: newCore(o), host: defaultHostNames()}
	if real, err := filepath.EvalSymlinks(s.opts.StateDir); err == nil {
		s.opts.StateDir = real
	}
	var recorded string
	if f, err := os.OpenFile(filepath.Join(s.host.runDir, "lock"), os.O_RDWR, 0); err == nil {
		b, _ := io.ReadAll(f)
		pidText, rest, _ := strings.Cut(string(b), "\n")
		recorded = strings.TrimSpace(rest)
		// Only a held lock names a live cluster: a pid from a stale file
		// may be anyone's now.
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			pid, err := strconv.Atoi(strings.TrimSpace(pidText))
			if err != nil || pid <= 1 {
				_ = f.Close()
				return errors.Errorf("the machine-wide lock is held but names no pid (%q)", pidText)
			}
			s.Logf("stopping make cluster (pid %d) ...", pid)
			_ = syscall.Kill(pid, syscall.SIGTERM)
			deadline := time.Now().Add(2 * time.Minute)
			for syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
				if time.Now().After(deadline) {
					_ = f.Close()
					return errors.Errorf("make cluster (pid %d) did not stop within two minutes", pid)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		defer f.Close() //nolint:errcheck // Releases the lock.
	}
	if recorded != "" && recorded != s.opts.StateDir {
		old := &Cluster{core: core{opts: s.opts}, host: s.host}
		old.opts.StateDir = recorded
		old.sweepNode(context.Background())
		if left := old.ClusterLeftBehind(); len(left) > 0 {
			return errors.Errorf("still on this machine: %s", strings.Join(left, ", "))
		}
	}
	s.sweepNode(context.Background())
	if left := s.ClusterLeftBehind(); len(left) > 0 {
		return errors.Errorf("still on this machine: %s", strings.Join(left, ", "))
	}
	s.Logf("nothing of the cluster runs")
	return nil
}

// ClusterLeftBehind lists what of a cluster is still on this machine: what
// Down (and make cluster-down) must not leave. It checks the processes
// running from the state folder (the control plane, containerd, its shims,
// kubelet) or in the kubelet's cgroups, the mounts under the state folder,
// the bridge, the target host's and pods' network namespaces, and the
// iptables chains of the guard, the kubelet and kube-proxy.
func (s *Cluster) ClusterLeftBehind() []string {
	var left []string
	for _, pid := range s.strays() {
		left = append(left, fmt.Sprintf("process %d (%s)", pid, cmdline(pid)))
	}
	for _, root := range s.cgroupRoots() {
		if exists(root) {
			left = append(left, "cgroup "+root)
		}
	}
	left = append(left, s.mountsLeft()...)
	if exists(s.sysctlSnapshot()) {
		left = append(left, "machine settings not restored from "+s.sysctlSnapshot())
	}
	for _, link := range []string{s.host.bridge, s.host.targetVeth} {
		if exec.Command("ip", "link", "show", link).Run() == nil {
			left = append(left, "link "+link)
		}
	}
	left = append(left, s.namespacesLeft()...)
	return append(left, s.chainsLeft()...)
}

// mountsLeft lists the mounts under the state folder.
func (s *Cluster) mountsLeft() []string {
	var left []string
	abs, _ := filepath.Abs(s.opts.StateDir)
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(unescapeMount(f[4]), abs+"/") {
				left = append(left, "mount "+f[4])
			}
		}
	}
	return left
}

// namespacesLeft lists the target host's network namespace and, machine
// wide, the pods'.
func (s *Cluster) namespacesLeft() []string {
	var left []string
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && (f[0] == s.host.targetNetns || s.host.machineWide && strings.HasPrefix(f[0], "cni-")) {
			left = append(left, "network namespace "+f[0])
		}
	}
	return left
}

// chainsLeft lists the guard's and the kubelet's chains and, machine wide,
// any KUBE- chain, in IPv4 and IPv6.
func (s *Cluster) chainsLeft() []string {
	var left []string
	for _, bin := range []string{binIptables, "ip6tables"} {
		for _, table := range iptablesTables {
			out, _ := exec.Command(bin, "-w", "-t", table, "-S").Output()
			for _, line := range strings.Split(string(out), "\n") {
				f := strings.Fields(line)
				if len(f) == 2 && f[0] == "-N" && (strings.HasPrefix(f[1], s.host.guard) || contains(s.host.kubeChains, f[1]) || s.host.machineWide && strings.HasPrefix(f[1], "KUBE-")) {
					left = append(left, bin+" "+table+" chain "+f[1])
				}
			}
		}
	}
	return left
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	s := strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ")
	if len(s) > 120 {
		s = s[:120] + "..."
	}
	return s
}
