package devenv

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// sysctls the node needs: forwarding (Service traffic is DNATed on the
// node, then forwarded back onto the bridge), and bridged traffic through
// iptables (a reply between two pods on the bridge must meet conntrack to
// be un-DNATed).
var sysctls = map[string]string{
	"net/ipv4/ip_forward":                 "1",
	"net/bridge/bridge-nf-call-iptables":  "1",
	"net/bridge/bridge-nf-call-ip6tables": "1",
}

// machineSysctls are the machine-wide settings a node changes, under
// /proc/sys: those above, the kubelet's (it sets the kernel's panic and
// overcommit behaviour and key quotas at start) and kube-proxy's
// (conntrack). They are saved before anything starts and put back by the
// sweep.
var machineSysctls = []string{
	"net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables",
	"kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory", "vm/panic_on_oom",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
	"net/netfilter/nf_conntrack_max", "net/netfilter/nf_conntrack_tcp_timeout_established",
	"net/netfilter/nf_conntrack_tcp_timeout_close_wait", "net/ipv4/conf/all/route_localnet",
}

func (s *Cluster) sysctlSnapshot() string { return filepath.Join(s.host.runDir, "sysctls.json") }

// saveSysctls records the machine's settings, unless a record is there
// already: then an earlier cluster was killed before restoring them, and
// that record holds the machine's own.
func (s *Cluster) saveSysctls() error {
	if _, err := os.Stat(s.sysctlSnapshot()); err == nil {
		return nil
	}
	saved := map[string]string{}
	for _, k := range machineSysctls {
		if b, err := os.ReadFile(filepath.Join(s.host.sysctlRoot, k)); err == nil {
			saved[k] = strings.TrimSpace(string(b))
		}
	}
	b, _ := json.MarshalIndent(saved, "", "  ")
	tmp := s.sysctlSnapshot() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return errors.Wrap(err, "cannot save the machine's settings")
	}
	return errors.Wrap(os.Rename(tmp, s.sysctlSnapshot()), "cannot save the machine's settings")
}

// restoreSysctls puts the recorded settings back and drops the record; a
// setting it cannot write keeps the record, which ClusterLeftBehind then
// reports.
func (s *Cluster) restoreSysctls() {
	b, err := os.ReadFile(s.sysctlSnapshot())
	if err != nil {
		return
	}
	saved := map[string]string{}
	if json.Unmarshal(b, &saved) != nil {
		return
	}
	failed := false
	for k, v := range saved {
		if err := os.WriteFile(filepath.Join(s.host.sysctlRoot, k), []byte(v), 0o644); err != nil { //nolint:gosec // A sysctl.
			failed = true
		}
	}
	if !failed {
		_ = os.Remove(s.sysctlSnapshot())
	}
}

