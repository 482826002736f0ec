package proxy_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	awsbackend "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/aws"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/aws/ec2fake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp/gcpfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/local"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// killRun is one run of the provider-kill scenario against one backend.
type killRun struct {
	t     *testing.T
	bin   string
	env   []string
	ns    string
	logs  string
	rng   *rand.Rand
	proxy func(name string, port int32) *v1alpha1.Proxy
	// progress changes when the backend begins a create; window is how
	// long after that a targeted kill may come.
	progress func() int
	window   time.Duration
	next     int32 // the last Proxy's number
	ports    int32 // Proxy k<n> listens on ports+n
	live     map[string]types.UID
	gone     map[string]types.UID
	proc     *exec.Cmd
	exited   chan struct{}
	// leftovers counts what a killed create left in the backend.
	leftovers func() int
	// unlearned counts the instances the backend holds whose Proxy does
	// not yet record them: a kill landed between a launch and the
	// provider learning of it.
	unlearned func() int
	// What the kills landed in, and left.
	kills, midCreate, midDelete, leftover, midLaunch int
}

// providerKills is how many times each backend's provider is killed:
// FAULTS_PROVIDER_KILLS (make faults: 100), else a few so that CI keeps
// the scenario working.
func providerKills(t *testing.T) int {
	if s := os.Getenv("FAULTS_PROVIDER_KILLS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("FAULTS_PROVIDER_KILLS=%q is not a positive number", s)
		}
		return n
	}
	return 6
}

// buildProvider builds cmd/provider: the scenario kills the real process.
func buildProvider(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "provider")
	root := sharedBed.Env(t).Root
	if out, err := exec.Command("go", "build", "-o", bin, filepath.Join(root, "cmd", "provider")).CombinedOutput(); err != nil {
		t.Fatalf("cannot build the provider: %v\n%s", err, out)
	}
	return bin
}

