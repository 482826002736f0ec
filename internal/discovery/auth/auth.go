// Package auth is who egress-discovery's callers are and what they may
// use: Kubernetes ServiceAccount tokens (a TokenReview, with the audience
// checked) and static tokens, authorised per fleet by a
// SubjectAccessReview for verb use on proxyfleets; the answers cached
// briefly, refused tokens apart from valid ones, and token reviews bounded
// per client address before authentication. The API, the status page's
// sign-in and the gateway authenticate through it.
//
// auth.go authenticates and authorises, metricsauth.go guards /metrics,
// cookie.go is the status page's sign-in cookie (and the checks of a
// sign-in form's origin and token), and limits.go is the token bucket per
// identity or address.
package auth

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/ttlcache"
)

// Errors of authentication and authorisation, answered 401 and 403: the
// problem package's, which answers them.
var (
	ErrUnauthenticated = problem.ErrUnauthenticated
	ErrForbidden       = problem.ErrForbidden
	ErrWrongAudience   = problem.ErrWrongAudience
)

// Identity is an authenticated caller.
type Identity struct {
	User   string
	Groups []string
	// Namespaces a static token may use; nil for Kubernetes identities,
	// which are authorised per fleet.
	Namespaces map[string]bool
	token      string
}

// Authenticator authenticates callers and authorises their use of fleets.
// AuthenticateToken takes the token itself, as the gateway reads it from
// Proxy-Authorization; Authenticate reads it from a request's
// Authorization bearer header.
type Authenticator interface {
	Authenticate(ctx context.Context, r *http.Request) (*Identity, error)
	AuthenticateToken(ctx context.Context, token string) (*Identity, error)
	Authorize(ctx context.Context, id *Identity, namespace, fleet string) error
}

// Bearer is the token of a request's Authorization bearer header.
func Bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if t, ok := strings.CutPrefix(h, "Bearer "); ok {
		return strings.TrimSpace(t)
	}
	return ""
}

// SeatIdentityPrefix begins the identity a gateway replica's seats are
// leased as: no token review passes for it.
const SeatIdentityPrefix = "egress-discovery:gateway-seats:"

// StaticPrefix begins the user name of a static token's identity; no
// Kubernetes identity may take such a name (it is refused), so that none
// can pass for a static token's, nor hold its leases.
const StaticPrefix = "static:"

// DefaultAudience is the audience discovery's tokens are issued for:
// kubectl create token <sa> --audience egress-discovery, or a projected
// serviceAccountToken volume with that audience.
const DefaultAudience = "egress-discovery"

func tokenKey(t string) string {
	s := sha256.Sum256([]byte(t))
	return hex.EncodeToString(s[:])
}

