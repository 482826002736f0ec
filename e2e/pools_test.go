//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

const pooled = "pooled"

// pooledFleet is the rotor fleet in pools of two.
var pooledFleet = strings.Replace(strings.Replace(rotorFleet, "name: rotor", "name: "+pooled, 1),
	"  replicas: 3\n", "  replicas: 3\n  pools: {proxiesPerPool: 2}\n", 1)

// pools lists a fleet's ProxyPools: name and spec replicas.
func pools(t *testing.T, fleet string) map[string]int64 {
	t.Helper()
	l := &unstructured.UnstructuredList{}
	l.SetAPIVersion(fleetv1alpha1.SchemeGroupVersion.String())
	l.SetKind(fleetv1alpha1.ProxyPoolKind + "List")
	if err := stack.Client.List(context.Background(), l, client.InNamespace(ns), client.MatchingLabels{fleetv1alpha1.LabelFleet: fleet}); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, p := range l.Items {
		n, _, _ := unstructured.NestedInt64(p.Object, "spec", "template", "replicas")
		out[p.GetName()] = n
	}
	return out
}

// pooledFleetScalesRollsAndGoes runs a fleet in pools of two through
// scaling up (a third pool), a template change rolled over every pool with
// the fleet's Ready floor held and its surge never exceeded, rotation by
// age with the floor held, scaling down
// (the emptied pools go) and deletion, which leaves no pool, Proxy or
// Lease.
func pooledFleetScalesRollsAndGoes(t *testing.T) {
	ctx := context.Background()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(pooledFleet), &u.Object); err != nil || u.GetName() != pooled {
		t.Fatalf("the pooled fleet's YAML: %v", err)
	}
	if pools, _, _ := unstructured.NestedMap(u.Object, "spec", "pools"); pools == nil {
		t.Fatal("the pooled fleet's YAML has no spec.pools")
	}
	if err := stack.Client.Create(ctx, u); err != nil {
		t.Fatalf("cannot create fleet %s: %v", pooled, err)
	}
	created := time.Now()
	names := waitFleet(t, pooled, 3, 2*time.Minute)
	t.Logf("3 proxies in pools Ready in %.1fs: %v, pools %v", time.Since(created).Seconds(), names, pools(t, pooled))
	if p := pools(t, pooled); len(p) != 2 || p[pooled+"-pool-1"] != 2 || p[pooled+"-pool-2"] != 1 {
		t.Fatalf("3 proxies in pools of 2: want pool-1 of 2 and pool-2 of 1, got %v", p)
	}
	for _, n := range names {
		ord, err := strconv.Atoi(strings.TrimPrefix(n, pooled+"-"))
		if k := ord / fleetv1alpha1.PoolOrdinalSpan; err != nil || k < 1 || k > 2 {
			t.Errorf("%s is not named from the ordinals of pool 1 or 2", n)
		}
	}

	up := time.Now()
	setReplicas(t, pooled, 5)
	five := waitFleet(t, pooled, 5, 2*time.Minute)
	t.Logf("3 -> 5 in %.1fs: %v, pools %v", time.Since(up).Seconds(), five, pools(t, pooled))
	for _, n := range names {
		if !contains(five, n) {
			t.Errorf("scaling 3 -> 5 replaced %s: before %v, after %v", n, names, five)
		}
	}
	if p := pools(t, pooled); len(p) != 3 {
		t.Errorf("5 proxies in pools of 2: want 3 pools, got %v", p)
	}
	traceWalksPools(t, pooled, five)

	// A template change: every pool rolls, one surge Proxy at a time for
	// the whole fleet.
	const floor = 5
	sample := sampleReady(pooled, floor)
	// Proxies being deleted (their Squid stopping) are no surge: counted
	// are those not being deleted.
	most, mostAt := 0, ""
	stop := make(chan struct{})
	counted := make(chan int)
	go func() {
		for {
			select {
			case <-stop:
				counted <- most
				return
			case <-time.After(200 * time.Millisecond):
			}
			ps, err := proxies(pooled)
			if err != nil {
				continue
			}
			var live []string
			for _, p := range ps {
				if p.DeletionTimestamp == nil {
					live = append(live, p.Name)
				}
			}
			if len(live) > most {
				most, mostAt = len(live), strings.Join(live, " ")
			}
		}
	}()
	rolled := time.Now()
	patch(t, pooled, `{"spec":{"proxy":{"port":3130}}}`)
	testbed.Eventually(t, 6*time.Minute, "every proxy of the pooled fleet on the new template", func() (bool, string) {
		st, ps, err := observe(pooled)
		if err != nil {
			return false, err.Error()
		}
		var old []string
		for _, p := range ps {
			if p.Spec.ForProvider.Port != 3130 {
				old = append(old, p.Name)
			}
		}
		now, ready := namesAndReady(ps)
		return len(old) == 0 && len(ps) == 5 && ready == 5 && st.ready, fmt.Sprintf("old %v; proxies %v; %+v", old, now, st)
	})
	r := sample()
	close(stop)
	peak := <-counted
	t.Logf("rolled over 3 pools in %.1fs; lowest Ready count %d over %d samples; at most %d proxies", time.Since(rolled).Seconds(), r.minReady, r.samples, peak)
	if r.minReady < floor {
		t.Errorf("the rollout dropped to %d Ready proxies, below the fleet's floor of %d: %v", r.minReady, floor, r.lowAt)
	}
	if peak > 5+1 {
		t.Errorf("the rollout made %d proxies at once (%s), above replicas 5 + the fleet's maxSurge 1: pools must share the fleet's budget", peak, mostAt)
	}

	// Rotation by age: every proxy of every pool replaced, within the
	// same bounds.
	before, _ := namesAndReady(mustProxies(t, pooled))
	sample = sampleReady(pooled, floor)
	rotated := time.Now()
	patch(t, pooled, `{"spec":{"rotation":{"maxAge":"1m"}}}`)
	// With maxAge 1m the fleet rotates without pause: done once none of
	// the proxies before is left; then rotation stops and the fleet
	// settles.
	testbed.Eventually(t, 8*time.Minute, "every proxy of the pooled fleet rotated", func() (bool, string) {
		st, ps, err := observe(pooled)
		if err != nil {
			return false, err.Error()
		}
		now, _ := namesAndReady(ps)
		for _, n := range before {
			if contains(now, n) {
				return false, fmt.Sprintf("%s not rotated yet; proxies %v; %+v", n, now, st)
			}
		}
		return true, ""
	})
	patch(t, pooled, `{"spec":{"rotation":{"maxAge":null}}}`)
	waitFleet(t, pooled, 5, 3*time.Minute)
	r = sample()
	t.Logf("rotated every proxy of 3 pools in %.1fs; lowest Ready count %d over %d samples", time.Since(rotated).Seconds(), r.minReady, r.samples)
	if r.minReady < floor {
		t.Errorf("rotation dropped to %d Ready proxies, below the fleet's floor of %d: %v", r.minReady, floor, r.lowAt)
	}

	down := time.Now()
	setReplicas(t, pooled, 2)
	waitFleet(t, pooled, 2, 2*time.Minute)
	testbed.Eventually(t, time.Minute, "the emptied pools deleted", func() (bool, string) {
		p := pools(t, pooled)
		return len(p) == 1, fmt.Sprintf("%v", p)
	})
	t.Logf("5 -> 2 and the emptied pools gone in %.1fs", time.Since(down).Seconds())
	assertNotThrottled(t, pooled)

	if err := stack.Client.Delete(ctx, fleetObject(pooled)); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	testbed.Eventually(t, 2*time.Minute, "no pooled fleet, pool, Proxy or Lease left", func() (bool, string) {
		var left []string
		if err := stack.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: pooled}, fleetObject(pooled)); !kerrors.IsNotFound(err) {
			left = append(left, "fleet "+pooled)
		}
		for n := range pools(t, pooled) {
			left = append(left, "ProxyPool "+n)
		}
		pl := &v1alpha1.ProxyList{}
		if err := stack.Client.List(ctx, pl, client.InNamespace(ns), client.MatchingLabels{fleetv1alpha1.LabelFleet: pooled}); err != nil {
			return false, err.Error()
		}
		for _, p := range pl.Items {
			left = append(left, "Proxy "+p.Name)
		}
		ls, err := stack.Leases(ctx, ns, pooled)
		if err != nil {
			return false, err.Error()
		}
		for _, l := range ls {
			left = append(left, "Lease "+l.Name)
		}
		left = append(left, accessGrants(t, pooled)...)
		sort.Strings(left)
		return len(left) == 0, strings.Join(left, ", ")
	})
	t.Logf("the pooled fleet gone %.1fs after its delete", time.Since(deleted).Seconds())
}

