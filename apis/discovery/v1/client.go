package v1

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// Client talks to egress-discovery.
type Client struct {
	// BaseURL of the discovery service, such as
	// https://egress-discovery.egress-system.svc.
	BaseURL string
	// Token is sent as a bearer token: a ServiceAccount token or a static one.
	Token string
	// TokenFile is a file holding the bearer token, such as a projected
	// ServiceAccount token. It is read again for every request, because
	// the kubelet rewrites a projected token before it expires, so a token
	// read once stops working within the hour. Surrounding white space is
	// trimmed. Setting both Token and TokenFile is an error on every
	// request, as nothing says which of the two the caller meant.
	TokenFile string
	// HTTP is the client to use; nil means http.DefaultClient. NewHTTPClient
	// makes one that trusts a private CA.
	HTTP *http.Client
}

// NewHTTPClient returns an HTTP client for Client.HTTP that trusts only the
// CA certificates in the PEM file caFile, such as the CA that signs
// egress-discovery's certificate: a bearer token must reach discovery and
// nobody else, so the system's public CAs are not trusted alongside it.
// An empty caFile returns a client that trusts the system's CAs.
func NewHTTPClient(caFile string) (*http.Client, error) {
	if caFile == "" {
		return &http.Client{}, nil
	}
	bundle, err := os.ReadFile(caFile)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read the CA bundle")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		return nil, errors.Errorf("the CA bundle %s holds no PEM certificate", caFile)
	}
	// A clone keeps the default's proxy settings, timeouts and HTTP/2.
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: t}, nil
}

// APIError is an error answer.
type APIError struct {
	Status     int
	RetryAfter string
	Detail     ErrorDetail
}

func (e *APIError) Error() string {
	return fmt.Sprintf("egress-discovery: %d %s", e.Status, e.Detail.Message)
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.BaseURL, "/")+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	token, err := c.token()
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	h := c.HTTP
	if h == nil {
		h = http.DefaultClient
	}
	resp, err := h.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close() //nolint:errcheck // Read-only.
	if resp.StatusCode >= 300 {
		e := &APIError{Status: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After")}
		var eb Error
		if json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&eb) == nil {
			e.Detail = eb.Error
		}
		return e
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// token is the bearer token to send now: Token, or what TokenFile holds.
func (c *Client) token() (string, error) {
	if c.TokenFile == "" {
		return c.Token, nil
	}
	if c.Token != "" {
		return "", errors.Errorf("both a token and the token file %s are set: set one", c.TokenFile)
	}
	b, err := os.ReadFile(c.TokenFile)
	if err != nil {
		return "", errors.Wrap(err, "cannot read the token file")
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		// Sending no token would only earn a 401 that does not say why.
		return "", errors.Errorf("the token file %s is empty", c.TokenFile)
	}
	return token, nil
}

// Acquire takes a lease.
func (c *Client) Acquire(ctx context.Context, r AcquireRequest) (*Lease, error) {
	l := &Lease{}
	return l, c.do(ctx, http.MethodPost, "/v1/leases", r, l)
}

// Renew extends a lease.
func (c *Client) Renew(ctx context.Context, leaseID, ttl string) (*Lease, error) {
	l := &Lease{}
	return l, c.do(ctx, http.MethodPost, "/v1/leases/"+leaseID+"/renew", RenewRequest{TTL: ttl}, l)
}

// Release gives a lease back.
func (c *Client) Release(ctx context.Context, leaseID string) error {
	return c.do(ctx, http.MethodDelete, "/v1/leases/"+leaseID, nil, nil)
}

// Report tells how the leased proxy fared with a domain.
func (c *Client) Report(ctx context.Context, leaseID string, r ReportRequest) error {
	return c.do(ctx, http.MethodPost, "/v1/leases/"+leaseID+"/report", r, nil)
}

// Proxies lists a fleet's healthy proxies; fleet is <namespace>/<name>.
func (c *Client) Proxies(ctx context.Context, fleet string, zone string) (*ProxyList, error) {
	l := &ProxyList{}
	q := ""
	if zone != "" {
		q = "?zone=" + url.QueryEscape(zone)
	}
	return l, c.do(ctx, http.MethodGet, "/v1/fleets/"+fleet+"/proxies"+q, nil, l)
}

// Fleets lists the fleets the caller may use.
func (c *Client) Fleets(ctx context.Context) (*FleetList, error) {
	l := &FleetList{}
	return l, c.do(ctx, http.MethodGet, "/v1/fleets", nil, l)
}
