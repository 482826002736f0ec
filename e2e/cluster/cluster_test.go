//go:build e2ecluster

// Package cluster is make e2e-cluster: the product on a real one-node
// cluster (devenv.UpCluster, the same as make cluster), with Crossplane's
// default package runtime, Squid pods run by kubelet and containerd, and
// egress-discovery from cluster/discovery.
package cluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	discoveryv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/devenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/netns"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

var (
	stack *devenv.Cluster
	root  string
	// crawlerToken is the crawler's ServiceAccount token for discovery.
	crawlerToken string
)

const (
	ns         = "crawl-team"
	proxiesNS  = "egress-proxies"
	fleet      = "pod-fleet"
	claim      = "legacy-pods"
	replicas   = 3
	crawlerSA  = "crawler"
	proxyPort  = 3128
	stepBudget = 5 * time.Minute
)

func TestMain(m *testing.M) {
	var err error
	if root, err = filepath.Abs("../.."); err != nil {
		panic(err)
	}
	state, err := os.MkdirTemp("", "egress-e2e-cluster-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e-cluster:", err)
		os.Exit(1)
	}
	start := time.Now()
	stack, err = devenv.UpCluster(context.Background(), devenv.Options{Root: root, StateDir: state, Progress: os.Stderr})
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e-cluster: bring-up failed: %v\nlogs kept in %s\n", err, filepath.Join(state, "logs"))
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "e2e-cluster: the cluster came up in %.1fs\n", time.Since(start).Seconds())
	code := m.Run()
	down := time.Now()
	stack.Down()
	fmt.Fprintf(os.Stderr, "e2e-cluster: the cluster stopped in %.1fs\n", time.Since(down).Seconds())
	if left := stack.ClusterLeftBehind(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "e2e-cluster: FAIL: stopping the cluster left behind: %s\n", strings.Join(left, ", "))
		code = 1
	}
	if code == 0 && os.Getenv("E2E_KEEP_STATE") == "" {
		_ = os.RemoveAll(state)
	} else {
		fmt.Fprintf(os.Stderr, "e2e-cluster: logs kept in %s\n", filepath.Join(state, "logs"))
	}
	os.Exit(code)
}

// TestCluster runs the steps in order, each on what the one before left,
// and prints each one's time.
func TestCluster(t *testing.T) {
	steps := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"PodFleetBecomesReady", podFleetBecomesReady},
		{"PodNetworkStaysOnMachine", podNetworkStaysOnMachine},
		{"LeaseAndFetchThroughPod", leaseAndFetchThroughPod},
		{"GatewaySessionThroughPod", gatewaySessionThroughPod},
		{"DeletedPodIsReplaced", deletedPodIsReplaced},
		{"LegacyClaimBinds", legacyClaimBinds},
		{"DeletingFleetsLeavesNothing", deletingFleetsLeavesNothing},
	}
	for _, s := range steps {
		began := time.Now()
		ok := t.Run(s.name, s.fn)
		fmt.Fprintf(os.Stderr, "e2e-cluster: step %s took %.1fs\n", s.name, time.Since(began).Seconds())
		if !ok {
			t.Fatalf("step %s failed; the later steps depend on it", s.name)
		}
	}
}