// TestProviderKilledMidOperation SIGKILLs the provider process at random
// points while Proxies are created and deleted, and restarts it, for the
// local backend (real Squids), for GCP (the fake Compute API, with
// operations that take a while) and for AWS (the fake EC2 API, whose
// answers come a while after the change). After the last restart every Proxy
// becomes Ready, and nothing is left over: each Proxy has exactly one
// instance (process, state folder, port claim, or VM and firewall rule),
// deleted Proxies have none, and deleting them all leaves no instance,
// firewall rule, connection Secret, state folder or process.
func TestProviderKilledMidOperation(t *testing.T) {
	bin := buildProvider(t)
	kills := providerKills(t)
	t.Run("Local", func(t *testing.T) {
		r, dir := newKillRun(t, bin)
		r.env = append(r.env, "STATE_DIR="+dir)
		// After the provider stops (cleanups run last in, first out):
		// whatever a failed run left must not hold the next one's ports.
		t.Cleanup(func() { local.StopAll(dir) })
		create(t, &v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "kill-" + r.ns}, Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal,
			Policy: &v1alpha1.Policy{Local: &v1alpha1.LocalPolicy{AllowLoopbackDestinations: true}}}})
		target := r.target()
		// A local create claims a port, then stages the instance's folder.
		r.progress = func() int {
			ports, _ := os.ReadDir(filepath.Join(dir, ".ports"))
			staged, _ := os.ReadDir(filepath.Join(dir, ".staging"))
			return len(ports)*1000 + len(staged)
		}
		r.window = 20 * time.Millisecond
		r.leftovers = func() int {
			staged, _ := os.ReadDir(filepath.Join(dir, ".staging"))
			return len(staged)
		}
		r.proxy = func(name string, port int32) *v1alpha1.Proxy {
			p := proxyObject(r.ns, name, port, target)
			p.Spec.ProviderConfigReference.Name = "kill-" + r.ns
			return p
		}
		r.run(kills)
		r.settle(nil)
		r.checkLocal(dir)
		r.deleteAll()
		r.checkLocal(dir)
		r.report()
	})
	t.Run("GCP", func(t *testing.T) {
		r, dir := newKillRun(t, bin)
		r.ports = 34000
		fake := gcpfake.Start(t)
		// Inserts and deletes take a while, as on GCP, so that kills land
		// while they run.
		fake.SetOperationDuration(300 * time.Millisecond)
		r.env = append(r.env, "STATE_DIR="+dir, "EGRESS_PROVIDER_TEST_GCP_ENDPOINT="+fake.URL)
		pc := gcpConfig("kill-"+r.ns, nil)
		pc.Spec.Policy = &v1alpha1.Policy{GCP: &v1alpha1.GCPPolicy{AllowedNetworkTags: []v1alpha1.NetworkTag{"crawl"}}}
		create(t, pc)
		target := testbed.Target{URL: r.target()}
		r.progress = func() int { return fake.Calls("instances.insert") + fake.Calls("firewalls.insert") }
		r.window = 600 * time.Millisecond
		r.proxy = func(name string, port int32) *v1alpha1.Proxy {
			p := vmProxy(r.ns, name, port, target, "kill-"+r.ns, "europe-west1-b")
			// Of a fleet, so that its VM shares the fleet's rule (one
			// per port: each proxy here has its own).
			p.SetLabels(map[string]string{fleetv1alpha1.LabelFleet: "kill"})
			p.Spec.ForProvider.GCP.GCPInstance = v1alpha1.GCPInstance{MachineType: "e2-micro", NetworkTags: []v1alpha1.NetworkTag{"crawl"}}
			p.Spec.ForProvider.AllowedSourceRanges = []v1alpha1.CIDR{"127.0.0.0/8"}
			return p
		}
		r.run(kills)
		started := map[string]bool{}
		r.settle(func(p *v1alpha1.Proxy) {
			// Each VM boots once it exists, and stays RUNNING.
			name := ownership.InstanceName(p.UID)
			vm := fake.Instance("europe-west1-b", name)
			if vm == nil || len(vm.GetMetadata().GetItems()) == 0 {
				return
			}
			if !started[name] {
				runVMSquid(t, fake, "europe-west1-b", name, fmt.Sprintf("127.0.0.1:%d", p.Spec.ForProvider.Port))
				started[name] = true
			}
			if vm.GetStatus() != "RUNNING" {
				fake.SetStatus("europe-west1-b", name, "RUNNING", "127.0.0.1")
			}
		})
		r.checkGCP(fake)
		r.deleteAll()
		r.checkGCP(fake)
		r.report()
	})
	t.Run("AWS", func(t *testing.T) {
		r, dir := newKillRun(t, bin)
		r.ports = 34500
		fake := ec2fake.Start(t)
		// The test boots each instance (its Squid on loopback); EC2's
		// answers to changes come a while after the change, so that
		// kills land between an instance's launch and the provider
		// learning of it.
		fake.PendingFor, fake.AnswerAfter = time.Hour, 300*time.Millisecond
		// EC2's listing lags its launches.
		fake.HideNewFor = 500 * time.Millisecond
		// The orphan collector takes the groups an instance still shutting
		// down held when its Proxy was deleted (and must take no
		// instance: checked from the log below).
		r.env = append(r.env, "STATE_DIR="+dir, "EGRESS_PROVIDER_TEST_AWS_ENDPOINT="+fake.URL, "GC_INTERVAL=2s", "GC_GRACE_PERIOD=1s")
		pc := "kill-" + r.ns
		create(t, awsConfig(r.ns, pc)...)
		target := testbed.Target{URL: r.target()}
		r.progress = func() int { return fake.Calls("RunInstances") }
		r.unlearned = func() int {
			l := &v1alpha1.ProxyList{}
			if err := sharedBed.Env(t).Client.List(context.Background(), l, client.InNamespace(r.ns)); err != nil {
				t.Fatal(err)
			}
			recorded := map[string]bool{}
			for _, p := range l.Items {
				if id := p.Status.AtProvider.ProviderID; id != "" {
					recorded[id[strings.LastIndexByte(id, '/')+1:]] = true
				}
			}
			n := 0
			for _, vm := range fake.Instances() {
				if vm.State == "pending" && !recorded[vm.ID] {
					n++
				}
			}
			return n
		}
		r.window = 600 * time.Millisecond
		r.proxy = func(name string, port int32) *v1alpha1.Proxy {
			p := awsProxy(r.ns, name, port, target, pc)
			// Of a fleet: its instances share the fleet's security group
			// (one per port: each proxy here has its own).
			p.SetLabels(map[string]string{fleetv1alpha1.LabelFleet: "kill"})
			return p
		}
		r.run(kills)
		started := map[string]bool{}
		// booted is the instance whose Squid serves each Proxy's port:
		// every instance on EC2 has an address of its own, here they
		// share loopback, so a second instance of a Proxy (the older is
		// the provider's to end; the checks below find one that stays)
		// takes the port over.
		booted := map[string]struct {
			id  string
			cmd *exec.Cmd
		}{}
		r.settle(func(p *v1alpha1.Proxy) {
			// Each instance boots once it exists, and stays running.
			for _, vm := range fake.Instances() {
				if vm.Tags[awsbackend.TagInstance] != ownership.InstanceName(p.UID) || vm.State != "pending" {
					continue
				}
				if !started[vm.ID] {
					script, err := base64.StdEncoding.DecodeString(vm.UserData)
					if err != nil {
						t.Fatal(err)
					}
					if prev, ok := booted[p.Name]; ok {
						t.Logf("Proxy %s has a second instance %s besides %s: its Squid takes the port over", p.Name, vm.ID, prev.id)
						_ = prev.cmd.Process.Kill()
						// Gone (reaped by its starter) before the port is
						// taken again.
						for deadline := time.Now().Add(10 * time.Second); syscall.Kill(prev.cmd.Process.Pid, 0) == nil && time.Now().Before(deadline); {
							time.Sleep(10 * time.Millisecond)
						}
					}
					cmd := testbed.StartScriptSquid(t, string(script), fmt.Sprintf("127.0.0.1:%d", p.Spec.ForProvider.Port), nil)
					booted[p.Name] = struct {
						id  string
						cmd *exec.Cmd
					}{vm.ID, cmd}
					started[vm.ID] = true
				}
				fake.SetPublicIP(vm.ID, "127.0.0.1")
				fake.SetState(vm.ID, "running")
			}
		})
		r.checkAWS(fake)
		r.deleteAll()
		r.checkAWS(fake)
		r.report()
		if r.midLaunch == 0 {
			t.Error("no kill landed between an instance's launch and its Proxy recording it")
		}
		// The provider's own deletes took every instance: the orphan
		// collector, there for the groups, took none.
		all, err := os.ReadFile(r.logs)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(all), "\n") {
			if strings.Contains(line, "Deleted orphan") && strings.Contains(line, "/i-") {
				t.Errorf("an instance was left to the orphan collector: %s", line)
			}
		}
	})
}

