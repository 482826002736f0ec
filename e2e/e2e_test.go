//go:build e2e

// Package e2e checks the whole product on real Crossplane: the environment
// `make run` starts (internal/devenv), brought up in a fresh state folder
// at the previous release and upgraded in place to this checkout by its
// second step, then driven the way a platform team and a crawler would.
// Run it with `make e2e`; it is not part of `make test`.
package e2e

import (
	"context"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	discoveryv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/local"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/devenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

var stack *devenv.Stack

// restartDelay keeps a killed Squid down long enough for the probe and
// the fleet's status to notice before the supervisor restarts it.
const restartDelay = 6 * time.Second

// discoveryClient talks to the stack's egress-discovery, over TLS, trusting
// the CA the stack made for it.
func discoveryClient(t *testing.T) *discoveryv1.Client {
	t.Helper()
	h, err := discoveryv1.NewHTTPClient(stack.DiscoveryCA)
	if err != nil {
		t.Fatal(err)
	}
	return &discoveryv1.Client{BaseURL: stack.DiscoveryURL, Token: stack.Token, HTTP: h}
}

func TestMain(m *testing.M) {
	root, err := filepath.Abs("..")
	if err != nil {
		panic(err)
	}
	state, err := os.MkdirTemp("", "egress-e2e-")
	if err == nil {
		err = os.Chmod(state, 0o755) // Squid drops root and must reach it.
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	// The product starts at the previous release, and the second step
	// upgrades it to this checkout.
	began := time.Now()
	release, err := devenv.BuildRelease(context.Background(), root, testbed.PreviousRelease, filepath.Join(state, "release"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: cannot build the previous release: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "e2e: built release %s in %.1fs\n", testbed.PreviousRelease[:7], time.Since(began).Seconds())
	stack, err = devenv.Up(context.Background(), devenv.Options{
		Root: root, StateDir: state, Progress: os.Stderr, ApplyExamples: true,
		Packages: release.Packages, Function: release.Function,
		ProviderArgs:  []string{"--local-restart-delay=" + restartDelay.String(), startEC2()},
		DiscoveryArgs: []string{"--sweep-interval=2s", "--gateway-idle=2s"},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: bring-up failed: %v\nlogs kept in %s\n", err, filepath.Join(state, "logs"))
		os.Exit(1)
	}
	testbed.RestartLogs = filepath.Join(state, "logs")
	code := m.Run()
	stack.Down()
	ec2.Close()
	// The apiserver and etcd ControlPlaneRestarts started again.
	testbed.StopRestarted()
	if left := leftBehind(stack); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "e2e: FAIL: stopping the environment left behind: %s\n", strings.Join(left, ", "))
		code = 1
	}
	if code == 0 && os.Getenv("E2E_KEEP_STATE") == "" {
		_ = os.RemoveAll(state)
	} else {
		fmt.Fprintf(os.Stderr, "e2e: logs kept in %s\n", filepath.Join(state, "logs"))
	}
	os.Exit(code)
}

// leftBehind lists the Squid processes and listeners still there after
// Down: what Ctrl-C on make run must not leave.
func leftBehind(s *devenv.Stack) []string {
	var left []string
	for _, pid := range local.Processes(s.SquidDir) {
		left = append(left, fmt.Sprintf("Squid pid %d", pid))
	}
	for _, addr := range s.Listeners() {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = c.Close()
			left = append(left, "a listener on "+addr)
		}
	}
	return left
}

// TestEndToEnd runs the steps in order: each builds on the state the one
// before it left.
func TestEndToEnd(t *testing.T) {
	steps := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"ExampleFleetBecomesReady", exampleFleetBecomesReady},
		{"ConfigurationUpgradeKeepsFleet", configurationUpgradeKeepsFleet},
		{"LeaseAndFetchThroughProxy", leaseAndFetchThroughProxy},
		{"GatewaySessionWithCurl", gatewaySessionWithCurl},
		{"GatewayRotatesWithCurl", gatewayRotatesWithCurl},
		{"GatewayRotatesThroughSOCKS5", gatewayRotatesThroughSOCKS5},
		{"SecondFleetBecomesReady", secondFleetBecomesReady},
		{"KilledSquidHeals", killedSquidHeals},
		{"CrashLoopAndBlackHole", crashLoopAndBlackHole},
		{"ControlPlaneRestarts", controlPlaneRestarts},
		{"ScaleKeepsNames", scaleKeepsNames},
		{"KubectlScale", kubectlScale},
		{"AutoscalesWithLeaseDemand", autoscalesWithLeaseDemand},
		{"RotationKeepsReadyFloor", rotationKeepsReadyFloor},
		{"TemplateChangeRollsOut", templateChangeRollsOut},
		{"BurnedAddressRecycled", burnedAddressRecycled},
		{"PasswordRotatesInPlace", passwordRotatesInPlace},
		{"PooledFleetScalesRollsAndGoes", pooledFleetScalesRollsAndGoes},
		{"AWSFleetOnEC2", awsFleetOnEC2},
		{"DeletingFleetsLeavesNothing", deletingFleetsLeavesNothing},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.fn) {
			t.Fatalf("step %s failed; the later steps depend on it", s.name)
		}
	}
}

