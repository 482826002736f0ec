//go:build e2e

package e2e

import (
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

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