func newKillRun(t *testing.T, bin string) (*killRun, string) {
	bed := sharedBed.Env(t)
	ns := namespace(t)
	dir := testbed.SquidStateDir(t)
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := bed.WriteKubeconfig(kc); err != nil {
		t.Fatal(err)
	}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	r := &killRun{
		t: t, bin: bin, ns: ns, logs: filepath.Join(t.TempDir(), "provider.log"), ports: 33000,
		rng:  rand.New(rand.NewPCG(uint64(seed), 17)), //nolint:gosec // Kill points, not secrets.
		live: map[string]types.UID{}, gone: map[string]types.UID{},
		env: []string{
			"KUBECONFIG=" + kc, "CLUSTER_ID=kill-" + ns, "POLL_INTERVAL=2s", "LOCAL_RESTART_DELAY=1s",
			// The clouds whose fake a subtest starts replace these (the
			// last of a key wins): others' ProviderConfigs never reach
			// a cloud.
			"EGRESS_PROVIDER_TEST_AWS_ENDPOINT=" + noCloud, "EGRESS_PROVIDER_TEST_GCP_ENDPOINT=" + noCloud,
			"METRICS_BIND_ADDRESS=0", "HEALTH_PROBE_BIND_ADDRESS=0", "PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		},
	}
	create(t, authSecret(ns))
	t.Cleanup(func() {
		r.stop()
		if t.Failed() {
			t.Logf("provider log:\n%s", r.logTail())
		}
	})
	return r, dir
}

// target starts the probe target and hands the provider its CA.
func (r *killRun) target() string {
	target := testbed.StartEchoTarget(r.t)
	ca := filepath.Join(r.t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, target.CAPEM, 0o644); err != nil {
		r.t.Fatal(err)
	}
	r.env = append(r.env, "PROBE_CA_BUNDLE="+ca)
	return target.URL
}

// start runs the provider process, appending to the log.
func (r *killRun) start() {
	r.t.Helper()
	f, err := os.OpenFile(r.logs, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		r.t.Fatal(err)
	}
	defer f.Close() //nolint:errcheck // The child holds its own descriptor.
	cmd := exec.Command(r.bin)
	cmd.Env, cmd.Stdout, cmd.Stderr = r.env, f, f
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	r.proc, r.exited = cmd, exited
}

// kill SIGKILLs the provider and waits until it is gone.
func (r *killRun) kill() {
	_ = r.proc.Process.Signal(syscall.SIGKILL)
	<-r.exited
	r.proc = nil
}

// stop ends the provider the way Kubernetes ends a pod, at the end.
func (r *killRun) stop() {
	if r.proc == nil {
		return
	}
	_ = r.proc.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.exited:
	case <-time.After(30 * time.Second):
		r.kill()
	}
	r.proc = nil
}