func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(root, "bin", "kubectl"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+stack.Kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// podFleetBecomesReady applies examples/cluster, as a user would: a
// ClusterProviderConfig for pods and a fleet of three. Each Proxy becomes
// Ready only when the provider, in its pod, probed the target through the
// Squid pod: the egress IP the target saw is the pod's own address.
func podFleetBecomesReady(t *testing.T) {
	dir := filepath.Join(root, "examples", "cluster")
	kubectl(t, "apply", "-f", filepath.Join(dir, "namespace.yaml"))
	kubectl(t, "apply", "-f", dir)
	applied := time.Now()
	ps := waitFleet(t, fleet, replicas)
	t.Logf("apply to Ready with %d healthy Squid pods: %.1fs", replicas, time.Since(applied).Seconds())
	pods := proxyPods(t)
	if len(pods) != replicas {
		t.Fatalf("want %d proxy pods in %s, got %d", replicas, proxiesNS, len(pods))
	}
	byIP := map[string]corev1.Pod{}
	for _, p := range pods {
		if p.Status.Phase != corev1.PodRunning || p.Spec.NodeName != devenv.NodeName {
			t.Errorf("pod %s is %s on %q, want Running on %s", p.Name, p.Status.Phase, p.Spec.NodeName, devenv.NodeName)
		}
		if img := p.Spec.Containers[0].Image; !strings.Contains(img, "egress-squid") {
			t.Errorf("pod %s runs %s, want the project's Squid image", p.Name, img)
		}
		byIP[p.Status.PodIP] = p
	}
	for _, p := range ps {
		at := p.Status.AtProvider
		if _, ok := byIP[at.Host]; !ok {
			t.Errorf("Proxy %s has host %q, which is no proxy pod's address", p.Name, at.Host)
		}
		if at.EgressIP != at.Host {
			t.Errorf("Proxy %s: the target saw egress IP %q, want the pod's %q (probed through the pod's Squid)", p.Name, at.EgressIP, at.Host)
		}
	}
}

// leaseAndFetchThroughPod leases a proxy through egress-discovery's
// Service, reached via the node, as a crawler on this machine would, with
// a ServiceAccount token for discovery's audience; fetches the target host
// through the pod's Squid; and finds the CONNECT in the pod's access log
// (kubectl logs, through the kubelet). The node's own apiserver, a private
// address no policy opens, is refused by the same proxy.
func leaseAndFetchThroughPod(t *testing.T) {
	ctx := context.Background()
	kubectl(t, "apply", "-f", filepath.Join(root, "examples", "crawler-rbac.yaml"))
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: crawlerSA}}
	if err := stack.Client.Create(ctx, sa); err != nil && !kerrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	cs := clientset(t)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, crawlerSA, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences: []string{"egress-discovery"}, ExpirationSeconds: ptr.To(int64(3600)),
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("cannot get a token for %s/%s: %v", ns, crawlerSA, err)
	}
	crawlerToken = tr.Status.Token
	apiserver := fmt.Sprintf("https://%s:%d/version", devenv.NodeIP, devenv.APIServerPort)
	script := fmt.Sprintf(`set -e
echo "proxy=${HTTPS_PROXY##*@}"
echo "seen=$(curl -sS --fail --max-time 10 --cacert %q %q)"
echo "apiserver=$(curl -s -o /dev/null -w '%%{http_connect}' --max-time 10 -k %q || true)"`, stack.TargetCA, stack.TargetURL, apiserver)
	cmd := exec.Command(filepath.Join(root, "bin", "egressctl"), "lease", "--fleet", ns+"/"+fleet, "--holder", "e2e-cluster", "--", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "EGRESS_DISCOVERY_URL="+stack.DiscoveryURL, "EGRESS_DISCOVERY_TOKEN="+tr.Status.Token, "EGRESS_DISCOVERY_CA_FILE="+stack.DiscoveryCA)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("egressctl lease: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			got[k] = v
		}
	}
	host, _, _ := strings.Cut(got["proxy"], ":")
	if host == "" || got["seen"] != host {
		t.Fatalf("the target saw %q through the leased proxy %q; want the proxy pod's address\n%s", got["seen"], got["proxy"], out)
	}
	if got["apiserver"] != "403" {
		t.Errorf("CONNECT to the node's apiserver through the proxy answered %q, want 403 (a private address no policy opens)", got["apiserver"])
	}
	var pod *corev1.Pod
	for _, p := range proxyPods(t) {
		if p.Status.PodIP == host {
			pod = &p
		}
	}
	if pod == nil {
		t.Fatalf("no proxy pod has the leased address %s", host)
	}
	logs, err := cs.CoreV1().Pods(proxiesNS).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("cannot read the logs of pod %s: %v", pod.Name, err)
	}
	// The crawler on this machine comes from the node's address; the
	// provider's probes come from its pod.
	want := []string{devenv.NodeIP + " TCP_TUNNEL/200", fmt.Sprintf("CONNECT %s:%d crawler", devenv.TargetHostIP, devenv.TargetHostPort)}
	found := false
	for _, line := range strings.Split(string(logs), "\n") {
		if strings.Contains(line, want[0]) && strings.Contains(line, want[1]) {
			found = true
			t.Logf("access log of %s: %s", pod.Name, strings.TrimSpace(line))
		}
	}
	if !found {
		t.Errorf("the access log of pod %s has no line with %q and %q:\n%s", pod.Name, want[0], want[1], logs)
	}
}

