//go:build e2e

// Package e2e checks the whole product on real Crossplane: the environment
// `make run` starts (internal/devenv), brought up in a fresh state folder,
// then driven the way a platform team and a crawler would. Run it with
// `make e2e`; it is not part of `make test`.
package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
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
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
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
	stack, err = devenv.Up(context.Background(), devenv.Options{
		Root: root, StateDir: state, Progress: os.Stderr, ApplyExamples: true,
		ProviderArgs:  []string{"--local-restart-delay=" + restartDelay.String()},
		DiscoveryArgs: []string{"--sweep-interval=2s", "--gateway-idle=2s"},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: bring-up failed: %v\nlogs kept in %s\n", err, filepath.Join(state, "logs"))
		os.Exit(1)
	}
	testbed.RestartLogs = filepath.Join(state, "logs")
	code := m.Run()
	stack.Down()
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
	took := time.Since(stack.ExamplesApplied)
	t.Logf("apply to Ready with 3 healthy proxies: %.1fs (goal <= 20s)", took.Seconds())
	if took > 20*time.Second {
		t.Errorf("the example fleet took %s from apply to Ready with 3 healthy proxies; the goal is 20s", took.Round(100*time.Millisecond))
	}
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

// gatewaySessionWithCurl fetches five times through egress-discovery's
// gateway with curl and nothing but the gateway URL (an HTTPS proxy, the
// fleet and a session in the username, the token as the password): every
// request reaches the target, one Squid served them all, and the session's
// lease is given back once it is idle.
func gatewaySessionWithCurl(t *testing.T) {
	target := httptest.NewTLSServer(http.HandlerFunc(probe.EchoIP))
	defer target.Close()
	ca := filepath.Join(t.TempDir(), "target.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: target.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	proxyURL := fmt.Sprintf("https://%s_%s_session_a:%s@%s", ns, example, stack.Token, stack.GatewayAddress)
	first := ""
	for i := range 5 {
		out, err := exec.Command("curl", "-sS", "--fail", "--max-time", "10", "--proxy", proxyURL, "--proxy-cacert", stack.DiscoveryCA,
			"--cacert", ca, target.URL+"/ip").CombinedOutput()
		seen := strings.TrimSpace(string(out))
		if first == "" {
			first = seen
		}
		// The session's proxy's own loopback address, every time.
		if err != nil || !strings.HasPrefix(seen, "127.1.") || seen != first {
			t.Fatalf("curl %d through the gateway: %v: %s (the first left from %s)", i, err, out, first)
		}
	}
	connect := "CONNECT " + strings.TrimPrefix(target.URL, "https://")
	testbed.Eventually(t, 10*time.Second, "one Squid logging all 5 of the session's CONNECTs", func() (bool, string) {
		logged := connectsLogged(t, connect)
		for _, n := range logged {
			if n == 5 && len(logged) == 1 {
				return true, ""
			}
		}
		return false, fmt.Sprintf("proxies that logged it: %v", logged)
	})
	testbed.Eventually(t, 15*time.Second, "the session's lease given back when idle (--gateway-idle=2s)", func() (bool, string) {
		held := heldLeases(t, example)
		return len(held) == 0, fmt.Sprintf("held: %v", held)
	})
}

// gatewayRotatesWithCurl fetches 30 times in a row through the gateway
// with curl and no session: each fetch is a connection of its own, and
// the default rotation (least recently used) sends them through every
// proxy of the example fleet, 10 each, as their Squids' access logs show.
func gatewayRotatesWithCurl(t *testing.T) {
	proxyURL := fmt.Sprintf("https://%s_%s:%s@%s", ns, example, stack.Token, stack.GatewayAddress)
	target := rotateThrough(t, "the gateway", "--proxy", proxyURL, "--proxy-cacert", stack.DiscoveryCA)
	connect := "CONNECT " + strings.TrimPrefix(target, "https://")
	testbed.Eventually(t, 10*time.Second, "each Squid logging 10 of the 30 CONNECTs", func() (bool, string) {
		logged := connectsLogged(t, connect)
		even := len(logged) == 3
		for _, n := range logged {
			even = even && n == 10
		}
		return even, fmt.Sprintf("proxies that logged it: %v", logged)
	})
}

// gatewayRotatesThroughSOCKS5 is gatewayRotatesWithCurl through the
// gateway's SOCKS5 listener (curl --proxy socks5h://, the host name
// resolved by the gateway).
func gatewayRotatesThroughSOCKS5(t *testing.T) {
	rotateThrough(t, "SOCKS5", "--proxy", fmt.Sprintf("socks5h://%s_%s:%s@%s", ns, example, stack.Token, stack.SOCKS5Address))
}

// rotateThrough fetches a target of its own 30 times with curl and the
// proxy arguments given: the fetches leave from each of the example
// fleet's proxies 10 times, and the seats go back once idle. It returns
// the target's URL, for the access logs.
func rotateThrough(t *testing.T, how string, proxy ...string) string {
	t.Helper()
	target := httptest.NewTLSServer(http.HandlerFunc(probe.EchoIP))
	t.Cleanup(target.Close)
	ca := filepath.Join(t.TempDir(), "target.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: target.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	ps, err := proxies(example)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for i := range 30 {
		args := append(append([]string{"-sS", "--fail", "--max-time", "10"}, proxy...), "--cacert", ca, target.URL+"/ip")
		out, err := exec.Command("curl", args...).CombinedOutput()
		if err != nil || !strings.HasPrefix(strings.TrimSpace(string(out)), "127.1.") {
			t.Fatalf("curl %d through %s: %v: %s", i, how, err, out)
		}
		seen[strings.TrimSpace(string(out))]++
	}
	even := len(ps) == 3 && len(seen) == 3
	for _, n := range seen {
		even = even && n == 10
	}
	if !even {
		t.Errorf("30 fetches through %s left from %v: want each of the fleet's 3 proxies 10 times (it has %d)", how, seen, len(ps))
	}
	testbed.Eventually(t, 15*time.Second, "the seats given back when idle (--gateway-idle=2s)", func() (bool, string) {
		held := heldLeases(t, example)
		return len(held) == 0, fmt.Sprintf("held: %v", held)
	})
	return target.URL
}

// connectsLogged counts, per Proxy of the example fleet, the access log
// lines of its Squid that hold connect.
func connectsLogged(t *testing.T, connect string) map[string]int {
	t.Helper()
	ps, err := proxies(example)
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, p := range ps {
		b, _ := os.ReadFile(filepath.Join(instanceDir(&p), "access.log"))
		if c := strings.Count(string(b), connect); c > 0 {
			n[p.Name] = c
		}
	}
	return n
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

// rotorFleet probes every 2s and fails after one miss, so a dead Squid
// shows within seconds; it replaces an unhealthy proxy only after 10m, so
// a healing proxy is not replaced meanwhile.
const rotorFleet = `
apiVersion: crawl.example.com/v1alpha1
kind: ProxyFleet
metadata:
  name: rotor
  namespace: crawl-team
spec:
  replicas: 3
  providerConfigRef: {kind: ClusterProviderConfig, name: local}
  zones: [local-a, local-b]
  placement: {local: {bindAddress: 127.0.0.1}}
  proxy:
    authSecretRef: {name: crawlers-proxy-auth}
    allowedSourceRanges: [127.0.0.0/8]
  healthCheck: {url: "https://127.0.0.1:18443/ip", interval: 2s, timeout: 1s, failureThreshold: 1}
  rotation: {maxSurge: 1, maxUnavailable: 0, replaceUnhealthyAfter: 10m}
`

func secondFleetBecomesReady(t *testing.T) {
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(rotorFleet), &u.Object); err != nil {
		t.Fatal(err)
	}
	if err := stack.Client.Create(context.Background(), u); err != nil {
		t.Fatalf("cannot create fleet %s: %v", rotor, err)
	}
	waitFleet(t, rotor, 3, time.Minute)
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

// rotationKeepsReadyFloor sets maxAge to its minimum, one minute, and
// watches the fleet rotate every proxy while never having fewer than
// replicas - maxUnavailable (2 - 0) Ready proxies.
func rotationKeepsReadyFloor(t *testing.T) {
	start := waitFleet(t, rotor, 2, 30*time.Second)
	const floor = 2

	sample := sampleReady(rotor, floor)
	rotated := time.Now()
	patch(t, rotor, `{"spec":{"rotation":{"maxAge":"1m","maxSurge":1,"maxUnavailable":0}}}`)
	var now []string
	testbed.Eventually(t, 5*time.Minute, "every proxy of the fleet rotated", func() (bool, string) {
		st, ps, err := observe(rotor)
		if err != nil {
			return false, err.Error()
		}
		now, _ = namesAndReady(ps)
		for _, n := range start {
			if contains(now, n) {
				return false, fmt.Sprintf("%s not rotated yet; proxies %v; %+v", n, now, st)
			}
		}
		return st.ready && st.healthy == 2 && len(ps) == 2, fmt.Sprintf("proxies %v; %+v", now, st)
	})
	r := sample()
	t.Logf("rotated %v -> %v in %.1fs after setting maxAge 1m; lowest Ready count %d over %d samples", start, now, time.Since(rotated).Seconds(), r.minReady, r.samples)
	if r.minReady < floor {
		t.Errorf("rotation dropped to %d Ready proxies, below replicas - maxUnavailable = %d: %v", r.minReady, floor, r.lowAt)
	}
	assertNotThrottled(t, rotor)
	assertNotThrottled(t, example)
}

// templateChangeRollsOut changes the rotor fleet's proxy template (its
// port) while a crawler holds a lease on one proxy: the fleet stays Ready
// and keeps replicas - maxUnavailable Ready proxies at every sample, the
// proxies of the old template are replaced, except the leased one, which
// stops taking leases (draining) and stays until the lease is released.
func templateChangeRollsOut(t *testing.T) {
	ctx := context.Background()
	// Age-based rotation off, so that only the template change replaces,
	// and two leases per proxy, so that a proxy left out of a new lease is
	// left out because it drains, not because it is full.
	patch(t, rotor, `{"spec":{"rotation":{"maxAge":null},"leases":{"maxLeasesPerProxy":2}}}`)
	// Settled: the same two proxies twice, seconds apart, so that no
	// rotation the patch came too late for is still under way.
	var start []string
	testbed.Eventually(t, 3*time.Minute, "the fleet settled after rotation", func() (bool, string) {
		a := waitFleet(t, rotor, 2, 2*time.Minute)
		time.Sleep(3 * time.Second)
		start = waitFleet(t, rotor, 2, 2*time.Minute)
		return slices.Equal(a, start), fmt.Sprintf("%v then %v", a, start)
	})
	const floor = 2
	c := discoveryClient(t)
	held, err := c.Acquire(ctx, discoveryv1.AcquireRequest{Fleet: ns + "/" + rotor, Holder: "e2e-rollout", TTL: "10m"})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	released := false
	defer func() {
		if !released {
			_ = c.Release(ctx, held.LeaseID)
		}
	}()
	// The function knows of leases from egress-discovery's LeaseSummaries:
	// the template changes once they list this one, as they do within a
	// second, so that the rollout replaces the unleased proxy first.
	testbed.Eventually(t, 30*time.Second, "the LeaseSummaries listing the lease", func() (bool, string) {
		l := &v1alpha1.LeaseSummaryList{}
		if err := stack.Client.List(ctx, l, client.InNamespace(ns), client.MatchingLabels(leasewire.SummarySelector(rotor))); err != nil {
			return false, err.Error()
		}
		for _, s := range l.Items {
			if slices.ContainsFunc(s.Spec.Leased, func(p v1alpha1.LeasedProxy) bool { return p.Name == held.Proxy }) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d summaries, none listing %s", len(l.Items), held.Proxy)
	})

	sample := sampleReady(rotor, floor)
	changed := time.Now()
	patch(t, rotor, `{"spec":{"proxy":{"port":3130}}}`)
	revision := func() string {
		u := fleetObject(rotor)
		if err := stack.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: rotor}, u); err != nil {
			return ""
		}
		r, _, _ := unstructured.NestedString(u.Object, "status", "observedRevision")
		return r
	}
	var rev string
	testbed.Eventually(t, 3*time.Minute, "every proxy but the leased one replaced, the leased one draining", func() (bool, string) {
		rev = revision()
		ps, err := proxies(rotor)
		if err != nil {
			return false, err.Error()
		}
		newReady, leased := 0, false
		var seen []string
		for _, p := range ps {
			seen = append(seen, fmt.Sprintf("%s(rev=%s ready=%t draining=%q)", p.Name, p.Labels[fleetv1alpha1.LabelTemplateRevision], isReady(&p), p.Labels[fleetv1alpha1.LabelDrainingSince]))
			switch {
			case p.Name == held.Proxy:
				leased = p.Labels[fleetv1alpha1.LabelDrainingSince] != ""
			case p.Labels[fleetv1alpha1.LabelTemplateRevision] == rev && isReady(&p):
				newReady++
			}
		}
		return rev != "" && leased && newReady == 2, fmt.Sprintf("revision %s: %v", rev, seen)
	})
	// The leased proxy stays while the lease does, and takes no new one:
	// once the fleet says it waits for its leases (the function has seen
	// its replacements Ready and kept it), it must still be there.
	testbed.Eventually(t, time.Minute, "the fleet keeps the leased proxy for its lease", func() (bool, string) {
		st, err := fleetState(rotor)
		return err == nil && strings.Contains(st.message, held.Proxy) && strings.Contains(st.message, "waits for its leases to drain"), fmt.Sprintf("%q %v", st.message, err)
	})
	if ps, _ := proxies(rotor); !slices.ContainsFunc(ps, func(p v1alpha1.Proxy) bool { return p.Name == held.Proxy }) {
		t.Fatalf("the leased proxy %s went while its lease was held", held.Proxy)
	}
	if other, err := c.Acquire(ctx, discoveryv1.AcquireRequest{Fleet: ns + "/" + rotor, Holder: "e2e-other", TTL: "1m"}); err == nil {
		if other.Proxy == held.Proxy {
			t.Errorf("a draining proxy must take no new lease")
		}
		_ = c.Release(ctx, other.LeaseID)
	}
	if err := c.Release(ctx, held.LeaseID); err != nil {
		t.Fatal(err)
	}
	released = true
	var now []string
	testbed.Eventually(t, 2*time.Minute, "the leased proxy gone once released, the fleet all of the new template", func() (bool, string) {
		st, ps, err := observe(rotor)
		if err != nil {
			return false, err.Error()
		}
		now, _ = namesAndReady(ps)
		for _, p := range ps {
			if p.Labels[fleetv1alpha1.LabelTemplateRevision] != rev {
				return false, fmt.Sprintf("%s still of revision %s", p.Name, p.Labels[fleetv1alpha1.LabelTemplateRevision])
			}
		}
		return st.ready && len(ps) == 2 && st.healthy == 2, fmt.Sprintf("%v %+v", now, st)
	})
	r := sample()
	t.Logf("port change rolled out %v -> %v in %.1fs with %s leased; lowest Ready count %d over %d samples, the fleet unready in %d of them",
		start, now, time.Since(changed).Seconds(), held.Proxy, r.minReady, r.samples, r.unreadyXR)
	if r.minReady < floor {
		t.Errorf("the rollout dropped to %d Ready proxies, below replicas - maxUnavailable = %d: %v", r.minReady, floor, r.lowAt)
	}
	if r.unreadyXR > 0 {
		t.Errorf("the fleet was unready in %d of %d samples during a routine rollout", r.unreadyXR, r.samples)
	}
	assertNotThrottled(t, rotor)
}

// burnedAddressRecycled gives the rotor fleet a recycling policy and has a
// crawler report bans by two domains on the proxy its lease is on: its
// address is burned, and the fleet recycles it through the rollout
// machinery: a replacement (which leaves from another address) is Ready
// before the burned proxy goes, the fleet never drops below its floor,
// and its status lists the recycle with the address and why, and says
// that nothing burned waits afterwards.
func burnedAddressRecycled(t *testing.T) {
	ctx := context.Background()
	const floor = 2
	start := waitFleet(t, rotor, 2, 2*time.Minute)
	patch(t, rotor, `{"spec":{"recycling":{"bannedByDomains":2,"maxPerHour":1,"backoff":"1m"}}}`)
	c := discoveryClient(t)
	held, err := c.Acquire(ctx, discoveryv1.AcquireRequest{Fleet: ns + "/" + rotor, Holder: "e2e-recycle", TTL: "5m"})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	victim, ip := held.Proxy, ""
	if ps, err := proxies(rotor); err == nil {
		for _, p := range ps {
			if p.Name == victim {
				ip = p.Status.AtProvider.EgressIP
			}
		}
	}
	if ip == "" {
		t.Fatalf("the leased proxy %s has no egress IP; proxies %v", victim, start)
	}
	for _, domain := range []string{"shop.example", "news.example"} {
		if err := c.Report(ctx, held.LeaseID, discoveryv1.ReportRequest{Domain: domain, Outcome: "banned"}); err != nil {
			t.Fatalf("report a ban by %s: %v", domain, err)
		}
	}
	if err := c.Release(ctx, held.LeaseID); err != nil {
		t.Fatal(err)
	}
	sample := sampleReady(rotor, floor)
	burned := time.Now()
	// The replacement is Ready while the burned proxy is still there.
	var replacement string
	testbed.Eventually(t, 4*time.Minute, "a replacement of "+victim+" Ready beside it", func() (bool, string) {
		ps, err := proxies(rotor)
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		found := false
		for _, p := range ps {
			seen = append(seen, fmt.Sprintf("%s(ready=%t ip=%s recycle-of=%q)", p.Name, isReady(&p), p.Status.AtProvider.EgressIP, p.Annotations[fleetv1alpha1.AnnotationRecycleOf]))
			if p.Name == victim {
				found = true
			}
			if p.Annotations[fleetv1alpha1.AnnotationRecycleOf] == victim && isReady(&p) {
				replacement = p.Name
				if got := p.Status.AtProvider.EgressIP; got == ip || got == "" {
					return false, fmt.Sprintf("the replacement %s leaves from %q, want another address than %s", p.Name, got, ip)
				}
			}
		}
		if replacement != "" && !found {
			t.Fatalf("%s went before its replacement %s was Ready: %v", victim, replacement, seen)
		}
		return replacement != "" && found, strings.Join(seen, " ")
	})
	testbed.Eventually(t, 2*time.Minute, victim+" gone, the fleet whole again", func() (bool, string) {
		st, ps, err := observe(rotor)
		if err != nil {
			return false, err.Error()
		}
		now, _ := namesAndReady(ps)
		return st.ready && st.healthy == 2 && len(ps) == 2 && !contains(now, victim), fmt.Sprintf("%v %+v", now, st)
	})
	// The ban history stays with the address, not the proxy that went.
	hist := &coordv1.Lease{}
	if err := stack.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: lease.IPBansName(rotor, lease.CanonicalIP(ip))}, hist); err != nil {
		t.Errorf("the ban history of %s after %s went: %v", ip, victim, err)
	} else {
		domains := map[string]bool{}
		for _, b := range lease.HistoryOf(hist, time.Now()) {
			domains[b.Domain] = true
		}
		if !domains["shop.example"] || !domains["news.example"] {
			t.Errorf("the ban history of %s after %s went lists %v, want both domains", ip, victim, domains)
		}
	}
	r := sample()
	t.Logf("%s (%s) recycled into %s in %.1fs after two domains banned it; lowest Ready count %d over %d samples",
		victim, ip, replacement, time.Since(burned).Seconds(), r.minReady, r.samples)
	if r.minReady < floor {
		t.Errorf("the recycle dropped to %d Ready proxies, below replicas - maxUnavailable = %d: %v", r.minReady, floor, r.lowAt)
	}
	testbed.Eventually(t, time.Minute, "the fleet's status lists the recycle, nothing burned waiting", func() (bool, string) {
		u := fleetObject(rotor)
		if err := stack.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: rotor}, u); err != nil {
			return false, err.Error()
		}
		recs, _, _ := unstructured.NestedSlice(u.Object, "status", "egress", "recycles")
		waiting, _, _ := unstructured.NestedString(u.Object, "status", "egress", "recycleWaiting")
		for _, v := range recs {
			m, _ := v.(map[string]any)
			reason, _ := m["reason"].(string)
			if m["proxy"] == victim && m["egressIP"] == ip && strings.Contains(reason, "banned by 2 or more domains") {
				return waiting == "", fmt.Sprintf("recycleWaiting %q", waiting)
			}
		}
		return false, fmt.Sprintf("status.egress.recycles %v", recs)
	})
	patch(t, rotor, `{"spec":{"recycling":null}}`)
	assertNotThrottled(t, rotor)
}