// run kills the provider n times. Before each start two Proxies are
// created and, once there are more than four, as many deleted, so that the provider starts with work to do;
// it is killed at a random point in its first 2.5 s, which covers its start,
// creates and deletes under way, and idle time, or, every other time, at a
// random point soon after the backend began a create. Which of these a
// kill landed in is judged from the Proxies' annotations and conditions.
//
// Where the kills happen to miss what the scenario is named for (a create
// under way; for a backend that counts them, a launch its Proxy did not
// record yet), up to n more aimed kills follow, so that a run's verdict
// rests on its subject rather than on the draw.
func (r *killRun) run(n int) {
	for i := range n {
		r.once(i%2 == 1)
	}
	for extra := 0; extra < n && (r.midCreate == 0 || r.unlearned != nil && r.midLaunch == 0); extra++ {
		r.once(true)
	}
}

// once is one round of run: Proxies created and deleted, the provider
// started and killed, at a random point or aimed soon after a create
// began.
func (r *killRun) once(aimed bool) {
	ctx := context.Background()
	bed := sharedBed.Env(r.t)
	for range 2 {
		r.next++
		name := fmt.Sprintf("k%d", r.next)
		p := r.proxy(name, r.ports+r.next)
		create(r.t, p)
		r.live[name] = p.UID
	}
	// As many deleted as created, once there are a few: the fleet
	// stays small however long the run.
	for len(r.live) > 4 {
		names := r.liveNames()
		victim := names[r.rng.IntN(len(names))]
		if err := bed.Client.Delete(ctx, &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: victim}}); err != nil {
			r.t.Fatal(err)
		}
		r.gone[victim] = r.live[victim]
		delete(r.live, victim)
	}
	before := r.progress()
	r.start()
	if !aimed {
		time.Sleep(time.Duration(r.rng.IntN(2500)) * time.Millisecond)
	} else {
		// Aimed at a create: soon after the backend begins one.
		for deadline := time.Now().Add(5 * time.Second); r.progress() == before && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(time.Duration(r.rng.Int64N(int64(r.window))))
	}
	r.kill()
	r.kills++
	l := &v1alpha1.ProxyList{}
	if err := bed.Client.List(ctx, l, client.InNamespace(r.ns)); err != nil {
		r.t.Fatal(err)
	}
	creating, deleting := false, false
	for i := range l.Items {
		p := &l.Items[i]
		creating = creating || meta.ExternalCreateIncomplete(p)
		deleting = deleting || p.DeletionTimestamp != nil && p.GetCondition(xpv2.TypeReady).Reason == xpv2.ReasonDeleting
	}
	if creating {
		r.midCreate++
	}
	if deleting {
		r.midDelete++
	}
	if r.leftovers != nil {
		r.leftover += r.leftovers()
	}
	if r.unlearned != nil && r.unlearned() > 0 {
		r.midLaunch++
	}
}