const (
	ns      = devenv.ExampleNamespace
	example = "crawlers"
	rotor   = "rotor"
)

func exampleFleetBecomesReady(t *testing.T) {
	waitFleet(t, example, 3, time.Minute)
	// The previous release composed it; SecondFleetBecomesReady holds
	// this release to the goal.
	t.Logf("apply to Ready with 3 healthy proxies, by the previous release: %.1fs", time.Since(stack.ExamplesApplied).Seconds())
	// Each local proxy leaves from a loopback address of its own, which
	// the probe's echo target saw: 3 distinct egress IPs, none flagged.
	testbed.Eventually(t, 30*time.Second, "3 distinct egress IPs, none flagged duplicate", func() (bool, string) {
		ps, err := proxies(example)
		if err != nil {
			return false, err.Error()
		}
		ips := map[string]bool{}
		var seen []string
		flagged := 0
		for _, p := range ps {
			if ip := p.Status.AtProvider.EgressIP; ip != "" {
				ips[ip] = true
			}
			seen = append(seen, p.Name+"="+p.Status.AtProvider.EgressIP)
			if p.Labels[fleetv1alpha1.LabelDuplicateEgressIP] != "" {
				flagged++
			}
		}
		st, err := fleetState(example)
		if err != nil {
			return false, err.Error()
		}
		return len(ps) == 3 && len(ips) == 3 && flagged == 0 && st.duplicates == "False",
			fmt.Sprintf("%v, %d flagged, DuplicateEgressIP %q", seen, flagged, st.duplicates)
	})
}

// waitFleet waits until a fleet is Ready with n healthy proxies and n
// Proxy objects, all Ready, and returns their names.
func waitFleet(t *testing.T, name string, n int, timeout time.Duration) []string {
	t.Helper()
	var names []string
	testbed.Eventually(t, timeout, fmt.Sprintf("fleet %s Ready with %d healthy proxies", name, n), func() (bool, string) {
		st, ps, err := observe(name)
		if err != nil {
			return false, err.Error()
		}
		var ready int
		names, ready = namesAndReady(ps)
		ok := st.ready && st.healthy == n && len(ps) == n && ready == n
		return ok, fmt.Sprintf("%+v, %d Proxies of which %d Ready", st, len(ps), ready)
	})
	sort.Strings(names)
	return names
}

// leaseAndFetchThroughProxy fetches from an HTTPS target of its own, which
// no health check probes, so the CONNECT in a Squid's access log can only be
// the crawler's.
func leaseAndFetchThroughProxy(t *testing.T) {
	target := httptest.NewTLSServer(http.HandlerFunc(probe.EchoIP))
	defer target.Close()
	ca := filepath.Join(t.TempDir(), "target.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: target.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	connect := "CONNECT " + strings.TrimPrefix(target.URL, "https://")
	// A request without the proxy's credentials must get 407: the leased
	// proxy is not open. It goes to a second target, so that the first
	// one's CONNECT stays the only one logged.
	other := httptest.NewTLSServer(http.HandlerFunc(probe.EchoIP))
	defer other.Close()
	script := fmt.Sprintf(`curl -sS --fail --max-time 10 --cacert %q %q && echo "$EGRESS_PROXY" && `+
		`curl -s -o /dev/null -w '%%{http_connect}\n' --max-time 10 -k --proxy "$(echo "$HTTPS_PROXY" | sed 's|//[^@]*@|//|')" %q 2>/dev/null; true`,
		ca, target.URL+"/ip", other.URL+"/ip")
	cmd := exec.Command(filepath.Join(stackRoot(), "bin", "egressctl"), "lease", "--fleet", ns+"/"+example, "--holder", "e2e", "--", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "EGRESS_DISCOVERY_URL="+stack.DiscoveryURL, "EGRESS_DISCOVERY_TOKEN="+stack.Token, "EGRESS_DISCOVERY_CA_FILE="+stack.DiscoveryCA)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("egressctl lease -- curl: %v\n%s", err, out)
	}
	lines := strings.Fields(string(out))
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "127.1.") {
		t.Fatalf("want the target's answer (the proxy's own egress IP in 127.1.0.0/16), the leased proxy's name and the answer without credentials, got:\n%s", out)
	}
	leased := &v1alpha1.Proxy{}
	if err := stack.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: lines[1]}, leased); err != nil {
		t.Fatal(err)
	}
	if ip := leased.Status.AtProvider.EgressIP; ip != lines[0] {
		t.Errorf("the target saw %s; the leased proxy %s reports egress IP %q", lines[0], lines[1], ip)
	}
	if lines[len(lines)-1] != "407" {
		t.Fatalf("the leased proxy must answer a CONNECT without credentials with 407, got:\n%s", out)
	}
	proxy := lines[1]
	// Squid logs a tunnel when it closes.
	testbed.Eventually(t, 10*time.Second, "the leased proxy "+proxy+" logging the crawler's "+connect, func() (bool, string) {
		logged := connectsLogged(t, connect)
		return logged[proxy] == 1 && len(logged) == 1, fmt.Sprintf("proxies that logged it: %v", logged)
	})
	testbed.Eventually(t, 10*time.Second, "the lease released when the command ended", func() (bool, string) {
		held := heldLeases(t, example)
		return len(held) == 0, fmt.Sprintf("held: %v", held)
	})
}

