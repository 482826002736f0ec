package discovery

import (
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
)

// limit refuses a request of an identity over its limit (Limits): 429 with
// Retry-After.
func (s *Server) limit(id *auth.Identity) error { return s.Limits.Check(id, s.Now()) }