func (r *killRun) liveNames() []string {
	var out []string
	for n := range r.live {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// settle starts the provider for good and waits until every live Proxy is
// Ready and every deleted one gone; boot, asked about each live Proxy not
// yet Ready, plays its VM booting.
func (r *killRun) settle(boot func(*v1alpha1.Proxy)) {
	r.t.Helper()
	r.start()
	ctx := context.Background()
	bed := sharedBed.Env(r.t)
	testbed.Eventually(r.t, 120*time.Second, fmt.Sprintf("the Proxies to settle after %d kills", r.kills), func() (bool, string) {
		l := &v1alpha1.ProxyList{}
		if err := bed.Client.List(ctx, l, client.InNamespace(r.ns)); err != nil {
			return false, err.Error()
		}
		var waiting []string
		for i := range l.Items {
			p := &l.Items[i]
			if _, ok := r.gone[p.Name]; ok {
				waiting = append(waiting, p.Name+" not deleted")
				continue
			}
			if c := p.GetCondition(xpv2.TypeReady); c.Status != corev1.ConditionTrue {
				waiting = append(waiting, fmt.Sprintf("%s %s: %s", p.Name, c.Reason, c.Message))
				if boot != nil {
					boot(p)
				}
			}
		}
		if len(l.Items) != len(r.live)+countStill(l, r.gone) {
			return false, fmt.Sprintf("%d Proxies, want %d", len(l.Items), len(r.live))
		}
		return len(waiting) == 0, strings.Join(waiting, "; ")
	})
}

func countStill(l *v1alpha1.ProxyList, gone map[string]types.UID) int {
	n := 0
	for _, p := range l.Items {
		if _, ok := gone[p.Name]; ok {
			n++
		}
	}
	return n
}

// deleteAll deletes every Proxy with the provider running, and waits until
// they are gone.
func (r *killRun) deleteAll() {
	r.t.Helper()
	for n, uid := range r.live {
		r.gone[n] = uid
	}
	r.live = map[string]types.UID{}
	deleteProxies(r.t, r.ns)
}

// checkSecrets: a live Proxy's connection Secret exists, and every
// Secret of a Proxy's, live or deleted, is controlled by it: Kubernetes'
// garbage collector deletes it with the Proxy. The test bed runs no
// garbage collector, so a deleted Proxy's Secret is there still; the
// owner reference is what is checked.
func (r *killRun) checkSecrets() {
	r.t.Helper()
	ctx := context.Background()
	bed := sharedBed.Env(r.t)
	for _, set := range []map[string]types.UID{r.live, r.gone} {
		for n, uid := range set {
			sec := &corev1.Secret{}
			err := bed.Client.Get(ctx, types.NamespacedName{Namespace: r.ns, Name: n + "-conn"}, sec)
			switch {
			case err != nil:
				if _, live := r.live[n]; live || !kerrors.IsNotFound(err) {
					r.t.Errorf("Proxy %s's connection Secret: %v", n, err)
				}
			case !controlledBy(sec, uid):
				r.t.Errorf("Proxy %s's connection Secret is not controlled by it, and would outlive it: %v", n, sec.OwnerReferences)
			}
		}
	}
}

func controlledBy(o metav1.Object, uid types.UID) bool {
	c := metav1.GetControllerOf(o)
	return c != nil && c.UID == uid && c.Kind == "Proxy"
}

// checkLocal: one state folder, port claim and Squid per live Proxy, and
// nothing else, not even a half-written folder.
func (r *killRun) checkLocal(dir string) {
	r.t.Helper()
	want := map[string]string{}
	for n, uid := range r.live {
		want[ownership.InstanceName(uid)] = n
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		r.t.Fatal(err)
	}
	folders := map[string]bool{}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		folders[e.Name()] = true
		if _, ok := want[e.Name()]; !ok {
			r.t.Errorf("state folder %s belongs to no live Proxy", e.Name())
		}
	}
	for inst, n := range want {
		if !folders[inst] {
			r.t.Errorf("Proxy %s has no state folder %s", n, inst)
		}
	}
	if staged, _ := os.ReadDir(filepath.Join(dir, ".staging")); len(staged) > 0 {
		r.t.Errorf("half-written instance folders left in .staging: %v", names(staged))
	}
	ports, _ := os.ReadDir(filepath.Join(dir, ".ports"))
	claimed := map[string]int{}
	for _, p := range ports {
		b, _ := os.ReadFile(filepath.Join(dir, ".ports", p.Name()))
		claimed[string(b)]++
		if _, ok := want[string(b)]; !ok {
			r.t.Errorf("port %s is claimed by %q, no live Proxy's instance", p.Name(), b)
		}
	}
	for inst, n := range want {
		if claimed[inst] != 1 {
			r.t.Errorf("Proxy %s's instance claims %d ports, want 1", n, claimed[inst])
		}
	}
	running := map[string]int{}
	for _, pid := range local.Processes(dir) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		for _, arg := range bytes.Split(b, []byte{0}) {
			if rel, err := filepath.Rel(dir, string(arg)); err == nil && strings.HasSuffix(rel, "/squid.conf") {
				running[filepath.Dir(rel)]++
			}
		}
	}
	for inst, n := range running {
		if _, ok := want[inst]; !ok {
			r.t.Errorf("%d Squid processes run for %s, no live Proxy's instance", n, inst)
		}
	}
	for inst, n := range want {
		if running[inst] != 1 {
			r.t.Errorf("Proxy %s has %d Squid processes, want 1", n, running[inst])
		}
	}
	r.checkSecrets()
}

