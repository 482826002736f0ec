//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	discoveryv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

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
