package catalog

import (
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