// checkGCP: one VM per live Proxy, the firewall rule each VM names (its
// fleet's, or one named after it), and nothing else.
func (r *killRun) checkGCP(fake *gcpfake.Server) {
	r.t.Helper()
	want := map[string]string{}
	for n, uid := range r.live {
		want[ownership.InstanceName(uid)] = n
	}
	byOwner := map[types.UID][]string{}
	wantRules := map[string]string{}
	for key, vm := range fake.AllInstances() {
		o, ok := ownership.FromLabels(vm.GetLabels())
		if !ok {
			r.t.Errorf("VM %s carries no owner", key)
			continue
		}
		byOwner[o.UID] = append(byOwner[o.UID], vm.GetName())
		n, ok := want[vm.GetName()]
		if !ok {
			r.t.Errorf("VM %s (status %s) belongs to no live Proxy", key, vm.GetStatus())
			continue
		}
		rule := vm.GetLabels()["egress-rule"]
		if rule == "" {
			rule = vm.GetName()
		}
		wantRules[rule] = n
	}
	for n, uid := range r.live {
		if vms := byOwner[uid]; len(vms) != 1 {
			r.t.Errorf("Proxy %s has %d VMs, want 1: %v", n, len(vms), vms)
		}
	}
	rules := map[string]bool{}
	for _, fw := range fake.FirewallNames() {
		name := fw[strings.LastIndexByte(fw, '/')+1:]
		rules[name] = true
		if _, ok := wantRules[name]; !ok {
			r.t.Errorf("firewall rule %s belongs to no live Proxy's VM", fw)
		}
	}
	for rule, n := range wantRules {
		if !rules[rule] {
			r.t.Errorf("Proxy %s has no firewall rule (its VM names %s)", n, rule)
		}
	}
	r.checkSecrets()
}

// checkAWS: one instance that is not ending per live Proxy, none for a
// deleted one, and no security group that no such instance uses, once the
// orphan collector had its turn (an instance still shutting down holds
// its group from the Proxy's delete).
func (r *killRun) checkAWS(fake *ec2fake.Server) {
	r.t.Helper()
	testbed.Eventually(r.t, 30*time.Second, "one instance per live Proxy and no other group or instance", func() (bool, string) {
		bad := awsLeaks(r.live, fake.Instances(), fake.Groups())
		return len(bad) == 0, strings.Join(bad, "; ")
	})
	r.checkSecrets()
}

// awsLeaks is what checkAWS finds wrong in what the fake holds.
func awsLeaks(live map[string]types.UID, instances []ec2fake.Instance, groups []ec2fake.Group) []string {
	want := map[string]string{}
	for n, uid := range live {
		want[ownership.InstanceName(uid)] = n
	}
	var bad []string
	byName := map[string][]string{}
	used := map[string]bool{}
	for _, vm := range instances {
		if vm.State == "shutting-down" || vm.State == "terminated" {
			continue
		}
		name := vm.Tags[awsbackend.TagInstance]
		if o, ok := ownership.FromLabels(vm.Tags); !ok || ownership.InstanceName(o.UID) != name {
			bad = append(bad, fmt.Sprintf("instance %s (%s) carries no owner matching its name %q", vm.ID, vm.State, name))
		}
		if _, ok := want[name]; !ok {
			bad = append(bad, fmt.Sprintf("instance %s (%s, %s) belongs to no live Proxy", vm.ID, name, vm.State))
		}
		byName[name] = append(byName[name], vm.ID)
		for _, g := range vm.Groups {
			used[g] = true
		}
	}
	for name, n := range want {
		if ids := byName[name]; len(ids) != 1 {
			bad = append(bad, fmt.Sprintf("Proxy %s has %d instances, want 1: %v", n, len(ids), ids))
		}
	}
	have := map[string]bool{}
	for _, g := range groups {
		have[g.ID] = true
		if !used[g.ID] {
			bad = append(bad, fmt.Sprintf("security group %s (%s) is used by no live instance", g.ID, g.Name))
		}
	}
	for g := range used {
		if !have[g] {
			bad = append(bad, "an instance's security group "+g+" is gone")
		}
	}
	sort.Strings(bad)
	return bad
}

