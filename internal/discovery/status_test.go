package discovery

import (
	"bytes"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
)

// bigFleet is a pooled fleet of n proxies in pools of 125 over three
// zones, some unhealthy and some draining.
func bigFleet(n int) ([]catalog.Member, map[string]int) {
	ms := make([]catalog.Member, 0, n)
	leases := map[string]int{}
	for i := range n {
		m := catalog.Member{Namespace: "team", Fleet: "crawlers", Name: fmt.Sprintf("crawlers-%d", 10000000*(1+i/125)+i%125),
			Zone: []string{"a", "b", "c"}[i%3], Pool: fmt.Sprintf("crawlers-pool-%d", 1+i/125), Healthy: true, MaxLeases: 10,
			Host: "127.0.0.1", Port: 3128, EgressIP: fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255)}
		switch {
		case i%1000 == 7:
			m.Healthy, m.Problem = false, "proxy 127.0.0.1:3128 refused the connection"
		case i%2000 == 11:
			m.DrainSince = time.Unix(1764500000, 0)
		}
		if i%10 == 0 {
			leases[m.Name] = 10
		}
		ms = append(ms, m)
	}
	return ms, leases
}

// TestStatusSummarisesLargeFleets: a fleet of 10 000 proxies is summarised
// (counts per pool and zone over all of them), its proxies at fault come
// first with why, and it is listed a page at a time, filtered by pool, zone
// or faults; the rendered page stays small.
func TestStatusSummarisesLargeFleets(t *testing.T) {
	ms, leases := bigFleet(10000)
	f := summarise("team", "crawlers", ms, leases, nil, nil, statusQuery{})
	if f.Total != 10000 || f.Healthy != 9990 || f.Faults != 15 {
		t.Errorf("counts: %d proxies, %d healthy, %d at fault; want 10000, 9990, 15", f.Total, f.Healthy, f.Faults)
	}
	if len(f.Pools) != 80 || len(f.Zones) != 3 {
		t.Errorf("want 80 pools and 3 zones summarised, got %d and %d", len(f.Pools), len(f.Zones))
	}
	if g := f.Pools[0]; g.Proxies != 125 || g.Capacity != 1250 || g.Leases != 130 {
		t.Errorf("pool %s: %+v; want 125 proxies, capacity 1250, 130 leases", g.Name, g)
	}
	if len(f.Shown) != statusRows || f.Next == "" || f.Prev != "" || f.Matching != 10000 {
		t.Errorf("the first page: %d shown of %d, next %q, prev %q", len(f.Shown), f.Matching, f.Next, f.Prev)
	}
	for i, p := range f.Shown[:15] {
		if p.Why == "" {
			t.Fatalf("row %d (%s) is not at fault: those at fault come first", i, p.Name)
		}
	}
	if w := f.Shown[0].Why; !strings.Contains(w, "unhealthy: proxy 127.0.0.1:3128 refused the connection") && !strings.Contains(w, "draining since") {
		t.Errorf("why: %q", w)
	}
	if f.Shown[15].Why != "" {
		t.Errorf("row 15 says %q: only 15 are at fault", f.Shown[15].Why)
	}

	// The next link, followed, and a page past the end.
	u, err := url.Parse(f.Next)
	if err != nil {
		t.Fatal(err)
	}
	next := summarise("team", "crawlers", ms, leases, nil, nil, parseStatusQuery(u.Query()))
	if next.First != statusRows+1 || next.Prev == "" {
		t.Errorf("page 2 starts at %d (want %d), prev %q", next.First, statusRows+1, next.Prev)
	}
	last := summarise("team", "crawlers", ms, leases, nil, nil, statusQuery{page: 1 << 30})
	if last.Last != 10000 || last.Next != "" || len(last.Shown) != statusRows {
		t.Errorf("a page past the end shows the last one: %d-%d, next %q", last.First, last.Last, last.Next)
	}
	huge := summarise("team", "crawlers", ms, leases, nil, nil, parseStatusQuery(url.Values{"page": {"999999999999999999"}}))
	if huge.Last != 10000 {
		t.Errorf("a page number past any count shows the last page: %d-%d", huge.First, huge.Last)
	}
	faults := summarise("team", "crawlers", ms, leases, nil, nil, statusQuery{faults: true})
	if faults.Matching != 15 || len(faults.Shown) != 15 {
		t.Errorf("show=faults: %d matching, %d shown; want 15", faults.Matching, len(faults.Shown))
	}
	pool := summarise("team", "crawlers", ms, leases, nil, nil, statusQuery{pool: "crawlers-pool-3", zone: "b"})
	if pool.Matching < 41 || pool.Matching > 42 {
		t.Errorf("pool 3, zone b: %d proxies, want 41 or 42", pool.Matching)
	}

	var buf bytes.Buffer
	start := time.Now()
	if err := statusTemplate.Execute(&buf, struct {
		Fleets   []statusFleet
		Now      string
		SignedIn bool
		Filter   string
	}{[]statusFleet{f}, "now", false, ""}); err != nil {
		t.Fatal(err)
	}
	t.Logf("the page of a 10 000-proxy fleet: %d bytes, rendered in %s", buf.Len(), time.Since(start))
	if buf.Len() > 100_000 {
		t.Errorf("the page of a 10 000-proxy fleet is %d bytes: it must summarise, not list every proxy", buf.Len())
	}
	for _, want := range []string{"9990/10000 healthy", "crawlers-pool-80", "at fault", "refused the connection", "next</a>"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}
