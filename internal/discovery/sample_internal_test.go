package discovery

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
)

// TestProxyEventsByFleet: a Proxy event moves its own fleet's version
// only; a relabelled Proxy moves both fleets'; a tombstone is unwrapped;
// an object that is no Proxy moves every fleet's; asking about a fleet
// stores nothing.
func TestProxyEventsByFleet(t *testing.T) {
	e := &proxyEvents{}
	proxy := func(ns, fleet string) *v1alpha1.Proxy {
		return &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p", Labels: map[string]string{fleetv1alpha1.LabelFleet: fleet}}}
	}
	f, g, h := e.version("ns/f"), e.version("ns/g"), e.version("other/f")
	e.bump(proxy("ns", "f"))
	if e.version("ns/f") == f || e.version("ns/g") != g || e.version("other/f") != h {
		t.Fatalf("an event of ns/f: versions %d %d %d from %d %d %d", e.version("ns/f"), e.version("ns/g"), e.version("other/f"), f, g, h)
	}
	f = e.version("ns/f")
	e.bump(toolscache.DeletedFinalStateUnknown{Key: "ns/p", Obj: proxy("ns", "g")})
	if e.version("ns/g") == g || e.version("ns/f") != f {
		t.Fatal("a tombstone of a Proxy of ns/g moves ns/g's version alone")
	}
	g = e.version("ns/g")
	e.bump(toolscache.DeletedFinalStateUnknown{Key: "ns/p", Obj: "not a proxy"})
	if e.version("ns/g") == g || e.version("ns/f") == f || e.version("never/asked") == 0 {
		t.Fatal("an event whose Proxy cannot be read moves every fleet's version")
	}
	n := 0
	e.byFleet.Range(func(any, any) bool { n++; return true })
	if n != 2 {
		t.Fatalf("versions asked of fleets without events stored %d counters, want the 2 of fleets with events", n)
	}
}

// TestDrawSample: a draw takes up to its limit of the members it keeps,
// each once, in random order, and looks at no more than its budget: a
// request few members admit does not walk the fleet.
func TestDrawSample(t *testing.T) {
	ms := make([]member, 1000)
	idx := make([]int32, len(ms))
	for i := range ms {
		ms[i].Name = fmt.Sprintf("p-%04d", i)
		idx[i] = int32(i)
	}
	budget := 1 << 20
	got := draw(ms, idx, nil, 32, &budget, func(*member) bool { return true })
	seen := map[string]bool{}
	for _, m := range got {
		if seen[m.Name] {
			t.Fatalf("%s drawn twice", m.Name)
		}
		seen[m.Name] = true
	}
	if len(got) != 32 || 1<<20-budget != 32 {
		t.Fatalf("all kept: want 32 drawn looking at 32, got %d looking at %d", len(got), 1<<20-budget)
	}
	// Uniform enough: over many draws every member is drawn.
	hits := map[string]int{}
	for range 400 {
		b := 1 << 20
		for _, m := range draw(ms, idx, nil, 32, &b, func(*member) bool { return true }) {
			hits[m.Name]++
		}
	}
	if len(hits) < 990 {
		t.Errorf("400 draws of 32 of 1000 reached %d members, want nearly all", len(hits))
	}
	// One member kept: the budget bounds the walk.
	budget = 256
	calls := 0
	draw(ms, idx, nil, 32, &budget, func(m *member) bool { calls++; return m.Name == "p-0500" })
	if calls > 256 || budget != 0 {
		t.Fatalf("one member of 1000 admitted, budget 256: %d looked at, %d left", calls, budget)
	}
	// Every member looked at once when the budget allows.
	budget, calls = 1<<20, 0
	got = draw(ms, idx, nil, 32, &budget, func(m *member) bool { calls++; return m.Name == "p-0500" })
	if len(got) != 1 || got[0].Name != "p-0500" || calls != len(ms) {
		t.Fatalf("one member of 1000 admitted: want it found looking at each once, got %d after %d", len(got), calls)
	}
}