// traced is a node of crossplane beta trace's JSON output.
type traced struct {
	Object   unstructured.Unstructured `json:"object"`
	Children []*traced                 `json:"children"`
}

// traceWalksPools runs crossplane beta trace on a pooled fleet, as
// docs/monitoring.md tells an operator to, and checks that it walks the
// fleet, its pools and each pool's Proxies: every one of want, under the
// pool its label names, and nothing twice.
func traceWalksPools(t *testing.T, fleet string, want []string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(stackRoot(), "bin", "crossplane"), "beta", "trace",
		"proxyfleet."+fleetv1alpha1.Group, fleet, "-n", ns, "-o", "json")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+stack.Kubeconfig)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("crossplane beta trace proxyfleet/%s: %v\n%s", fleet, err, stderr.String())
	}
	root := &traced{}
	if err := json.Unmarshal(out, root); err != nil {
		t.Fatalf("crossplane beta trace -o json printed no tree: %v\n%s", err, out)
	}
	if root.Object.GetKind() != fleetv1alpha1.ProxyFleetKind || root.Object.GetName() != fleet {
		t.Fatalf("trace's root is %s %s, want ProxyFleet %s", root.Object.GetKind(), root.Object.GetName(), fleet)
	}
	var got []string
	walked, have := 0, len(pools(t, fleet))
	for _, c := range root.Children {
		if c.Object.GetKind() != fleetv1alpha1.ProxyPoolKind {
			continue
		}
		walked++
		for _, p := range c.Children {
			if p.Object.GetKind() != "Proxy" {
				continue
			}
			got = append(got, p.Object.GetName())
			if l := p.Object.GetLabels()[fleetv1alpha1.LabelPool]; l != c.Object.GetName() {
				t.Errorf("trace shows Proxy %s under pool %s, but its label names pool %q", p.Object.GetName(), c.Object.GetName(), l)
			}
		}
	}
	sort.Strings(got)
	w := append([]string{}, want...)
	sort.Strings(w)
	if walked != have || strings.Join(got, " ") != strings.Join(w, " ") {
		t.Errorf("crossplane beta trace proxyfleet/%s walked %d pools and Proxies %v; want %d pools and %v", fleet, walked, got, have, w)
	}
	t.Logf("crossplane beta trace proxyfleet/%s walked %d pools and their %d Proxies", fleet, walked, len(got))
}

func mustProxies(t *testing.T, fleet string) []v1alpha1.Proxy {
	t.Helper()
	ps, err := proxies(fleet)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}