// gatewaySessionThroughPod fetches three times with curl through the
// gateway of cluster/discovery, reached via the node, with nothing but its
// URL (a session in the username, the crawler's ServiceAccount token as the
// password): the target sees one Squid pod's address every time.
func gatewaySessionThroughPod(t *testing.T) {
	proxyURL := fmt.Sprintf("https://%s_%s_session_c:%s@%s", ns, fleet, crawlerToken, stack.GatewayAddress)
	var first string
	for i := range 3 {
		out, err := exec.Command("curl", "-sS", "--fail", "--max-time", "15", "--proxy", proxyURL, "--proxy-cacert", stack.ClusterCA(),
			"--cacert", stack.TargetCA, stack.TargetURL).CombinedOutput()
		seen := strings.TrimSpace(string(out))
		if err != nil {
			t.Fatalf("curl %d through the gateway: %v: %s", i, err, out)
		}
		if first == "" {
			first = seen
		}
		if seen != first {
			t.Fatalf("request %d of the session left from %s, the first from %s", i, seen, first)
		}
	}
	for _, p := range proxyPods(t) {
		if p.Status.PodIP == first {
			t.Logf("the session's 3 requests left from pod %s (%s)", p.Name, first)
			return
		}
	}
	t.Fatalf("the target saw %q, no proxy pod's address", first)
}

// deletedPodIsReplaced deletes a proxy's pod: the provider sees the
// instance gone, marks the Proxy unready, creates another pod, and the
// Proxy is Ready again only through a new probe of the new pod.
func deletedPodIsReplaced(t *testing.T) {
	ctx := context.Background()
	_, ps, err := observe(fleet)
	if err != nil {
		t.Fatal(err)
	}
	proxy := ps[0]
	var victim *corev1.Pod
	for _, p := range proxyPods(t) {
		if p.Status.PodIP == proxy.Status.AtProvider.Host {
			victim = &p
		}
	}
	if victim == nil {
		t.Fatalf("no pod has Proxy %s's address %s", proxy.Name, proxy.Status.AtProvider.Host)
	}
	deleted := time.Now()
	if err := stack.Client.Delete(ctx, victim); err != nil {
		t.Fatalf("cannot delete pod %s: %v", victim.Name, err)
	}
	testbed.Eventually(t, stepBudget, "Proxy "+proxy.Name+" Ready again on a new pod, and the fleet Ready", func() (bool, string) {
		p := &v1alpha1.Proxy{}
		if err := stack.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: proxy.Name}, p); err != nil {
			return false, err.Error()
		}
		ready := p.GetCondition(xpv2.TypeReady)
		var now *corev1.Pod
		for _, pod := range proxyPods(t) {
			if pod.UID == victim.UID {
				return false, "the deleted pod is still there (" + string(pod.Status.Phase) + ")"
			}
			if pod.Status.PodIP != "" && pod.Status.PodIP == p.Status.AtProvider.Host {
				now = &pod
			}
		}
		if now == nil || !now.CreationTimestamp.After(deleted.Add(-time.Second)) {
			return false, fmt.Sprintf("Proxy host %q is no pod made after the deletion", p.Status.AtProvider.Host)
		}
		// Ready went False when the pod went, and True again after.
		if ready.Status != corev1.ConditionTrue || !ready.LastTransitionTime.After(deleted) {
			return false, fmt.Sprintf("Ready=%s since %s", ready.Status, ready.LastTransitionTime.Format(time.RFC3339))
		}
		if p.Status.AtProvider.EgressIP != now.Status.PodIP {
			return false, fmt.Sprintf("egress IP %q, want the new pod's %s", p.Status.AtProvider.EgressIP, now.Status.PodIP)
		}
		st, ps, err := observe(fleet)
		if err != nil {
			return false, err.Error()
		}
		_, n := namesAndReady(ps)
		return st.ready && st.healthy == replicas && n == replicas && len(proxyPods(t)) == replicas,
			fmt.Sprintf("fleet %+v, %d Ready Proxies", st, n)
	})
	t.Logf("pod deleted to Proxy and fleet Ready again: %.1fs", time.Since(deleted).Seconds())
}

