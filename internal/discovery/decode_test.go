package discovery

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/google/go-cmp/cmp"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
)

// fieldOf is the request field a 400 names, "" for any other error and
// "<nil>" for none.
func fieldOf(err error) string {
	var br *problem.BadRequest
	switch {
	case err == nil:
		return "<nil>"
	case errors.As(err, &br):
		return br.Field
	default:
		return ""
	}
}

func post(body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/leases", strings.NewReader(body))
	r.Body = http.MaxBytesReader(httptest.NewRecorder(), r.Body, maxBody)
	return r
}

func TestDecodeAcquire(t *testing.T) {
	type want struct {
		req       *apiv1.AcquireRequest
		ns, fleet string
		field     string
	}
	cases := map[string]struct {
		reason string
		body   string
		want   want
	}{
		"Full": {
			reason: "Every field is read, and the fleet split into namespace and name.",
			body:   `{"fleet": "team-a/crawlers", "holder": "scrapy-1", "ttl": "2m", "zone": "zone-a", "stickyKey": "s1", "domain": "shop.example"}`,
			want: want{
				req: &apiv1.AcquireRequest{Fleet: "team-a/crawlers", Holder: "scrapy-1", TTL: "2m", Zone: "zone-a", StickyKey: "s1", Domain: "shop.example"},
				ns:  "team-a", fleet: "crawlers", field: "<nil>",
			},
		},
		"Minimal":          {reason: "Fleet and holder are all that is required.", body: `{"fleet": "a/b", "holder": "h"}`, want: want{req: &apiv1.AcquireRequest{Fleet: "a/b", Holder: "h"}, ns: "a", fleet: "b", field: "<nil>"}},
		"LongestHolder":    {reason: "A holder may have 253 characters.", body: `{"fleet": "a/b", "holder": "` + strings.Repeat("h", 253) + `"}`, want: want{req: &apiv1.AcquireRequest{Fleet: "a/b", Holder: strings.Repeat("h", 253)}, ns: "a", fleet: "b", field: "<nil>"}},
		"FleetNoSlash":     {reason: "The fleet is <namespace>/<name>.", body: `{"fleet": "crawlers", "holder": "h"}`, want: want{field: "fleet"}},
		"FleetNoNamespace": {reason: "The namespace is required.", body: `{"fleet": "/crawlers", "holder": "h"}`, want: want{field: "fleet"}},
		"FleetNoName":      {reason: "The name is required.", body: `{"fleet": "a/", "holder": "h"}`, want: want{field: "fleet"}},
		"FleetThreeParts":  {reason: "A name has no slash.", body: `{"fleet": "a/b/c", "holder": "h"}`, want: want{field: "fleet"}},
		"NoHolder":         {reason: "The holder is required.", body: `{"fleet": "a/b"}`, want: want{field: "holder"}},
		"HolderTooLong":    {reason: "A holder has at most 253 characters.", body: `{"fleet": "a/b", "holder": "` + strings.Repeat("h", 254) + `"}`, want: want{field: "holder"}},
		"GatewayHolder":    {reason: "The gateway's holders are its own: an API lease taken as a session's would be taken up by the gateway.", body: `{"fleet": "a/b", "holder": "gateway-session:s1"}`, want: want{field: "holder"}},
		"BadDomain":        {reason: "The domain is a domain name.", body: `{"fleet": "a/b", "holder": "h", "domain": "not a domain"}`, want: want{field: "domain"}},
		"StickyKeyTooLong": {reason: "A sticky key has at most 1024 characters.", body: `{"fleet": "a/b", "holder": "h", "stickyKey": "` + strings.Repeat("k", 1025) + `"}`, want: want{field: "stickyKey"}},
		"WrongType":        {reason: "A field of the wrong type is named.", body: `{"fleet": 7}`, want: want{field: "fleet"}},
		"UnknownField":     {reason: "A misspelt field is named, not ignored.", body: `{"fleet": "a/b", "holdr": "h"}`, want: want{field: "holdr"}},
		"NotJSON":          {reason: "A body that is not JSON is the body's fault.", body: `fleet=a/b`, want: want{field: "body"}},
		"Empty":            {reason: "An empty body is the body's fault.", want: want{field: "body"}},
		"TooLarge":         {reason: "A body over the limit is not a 400: it is answered 413.", body: `{"holder": "` + strings.Repeat("h", maxBody) + `"}`, want: want{field: ""}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			req, ns, fleet, err := DecodeAcquire(post(tc.body))
			got := want{req: req, ns: ns, fleet: fleet, field: fieldOf(err)}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("%s\nDecodeAcquire: -want, +got:\n%s\nerror: %v", tc.reason, diff, err)
			}
		})
	}
}

