package discovery

import (
	"context"
	"net/http"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
)

// fail answers an error; one of discovery's own (5xx) is logged, unless
// the caller went away.
func (s *Server) fail(w http.ResponseWriter, err error) {
	e := problem.ToAPIError(err)
	if e.Code >= 500 && !errors.Is(err, context.Canceled) {
		s.Log.Info("Request failed", "error", err)
	}
	problem.WriteError(w, e)
}