// heldLeases lists the holders of a fleet's Lease objects.
func heldLeases(t *testing.T, fleet string) []string {
	t.Helper()
	ls, err := stack.Leases(context.Background(), ns, fleet)
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for _, l := range ls {
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
			held = append(held, l.Name+"="+*l.Spec.HolderIdentity)
		}
	}
	return held
}

func secondFleetBecomesReady(t *testing.T) {
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(rotorFleet), &u.Object); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	if err := stack.Client.Create(context.Background(), u); err != nil {
		t.Fatalf("cannot create fleet %s: %v", rotor, err)
	}
	waitFleet(t, rotor, 3, time.Minute)
	took := time.Since(created)
	t.Logf("apply to Ready with 3 healthy proxies, on the upgraded product: %.1fs (goal <= 20s)", took.Seconds())
	if took > 20*time.Second {
		t.Errorf("fleet %s took %s from apply to Ready with 3 healthy proxies; the goal is 20s", rotor, took.Round(100*time.Millisecond))
	}
}

func killedSquidHeals(t *testing.T) {
	ps, err := proxies(rotor)
	if err != nil || len(ps) == 0 {
		t.Fatalf("no proxies of %s: %v", rotor, err)
	}
	victim := ps[0]
	pid, err := strconv.Atoi(squidPids(t, rotor)[victim.Name])
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("cannot kill Squid %d of %s: %v", pid, victim.Name, err)
	}
	killed := time.Now()

	var said string
	testbed.Eventually(t, 30*time.Second, "the fleet's status reporting the dead proxy", func() (bool, string) {
		st, err := fleetState(rotor)
		if err != nil {
			return false, err.Error()
		}
		said = st.message
		return st.healthy < 3 && strings.Contains(st.message, victim.Name), fmt.Sprintf("%+v", st)
	})
	t.Logf("%.1fs after the kill the fleet said: %s", time.Since(killed).Seconds(), said)

	names := waitFleet(t, rotor, 3, 90*time.Second)
	t.Logf("healed %.1fs after the kill; proxies now %v", time.Since(killed).Seconds(), names)
	if !contains(names, victim.Name) {
		t.Logf("%s was replaced rather than restarted", victim.Name)
	}
	if pids := local.Processes(stack.SquidDir); len(pids) != 6 {
		t.Errorf("want 6 Squid processes (3 per fleet) after healing, got %d: %v", len(pids), pids)
	}
}

func scaleKeepsNames(t *testing.T) {
	before := waitFleet(t, rotor, 3, 30*time.Second)
	up := time.Now()
	setReplicas(t, rotor, 5)
	five := waitFleet(t, rotor, 5, 90*time.Second)
	t.Logf("3 -> 5 Ready in %.1fs", time.Since(up).Seconds())
	for _, n := range before {
		if !contains(five, n) {
			t.Errorf("scaling 3 -> 5 renamed or replaced %s: before %v, after %v", n, before, five)
		}
	}
	down := time.Now()
	setReplicas(t, rotor, 2)
	two := waitFleet(t, rotor, 2, 90*time.Second)
	t.Logf("5 -> 2 in %.1fs", time.Since(down).Seconds())
	for _, n := range two {
		if !contains(five, n) {
			t.Errorf("scaling 5 -> 2 kept a proxy that was not there before: %s (5: %v, 2: %v)", n, five, two)
		}
	}
	t.Logf("3 %v -> 5 %v -> 2 %v", before, five, two)
	assertNotThrottled(t, rotor)
}

