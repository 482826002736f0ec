//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	discoveryv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// kubectlScale sizes the example fleet with kubectl scale, through the
// scale subresource of the XRD the installed package made, as an HPA or
// KEDA would.
func kubectlScale(t *testing.T) {
	scale := func(n int) {
		t.Helper()
		out, err := exec.Command(filepath.Join(stackRoot(), "bin", "kubectl"), "--kubeconfig", stack.Kubeconfig,
			"-n", ns, "scale", "proxyfleet", example, fmt.Sprintf("--replicas=%d", n)).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl scale proxyfleet %s --replicas=%d: %v\n%s", example, n, err, out)
		}
	}
	start := time.Now()
	scale(4)
	waitFleet(t, example, 4, 90*time.Second)
	t.Logf("kubectl scale proxyfleet %s --replicas=4: 4 Ready in %.1fs", example, time.Since(start).Seconds())
	scale(3)
	waitFleet(t, example, 3, 90*time.Second)
}

const elastic = "elastic"

// elasticFleet is sized by its lease demand between 1 and 3 proxies of 3
// leases each; it shrinks after 20s of asking for fewer.
const elasticFleet = `
apiVersion: crawl.example.com/v1alpha1
kind: ProxyFleet
metadata:
  name: elastic
  namespace: crawl-team
spec:
  providerConfigRef: {kind: ClusterProviderConfig, name: local}
  zones: [local-a, local-b]
  placement: {local: {bindAddress: 127.0.0.1}}
  proxy:
    authSecretRef: {name: crawlers-proxy-auth}
    allowedSourceRanges: [127.0.0.0/8]
  healthCheck: {url: "https://127.0.0.1:18443/ip", interval: 2s, timeout: 1s}
  leases:
    maxLeasesPerProxy: 3
    admission: {maxWait: 20s}
  autoscaling: {minReplicas: 1, maxReplicas: 3, scaleDownStabilization: 20s}
`

// timeline samples an autoscaled fleet and logs each change of its
// desired, existing and Ready proxies, with the time since start; it fails
// the test when a proxy a crawler holds a lease on goes.
type timeline struct {
	t     *testing.T
	start time.Time
	mu    sync.Mutex
	// held are the proxies crawlers hold leases on now, by lease.
	held   map[string]string
	events []string
	last   string
	stop   chan struct{}
	done   chan struct{}
}

func watchFleet(t *testing.T, fleet string) *timeline {
	tl := &timeline{t: t, start: time.Now(), held: map[string]string{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(tl.done)
		for {
			select {
			case <-tl.stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
			tl.sample(fleet)
		}
	}()
	return tl
}

func (tl *timeline) sample(fleet string) {
	u := fleetObject(fleet)
	if err := stack.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: fleet}, u); err != nil {
		return
	}
	desired, _, _ := unstructured.NestedInt64(u.Object, "status", "desiredReplicas")
	reason, _, _ := unstructured.NestedString(u.Object, "status", "autoscaling", "reason")
	ps, err := proxies(fleet)
	if err != nil {
		return
	}
	names, ready := namesAndReady(ps)
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for id, proxy := range tl.held {
		gone := true
		for _, p := range ps {
			if p.Name == proxy && p.DeletionTimestamp == nil {
				gone = false
			}
		}
		if gone {
			tl.t.Errorf("%.1fs: proxy %s was removed while lease %s was held on it", time.Since(tl.start).Seconds(), proxy, id)
			delete(tl.held, id)
		}
	}
	now := fmt.Sprintf("desired %d, %d proxies %v, %d Ready", desired, len(ps), names, ready)
	if now != tl.last {
		tl.last = now
		tl.events = append(tl.events, fmt.Sprintf("%5.1fs %s (%s)", time.Since(tl.start).Seconds(), now, reason))
	}
}

func (tl *timeline) hold(id, proxy string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.held[id] = proxy
}

func (tl *timeline) release(id string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	delete(tl.held, id)
}

func (tl *timeline) note(format string, args ...any) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.events = append(tl.events, fmt.Sprintf("%5.1fs %s", time.Since(tl.start).Seconds(), fmt.Sprintf(format, args...)))
}

func (tl *timeline) finish() {
	close(tl.stop)
	<-tl.done
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.t.Logf("autoscaling timeline:\n%s", strings.Join(tl.events, "\n"))
}