// ipCmd runs ip with args, returning its output in the error.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return errors.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func iptables(args ...string) error {
	out, err := exec.Command(binIptables, append([]string{"-w"}, args...)...).CombinedOutput()
	if err != nil {
		return errors.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// startNetwork makes the bridge with NodeIP, routes Service addresses onto
// it (so that nothing aimed at a cluster IP takes this machine's default
// route), sets the sysctls, and installs the guard (guardHooks).
func (s *Cluster) startNetwork(_ context.Context) error {
	br := s.host.bridge
	for _, cmd := range []string{
		"link add " + br + " type bridge",
		"addr add " + NodeIP + "/24 dev " + br,
		"link set " + br + " up",
		"route add " + ServiceCIDR + " dev " + br + " src " + NodeIP,
	} {
		if err := ipCmd(strings.Fields(cmd)...); err != nil {
			return err
		}
	}
	if err := s.saveSysctls(); err != nil {
		return err
	}
	for k, v := range sysctls {
		f := filepath.Join(s.host.sysctlRoot, k)
		if _, err := os.Stat(f); err != nil {
			return errors.Wrapf(err, "cannot read %s (is the br_netfilter module loaded? modprobe br_netfilter)", f)
		}
		if err := os.WriteFile(f, []byte(v), 0o644); err != nil { //nolint:gosec // A sysctl.
			return errors.Wrapf(err, "cannot set %s", f)
		}
	}
	// No IPv6 on the bridge: pods would reach this machine's services on
	// its link-local address.
	if err := os.WriteFile(filepath.Join(s.host.sysctlRoot, "net/ipv6/conf", s.host.bridge, "disable_ipv6"), []byte("1"), 0o644); err != nil { //nolint:gosec // A sysctl.
		return errors.Wrap(err, "cannot turn IPv6 off on the bridge")
	}
	return s.SetGuard(true)
}

// iptables' tables, and the two the guard uses.
const (
	tableRaw    = "raw"
	tableMangle = "mangle"
)

var iptablesTables = []string{"filter", "nat", tableMangle, tableRaw}

// guardHook is one chain of the guard, hooked at the top of a built-in
// chain of a table kube-proxy does not write to.
type guardHook struct {
	table, builtin, suffix string
	rules                  [][]string
}

// guardHooks are the guard that keeps the pod network on this machine and
// this machine's services from the pods. kube-proxy prepends its own jumps
// to FORWARD, INPUT and nat's chains, and accepts marked and established
// traffic there, so the guard lives where it never writes:
//   - raw PREROUTING: what comes from the bridge goes only to the pod and
//     Service networks, and nothing from another interface reaches them;
//   - mangle PREROUTING: from the bridge, the node's address answers only
//     on the apiserver, kubelet, registry and NodePort ports (and replies);
//   - mangle POSTROUTING, before any masquerade: nothing from the pod
//     network leaves by another interface.
func (s *Cluster) guardHooks() []guardHook {
	br, node := s.host.bridge, NodeIP
	rules := func(lines ...string) [][]string {
		out := make([][]string, len(lines))
		for i, l := range lines {
			out[i] = strings.Fields(l)
		}
		return out
	}
	return []guardHook{
		{tableRaw, "PREROUTING", "-RAW", rules(
			"-i "+br+" -d "+PodCIDR+" -j RETURN",
			"-i "+br+" -d "+ServiceCIDR+" -j RETURN",
			"-i "+br+" -j DROP",
			// From here on, what came in by another interface.
			"! -i lo -d "+PodCIDR+" -j DROP",
			"! -i lo -d "+ServiceCIDR+" -j DROP",
		)},
		{tableMangle, "PREROUTING", "-IN", rules(
			"-i "+br+" -d "+node+" -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN",
			fmt.Sprintf("-i %s -d %s -p tcp -m multiport --dports %d,10250,%d,30000:32767 -j RETURN", br, node, APIServerPort, RegistryPort),
			"-i "+br+" -d "+node+" -j DROP",
		)},
		{tableMangle, "POSTROUTING", "-OUT", rules(
			"-o "+br+" -j RETURN",
			"-o lo -j RETURN",
			"-s "+PodCIDR+" -j DROP",
		)},
	}
}

// SetGuard installs the guard, or removes it. make e2e-cluster removes it
// for a moment to show that its check of the guard fails without it.
func (s *Cluster) SetGuard(on bool) error {
	for _, h := range s.guardHooks() {
		chain := s.host.guard + h.suffix
		for iptables("-t", h.table, "-D", h.builtin, "-j", chain) == nil {
		}
		_ = iptables("-t", h.table, "-F", chain)
		_ = iptables("-t", h.table, "-X", chain)
		if !on {
			continue
		}
		if err := iptables("-t", h.table, "-N", chain); err != nil {
			return err
		}
		for _, r := range h.rules {
			if err := iptables(append([]string{"-t", h.table, "-A", chain}, r...)...); err != nil {
				return err
			}
		}
		if err := iptables("-t", h.table, "-I", h.builtin, "1", "-j", chain); err != nil {
			return err
		}
	}
	return nil
}

// hostNames are the names a cluster takes on this machine: its bridge,
// the target host's namespace and veth, the guard chain, the kubelet's
// top cgroup, and the kubelet's iptables chains. machineWide also sweeps
// and checks what the node names itself (kube-proxy's rules, the pods'
// cni-* namespaces, every KUBE- chain); tests of the sweep turn it off so
// that they never touch a cluster running beside them.
type hostNames struct {
	bridge, targetNetns, targetVeth, guard, cgroup string
	kubeChains                                     []string
	machineWide                                    bool
	// runDir holds the machine-wide lock and the saved settings; sysctlRoot
	// is /proc/sys.
	runDir, sysctlRoot string
}

func defaultHostNames() hostNames {
	return hostNames{
		bridge: Bridge, targetNetns: TargetNetns, targetVeth: "egt-host", guard: guardChain, cgroup: clusterName,
		kubeChains: kubeletChains, machineWide: true, runDir: "/run/egress-cluster", sysctlRoot: "/proc/sys",
	}
}

// nodeBinaries are the programs of a node, by file name: a process of one
// of them whose arguments name the state folder is the cluster's.
var nodeBinaries = []string{
	binEtcd, binAPIServer, binKCM, binScheduler, binKubelet, binKubeProxy,
	binContainerd, "containerd-shim-runc-v2",
}

// strays lists the node's processes that name the state folder.
func (s *Cluster) strays() []int {
	abs, err := filepath.Abs(s.opts.StateDir)
	if err != nil {
		return nil
	}
	return pidsMatching(func(args []string) bool {
		if !contains(nodeBinaries, filepath.Base(args[0])) {
			return false
		}
		for _, a := range args {
			if strings.Contains(a, abs) {
				return true
			}
		}
		return false
	})
}

// cgroupRoots are where the kubelet's top cgroup is, per controller.
func (s *Cluster) cgroupRoots() []string {
	var out []string
	ctrls, _ := os.ReadDir("/sys/fs/cgroup")
	for _, c := range ctrls {
		if c.IsDir() {
			out = append(out, filepath.Join("/sys/fs/cgroup", c.Name(), s.host.cgroup))
		}
	}
	return append(out, filepath.Join("/sys/fs/cgroup", s.host.cgroup))
}

// sweepSkip names sweep steps to leave out: only the sweep's own test sets
// it, to show that ClusterLeftBehind catches what a broken sweep leaves.
var sweepSkip = map[string]bool{}

// sweepNode removes what a node leaves on this machine, whether or not it
// was stopped in order: the node's processes still running from the state
// folder, the containers' processes (by their cgroups), the mounts under
// the state folder, the cgroups, the pods' network namespaces, kube-proxy's
// rules, the guard, the routes and the bridge, and the target host's
// namespace.
func (s *Cluster) sweepNode(ctx context.Context) {
	if !sweepSkip["processes"] {
		for _, pid := range s.strays() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		for _, root := range s.cgroupRoots() {
			killCgroupTree(root)
		}
	}
	if !sweepSkip["mounts"] {
		unmountUnder(s.opts.StateDir)
	}
	if !sweepSkip["mounts"] {
		s.removeOutsideFiles()
	}
	if !sweepSkip["cgroups"] {
		for _, root := range s.cgroupRoots() {
			removeCgroupTree(root)
		}
	}
	if s.host.machineWide {
		// The pods' network namespaces (containerd names them cni-<uuid>):
		// those with an address on the pod network.
		if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
			for _, line := range strings.Split(string(out), "\n") {
				f := strings.Fields(line)
				if len(f) == 0 || !strings.HasPrefix(f[0], "cni-") {
					continue
				}
				addrs, _ := exec.Command("ip", "-n", f[0], "-4", "-o", "addr").Output()
				if strings.Contains(string(addrs), " "+strings.TrimSuffix(PodCIDR, "0/24")) {
					_ = exec.Command("ip", "netns", "del", f[0]).Run()
				}
			}
		}
		if _, err := os.Stat(s.bin(binKubeProxy)); err == nil {
			_ = exec.CommandContext(ctx, s.bin(binKubeProxy), "--cleanup").Run()
		}
	}
	if !sweepSkip["network"] {
		_ = exec.Command("ip", "netns", "del", s.host.targetNetns).Run()
		_ = s.SetGuard(false)
		for _, bin := range []string{binIptables, "ip6tables"} {
			removeChains(bin, s.host.kubeChains)
		}
		_ = exec.Command("ip", "link", "del", s.host.bridge).Run()
		_ = exec.Command("ip", "link", "del", s.host.targetVeth).Run()
	}
	if !sweepSkip["sysctls"] {
		s.restoreSysctls()
	}
}

