package discovery

import (
	"fmt"
	"testing"
	"time"
)

func TestSnapshot(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	var version uint64 = 7
	s := NewServer(ServerConfig{Now: func() time.Time { return now }, Version: func() uint64 { return version }})
	const key = "ns/crawlers?zone=a"
	hit := func() string {
		b, ok := s.snapshot(key)
		if !ok {
			return "<miss>"
		}
		return string(b)
	}

	if got := hit(); got != "<miss>" {
		t.Errorf("nothing kept yet: want a miss, got %q", got)
	}
	s.keep(key, version, now.Unix(), []byte("body-7"))
	if got := hit(); got != "body-7" {
		t.Errorf("same version, same second: want the kept body, got %q", got)
	}
	if _, ok := s.snapshot("ns/crawlers?zone=b"); ok {
		t.Error("another query is another snapshot")
	}
	now = now.Add(999 * time.Millisecond)
	if got := hit(); got != "body-7" {
		t.Errorf("later in the same second: want the kept body, got %q", got)
	}
	now = now.Add(time.Millisecond)
	if got := hit(); got != "<miss>" {
		t.Errorf("the next second (leases expire with time): want a miss, got %q", got)
	}
	s.keep(key, version, now.Unix(), []byte("body-7b"))
	version++
	if got := hit(); got != "<miss>" {
		t.Errorf("a watched object changed: want a miss, got %q", got)
	}
	s.keep(key, version-1, now.Unix(), []byte("stale"))
	if got := hit(); got != "<miss>" {
		t.Errorf("a body rendered at the version before must not be served, got %q", got)
	}

	for i := range maxSnapshots {
		s.keep(fmt.Sprintf("q%d", i), version, now.Unix(), []byte("x"))
	}
	if n := len(s.snaps); n > maxSnapshots {
		t.Errorf("snapshots are bounded by %d whatever callers ask, got %d", maxSnapshots, n)
	}

	unversioned := NewServer(ServerConfig{})
	unversioned.keep(key, 0, 0, []byte("body"))
	if _, ok := unversioned.snapshot(key); ok || unversioned.snaps != nil {
		t.Error("without a version source nothing is kept or served")
	}
}