// passwordRotatesInPlace changes the password in the auth Secret the rotor
// fleet shares with the example fleet, while a crawler holding a lease
// keeps fetching through its proxy with the password it was given: it is
// never refused during the grace period (30s here); discovery soon hands
// out the new password, which works through the same proxies; no proxy is
// replaced and no Squid restarted; the fleet stays Ready above its floor;
// and once the grace is over the old password is refused.
func passwordRotatesInPlace(t *testing.T) {
	ctx := context.Background()
	const grace = 30 * time.Second
	patch(t, rotor, `{"spec":{"proxy":{"credentialGracePeriod":"30s"}}}`)
	testbed.Eventually(t, time.Minute, "the rotor fleet's proxies told the grace period", func() (bool, string) {
		ps, err := proxies(rotor)
		if err != nil || len(ps) == 0 {
			return false, fmt.Sprint(err)
		}
		for _, p := range ps {
			if g := p.Spec.ForProvider.CredentialGracePeriod; g == nil || g.Duration != grace {
				return false, fmt.Sprintf("%s: %v", p.Name, g)
			}
		}
		return true, ""
	})
	before := waitFleet(t, rotor, 2, time.Minute)
	pids := squidPids(t, rotor)

	target := httptest.NewTLSServer(http.HandlerFunc(probe.EchoIP))
	defer target.Close()
	pool := x509.NewCertPool()
	pool.AddCert(target.Certificate())
	fetch := func(proxyURL string) error {
		u, err := url.Parse(proxyURL)
		if err != nil {
			return err
		}
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			Proxy: http.ProxyURL(u), TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true,
		}}
		rsp, err := hc.Get(target.URL + "/ip")
		if err != nil {
			return err
		}
		_ = rsp.Body.Close()
		if rsp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", rsp.StatusCode)
		}
		return nil
	}
	password := func(proxyURL string) string {
		u, _ := url.Parse(proxyURL)
		p, _ := u.User.Password()
		return p
	}

	c := discoveryClient(t)
	held, err := c.Acquire(ctx, discoveryv1.AcquireRequest{Fleet: ns + "/" + rotor, Holder: "e2e-password", TTL: "10m"})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	defer func() { _ = c.Release(ctx, held.LeaseID) }()
	if err := fetch(held.ProxyURL); err != nil {
		t.Fatalf("fetch through the leased proxy before the change: %v", err)
	}
	oldPassword := password(held.ProxyURL)

	// The crawler keeps fetching with what it was given.
	type attempt struct {
		at  time.Time
		err error
	}
	var attempts []attempt
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			attempts = append(attempts, attempt{time.Now(), fetch(held.ProxyURL)})
		}
	}()
	sample := sampleReady(rotor, 2)

	sec := &corev1.Secret{}
	if err := stack.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "crawlers-proxy-auth"}, sec); err != nil {
		t.Fatal(err)
	}
	newPassword := "rotated-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	sec.Data["password"] = []byte(newPassword)
	if err := stack.Client.Update(ctx, sec); err != nil {
		t.Fatalf("cannot change the password: %v", err)
	}
	changed := time.Now()

	var fresh *discoveryv1.Lease
	testbed.Eventually(t, 45*time.Second, "discovery handing out the new password", func() (bool, string) {
		l, err := c.Acquire(ctx, discoveryv1.AcquireRequest{Fleet: ns + "/" + rotor, Holder: "e2e-new-password", TTL: "2m"})
		if err != nil {
			return false, err.Error()
		}
		if password(l.ProxyURL) != newPassword {
			_ = c.Release(ctx, l.LeaseID)
			return false, "still the old password"
		}
		fresh = l
		return true, ""
	})
	handedOut := time.Since(changed)
	defer func() { _ = c.Release(ctx, fresh.LeaseID) }()
	if err := fetch(fresh.ProxyURL); err != nil {
		t.Errorf("fetch with the new password through %s: %v", fresh.Proxy, err)
	}
	if err := fetch(strings.Replace(held.ProxyURL, ":"+oldPassword+"@", ":"+newPassword+"@", 1)); err != nil {
		t.Errorf("the crawler's own proxy %s must take the new password too: %v", held.Proxy, err)
	}
	if g, err := c.Renew(ctx, held.LeaseID, "10m"); err != nil || password(g.ProxyURL) != newPassword {
		t.Errorf("renewing its lease, the crawler must be given the new password: %+v %v", g, err)
	}

	// Until the grace ends (the deadline is taken when the proxy is
	// rotated, after the change, rounded down to a second), the old
	// password is never refused.
	time.Sleep(time.Until(changed.Add(grace - 2*time.Second)))
	close(stop)
	<-done
	refused := 0
	for _, a := range attempts {
		if a.err != nil && a.at.After(changed) {
			refused++
			t.Errorf("the crawler was refused %.1fs after the change, within the grace: %v", a.at.Sub(changed).Seconds(), a.err)
		}
	}
	var lapsed time.Duration
	testbed.Eventually(t, grace+30*time.Second, "the old password refused once the grace is over", func() (bool, string) {
		err := fetch(held.ProxyURL)
		lapsed = time.Since(changed)
		return err != nil, fmt.Sprint(err)
	})
	testbed.Eventually(t, 30*time.Second, "the proxies' status without previous credentials", func() (bool, string) {
		ps, err := proxies(rotor)
		if err != nil {
			return false, err.Error()
		}
		for _, p := range ps {
			if p.Status.AtProvider.PreviousCredentialsUntil != nil {
				return false, fmt.Sprintf("%s accepts the previous ones until %v", p.Name, p.Status.AtProvider.PreviousCredentialsUntil)
			}
		}
		return true, ""
	})
	r := sample()
	after := waitFleet(t, rotor, 2, 30*time.Second)
	if !slices.Equal(before, after) {
		t.Errorf("a password change replaced proxies: %v, then %v", before, after)
	}
	if now := squidPids(t, rotor); !maps.Equal(pids, now) {
		t.Errorf("a password change restarted Squid: pids %v, then %v", pids, now)
	}
	t.Logf("password rotated in place on %v: discovery handed out the new one after %.1fs; the crawler fetched %d times with the old one, refused %d times within the %s grace, and first refused %.1fs after the change; lowest Ready count %d over %d samples, the fleet unready in %d",
		after, handedOut.Seconds(), len(attempts), refused, grace, lapsed.Seconds(), r.minReady, r.samples, r.unreadyXR)
	if r.minReady < 2 || r.unreadyXR > 0 {
		t.Errorf("the rotation dropped to %d Ready proxies, the fleet unready in %d of %d samples: %v", r.minReady, r.unreadyXR, r.samples, r.lowAt)
	}
	if len(attempts) < 50 {
		t.Errorf("the crawler fetched only %d times during the grace: too few to show anything", len(attempts))
	}
}

