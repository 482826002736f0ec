package allocator

import (
	"fmt"
	"testing"
	"time"
)

// TestSpreadQuantiles: ten proxies carrying 1 to 10 connections and an
// eleventh serving none: least 0, median 5 (nearest rank), 90th
// percentile 9, most 10; ten of eleven used. Connections older than the
// window do not count.
func TestSpreadQuantiles(t *testing.T) {
	var b spreadBook
	now := time.Unix(1_800_000_000, 0)
	var serving []string
	for i := 1; i <= 10; i++ {
		p := fmt.Sprintf("p%d", i)
		serving = append(serving, p)
		for range i {
			b.record("ns/f", p, now)
		}
	}
	b.record("ns/f", "p1", now.Add(-11*time.Minute))
	serving = append(serving, "idle")
	got := b.of("ns/f", serving, now)
	want := Spread{Connections: 55, Used: 10, Serving: 11, Min: 0, Median: 5, P90: 9, Max: 10}
	if got != want {
		t.Errorf("spread %+v, want %+v", got, want)
	}
	if later := b.of("ns/f", serving, now.Add(10*time.Minute)); later.Connections != 0 {
		t.Errorf("10 minutes on, %d connections still counted", later.Connections)
	}
}