// Folders outside the state folder where the node leaves files: the
// kubelet's links to container logs (a fixed path), and libcni's cache of
// each sandbox's results (containerd names no other).
var (
	containerLogLinks = "/var/log/containers"
	cniResults        = "/var/lib/cni/results"
)

// removeOutsideFiles removes the kubelet's log links that point into the
// state folder, and libcni's results of the cluster's network (and of
// containerd's loopback, on machineWide).
func (s *Cluster) removeOutsideFiles() {
	abs, _ := filepath.Abs(s.opts.StateDir)
	if ents, err := os.ReadDir(containerLogLinks); err == nil {
		for _, e := range ents {
			p := filepath.Join(containerLogLinks, e.Name())
			if to, err := os.Readlink(p); err == nil && strings.HasPrefix(to, abs+"/") {
				_ = os.Remove(p)
			}
		}
	}
	if ents, err := os.ReadDir(cniResults); err == nil && s.host.machineWide {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), cniNetwork+"-") || strings.HasPrefix(e.Name(), "cni-loopback-") {
				_ = os.Remove(filepath.Join(cniResults, e.Name()))
			}
		}
	}
}

// cniNetwork names the pod network in the CNI configuration.
const cniNetwork = clusterName

// kubeletChains are the iptables chains the kubelet makes (kube-proxy
// --cleanup removes kube-proxy's).
var kubeletChains = []string{"KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"}