func setReplicas(t *testing.T, fleet string, n int) {
	t.Helper()
	patch(t, fleet, fmt.Sprintf(`{"spec":{"replicas":%d}}`, n))
}

func patch(t *testing.T, fleet, body string) {
	t.Helper()
	u := fleetObject(fleet)
	if err := stack.Client.Patch(context.Background(), u, client.RawPatch(types.MergePatchType, []byte(body))); err != nil {
		t.Fatalf("cannot patch fleet %s with %s: %v", fleet, body, err)
	}
}

func deletingFleetsLeavesNothing(t *testing.T) {
	ctx := context.Background()
	// A crawler still holds a lease when the fleet goes.
	c := discoveryClient(t)
	l, err := c.Acquire(ctx, discoveryv1.AcquireRequest{Fleet: ns + "/" + example, Holder: "e2e-left-behind"})
	if err != nil {
		t.Fatalf("cannot lease a proxy of %s: %v", example, err)
	}
	if held := heldLeases(t, example); len(held) != 1 {
		t.Fatalf("want the one lease held in a Lease object, got %v", held)
	}
	t.Logf("holding %s on %s while deleting the fleets", l.LeaseID, l.Proxy)
	// Each fleet composed egress-discovery's grant in its namespace; it
	// must go with the fleet.
	for _, f := range []string{example, rotor} {
		if grants := accessGrants(t, f); len(grants) != 2 {
			t.Fatalf("fleet %s: want its Role and RoleBinding for egress-discovery before the delete, got %v", f, grants)
		}
	}

	for _, f := range []string{example, rotor} {
		if err := stack.Client.Delete(ctx, fleetObject(f)); err != nil {
			t.Fatalf("cannot delete fleet %s: %v", f, err)
		}
	}
	deleted := time.Now()
	testbed.Eventually(t, 2*time.Minute, "no fleet, Proxy, Squid, instance folder or Lease left", func() (bool, string) {
		var left []string
		for _, f := range []string{example, rotor} {
			if err := stack.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: f}, fleetObject(f)); !kerrors.IsNotFound(err) {
				left = append(left, "fleet "+f)
			}
			ls, err := stack.Leases(ctx, ns, f)
			if err != nil {
				return false, err.Error()
			}
			for _, l := range ls {
				left = append(left, "Lease "+l.Name)
			}
			left = append(left, accessGrants(t, f)...)
		}
		pl := &v1alpha1.ProxyList{}
		if err := stack.Client.List(ctx, pl, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		for _, p := range pl.Items {
			left = append(left, "Proxy "+p.Name)
		}
		for _, pid := range local.Processes(stack.SquidDir) {
			left = append(left, fmt.Sprintf("Squid pid %d", pid))
		}
		entries, _ := os.ReadDir(stack.SquidDir)
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), ".") {
				left = append(left, "instance folder "+e.Name())
			}
		}
		return len(left) == 0, strings.Join(left, ", ")
	})
	t.Logf("everything gone %.1fs after deleting the fleets", time.Since(deleted).Seconds())
}

// accessGrants names the Roles and RoleBindings a fleet composed for
// egress-discovery.
func accessGrants(t *testing.T, fleet string) []string {
	t.Helper()
	var out []string
	sel := client.MatchingLabels{fleetv1alpha1.LabelFleet: fleet}
	roles, bindings := &rbacv1.RoleList{}, &rbacv1.RoleBindingList{}
	if err := stack.Client.List(context.Background(), roles, client.InNamespace(ns), sel); err != nil {
		t.Fatal(err)
	}
	if err := stack.Client.List(context.Background(), bindings, client.InNamespace(ns), sel); err != nil {
		t.Fatal(err)
	}
	for _, r := range roles.Items {
		out = append(out, "Role "+r.Name)
	}
	for _, b := range bindings.Items {
		out = append(out, "RoleBinding "+b.Name)
	}
	return out
}

// assertNotThrottled fails when Crossplane's circuit breaker opened for a
// fleet: then its status lags by up to a minute behind its Proxies.
func assertNotThrottled(t *testing.T, fleet string) {
	t.Helper()
	st, err := fleetState(fleet)
	if err != nil {
		t.Fatal(err)
	}
	if st.throttled != "" {
		t.Errorf("Crossplane throttles fleet %s: %s", fleet, st.throttled)
	}
}

func stackRoot() string {
	root, _ := filepath.Abs("..")
	return root
}
