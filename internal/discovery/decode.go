package discovery

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/gateway"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
)

// errEmptyBody is decode's answer to a request without a body; a renew
// accepts it, every other request refuses it. A body cut short is not empty.
var errEmptyBody = &problem.BadRequest{Field: fieldBody, Msg: "is empty: send a JSON object"}

// fieldBody names the whole body as the field at fault.
const fieldBody = "body"

var domainRe = regexp.MustCompile(`^[a-zA-Z0-9]([-a-zA-Z0-9.]{0,251}[a-zA-Z0-9])?$`)

func decode(r *http.Request, into any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		// Decode returns io.EOF itself, unwrapped, only for no input at all.
		if err == io.EOF {
			return errEmptyBody
		}
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			return &problem.BadRequest{Field: ute.Field, Msg: fmt.Sprintf("must be a %s", ute.Type)}
		}
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return &problem.BadRequest{Field: strings.Trim(f, `"`), Msg: "is not a field of this request"}
		}
		return &problem.BadRequest{Field: fieldBody, Msg: "is not valid JSON: " + err.Error()}
	}
	// One object, and nothing after it.
	if dec.More() {
		return &problem.BadRequest{Field: fieldBody, Msg: "has more than one JSON value: send one object"}
	}
	return nil
}

// DecodeAcquire reads and validates an acquire request.
func DecodeAcquire(r *http.Request) (*apiv1.AcquireRequest, string, string, error) {
	req := &apiv1.AcquireRequest{}
	if err := decode(r, req); err != nil {
		return nil, "", "", err
	}
	ns, name, ok := strings.Cut(req.Fleet, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return nil, "", "", &problem.BadRequest{Field: "fleet", Msg: fmt.Sprintf("%q must be <namespace>/<name>", req.Fleet)}
	}
	if req.Holder == "" || len(req.Holder) > 253 {
		return nil, "", "", &problem.BadRequest{Field: "holder", Msg: "must name the crawler, in at most 253 characters"}
	}
	if strings.HasPrefix(req.Holder, gateway.HolderPrefix) {
		// The gateway finds a session's lease by its holder, and takes it
		// up on another replica: an API lease must not look like one.
		return nil, "", "", &problem.BadRequest{Field: "holder", Msg: fmt.Sprintf("%q begins with %q, which the gateway's own leases use", req.Holder, gateway.HolderPrefix)}
	}
	if req.Domain != "" && !domainRe.MatchString(req.Domain) {
		return nil, "", "", &problem.BadRequest{Field: "domain", Msg: fmt.Sprintf("%q is not a domain name", req.Domain)}
	}
	if len(req.StickyKey) > 1024 {
		return nil, "", "", &problem.BadRequest{Field: "stickyKey", Msg: "must be at most 1024 characters"}
	}
	if len(req.Zone) > 63 {
		return nil, "", "", &problem.BadRequest{Field: "zone", Msg: "must be at most 63 characters"}
	}
	return req, ns, name, nil
}