// removeChains deletes chains from every table: the rules that jump to
// them, then their rules, then the chains.
func removeChains(bin string, chains []string) {
	for _, table := range iptablesTables {
		out, err := exec.Command(bin, "-w", "-t", table, "-S").Output()
		if err != nil {
			continue
		}
		have := map[string]bool{}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "-N" {
				have[f[1]] = true
			}
			if len(f) >= 4 && f[0] == "-A" && f[len(f)-2] == "-j" && contains(chains, f[len(f)-1]) && !contains(chains, f[1]) {
				_ = exec.Command(bin, append([]string{"-w", "-t", table, "-D"}, f[1:]...)...).Run()
			}
		}
		for _, c := range chains {
			if have[c] {
				_ = exec.Command(bin, "-w", "-t", table, "-F", c).Run()
				_ = exec.Command(bin, "-w", "-t", table, "-X", c).Run()
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// pidsMatching lists the processes whose argv match.
func pidsMatching(match func(args []string) bool) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		if match(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")) {
			out = append(out, pid)
		}
	}
	return out
}

// killCgroupTree kills every process of a cgroup folder and those below
// it, a few times over, as a fork can race the first pass.
func killCgroupTree(root string) {
	for range 3 {
		found := false
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
					found = true
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			return nil
		})
		if !found {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// removeCgroupTree removes a cgroup folder and those below it, deepest
// first.
func removeCgroupTree(root string) {
	var all []string
	_ = filepath.WalkDir(root, func(p string, e os.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			all = append(all, p)
		}
		return nil
	})
	for i := len(all) - 1; i >= 0; i-- {
		_ = syscall.Rmdir(all[i])
	}
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close() //nolint:errcheck // read-only
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == abs || strings.HasPrefix(mp, abs+"/") {
			points = append(points, mp)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// registryHost is where containerd and Crossplane pull from.
func registryHost() string { return fmt.Sprintf("%s:%d", NodeIP, RegistryPort) }

// startContainerd writes containerd's configuration (CRI with the sandbox
// image from the registry, overlayfs, runc with cgroupfs, CNI from
// Debian's plugins with a conf folder of ours, registry hosts under
// certs.d) and runs it with every path under the state folder.
func (s *Cluster) startContainerd(ctx context.Context) error {
	dir := s.path(binContainerd)
	cni := s.path("cni")
	certs := filepath.Join(dir, "certs.d")
	for _, d := range []string{dir, filepath.Join(cni, "net.d"), filepath.Join(cni, "ipam")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return errors.Wrap(err, "cannot create containerd's folders")
		}
	}
	// The published names and the registry's own both resolve to the
	// registry, over plain HTTP on the node's address.
	hosts := fmt.Sprintf("server = \"http://%[1]s\"\n\n[host.\"http://%[1]s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", registryHost())
	// _default catches every other registry: the node pulls from nowhere
	// but its own.
	for _, h := range []string{upstreamHost, registryHost(), "_default"} {
		if err := os.MkdirAll(filepath.Join(certs, h), 0o755); err != nil {
			return errors.Wrap(err, "cannot create containerd's registry hosts")
		}
		if err := os.WriteFile(filepath.Join(certs, h, "hosts.toml"), []byte(hosts), 0o644); err != nil { //nolint:gosec // Not secret.
			return errors.Wrap(err, "cannot write containerd's registry hosts")
		}
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		return errors.New("runc is not installed: apt-get install -y runc")
	}
	cfg := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
# Plugins for other filesystems and for tracing are not needed here.
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %[3]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[8]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[4]q
  # This machine does not let a process lower its oom_score_adj; without
  # this the sandbox fails ("can't get final child's PID from pipe").
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = %[5]q
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[6]q
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = %[7]q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), filepath.Join(dir, "containerd.sock"),
		upstreamPrefix+"pause:"+PackageVersion, runc, filepath.Join(cni, "net.d"), certs, filepath.Join(dir, "opt"))
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o644); err != nil { //nolint:gosec // Not secret.
		return errors.Wrap(err, "cannot write containerd's configuration")
	}
	// The pod network: Debian's bridge plugin on Bridge, with host-local
	// addresses and routes to the bridge and Service addresses only.
	conflist := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": %q,
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "isDefaultGateway": false,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q, "rangeStart": %q, "rangeEnd": %q, "gateway": %q}]],
        "routes": [{"dst": %q, "gw": %q}]
      }
    },
    {"type": "loopback"}
  ]
}
`, cniNetwork, s.host.bridge, filepath.Join(cni, "ipam"), PodCIDR, podRangeStart, podRangeEnd, NodeIP, ServiceCIDR, NodeIP)
	if err := os.WriteFile(filepath.Join(cni, "net.d", "10-egress-cluster.conflist"), []byte(conflist), 0o644); err != nil { //nolint:gosec // Not secret.
		return errors.Wrap(err, "cannot write the CNI configuration")
	}
	p, err := s.start(binContainerd, binContainerd, []string{"--config", filepath.Join(dir, "config.toml")})
	if err != nil {
		return err
	}
	return wait(ctx, time.Minute, "containerd serving CRI", func() (bool, string, error) {
		if done, err := p.exited(); done {
			return false, "", errors.Errorf("containerd exited (%v); see logs/containerd.log", err)
		}
		out, err := exec.CommandContext(ctx, "ctr", "--address", filepath.Join(dir, "containerd.sock"), "plugins", "ls").CombinedOutput()
		if err != nil {
			return false, strings.TrimSpace(string(out)), nil
		}
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) >= 4 && f[0] == "io.containerd.grpc.v1" && f[1] == "cri" {
				if f[len(f)-1] == "ok" {
					return true, "", nil
				}
				return false, "cri plugin: " + f[len(f)-1], nil
			}
		}
		return false, "no cri plugin yet", nil
	})
}

// startKubelet configures the kubelet as NODE-NOTES.md found it works on
// this machine kind (cgroupfs, cgroup v1 allowed, swap allowed, no node
// allocatable enforcement or hard eviction on a 2-core box), serving on
// NodeIP with webhook authentication and authorisation (pods can reach the
// node, so its API is not open), and waits for the node to be Ready.
func (s *Cluster) startKubelet(ctx context.Context) error {
	dir := s.path(binKubelet)
	for _, d := range []string{dir, s.path("pod-logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return errors.Wrap(err, "cannot create the kubelet's folders")
		}
	}
	// Pods with dnsPolicy Default (CoreDNS) get this machine's resolver
	// configuration; there is none to give: nothing resolves off the node.
	resolv := s.path("kubelet-resolv.conf")
	if err := os.WriteFile(resolv, []byte("# make cluster: no resolver beyond the cluster DNS\noptions ndots:1\n"), 0o644); err != nil { //nolint:gosec // Not secret.
		return errors.Wrap(err, "cannot write the kubelet's resolv.conf")
	}
	health, err := s.port("kubelet-health")
	if err != nil {
		return err
	}
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %[2]d
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[3]q}
authorization:
  mode: Webhook
tlsCertFile: %[4]q
tlsPrivateKeyFile: %[5]q
cgroupDriver: cgroupfs
# Every pod's cgroup lies below this one of the cluster's own, which the
# sweep empties and removes.
cgroupRoot: /%[11]s
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%[6]s
clusterDNS: [%[7]s]
clusterDomain: %[8]s
resolvConf: %[9]q
podLogsDir: %[10]q
enforceNodeAllocatable: []
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# Secrets and ConfigMaps reach mounted volumes within this period.
syncFrequency: 10s
serializeImagePulls: false
maxPods: 110
`, NodeIP, health, s.path("pki", caFile), s.path("pki", "kubelet.crt"), s.path("pki", "kubelet.key"),
		s.path(binContainerd, "containerd.sock"), DNSServiceIP, clusterDomain, resolv, s.path("pod-logs"), s.host.cgroup)
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(cfg), 0o644); err != nil { //nolint:gosec // Not secret.
		return errors.Wrap(err, "cannot write the kubelet's configuration")
	}
	if err := s.makeCgroupRoot(); err != nil {
		return err
	}
	p, err := s.start(binKubelet, s.bin(binKubelet), []string{
		"--config=" + filepath.Join(dir, "config.yaml"),
		"--kubeconfig=" + s.path("pki", "kubelet.kubeconfig"),
		"--root-dir=" + filepath.Join(dir, "root"),
		"--hostname-override=" + NodeName,
		"--node-ip=" + NodeIP,
		// Fleets spread proxies over zones by this label.
		"--node-labels=topology.kubernetes.io/zone=" + NodeZone,
		"--v=1",
	})
	if err != nil {
		return err
	}
	return wait(ctx, 2*time.Minute, "node "+NodeName+" Ready", func() (bool, string, error) {
		if done, err := p.exited(); done {
			return false, "", errors.Errorf("kubelet exited (%v); see logs/kubelet.log", err)
		}
		n := &corev1.Node{}
		if err := s.Client.Get(ctx, types.NamespacedName{Name: NodeName}, n); err != nil {
			return false, err.Error(), nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, c.Reason + ": " + c.Message, nil
			}
		}
		return false, "no Ready condition yet", nil
	})
}