// podNetworkStaysOnMachine checks the node's guard from the test target
// host, which sits on the pod network as a pod does: it reaches the node's
// apiserver and the registry, which only serves pulls, but neither a
// listener of this machine on the node's address nor another address of
// this machine (with a route through the node, as a pod that could set
// routes would add). With the guard removed for a moment, the same check
// must fail: it has the power to see a missing guard.
func podNetworkStaysOnMachine(t *testing.T) {
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close() //nolint:errcheck // A test listener.
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	other := otherAddress(t)
	if other != "" {
		if out, err := exec.Command("ip", "-n", devenv.TargetNetns, "route", "add", other+"/32", "via", devenv.NodeIP).CombinedOutput(); err != nil {
			t.Fatalf("cannot route %s through the node in the target host: %v: %s", other, err, out)
		}
	}
	reach := func(addr string) bool {
		var ok bool
		_ = netns.Do(devenv.TargetNetns, func() error {
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err == nil {
				ok = true
				_ = c.Close()
			}
			return nil
		})
		return ok
	}
	probe := func() map[string]bool {
		got := map[string]bool{
			"apiserver": reach(net.JoinHostPort(devenv.NodeIP, strconv.Itoa(devenv.APIServerPort))),
			"node port": reach(net.JoinHostPort(devenv.NodeIP, strconv.Itoa(port))),
		}
		if other != "" {
			got["other address"] = reach(net.JoinHostPort(other, strconv.Itoa(port)))
		}
		return got
	}
	if got := probe(); !got["apiserver"] || got["node port"] || got["other address"] {
		t.Fatalf("from the pod network: %v; want the apiserver only", got)
	}
	t.Logf("from the pod network: the apiserver answers; this machine's listener on %s:%d and on %q does not", devenv.NodeIP, port, other)

	// The registry on the node's address serves pulls and refuses pushes.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := netns.Do(devenv.TargetNetns, func() (err error) {
			c, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}}}
	base := fmt.Sprintf("http://%s:%d/v2/kacerr/egress-squid", devenv.NodeIP, devenv.RegistryPort)
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/manifests/v0.1.0", http.StatusOK},
		{http.MethodPut, "/manifests/v0.1.0", http.StatusMethodNotAllowed},
		{http.MethodDelete, "/manifests/v0.1.0", http.StatusMethodNotAllowed},
		{http.MethodPost, "/blobs/uploads/", http.StatusMethodNotAllowed},
	} {
		req, _ := http.NewRequest(c.method, base+c.path, strings.NewReader("{}"))
		req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
		rsp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s from the pod network: %v", c.method, c.path, err)
		}
		_ = rsp.Body.Close()
		if rsp.StatusCode != c.want {
			t.Errorf("%s %s from the pod network answered %d, want %d", c.method, c.path, rsp.StatusCode, c.want)
		}
	}

	// Mutation: without the guard, the check must see the way open.
	if err := stack.SetGuard(false); err != nil {
		t.Fatal(err)
	}
	unguarded := probe()
	if err := stack.SetGuard(true); err != nil {
		t.Fatalf("cannot put the guard back: %v", err)
	}
	if !unguarded["node port"] || other != "" && !unguarded["other address"] {
		t.Errorf("with the guard removed, the check still found the way closed (%v): it cannot tell a guarded node from an open one", unguarded)
	}
	if got := probe(); got["node port"] || got["other address"] {
		t.Fatalf("with the guard back: %v", got)
	}
}

