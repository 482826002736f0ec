package discovery

// snapshot is a rendered listing.
type snapshot struct {
	version uint64
	second  int64
	body    []byte
}

// maxSnapshots bounds the snapshots kept, whatever queries callers send.
const maxSnapshots = 1024

// snapshot returns the listing rendered for key at the current version
// within the current second, if any.
func (s *Server) snapshot(key string) ([]byte, bool) {
	if s.Version == nil {
		return nil, false
	}
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	sn, ok := s.snaps[key]
	if !ok || sn.version != s.Version() || sn.second != s.Now().Unix() {
		return nil, false
	}
	return sn.body, true
}

// keep remembers a listing rendered at version within second.
func (s *Server) keep(key string, version uint64, second int64, body []byte) {
	if s.Version == nil {
		return
	}
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	if s.snaps == nil || len(s.snaps) >= maxSnapshots {
		s.snaps = map[string]snapshot{}
	}
	s.snaps[key] = snapshot{version: version, second: second, body: body}
}