// TestAWSLeaksCatches proves the AWS kill checker: each kind of leak, and a
// clean state, judged as it must be.
func TestAWSLeaksCatches(t *testing.T) {
	owner := func(uid types.UID) map[string]string {
		tags := ownership.Owner{ClusterID: "c", Namespace: "ns", Name: "p", UID: uid}.Labels()
		tags[awsbackend.TagInstance] = ownership.InstanceName(uid)
		return tags
	}
	live := map[string]types.UID{"k1": "u1"}
	vm := func(id string, uid types.UID, state string, groups ...string) ec2fake.Instance {
		return ec2fake.Instance{ID: id, State: state, Tags: owner(uid), Groups: groups}
	}
	sg := []ec2fake.Group{{ID: "sg-1", Name: "fleet"}}
	cases := map[string]struct {
		instances []ec2fake.Instance
		groups    []ec2fake.Group
		want      string
	}{
		"Clean":               {instances: []ec2fake.Instance{vm("i-1", "u1", "running", "sg-1"), vm("i-0", "u0", "terminated", "sg-1")}, groups: sg},
		"EndingIsNotALeak":    {instances: []ec2fake.Instance{vm("i-1", "u1", "running", "sg-1"), vm("i-0", "u0", "shutting-down", "sg-1")}, groups: sg},
		"DeletedProxys":       {instances: []ec2fake.Instance{vm("i-1", "u1", "running", "sg-1"), vm("i-0", "u0", "stopped", "sg-1")}, groups: sg, want: "belongs to no live Proxy"},
		"TwoForOne":           {instances: []ec2fake.Instance{vm("i-1", "u1", "running", "sg-1"), vm("i-2", "u1", "pending", "sg-1")}, groups: sg, want: "has 2 instances"},
		"NoneForALiveProxy":   {groups: sg, want: "has 0 instances"},
		"UnusedGroup":         {instances: []ec2fake.Instance{vm("i-1", "u1", "running", "sg-1")}, groups: append(sg, ec2fake.Group{ID: "sg-2", Name: "old"}), want: "sg-2 (old) is used by no live instance"},
		"GroupOnlyAnEndedOne": {instances: []ec2fake.Instance{vm("i-1", "u1", "running"), vm("i-0", "u0", "terminated", "sg-1")}, groups: sg, want: "sg-1 (fleet) is used by no live instance"},
		"NoOwner":             {instances: []ec2fake.Instance{{ID: "i-1", State: "running", Tags: map[string]string{awsbackend.TagInstance: ownership.InstanceName("u1")}, Groups: []string{"sg-1"}}}, groups: sg, want: "carries no owner"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := strings.Join(awsLeaks(live, tc.instances, tc.groups), "; ")
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func (r *killRun) report() {
	if r.midCreate == 0 {
		r.t.Errorf("no kill landed while a create was under way: the scenario tested nothing it is named for")
	}
	r.t.Logf("%d kills: %d found a create under way (Proxies with create-pending), %d a delete, %d an instance launched that its Proxy did not record yet; %d half-written instances left by them and swept; %d Proxies created, %d deleted",
		r.kills, r.midCreate, r.midDelete, r.midLaunch, r.leftover, r.next, len(r.gone))
}

func (r *killRun) logTail() string {
	b, _ := os.ReadFile(r.logs)
	return tail(string(b), 60)
}

func names(es []os.DirEntry) []string {
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}
