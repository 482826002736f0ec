package allocator

import (
	"fmt"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
)

// TestDrawSample: a draw takes up to its limit of the members it keeps,
// each once, in random order, and looks at no more than its budget: a
// request few members admit does not walk the fleet.
func TestDrawSample(t *testing.T) {
	ms := make([]catalog.Member, 1000)
	idx := make([]int32, len(ms))
	for i := range ms {
		ms[i].Name = fmt.Sprintf("p-%04d", i)
		idx[i] = int32(i)
	}
	budget := 1 << 20
	got := Draw(ms, idx, nil, 32, &budget, func(*catalog.Member) bool { return true })
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
		for _, m := range Draw(ms, idx, nil, 32, &b, func(*catalog.Member) bool { return true }) {
			hits[m.Name]++
		}
	}
	if len(hits) < 990 {
		t.Errorf("400 draws of 32 of 1000 reached %d members, want nearly all", len(hits))
	}
	// One member kept: the budget bounds the walk.
	budget = 256
	calls := 0
	Draw(ms, idx, nil, 32, &budget, func(m *catalog.Member) bool { calls++; return m.Name == "p-0500" })
	if calls > 256 || budget != 0 {
		t.Fatalf("one member of 1000 admitted, budget 256: %d looked at, %d left", calls, budget)
	}
	// Every member looked at once when the budget allows.
	budget, calls = 1<<20, 0
	got = Draw(ms, idx, nil, 32, &budget, func(m *catalog.Member) bool { calls++; return m.Name == "p-0500" })
	if len(got) != 1 || got[0].Name != "p-0500" || calls != len(ms) {
		t.Fatalf("one member of 1000 admitted: want it found looking at each once, got %d after %d", len(got), calls)
	}
}
