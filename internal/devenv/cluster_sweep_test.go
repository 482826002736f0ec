package devenv

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// leftovers makes, under names of its own, one of each thing a node leaves
// on this machine: a node process running from the state folder, a
// container process in the kubelet's cgroup, a mount under the state
// folder, the bridge and the target host's veth and namespace, and the
// guard's chains with their jumps and an ip6tables chain of the kubelet's,
// and the machine's settings changed after they were saved. It returns
// the Cluster that owns them and, per sweep step, what ClusterLeftBehind
// must report while that step has not run.
func leftovers(t *testing.T) (*Cluster, map[string][]string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test makes links, network namespaces, iptables chains, cgroups and mounts: run it as root (CI does)")
	}
	for _, tool := range []string{"ip", "iptables", "ip6tables", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: apt-get install -y iproute2 iptables mount", tool)
		}
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	state := t.TempDir()
	if exec.Command("ip", "link", "show", Bridge).Run() == nil {
		t.Fatalf("make cluster runs (bridge %s exists), and this test's guard rules would cut its pods off: stop it with make cluster-down first", Bridge)
	}
	s := &Cluster{core: core{opts: Options{StateDir: state}}, host: hostNames{
		bridge: "egtbr" + id, targetNetns: "egt-ns-" + id, targetVeth: "egtv" + id,
		guard: "EGT-GUARD-" + strings.ToUpper(id), cgroup: "egt-kubepods-" + id,
		kubeChains: []string{"EGT-KUBE-" + strings.ToUpper(id)},
		runDir:     t.TempDir(), sysctlRoot: t.TempDir(),
	}}
	t.Cleanup(func() { s.sweepNode(t.Context()) })
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	want := map[string][]string{}

	// A "kubelet" (a copy of sleep) whose arguments name the state folder.
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	body, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	kubelet := filepath.Join(state, "kubelet")
	if err := os.WriteFile(kubelet, body, 0o755); err != nil { //nolint:gosec // An executable.
		t.Fatal(err)
	}
	node := exec.Command(kubelet, "300")
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	go node.Wait() //nolint:errcheck // Reaped when killed.
	want["processes"] = append(want["processes"], "process "+strconv.Itoa(node.Process.Pid))

	// A "container": a process in the kubelet's cgroup, below a pod's.
	pod := filepath.Join("/sys/fs/cgroup/pids", s.host.cgroup, "pod-"+id)
	if err := os.MkdirAll(pod, 0o755); err != nil {
		t.Fatalf("cannot make a cgroup (cgroup v1 pids controller): %v", err)
	}
	container := exec.Command(sleep, "300")
	if err := container.Start(); err != nil {
		t.Fatal(err)
	}
	go container.Wait() //nolint:errcheck // Reaped when killed.

	if err := os.WriteFile(filepath.Join(pod, "cgroup.procs"), []byte(strconv.Itoa(container.Process.Pid)), 0o644); err != nil { //nolint:gosec // A cgroup file.
		t.Fatal(err)
	}
	want["cgroups"] = append(want["cgroups"], "cgroup /sys/fs/cgroup/pids/"+s.host.cgroup)

	mnt := filepath.Join(state, "kubelet-root", "pods", "volume")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	run("mount", "-t", "tmpfs", "tmpfs", mnt)
	want["mounts"] = append(want["mounts"], "mount "+mnt)

	run("ip", "link", "add", s.host.bridge, "type", "bridge")
	run("ip", "netns", "add", s.host.targetNetns)
	run("ip", "link", "add", s.host.targetVeth, "type", "veth", "peer", "name", "eth0", "netns", s.host.targetNetns)
	run("ip", "link", "set", s.host.targetVeth, "master", s.host.bridge)
	if err := s.SetGuard(true); err != nil {
		t.Fatal(err)
	}
	run("ip6tables", "-w", "-t", "raw", "-N", s.host.kubeChains[0])
	run("ip6tables", "-w", "-t", "raw", "-A", "OUTPUT", "-j", s.host.kubeChains[0])
	want["network"] = append(want["network"],
		"link "+s.host.bridge, "link "+s.host.targetVeth, "network namespace "+s.host.targetNetns,
		"iptables raw chain "+s.host.guard+"-RAW", "iptables mangle chain "+s.host.guard+"-IN",
		"iptables mangle chain "+s.host.guard+"-OUT", "ip6tables raw chain "+s.host.kubeChains[0])

	// The machine's settings, saved, then changed as a node changes them
	// (in a stand-in /proc/sys).
	for _, k := range machineSysctls {
		f := filepath.Join(s.host.sysctlRoot, k)
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("machine's own\n"), 0o644); err != nil { //nolint:gosec // A stand-in.
			t.Fatal(err)
		}
	}
	if err := s.saveSysctls(); err != nil {
		t.Fatal(err)
	}
	for _, k := range machineSysctls {
		if err := os.WriteFile(filepath.Join(s.host.sysctlRoot, k), []byte("node's"), 0o644); err != nil { //nolint:gosec // A stand-in.
			t.Fatal(err)
		}
	}
	want["sysctls"] = []string{"machine settings not restored"}
	return s, want
}

// missing returns what of want the report lacks.
func missing(report, want []string) []string {
	var out []string
	for _, w := range want {
		found := false
		for _, r := range report {
			if strings.HasPrefix(r, w) {
				found = true
			}
		}
		if !found {
			out = append(out, w)
		}
	}
	return out
}

// TestSweepLeavesNothing: the leak checker (ClusterLeftBehind) reports every
// kind of thing a node leaves; a sweep with one step broken (left out)
// leaves that step's things, and the checker names them; the full sweep
// leaves nothing the checker can find.
func TestSweepLeavesNothing(t *testing.T) {
	s, want := leftovers(t)
	report := s.ClusterLeftBehind()
	for _, w := range want {
		if m := missing(report, w); len(m) > 0 {
			t.Fatalf("the checker misses %v; it reports %v", m, report)
		}
	}

	// Mutations: each step of the sweep left out in turn. Only the step
	// that removes a thing may leave it, and the checker must say so.
	for _, step := range []string{"network", "mounts", "cgroups", "sysctls", "processes"} {
		sweepSkip = map[string]bool{step: true}
		s.sweepNode(t.Context())
		sweepSkip = map[string]bool{}
		report := s.ClusterLeftBehind()
		if m := missing(report, want[step]); len(m) > 0 {
			t.Errorf("with the %s step left out, the checker misses %v; it reports %v", step, m, report)
		}
		if step == "processes" {
			// A process still running holds its cgroup: the next full
			// sweep must kill it before removing the cgroup.
			continue
		}
		// Put the step's things back for the next mutation, by sweeping
		// in full and making them again.
		s.sweepNode(t.Context())
		if left := s.ClusterLeftBehind(); len(left) > 0 {
			t.Fatalf("after a full sweep: %v", left)
		}
		s, want = leftovers(t)
	}

	s.sweepNode(t.Context())
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := s.ClusterLeftBehind()
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sweep left %v", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, k := range machineSysctls {
		if b, _ := os.ReadFile(filepath.Join(s.host.sysctlRoot, k)); string(b) != "machine's own" {
			t.Errorf("%s is %q after the sweep, want the machine's own value back", k, b)
		}
	}
}
