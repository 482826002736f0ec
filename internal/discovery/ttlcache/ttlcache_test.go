package ttlcache

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestTTLCache(t *testing.T) {
	now := time.Unix(1000, 0)
	c := New[int](3)
	for i := range 5 {
		c.Add(fmt.Sprint(i), i, now)
	}
	if c.Len() != 3 {
		t.Fatalf("the cache holds %d entries, want at most 3", c.Len())
	}
	if _, ok := c.Get("0", now, time.Minute); ok {
		t.Error("the least recently used entry must have been evicted")
	}
	// Using 2 makes 3 the least recently used.
	if v, ok := c.Get("2", now, time.Minute); !ok || v != 2 {
		t.Fatalf("entry 2: %d %v", v, ok)
	}
	c.Add("5", 5, now)
	if _, ok := c.Get("3", now, time.Minute); ok {
		t.Error("after 2 was used, 3 is the one to go")
	}
	if _, ok := c.Get("2", now.Add(time.Minute), time.Minute); ok {
		t.Error("an entry as old as the TTL is expired")
	}
	if _, ok := c.Get("4", now.Add(-time.Second), time.Minute); ok {
		t.Error("an entry from the future (a clock set back) is not trusted")
	}
}

// TestKeys: Keys yields every key held, most recently used first, and
// stops when told to.
func TestKeys(t *testing.T) {
	now := time.Unix(1000, 0)
	c := New[int](3)
	for i := range 4 {
		c.Add(fmt.Sprint(i), i, now)
	}
	c.Get("1", now, time.Minute)
	var got []string
	for k := range c.Keys() {
		got = append(got, k)
	}
	if strings.Join(got, ",") != "1,3,2" {
		t.Errorf("keys %v, want 1,3,2 (0 evicted, 1 used last)", got)
	}
	for range c.Keys() {
		break
	}
}
