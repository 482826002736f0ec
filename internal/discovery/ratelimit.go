package discovery

import (
	"fmt"
	"math"
	"net/http"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
)

// limit refuses a request of an identity over its limit: 429 with
// Retry-After.
func (s *Server) limit(id *auth.Identity) error {
	if s.Limits == nil {
		return nil
	}
	ok, wait := s.Limits.Allow(id.User, s.now())
	if ok {
		return nil
	}
	secs := max(int(math.Ceil(wait.Seconds())), 1)
	return &problem.Error{
		Code: http.StatusTooManyRequests, Reason: apiv1.ReasonRateLimited, RetryAfter: secs,
		Msg: fmt.Sprintf("%s is over its limit of %g requests a second (burst %d): try again in %ds", id.User, float64(s.Limits.Rate), s.Limits.Burst, secs),
	}
}