// autoscalesWithLeaseDemand: 9 crawlers ask an elastic fleet of 1 proxy (3
// leases each) for a lease: it grows to its bound of 3 as they wait, and
// serves all 9; when 8 release, it shrinks after the 20s window to the one
// proxy the last crawler holds, never removing a leased proxy. With
// minReplicas 0 it then sits at zero, and egressctl lease wakes it: the
// acquisition waits while a proxy is made, then fetches through it.
func autoscalesWithLeaseDemand(t *testing.T) {
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(elasticFleet), &u.Object); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := stack.Client.Create(ctx, u); err != nil {
		t.Fatalf("cannot create fleet %s: %v", elastic, err)
	}
	waitFleet(t, elastic, 1, time.Minute)
	tl := watchFleet(t, elastic)
	defer tl.finish()

	c := discoveryClient(t)
	type grant struct{ id, proxy string }
	grants := make([]grant, 9)
	var wg sync.WaitGroup
	asked := time.Now()
	tl.note("9 crawlers ask for leases")
	for i := range grants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(90 * time.Second)
			for {
				l, err := c.Acquire(ctx, discoveryv1.AcquireRequest{Fleet: ns + "/" + elastic, Holder: fmt.Sprintf("crawler-%d", i), TTL: "5m", MaxWait: "20s"})
				if err == nil {
					tl.hold(l.LeaseID, l.Proxy)
					grants[i] = grant{l.LeaseID, l.Proxy}
					return
				}
				if time.Now().After(deadline) {
					t.Errorf("crawler-%d got no lease in 90s: %v", i, err)
					return
				}
				time.Sleep(time.Second)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	tl.note("all 9 hold leases")
	t.Logf("9 crawlers served %.1fs after asking", time.Since(asked).Seconds())
	waitFleet(t, elastic, 3, 30*time.Second)
	perProxy := map[string]int{}
	for _, g := range grants {
		perProxy[g.proxy]++
	}
	if len(perProxy) != 3 {
		t.Errorf("9 leases of 3 per proxy are on 3 proxies: %v", perProxy)
	}

	// The crawler on the newest proxy stays: the autoscaler would remove
	// that one first were it not leased.
	sort.Slice(grants, func(i, j int) bool { return grants[i].proxy > grants[j].proxy })
	keep := grants[0]
	released := time.Now()
	for _, g := range grants[1:] {
		if err := c.Release(ctx, g.id); err != nil {
			t.Fatal(err)
		}
		tl.release(g.id)
	}
	tl.note("8 released; %s keeps its lease on %s", keep.id, keep.proxy)
	names := waitFleet(t, elastic, 1, 90*time.Second)
	t.Logf("shrank to 1 proxy %.1fs after 8 of 9 leases were released (scaleDownStabilization 20s)", time.Since(released).Seconds())
	if len(names) != 1 || names[0] != keep.proxy {
		t.Errorf("the fleet shrank to %v; the leased %s must stay", names, keep.proxy)
	}
	if time.Since(released) < 20*time.Second {
		t.Errorf("the fleet shrank %.1fs after the release, within its 20s scale-down window", time.Since(released).Seconds())
	}
	if err := c.Release(ctx, keep.id); err != nil {
		t.Fatal(err)
	}
	tl.release(keep.id)

	// Scale to zero, then wake on the first acquisition.
	patch(t, elastic, `{"spec":{"autoscaling":{"minReplicas":0}}}`)
	tl.note("minReplicas 0")
	testbed.Eventually(t, 90*time.Second, "the idle fleet at zero", func() (bool, string) {
		ps, err := proxies(elastic)
		if err != nil {
			return false, err.Error()
		}
		return len(ps) == 0, fmt.Sprintf("%d proxies", len(ps))
	})
	tl.note("at zero")
	target := httptest.NewTLSServer(http.HandlerFunc(probe.EchoIP))
	defer target.Close()
	woke := time.Now()
	tl.note("egressctl lease asks")
	cmd := exec.Command(filepath.Join(stackRoot(), "bin", "egressctl"), "lease", "--fleet", ns+"/"+elastic, "--holder", "waker", "--wait", "60s",
		"--", "sh", "-c", `curl -sS --fail --max-time 10 -k "$0" && echo "$EGRESS_PROXY"`, target.URL+"/ip")
	cmd.Env = append(os.Environ(), "EGRESS_DISCOVERY_URL="+stack.DiscoveryURL, "EGRESS_DISCOVERY_TOKEN="+stack.Token, "EGRESS_DISCOVERY_CA_FILE="+stack.DiscoveryCA)
	out, err := cmd.CombinedOutput()
	took := time.Since(woke)
	tl.note("egressctl fetched through a proxy")
	if err != nil {
		t.Fatalf("egressctl lease against a fleet at zero: %v\n%s", err, out)
	}
	lines := strings.Fields(string(out))
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "127.1.") || !strings.HasPrefix(lines[len(lines)-1], elastic+"-") {
		t.Fatalf("want the target's answer through a proxy of %s, got:\n%s", elastic, out)
	}
	t.Logf("woke from zero: egressctl lease asked, waited and fetched through %s in %.1fs", lines[len(lines)-1], took.Seconds())

	if err := stack.Client.Delete(ctx, fleetObject(elastic)); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 90*time.Second, "fleet "+elastic+" gone with its Proxies and Leases", func() (bool, string) {
		ps, err := proxies(elastic)
		if err != nil {
			return false, err.Error()
		}
		ls, err := stack.Leases(ctx, ns, elastic)
		if err != nil {
			return false, err.Error()
		}
		var left []string
		for _, l := range ls {
			left = append(left, l.Name+"("+l.Labels[fleetv1alpha1.LabelLeaseKind]+")")
		}
		return len(ps) == 0 && len(ls) == 0, fmt.Sprintf("%d Proxies, Leases %v", len(ps), left)
	})
}