// otherAddress is an IPv4 address of this machine off the pod network and
// loopback, or "" when it has none.
func otherAddress(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	_, pods, _ := net.ParseCIDR(devenv.PodCIDR)
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !pods.Contains(n.IP) {
			return n.IP.String()
		}
	}
	t.Log("this machine has no address off loopback and the pod network: only the node's address is checked")
	return ""
}

// legacyClaimBinds applies a ProxyFleetClaim: it binds a cluster-scoped
// XProxyFleet, whose Squid pod becomes Ready, and the claim Ready too.
func legacyClaimBinds(t *testing.T) {
	kubectl(t, "apply", "-f", filepath.Join(root, "e2e", "cluster", "testdata", "claim.yaml"))
	applied := time.Now()
	testbed.Eventually(t, stepBudget, "claim "+claim+" bound and Ready", func() (bool, string) {
		u := claimObject()
		if err := stack.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: claim}, u); err != nil {
			return false, err.Error()
		}
		ref, _, _ := unstructured.NestedString(u.Object, "spec", "resourceRef", "name")
		ready := condition(u, "Ready")
		return ref != "" && ready == "True", fmt.Sprintf("resourceRef %q, Ready=%s", ref, ready)
	})
	t.Logf("claim apply to Ready: %.1fs", time.Since(applied).Seconds())
}

// deletingFleetsLeavesNothing deletes the fleet, with a lease still held,
// and the claim: no Proxy, pod, config Secret, NetworkPolicy or Lease is
// left of them.
func deletingFleetsLeavesNothing(t *testing.T) {
	ctx := context.Background()
	h, err := discoveryv1.NewHTTPClient(stack.DiscoveryCA)
	if err != nil {
		t.Fatal(err)
	}
	dc := &discoveryv1.Client{BaseURL: stack.DiscoveryURL, Token: crawlerToken, HTTP: h}
	l, err := dc.Acquire(ctx, discoveryv1.AcquireRequest{Fleet: ns + "/" + fleet, Holder: "e2e-left-behind"})
	if err != nil {
		t.Fatalf("cannot lease a proxy of %s: %v", fleet, err)
	}
	t.Logf("holding %s on %s while deleting the fleet", l.LeaseID, l.Proxy)
	u := fleetObject()
	if err := stack.Client.Delete(ctx, u); err != nil {
		t.Fatalf("cannot delete fleet %s: %v", fleet, err)
	}
	if err := stack.Client.Delete(ctx, claimObject()); err != nil {
		t.Fatalf("cannot delete claim %s: %v", claim, err)
	}
	deleted := time.Now()
	testbed.Eventually(t, stepBudget, "no fleet, claim, Proxy, pod, Secret, NetworkPolicy or Lease left", func() (bool, string) {
		var left []string
		if err := stack.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: fleet}, fleetObject()); !kerrors.IsNotFound(err) {
			left = append(left, "fleet")
		}
		if err := stack.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: claim}, claimObject()); !kerrors.IsNotFound(err) {
			left = append(left, "claim")
		}
		xrs := &unstructured.UnstructuredList{}
		xrs.SetAPIVersion("crawl.example.com/v1alpha1")
		xrs.SetKind("XProxyFleetList")
		if err := stack.Client.List(ctx, xrs); err != nil {
			return false, err.Error()
		}
		for _, x := range xrs.Items {
			left = append(left, "XProxyFleet "+x.GetName())
		}
		pl := &v1alpha1.ProxyList{}
		if err := stack.Client.List(ctx, pl); err != nil {
			return false, err.Error()
		}
		for _, p := range pl.Items {
			left = append(left, "Proxy "+p.Namespace+"/"+p.Name)
		}
		for _, p := range proxyPods(t) {
			left = append(left, "pod "+p.Name)
		}
		secrets := &corev1.SecretList{}
		if err := stack.Client.List(ctx, secrets, client.InNamespace(proxiesNS)); err != nil {
			return false, err.Error()
		}
		for _, s := range secrets.Items {
			left = append(left, "Secret "+s.Name)
		}
		nps := &networkingv1.NetworkPolicyList{}
		if err := stack.Client.List(ctx, nps, client.InNamespace(proxiesNS)); err != nil {
			return false, err.Error()
		}
		for _, n := range nps.Items {
			left = append(left, "NetworkPolicy "+n.Name)
		}
		leases := &coordinationv1.LeaseList{}
		if err := stack.Client.List(ctx, leases, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		for _, l := range leases.Items {
			left = append(left, "Lease "+l.Name)
		}
		sort.Strings(left)
		return len(left) == 0, strings.Join(left, ", ")
	})
	t.Logf("everything gone %.1fs after deleting the fleet and the claim", time.Since(deleted).Seconds())
}