// KubernetesConfig is what NewKubernetes builds a Kubernetes from.
type KubernetesConfig struct {
	Client client.Client
	// TTL of cached answers; zero means DefaultAuthTTL.
	TTL time.Duration
	// CacheSize bounds the answers remembered, of each kind (token
	// reviews, access reviews); zero means DefaultAuthCacheSize. Refused
	// tokens are remembered apart, at most FailedCacheSize of them (zero
	// means DefaultFailedCacheSize), so that random tokens never push a
	// crawler's identity out.
	CacheSize, FailedCacheSize int
	// Reviews, when set, bound the token reviews made for each client
	// address (WithClientAddress), before authentication: a token already
	// reviewed costs nothing, one more over the bound is answered 429.
	Reviews *IdentityLimits
	// Audience, when set, is the audience a token must be issued for
	// (DefaultAudience): a token for the API server is refused, and one
	// sent here cannot be replayed against the API server.
	Audience string
	// Static, when set, is tried first: tokens for crawlers outside the
	// cluster.
	Static *StaticTokens
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Kubernetes authenticates ServiceAccount (or any) bearer tokens with a
// TokenReview and authorises with a SubjectAccessReview of verb "use" on
// proxyfleets.crawl.example.com in the fleet's namespace. Answers are
// cached briefly, keyed by a hash of the token, never the token itself.
// Build it with NewKubernetes.
type Kubernetes struct {
	KubernetesConfig

	mu     sync.Mutex
	authn  *ttlcache.Cache[reviewed]
	failed *ttlcache.Cache[error]
	authz  *ttlcache.Cache[bool]
}

// DefaultAuthCacheSize is how many token and access reviews are
// remembered, of each, by default; DefaultFailedCacheSize how many
// refused tokens.
const (
	DefaultAuthCacheSize   = 10000
	DefaultFailedCacheSize = 1024
)

// DefaultAuthTTL is how long a review's answer is remembered by default.
const DefaultAuthTTL = 30 * time.Second

// NewKubernetes builds a Kubernetes, its zero settings taking their
// defaults.
func NewKubernetes(cfg KubernetesConfig) *Kubernetes {
	if cfg.TTL == 0 {
		cfg.TTL = DefaultAuthTTL
	}
	if cfg.CacheSize <= 0 {
		cfg.CacheSize = DefaultAuthCacheSize
	}
	if cfg.FailedCacheSize <= 0 {
		cfg.FailedCacheSize = DefaultFailedCacheSize
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Kubernetes{
		KubernetesConfig: cfg,
		authn:            ttlcache.New[reviewed](cfg.CacheSize),
		authz:            ttlcache.New[bool](cfg.CacheSize),
		failed:           ttlcache.New[error](cfg.FailedCacheSize),
	}
}

// clientAddressKey keys a request's client address in its context.
type clientAddressKey struct{}

// WithClientAddress names the address a request came from, by which token
// reviews are bounded: its host without the port, an IPv6 one by its /64
// (one host's, however many addresses it takes from it).
func WithClientAddress(ctx context.Context, remoteAddr string) context.Context {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	if a, err := netip.ParseAddr(host); err == nil && a.Unmap().Is6() {
		host = netip.PrefixFrom(a, 64).Masked().String()
	}
	return context.WithValue(ctx, clientAddressKey{}, host)
}

// reviewed is an identity a token review gave, and when.
type reviewed struct {
	id *Identity
	at time.Time
}

// staleGrace is how long past its TTL an identity is still answered when
// its client address may have no review now (mayReview): a flood of new
// tokens from a shared address (a NAT, an ingress) cannot lock out the
// crawlers behind it whose tokens passed lately.
const staleGrace = 5 * time.Minute

// Authenticate reviews the request's bearer token.
func (k *Kubernetes) Authenticate(ctx context.Context, r *http.Request) (*Identity, error) {
	return k.AuthenticateToken(ctx, Bearer(r))
}

// AuthenticateToken reviews a bearer token: a static token's, or a
// ServiceAccount's (TokenReview with discovery's audience, cached).
func (k *Kubernetes) AuthenticateToken(ctx context.Context, t string) (*Identity, error) {
	if t == "" {
		return nil, ErrUnauthenticated
	}
	if k.Static != nil {
		if id := k.Static.lookup(t); id != nil {
			return id, nil
		}
	}
	key := tokenKey(t)
	k.mu.Lock()
	now := k.Now()
	last, seen := k.authn.Get(key, now, k.TTL+staleGrace)
	if seen && now.Sub(last.at) < k.TTL {
		k.mu.Unlock()
		return last.id, nil
	}
	if err, ok := k.failed.Get(key, now, k.TTL); ok {
		k.mu.Unlock()
		return nil, err
	}
	k.mu.Unlock()
	if err := k.mayReview(ctx); err != nil {
		if seen {
			return last.id, nil
		}
		return nil, err
	}

	tr := &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: t}}
	if k.Audience != "" {
		tr.Spec.Audiences = []string{k.Audience}
	}
	if err := k.Client.Create(ctx, tr); err != nil {
		return nil, errors.Wrap(err, "cannot review token")
	}
	var id *Identity
	var err error
	// An identity without a name could not own a lease, and one named as
	// a static token's, or as the gateway's seats, could pass for it.
	switch u := tr.Status.User.Username; {
	case tr.Status.Authenticated && u != "" && !strings.HasPrefix(u, StaticPrefix) && !strings.HasPrefix(u, SeatIdentityPrefix) && k.audienceOK(tr.Status.Audiences):
		id = &Identity{User: u, Groups: tr.Status.User.Groups, token: key}
	case k.Audience != "" && (tr.Status.Authenticated || !jwtFor(t, k.Audience)):
		// Refused either way; the answer says why, when the token says
		// whom it was issued for. Its claims are read, never trusted:
		// the TokenReview decided.
		err = ErrWrongAudience
	default:
		err = ErrUnauthenticated
	}
	k.mu.Lock()
	if err != nil {
		k.failed.Add(key, err, k.Now())
	} else {
		k.authn.Add(key, reviewed{id: id, at: k.Now()}, k.Now())
	}
	k.mu.Unlock()
	return id, err
}

// mayReview takes a token review from the client address's bucket, or
// refuses it (429): a caller sending token after token cannot make the
// API server review them at any rate it likes.
func (k *Kubernetes) mayReview(ctx context.Context) error {
	if k.Reviews == nil {
		return nil
	}
	addr, _ := ctx.Value(clientAddressKey{}).(string)
	ok, wait := k.Reviews.Allow(addr, k.Now())
	if ok {
		return nil
	}
	secs := max(int(math.Ceil(wait.Seconds())), 1)
	return &problem.Error{
		Code: http.StatusTooManyRequests, Reason: apiv1.ReasonRateLimited, RetryAfter: secs,
		Msg: fmt.Sprintf("too many new tokens from %s (over %g reviews a second, burst %d): try again in %ds", addr, float64(k.Reviews.Rate), k.Reviews.Burst, secs),
	}
}