func TestParseTTL(t *testing.T) {
	const def, maxTTL = 10 * time.Minute, 30 * time.Minute
	type want struct {
		ttl   time.Duration
		field string
	}
	cases := map[string]struct {
		reason string
		in     string
		want   want
	}{
		"Empty":         {reason: "No TTL means the default.", in: "", want: want{ttl: def, field: "<nil>"}},
		"Duration":      {reason: "A Go duration is read.", in: "2m30s", want: want{ttl: 150 * time.Second, field: "<nil>"}},
		"Seconds":       {reason: "A bare number is seconds.", in: "600", want: want{ttl: 10 * time.Minute, field: "<nil>"}},
		"AtMax":         {reason: "The maximum itself is allowed.", in: "30m", want: want{ttl: maxTTL, field: "<nil>"}},
		"OverMax":       {reason: "More than the fleet's maxTTL is refused.", in: "31m", want: want{field: "ttl"}},
		"OneSecond":     {reason: "One second is the shortest lease.", in: "1s", want: want{ttl: time.Second, field: "<nil>"}},
		"UnderASecond":  {reason: "A lease shorter than a second is refused.", in: "999ms", want: want{field: "ttl"}},
		"Zero":          {reason: "Zero is not a lease.", in: "0", want: want{field: "ttl"}},
		"Negative":      {reason: "A negative duration is refused.", in: "-5m", want: want{field: "ttl"}},
		"NotADuration":  {reason: "Words are refused.", in: "ten minutes", want: want{field: "ttl"}},
		"NumberTooLong": {reason: "Seconds beyond the maximum are refused.", in: "1801", want: want{field: "ttl"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ttl, err := allocator.ParseTTL("ttl", tc.in, def, maxTTL)
			got := want{ttl: ttl, field: fieldOf(err)}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("%s\nparseTTL(%q): -want, +got:\n%s\nerror: %v", tc.reason, tc.in, diff, err)
			}
		})
	}
}

func TestDecodeRenewBody(t *testing.T) {
	cases := map[string]struct {
		reason    string
		body      string
		wantEmpty bool
		wantField string
	}{
		"Empty":     {reason: "A renew may have no body: the fleet's default TTL applies.", wantEmpty: true, wantField: "body"},
		"TTL":       {reason: "A renew may name its TTL.", body: `{"ttl": "5m"}`, wantField: "<nil>"},
		"NotJSON":   {reason: "A body that is not JSON is no empty body.", body: `ttl=5m`, wantField: "body"},
		"Truncated": {reason: "A body cut short is no empty body: the renew must fail, not take the default TTL.", body: `{"ttl": `, wantField: "body"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := decode(post(tc.body), &apiv1.RenewRequest{})
			if got := fieldOf(err); got != tc.wantField {
				t.Errorf("%s\nwant field %q, got %q (%v)", tc.reason, tc.wantField, got, err)
			}
			if got := errors.Is(err, errEmptyBody); got != tc.wantEmpty {
				t.Errorf("%s\nempty body: want %t, got %t (%v)", tc.reason, tc.wantEmpty, got, err)
			}
		})
	}
}