// squidPids reads the pid of each of a fleet's Squids, by Proxy.
func squidPids(t *testing.T, fleet string) map[string]string {
	t.Helper()
	ps, err := proxies(fleet)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range ps {
		raw, err := os.ReadFile(filepath.Join(instanceDir(&p), "squid.pid"))
		if err != nil {
			t.Fatalf("cannot read the pid of %s's Squid: %v", p.Name, err)
		}
		out[p.Name] = strings.TrimSpace(string(raw))
	}
	return out
}

// readySamples is what sampleReady saw.
type readySamples struct {
	minReady, samples, unreadyXR int
	// lowAt names the Proxies, and whether each was Ready, when the
	// fewest were.
	lowAt []string
}

// sampleReady samples a fleet every 100 ms until the returned function is
// called, which returns the lowest count of Ready Proxies (starting from
// floor) and how often the fleet itself was not Ready.
func sampleReady(fleet string, floor int) func() readySamples {
	r := readySamples{minReady: floor}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			st, ps, err := observe(fleet)
			if err != nil {
				continue
			}
			ready := 0
			var seen []string
			for _, p := range ps {
				if isReady(&p) {
					ready++
				}
				seen = append(seen, fmt.Sprintf("%s(ready=%t)", p.Name, isReady(&p)))
			}
			r.samples++
			if !st.ready {
				r.unreadyXR++
			}
			if ready < r.minReady {
				r.minReady, r.lowAt = ready, seen
			}
		}
	}()
	return func() readySamples {
		close(stop)
		<-done // the sampler has stopped writing r
		return r
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

type fleetStatus struct {
	ready   bool
	healthy int
	message string
	// throttled holds Crossplane's message when it throttles the fleet's
	// reconciles because the fleet or its Proxies change too often.
	throttled string
	// duplicates is the DuplicateEgressIP condition's status.
	duplicates string
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

func fleetObject(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("crawl.example.com/v1alpha1")
	u.SetKind("ProxyFleet")
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

// observe reads a fleet's status and its Proxies.
func observe(fleet string) (fleetStatus, []v1alpha1.Proxy, error) {
	st, err := fleetState(fleet)
	if err != nil {
		return st, nil, err
	}
	ps, err := proxies(fleet)
	return st, ps, err
}

func fleetState(name string) (fleetStatus, error) {
	u := fleetObject(name)
	if err := stack.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, u); err != nil {
		return fleetStatus{}, err
	}
	st := fleetStatus{}
	h, _, _ := unstructured.NestedInt64(u.Object, "status", "healthyReplicas")
	st.healthy = int(h)
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		switch m["type"] {
		case "Ready":
			st.ready = m["status"] == "True"
		case "FleetHealthy":
			st.message, _ = m["message"].(string)
		case "DuplicateEgressIP":
			st.duplicates, _ = m["status"].(string)
		case "Responsive":
			if m["status"] == "False" {
				st.throttled, _ = m["message"].(string)
			}
		}
	}
	return st, nil
}

func proxies(fleet string) ([]v1alpha1.Proxy, error) {
	l := &v1alpha1.ProxyList{}
	err := stack.Client.List(context.Background(), l, client.InNamespace(ns), client.MatchingLabels{fleetv1alpha1.LabelFleet: fleet})
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	return l.Items, err
}

// namesAndReady returns the Proxies' names and how many are Ready.
func namesAndReady(ps []v1alpha1.Proxy) ([]string, int) {
	names := make([]string, 0, len(ps))
	ready := 0
	for _, p := range ps {
		names = append(names, p.Name)
		if isReady(&p) {
			ready++
		}
	}
	return names, ready
}

func isReady(p *v1alpha1.Proxy) bool {
	return p.GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue
}

// instanceDir is the local backend's folder for a Proxy's Squid.
func instanceDir(p *v1alpha1.Proxy) string {
	return filepath.Join(stack.SquidDir, ownership.InstanceName(p.UID))
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func stackRoot() string {
	root, _ := filepath.Abs("..")
	return root
}