func clientset(t *testing.T) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(stack.Config)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// proxyPods lists the Squid pods the provider runs.
func proxyPods(t *testing.T) []corev1.Pod {
	t.Helper()
	l := &corev1.PodList{}
	if err := stack.Client.List(context.Background(), l, client.InNamespace(proxiesNS)); err != nil {
		t.Fatal(err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	return l.Items
}

// waitFleet waits until the fleet is Ready with n healthy proxies and n
// Ready Proxies, and returns them.
func waitFleet(t *testing.T, name string, n int) []v1alpha1.Proxy {
	t.Helper()
	var ps []v1alpha1.Proxy
	testbed.Eventually(t, stepBudget, fmt.Sprintf("fleet %s Ready with %d healthy proxies", name, n), func() (bool, string) {
		st, got, err := observe(name)
		if err != nil {
			return false, err.Error()
		}
		ps = got
		_, ready := namesAndReady(ps)
		return st.ready && st.healthy == n && len(ps) == n && ready == n,
			fmt.Sprintf("%+v, %d Proxies of which %d Ready", st, len(ps), ready)
	})
	return ps
}

type fleetStatus struct {
	ready   bool
	healthy int
}

func observe(name string) (fleetStatus, []v1alpha1.Proxy, error) {
	u := fleetObject()
	u.SetName(name)
	if err := stack.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, u); err != nil {
		return fleetStatus{}, nil, err
	}
	h, _, _ := unstructured.NestedInt64(u.Object, "status", "healthyReplicas")
	st := fleetStatus{ready: condition(u, "Ready") == "True", healthy: int(h)}
	l := &v1alpha1.ProxyList{}
	err := stack.Client.List(context.Background(), l, client.InNamespace(ns), client.MatchingLabels{fleetv1alpha1.LabelFleet: name})
	return st, l.Items, err
}

func namesAndReady(ps []v1alpha1.Proxy) ([]string, int) {
	names := make([]string, 0, len(ps))
	ready := 0
	for _, p := range ps {
		names = append(names, p.Name)
		if p.GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue {
			ready++
		}
	}
	return names, ready
}

func condition(u *unstructured.Unstructured, typ string) string {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, _ := c.(map[string]any); m["type"] == typ {
			s, _ := m["status"].(string)
			return s
		}
	}
	return ""
}

func fleetObject() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("crawl.example.com/v1alpha1")
	u.SetKind("ProxyFleet")
	u.SetNamespace(ns)
	u.SetName(fleet)
	return u
}

func claimObject() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("crawl.example.com/v1alpha1")
	u.SetKind("ProxyFleetClaim")
	u.SetNamespace(ns)
	u.SetName(claim)
	return u
}