// jwtFor says whether a token is not a JWT, or is one whose unverified
// aud claim names audience: only a JWT for another audience is false.
func jwtFor(token, audience string) bool {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || len(parts[1]) > 8<<10 {
		return true
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return true
	}
	var claims struct {
		Aud json.RawMessage `json:"aud"`
	}
	if json.Unmarshal(raw, &claims) != nil || len(claims.Aud) == 0 {
		return true
	}
	var auds []string
	if json.Unmarshal(claims.Aud, &auds) != nil {
		var one string
		if json.Unmarshal(claims.Aud, &one) != nil {
			return true
		}
		auds = []string{one}
	}
	return slices.Contains(auds, audience)
}

// audienceOK says whether a reviewed token was issued for k's audience.
func (k *Kubernetes) audienceOK(got []string) bool {
	return k.Audience == "" || slices.Contains(got, k.Audience)
}

// Authorize asks the API server whether id may use the fleet.
func (k *Kubernetes) Authorize(ctx context.Context, id *Identity, namespace, fleet string) error {
	if id.Namespaces != nil {
		if id.Namespaces[namespace] || id.Namespaces["*"] {
			return nil
		}
		return ErrForbidden
	}
	// Hashed: a key never grows with what the caller sends.
	key := tokenKey(id.token + "\x00" + namespace + "\x00" + fleet)
	k.mu.Lock()
	if allowed, ok := k.authz.Get(key, k.Now(), k.TTL); ok {
		k.mu.Unlock()
		if !allowed {
			return ErrForbidden
		}
		return nil
	}
	k.mu.Unlock()
	// A team may hold "use" on the namespaced ProxyFleet, or, on the
	// legacy path, on the ProxyFleetClaim of the same name.
	allowed := false
	for _, resource := range []string{fleetv1alpha1.ProxyFleetResource, fleetv1alpha1.ProxyFleetClaimResource} {
		sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User: id.User, Groups: id.Groups,
			ResourceAttributes: &authzv1.ResourceAttributes{
				Namespace: namespace, Verb: "use", Group: fleetv1alpha1.Group, Resource: resource, Name: fleet,
			},
		}}
		if err := k.Client.Create(ctx, sar); err != nil {
			return errors.Wrap(err, "cannot review access")
		}
		if allowed = sar.Status.Allowed; allowed {
			break
		}
	}
	k.mu.Lock()
	k.authz.Add(key, allowed, k.Now())
	k.mu.Unlock()
	if !allowed {
		return ErrForbidden
	}
	return nil
}

// StaticTokens maps tokens to the namespaces whose fleets they may use.
type StaticTokens struct {
	byHash map[string]*Identity
}

// What LoadStaticTokens refuses of a token file's line: its number first.
const (
	errFmtTokenLine      = "token file line %d: want \"<token> <namespace>[,<namespace>...] [name]\""
	errFmtTokenName      = "token file line %d: name %q: %s"
	errFmtTokenReused    = "token file line %d: a token given on an earlier line: give each line its own token"
	errFmtSameIdentity   = "token file line %d: the same identity %s as line %d: give each token its own name (and token)"
	errFmtTokenNamespace = "token file line %d: %q is not a namespace (nor *, for all)"
)

// LoadStaticTokens reads a token file: one "token namespace[,namespace...]
// [name]" per line ("*" for all), # comments allowed. A named token's
// identity is static:<name>, which quota overrides (staticToken) and the
// status page show; an unnamed one's is static: and 16 hex digits of its
// hash.
func LoadStaticTokens(path string) (*StaticTokens, error) {
	f, err := os.Open(path) //nolint:gosec // The operator names the file.
	if err != nil {
		return nil, errors.Wrap(err, "cannot open token file")
	}
	defer f.Close() //nolint:errcheck // Read-only.
	s := &StaticTokens{byHash: map[string]*Identity{}}
	users := map[string]int{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 && len(fields) != 3 {
			return nil, errors.Errorf(errFmtTokenLine, n)
		}
		// 64 bits of the token's hash: distinct for any set of tokens,
		// and no help in guessing one.
		user := StaticPrefix + tokenKey(fields[0])[:16]
		if len(fields) == 3 {
			if errs := validation.IsDNS1123Label(fields[2]); len(errs) > 0 {
				return nil, errors.Errorf(errFmtTokenName, n, fields[2], strings.Join(errs, "; "))
			}
			user = StaticPrefix + fields[2]
		}
		if _, dup := s.byHash[tokenKey(fields[0])]; dup {
			return nil, errors.Errorf(errFmtTokenReused, n)
		}
		if prev, dup := users[user]; dup {
			return nil, errors.Errorf(errFmtSameIdentity, n, user, prev)
		}
		users[user] = n
		id := &Identity{User: user, Namespaces: map[string]bool{}}
		for _, ns := range strings.Split(fields[1], ",") {
			if ns != "*" && len(validation.IsDNS1123Label(ns)) > 0 {
				return nil, errors.Errorf(errFmtTokenNamespace, n, ns)
			}
			id.Namespaces[ns] = true
		}
		s.byHash[tokenKey(fields[0])] = id
	}
	return s, errors.Wrap(sc.Err(), "cannot read token file")
}

func (s *StaticTokens) lookup(t string) *Identity { return s.byHash[tokenKey(t)] }