// makeCgroupRoot makes the kubelet's cgroup root under every controller;
// cpuset's needs its parent's CPUs and memory nodes before it takes tasks.
func (s *Cluster) makeCgroupRoot() error {
	for _, dir := range s.cgroupRoots() {
		parent := filepath.Dir(dir)
		if _, err := os.Stat(parent); err != nil || parent == "/sys/fs/cgroup" && !exists(filepath.Join(parent, "cgroup.procs")) {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return errors.Wrapf(err, "cannot make the cgroup %s", dir)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(parent, f)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil { //nolint:gosec // A cgroup file.
					return errors.Wrapf(err, "cannot set %s of %s", f, dir)
				}
			}
		}
	}
	return nil
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// startKubeProxy runs kube-proxy in iptables mode, its NodePorts on NodeIP
// only.
func (s *Cluster) startKubeProxy(ctx context.Context) error {
	ports, err := s.ports("kube-proxy-health", "kube-proxy-metrics")
	if err != nil {
		return err
	}
	cfg := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %[1]q
mode: iptables
clusterCIDR: %[2]s
hostnameOverride: %[3]s
healthzBindAddress: 127.0.0.1:%[4]d
metricsBindAddress: 127.0.0.1:%[5]d
nodePortAddresses: [%[6]s/32]
# Leave the machine's conntrack table size and timeouts alone.
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, s.path("pki", "kube-proxy.kubeconfig"), PodCIDR, NodeName, ports[0], ports[1], NodeIP)
	path := s.path("kube-proxy.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil { //nolint:gosec // Not secret.
		return errors.Wrap(err, "cannot write kube-proxy's configuration")
	}
	p, err := s.start(binKubeProxy, s.bin(binKubeProxy), []string{"--config=" + path})
	if err != nil {
		return err
	}
	return waitHTTP(ctx, p, fmt.Sprintf("http://127.0.0.1:%d/healthz", ports[0]), time.Minute)
}
