package lease

import (
	"time"
)

// What a replica remembers of its own grants, releases and taken slots,
// which its cache may not show yet: it orders attempts, never decides.

type grantedEntry struct {
	identity string
	until    time.Time
	// stuck is the sticky memory's key the grant made, if any: its
	// release forgets it.
	stuck string
}

// grantRemembered is how long a grant's identity is remembered: long
// enough for a crawler that releases at once; later ones are read.
const grantRemembered = time.Minute

// remember notes a grant; every 1024 grants, those remembered past
// grantRemembered (or their expiry) are forgotten, so the map holds at most
// a minute of grants.
func (s *Store) remember(g *Grant, identity, stuck string) {
	s.granted.Store(g.ID, grantedEntry{identity: identity, until: minTime(g.ExpiresAt, s.Now().Add(grantRemembered)), stuck: stuck})
	if s.grantsSince.Add(1)%1024 != 0 {
		return
	}
	now := s.Now()
	s.granted.Range(func(k, v any) bool {
		if now.After(v.(grantedEntry).until) { //nolint:forcetypeassert // Only entries are stored.
			s.granted.Delete(k)
		}
		return true
	})
	s.freed.Range(func(k, v any) bool {
		if now.After(v.(time.Time)) { //nolint:forcetypeassert // Only times are stored.
			s.freed.Delete(k)
		}
		return true
	})
	s.stuck.Range(func(k, v any) bool {
		if now.After(v.(stuckEntry).until) { //nolint:forcetypeassert // Only entries are stored.
			s.stuck.Delete(k)
		}
		return true
	})
}

// recentlyTaken is how long a slot this replica saw taken is tried last.
const recentlyTaken = time.Second

func (s *Store) noteTaken(key string) {
	s.freed.Delete(key)
	s.recent.Store(key, s.Now().Add(recentlyTaken))
}

// freedLately says whether this replica released the slot within
// recentlyTaken.
func (s *Store) freedLately(key string) bool {
	v, ok := s.freed.Load(key)
	if !ok {
		return false
	}
	if s.Now().After(v.(time.Time)) { //nolint:forcetypeassert // Only times are stored.
		s.freed.Delete(key)
		return false
	}
	return true
}

func (s *Store) seenTaken(key string) bool {
	v, ok := s.recent.Load(key)
	if !ok {
		return false
	}
	if s.Now().After(v.(time.Time)) {
		s.recent.Delete(key)
		return false
	}
	return true
}
