// Package discovery is egress-discovery's HTTP API: crawlers list a fleet's
// healthy proxies and lease them (TTL, renew, release, at most maxLeases
// holders per proxy), report bans per domain, and read a status page. Every
// replica serves; all state is in the API server.
package discovery

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pkg/errors"
	"github.com/prometheus/client_golang/prometheus"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// maxBody bounds request bodies.
const maxBody = 16 << 10

//go:embed openapi.json
var openAPI []byte

// Server is the HTTP API.
type Server struct {
	Catalog *Catalog
	Leases  *lease.Store
	Auth    Authenticator
	Metrics *Metrics
	Log     logging.Logger
	Now     func() time.Time
	// Version, when set, changes whenever a watched Proxy or Lease does.
	// Listings are then answered from a snapshot rendered at the same
	// version within the same second (leases also expire with time), so a
	// crawler fleet polling a large fleet costs little.
	Version func() uint64
	// Limits, when set, bound each identity's request rate: over it, a
	// request is answered 429 with Retry-After.
	Limits *IdentityLimits
	// MaxBansPerFleet and MaxBansPerIdentity bound the live bans of a
	// fleet, and of the identities reporting them in it; zero sets no
	// bound. A ban over either is answered 429.
	MaxBansPerFleet, MaxBansPerIdentity int

	// banRecord serialises the bound check and the write of a ban;
	// bansMade are the bans this replica recorded lately, by fleet.
	banRecord sync.Mutex
	banMu     sync.Mutex
	bansMade  map[string][]recentBan

	snapMu sync.Mutex
	snaps  map[string]snapshot
}

// snapshot is a rendered listing.
type snapshot struct {
	version uint64
	second  int64
	body    []byte
}

// maxSnapshots bounds the snapshots kept, whatever queries callers send.
const maxSnapshots = 1024

func (s *Server) snapshot(key string) ([]byte, bool) {
	if s.Version == nil {
		return nil, false
	}
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	sn, ok := s.snaps[key]
	if !ok || sn.version != s.Version() || sn.second != s.now().Unix() {
		return nil, false
	}
	return sn.body, true
}

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

func (s *Server) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Handler routes every endpoint.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openAPI)
	})
	mux.HandleFunc("GET /v1/fleets", s.authed(s.fleets))
	mux.HandleFunc("GET /v1/fleets/{namespace}/{name}/proxies", s.authed(s.proxies))
	mux.HandleFunc("GET /v1/fleets/{namespace}/{name}/proxies.txt", s.authed(s.proxiesTxt))
	mux.HandleFunc("POST /v1/leases", s.authed(s.acquire))
	mux.HandleFunc("POST /v1/leases/{namespace}/{name}/{token}/renew", s.authed(s.renew))
	mux.HandleFunc("DELETE /v1/leases/{namespace}/{name}/{token}", s.authed(s.release))
	mux.HandleFunc("POST /v1/leases/{namespace}/{name}/{token}/report", s.authed(s.report))
	mux.HandleFunc("GET /{$}", s.authed(s.status))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "", fmt.Sprintf("no endpoint %s %s: see /openapi.json", r.Method, r.URL.Path))
	})
	return mux
}

type handler func(w http.ResponseWriter, r *http.Request, id *Identity)

// authed authenticates every API call: 401 without a valid token.
func (s *Server) authed(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		id, err := s.Auth.Authenticate(r.Context(), r)
		if err != nil {
			s.fail(w, err)
			return
		}
		if s.limited(w, id) {
			return
		}
		h(w, r, id)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, field, msg string) {
	writeJSON(w, code, apiv1.Error{Error: apiv1.ErrorDetail{Code: code, Message: msg, Field: field}})
}

// badRequest is a 400 naming the field.
type badRequest struct{ field, msg string }

func (b *badRequest) Error() string { return b.field + ": " + b.msg }

// fail maps an error to its status code.
func (s *Server) fail(w http.ResponseWriter, err error) {
	var br *badRequest
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &br):
		writeError(w, http.StatusBadRequest, br.field, br.Error())
	case errors.As(err, &mbe):
		writeError(w, http.StatusRequestEntityTooLarge, "", fmt.Sprintf("request body larger than %d bytes", mbe.Limit))
	case errors.Is(err, ErrUnauthenticated):
		w.Header().Set("WWW-Authenticate", `Bearer realm="egress-discovery"`)
		writeError(w, http.StatusUnauthorized, "", "authenticate with a bearer token: a ServiceAccount token or a static token")
	case errors.Is(err, lease.ErrNotYours):
		writeError(w, http.StatusForbidden, "", err.Error())
	case errors.As(err, new(*errBanLimit)):
		writeError(w, http.StatusTooManyRequests, "", err.Error())
	case errors.Is(err, ErrForbidden):
		writeError(w, http.StatusForbidden, "", err.Error()+": ask for verb \"use\" on "+fleetv1alpha1.ProxyFleetResource+"."+fleetv1alpha1.Group+" in the fleet's namespace")
	case errors.Is(err, lease.ErrInvalidTTL):
		writeError(w, http.StatusBadRequest, "ttl", err.Error())
	case errors.Is(err, lease.ErrNotFound), errors.Is(err, errFleetNotFound):
		writeError(w, http.StatusNotFound, "", err.Error())
	case errors.As(err, new(*SecretError)):
		// The fleet's owner must fix it; retrying changes nothing.
		writeError(w, http.StatusNotFound, "", err.Error())
	default:
		s.Log.Info("Request failed", "error", err)
		writeError(w, http.StatusServiceUnavailable, "", "the Kubernetes API server is unreachable or failing; try again: "+apiErrorSummary(err))
	}
}

func apiErrorSummary(err error) string {
	if kerrors.IsTimeout(err) || kerrors.IsServerTimeout(err) {
		return "timeout"
	}
	return err.Error()
}

// fleetName says whether a fleet could have this namespace and name.
func fleetName(namespace, name string) bool {
	return len(validation.IsDNS1123Label(namespace)) == 0 && len(validation.IsDNS1123Subdomain(name)) == 0
}

var errFleetNotFound = errors.New("fleet not found (or it has no proxies)")

// fleetOf checks and authorises a fleet named in a path.
func (s *Server) fleetOf(ctx context.Context, id *Identity, namespace, name string) ([]member, error) {
	// Names no fleet can have cost no access review, nor a cache entry.
	if !fleetName(namespace, name) {
		return nil, errFleetNotFound
	}
	if err := s.Auth.Authorize(ctx, id, namespace, name); err != nil {
		return nil, err
	}
	ms, err := s.Catalog.Fleet(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	if len(ms) == 0 {
		return nil, errFleetNotFound
	}
	return ms, nil
}

func (s *Server) fleets(w http.ResponseWriter, r *http.Request, id *Identity) {
	all, err := s.Catalog.All(r.Context())
	if err != nil {
		s.fail(w, err)
		return
	}
	out := apiv1.FleetList{Items: []apiv1.Fleet{}}
	for key, ms := range all {
		ns, name, _ := strings.Cut(key, "/")
		if s.Auth.Authorize(r.Context(), id, ns, name) != nil {
			continue
		}
		f := apiv1.Fleet{Namespace: ns, Name: name, Proxies: len(ms)}
		for _, m := range ms {
			if m.Healthy {
				f.Healthy++
			}
		}
		out.Items = append(out.Items, f)
	}
	sort.Slice(out.Items, func(i, j int) bool {
		return out.Items[i].Namespace+"/"+out.Items[i].Name < out.Items[j].Namespace+"/"+out.Items[j].Name
	})
	writeJSON(w, http.StatusOK, out)
}

// healthy filters a fleet's proxies: healthy, not draining (being
// replaced), accepting the auth Secret's credentials, in the zone, not
// excluded, not banned for the domain.
func (s *Server) healthy(ctx context.Context, ms []member, zone string, exclude map[string]bool, domain string) ([]member, map[string][]string, error) {
	var bans map[string][]string
	if len(ms) > 0 {
		var err error
		if bans, err = s.Leases.Bans(ctx, ms[0].Namespace, ms[0].Fleet); err != nil {
			return nil, nil, err
		}
	}
	out := make([]member, 0, len(ms))
	for _, m := range ms {
		if !m.Healthy || !m.DrainSince.IsZero() || m.CredentialsOutdated || (zone != "" && m.Zone != zone) || exclude[m.Name] {
			continue
		}
		banned := false
		for _, d := range bans[m.Name] {
			if domain != "" && strings.EqualFold(d, domain) {
				banned = true
			}
		}
		if !banned {
			out = append(out, m)
		}
	}
	return out, bans, nil
}

var domainRe = regexp.MustCompile(`^[a-zA-Z0-9]([-a-zA-Z0-9.]{0,251}[a-zA-Z0-9])?$`)

func (s *Server) proxies(w http.ResponseWriter, r *http.Request, id *Identity) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	q := r.URL.Query()
	domain := q.Get("notBannedFor")
	if domain != "" && !domainRe.MatchString(domain) {
		s.fail(w, &badRequest{"notBannedFor", fmt.Sprintf("%q is not a domain name", domain)})
		return
	}
	exclude := map[string]bool{}
	for _, e := range strings.Split(q.Get("exclude"), ",") {
		if e != "" {
			exclude[e] = true
		}
	}
	if !fleetName(ns, name) {
		s.fail(w, errFleetNotFound)
		return
	}
	if err := s.Auth.Authorize(r.Context(), id, ns, name); err != nil {
		s.fail(w, err)
		return
	}
	key := ns + "/" + name + "?" + r.URL.RawQuery
	if body, ok := s.snapshot(key); ok {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
		return
	}
	var version uint64
	if s.Version != nil {
		version = s.Version()
	}
	second := s.now().Unix()
	ms, err := s.fleetOf(r.Context(), id, ns, name)
	if err != nil {
		s.fail(w, err)
		return
	}
	ok, bans, err := s.healthy(r.Context(), ms, q.Get("zone"), exclude, domain)
	if err != nil {
		s.fail(w, err)
		return
	}
	slots, err := s.Leases.Slots(r.Context(), ns, name)
	if err != nil {
		s.fail(w, err)
		return
	}
	out := apiv1.ProxyList{Items: make([]apiv1.Proxy, 0, len(ok))}
	for _, m := range ok {
		out.Items = append(out.Items, apiv1.Proxy{
			Name: m.Name, Zone: m.Zone, Endpoint: m.Endpoint(), EgressIP: m.EgressIP, LatencyMs: m.LatencyMs,
			Leases: len(slots[m.Name]), MaxLeases: m.MaxLeases, BannedFor: bans[m.Name],
		})
	}
	body, err := json.Marshal(out)
	if err != nil {
		s.fail(w, err)
		return
	}
	body = append(body, '\n')
	s.keep(key, version, second, body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// proxiesTxt serves one proxy URL (with credentials) per line, for clients
// such as scrapy-rotating-proxies that reload a list from a URL.
func (s *Server) proxiesTxt(w http.ResponseWriter, r *http.Request, id *Identity) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	ms, err := s.fleetOf(r.Context(), id, ns, name)
	if err != nil {
		s.fail(w, err)
		return
	}
	ok, _, err := s.healthy(r.Context(), ms, r.URL.Query().Get("zone"), nil, r.URL.Query().Get("notBannedFor"))
	if err != nil {
		s.fail(w, err)
		return
	}
	var b strings.Builder
	for _, m := range ok {
		u, err := s.Catalog.ProxyURL(r.Context(), m)
		if err != nil {
			s.fail(w, err)
			return
		}
		b.WriteString(u + "\n")
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = io.WriteString(w, b.String())
}

// errEmptyBody is decode's answer to a request without a body; a renew
// accepts it, every other request refuses it. A body cut short is not empty.
var errEmptyBody = &badRequest{"body", "is empty: send a JSON object"}

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
			return &badRequest{ute.Field, fmt.Sprintf("must be a %s", ute.Type)}
		}
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return &badRequest{strings.Trim(f, `"`), "is not a field of this request"}
		}
		return &badRequest{"body", "is not valid JSON: " + err.Error()}
	}
	return nil
}

func parseTTL(field, v string, def, maxTTL time.Duration) (time.Duration, error) {
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		if n, nerr := strconv.Atoi(v); nerr == nil {
			d, err = time.Duration(n)*time.Second, nil
		}
	}
	switch {
	case err != nil:
		return 0, &badRequest{field, fmt.Sprintf("%q is not a duration such as 10m or 600", v)}
	case d < time.Second:
		return 0, &badRequest{field, "must be at least 1s"}
	case d > maxTTL:
		return 0, &badRequest{field, fmt.Sprintf("%s exceeds the fleet's maxTTL %s", d, maxTTL)}
	}
	return d, nil
}

// DecodeAcquire reads and validates an acquire request.
func DecodeAcquire(r *http.Request) (*apiv1.AcquireRequest, string, string, error) {
	req := &apiv1.AcquireRequest{}
	if err := decode(r, req); err != nil {
		return nil, "", "", err
	}
	ns, name, ok := strings.Cut(req.Fleet, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return nil, "", "", &badRequest{"fleet", fmt.Sprintf("%q must be <namespace>/<name>", req.Fleet)}
	}
	if req.Holder == "" || len(req.Holder) > 253 {
		return nil, "", "", &badRequest{"holder", "must name the crawler, in at most 253 characters"}
	}
	if req.Domain != "" && !domainRe.MatchString(req.Domain) {
		return nil, "", "", &badRequest{"domain", fmt.Sprintf("%q is not a domain name", req.Domain)}
	}
	if len(req.StickyKey) > 1024 {
		return nil, "", "", &badRequest{"stickyKey", "must be at most 1024 characters"}
	}
	return req, ns, name, nil
}

func (s *Server) acquire(w http.ResponseWriter, r *http.Request, id *Identity) {
	start := s.now()
	req, ns, name, err := DecodeAcquire(r)
	if err != nil {
		s.Metrics.Denials.WithLabelValues("invalid").Inc()
		s.fail(w, err)
		return
	}
	ms, err := s.fleetOf(r.Context(), id, ns, name)
	if err != nil {
		s.Metrics.Denials.WithLabelValues(reason(err)).Inc()
		s.fail(w, err)
		return
	}
	def, maxTTL, err := s.Catalog.TTLs(r.Context(), ns, name)
	if err != nil {
		s.fail(w, err)
		return
	}
	ttl, err := parseTTL("ttl", req.TTL, def, maxTTL)
	if err != nil {
		s.Metrics.Denials.WithLabelValues("invalid").Inc()
		s.fail(w, err)
		return
	}
	ok, _, err := s.healthy(r.Context(), ms, req.Zone, nil, req.Domain)
	if err != nil {
		s.fail(w, err)
		return
	}
	slots, err := s.Leases.Slots(r.Context(), ns, name)
	if err != nil {
		s.fail(w, err)
		return
	}
	sticky, err := s.Leases.Sticky(r.Context(), ns, name, req.StickyKey)
	if err != nil {
		s.fail(w, err)
		return
	}
	// The sticky key's last proxy first, then the least loaded; equally
	// loaded proxies in random order, so that concurrent crawlers (and
	// replicas) spread out instead of racing for the same slot.
	rand.Shuffle(len(ok), func(i, j int) { ok[i], ok[j] = ok[j], ok[i] })
	sort.SliceStable(ok, func(i, j int) bool {
		if (ok[i].Name == sticky) != (ok[j].Name == sticky) {
			return ok[i].Name == sticky
		}
		li := float64(len(slots[ok[i].Name])) / float64(ok[i].MaxLeases)
		lj := float64(len(slots[ok[j].Name])) / float64(ok[j].MaxLeases)
		return li < lj
	})
	cands := make([]lease.Candidate, 0, len(ok))
	byName := map[string]member{}
	for _, m := range ok {
		cands = append(cands, lease.Candidate{Namespace: ns, Fleet: name, Proxy: m.Name, MaxLeases: m.MaxLeases})
		byName[m.Name] = m
	}
	g, err := s.Leases.Acquire(r.Context(), cands, lease.Request{Identity: id.User, Holder: req.Holder, TTL: ttl, StickyKey: req.StickyKey})
	if errors.Is(err, lease.ErrUnavailable) {
		s.Metrics.Denials.WithLabelValues("unavailable").Inc()
		retry := s.retryAfter(slots)
		w.Header().Set("Retry-After", strconv.Itoa(retry))
		writeError(w, http.StatusConflict, "", fmt.Sprintf("no healthy proxy of %s/%s has a free slot (%d healthy, none with fewer than maxLeases holders); retry in %ds", ns, name, len(ok), retry))
		return
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	u, err := s.Catalog.ProxyURL(r.Context(), byName[g.Proxy])
	if err != nil {
		_ = s.Leases.Release(context.WithoutCancel(r.Context()), g.ID, id.User)
		s.fail(w, err)
		return
	}
	s.Metrics.Acquisitions.Inc()
	s.Metrics.AcquireLatency.Observe(s.now().Sub(start).Seconds())
	writeJSON(w, http.StatusCreated, apiv1.Lease{LeaseID: g.ID, Proxy: g.Proxy, ProxyURL: u, ExpiresAt: g.ExpiresAt})
}

// retryAfter suggests when a slot is likely free: the soonest expiry.
func (s *Server) retryAfter(slots map[string][]*coordLease) int {
	soonest := math.MaxFloat64
	for _, ls := range slots {
		for _, l := range ls {
			soonest = min(soonest, lease.ExpiresAt(l).Sub(s.now()).Seconds())
		}
	}
	if soonest == math.MaxFloat64 || soonest < 1 {
		return 5
	}
	return int(math.Ceil(min(soonest, 60)))
}

// recentBanTime is how long a ban this replica recorded is counted
// besides its cache: longer than the cache takes to show it.
const recentBanTime = 10 * time.Second

type recentBan struct {
	ban lease.Ban
	at  time.Time
}

// recentBans returns the bans this replica recorded in the fleet in the
// last recentBanTime that listed does not hold yet, forgetting older ones.
func (s *Server) recentBans(key string, listed []lease.Ban) []lease.Ban {
	s.banMu.Lock()
	defer s.banMu.Unlock()
	var out []lease.Ban
	kept := s.bansMade[key][:0]
	for _, r := range s.bansMade[key] {
		if s.now().Sub(r.at) >= recentBanTime {
			continue
		}
		kept = append(kept, r)
		if !slices.ContainsFunc(listed, func(b lease.Ban) bool { return b.Proxy == r.ban.Proxy && strings.EqualFold(b.Domain, r.ban.Domain) }) {
			out = append(out, r.ban)
		}
	}
	if len(kept) == 0 {
		delete(s.bansMade, key)
	} else {
		s.bansMade[key] = kept
	}
	return out
}

// ban checks a new ban against the bounds and records it, one at a time
// per replica, so that reports racing on it cannot pass a bound together.
func (s *Server) ban(ctx context.Context, ns, fleet, proxy, domain string, cooldown time.Duration, id *Identity) error {
	s.banRecord.Lock()
	defer s.banRecord.Unlock()
	if err := s.banAllowed(ctx, ns, fleet, proxy, domain, id); err != nil {
		return err
	}
	if err := s.Leases.Ban(ctx, ns, fleet, proxy, domain, cooldown, id.User); err != nil {
		return err
	}
	s.banMu.Lock()
	defer s.banMu.Unlock()
	if s.bansMade == nil {
		s.bansMade = map[string][]recentBan{}
	}
	key := ns + "/" + fleet
	// An extended ban is one ban, not another.
	made := slices.DeleteFunc(s.bansMade[key], func(r recentBan) bool {
		return r.ban.Proxy == proxy && strings.EqualFold(r.ban.Domain, domain)
	})
	s.bansMade[key] = append(made, recentBan{ban: lease.Ban{Proxy: proxy, Domain: domain, Identity: id.User}, at: s.now()})
	return nil
}

// errBanLimit is a ban over a fleet's or an identity's bound.
type errBanLimit struct{ msg string }

func (e *errBanLimit) Error() string { return e.msg }

// banAllowed checks a new ban against the fleet's and the identity's
// bounds; extending a ban that is live already is always allowed. Replicas
// count from their caches, so the bounds hold up to what they grant at the
// same moment.
func (s *Server) banAllowed(ctx context.Context, ns, fleet, proxy, domain string, id *Identity) error {
	if s.MaxBansPerFleet <= 0 && s.MaxBansPerIdentity <= 0 {
		return nil
	}
	bans, err := s.Leases.ActiveBans(ctx, ns, fleet)
	if err != nil {
		return err
	}
	// With the bans this replica recorded lately, which its cache may
	// not show yet: reports racing on one replica count each other.
	bans = append(bans, s.recentBans(ns+"/"+fleet, bans)...)
	mine := 0
	for _, b := range bans {
		if b.Proxy == proxy && strings.EqualFold(b.Domain, domain) {
			return nil
		}
		if b.Identity == id.User {
			mine++
		}
	}
	switch {
	case s.MaxBansPerFleet > 0 && len(bans) >= s.MaxBansPerFleet:
		return &errBanLimit{fmt.Sprintf("fleet %s/%s has %d live bans, its bound (--max-bans-per-fleet): lift some with an \"ok\" report, or wait for their cooldowns", ns, fleet, len(bans))}
	case s.MaxBansPerIdentity > 0 && mine >= s.MaxBansPerIdentity:
		return &errBanLimit{fmt.Sprintf("%s has %d live bans in fleet %s/%s, its bound (--max-bans-per-identity)", id.User, mine, ns, fleet)}
	}
	return nil
}

func reason(err error) string {
	switch {
	case errors.Is(err, ErrForbidden):
		return "forbidden"
	case errors.Is(err, errFleetNotFound):
		return "not-found"
	default:
		return "error"
	}
}

// leaseOf reads the lease named in the path and authorises its fleet. The
// fleet comes from the cached Proxy the slot belongs to, so renew and
// release cost one API call each.
func (s *Server) leaseOf(r *http.Request, id *Identity) (leaseID, namespace, fleet string, p *v1alpha1.Proxy, err error) {
	leaseID = r.PathValue("namespace") + "/" + r.PathValue("name") + "/" + r.PathValue("token")
	namespace, name, _, err := lease.ParseID(leaseID)
	if err != nil {
		return "", "", "", nil, lease.ErrNotFound
	}
	proxy, ok := lease.ProxyOf(name)
	if !ok {
		return "", "", "", nil, lease.ErrNotFound
	}
	p = &v1alpha1.Proxy{}
	if err := s.Catalog.Cache.Get(r.Context(), types.NamespacedName{Namespace: namespace, Name: proxy}, p); err != nil {
		if kerrors.IsNotFound(err) {
			return "", "", "", nil, lease.ErrNotFound
		}
		return "", "", "", nil, err
	}
	fleet = fleetv1alpha1.FleetName(p)
	if err := s.Auth.Authorize(r.Context(), id, namespace, fleet); err != nil {
		return "", "", "", nil, err
	}
	return leaseID, namespace, fleet, p, nil
}

func (s *Server) renew(w http.ResponseWriter, r *http.Request, id *Identity) {
	leaseID, ns, fleet, p, err := s.leaseOf(r, id)
	if err != nil {
		s.fail(w, err)
		return
	}
	req := &apiv1.RenewRequest{}
	if err := decode(r, req); err != nil && !errors.Is(err, errEmptyBody) {
		s.fail(w, err)
		return
	}
	def, maxTTL, err := s.Catalog.TTLs(r.Context(), ns, fleet)
	if err != nil {
		s.fail(w, err)
		return
	}
	ttl, err := parseTTL("ttl", req.TTL, def, maxTTL)
	if err != nil {
		s.fail(w, err)
		return
	}
	if since := drainSince(p); !since.IsZero() {
		// A start in the future (a skewed clock, an edited label) counts
		// as now: it never extends a lease past now plus maxTTL.
		if now := s.now(); since.After(now) {
			since = now
		}
		// A proxy being replaced: its leases are renewed only up to the
		// drain start plus maxTTL, so that one crawler renewing forever
		// cannot hold the rollout up.
		left := since.Add(maxTTL).Sub(s.now()).Truncate(time.Second)
		if left < time.Second {
			writeError(w, http.StatusConflict, "", fmt.Sprintf("proxy %s is being replaced since %s and its leases are no longer renewed: release this lease and take a new one", p.Name, since.Format(time.RFC3339)))
			return
		}
		ttl = min(ttl, left)
	}
	g, err := s.Leases.Renew(r.Context(), leaseID, id.User, ttl)
	if err != nil {
		s.fail(w, err)
		return
	}
	out := apiv1.Lease{LeaseID: g.ID, Proxy: g.Proxy, ExpiresAt: g.ExpiresAt}
	// The URL with the credentials the proxy takes now, so that a crawler
	// renewing across a password change moves to the new one before the
	// previous one's grace ends; none for a proxy that still takes only
	// the credentials the crawler was given.
	if m := toMember(p); !m.CredentialsOutdated {
		// The lease is renewed whatever happens here: a failure to read
		// the credentials leaves the URL out, never answers an error
		// that would make the crawler drop a lease it holds.
		if out.ProxyURL, err = s.Catalog.ProxyURL(r.Context(), m); err != nil {
			s.Log.Info("Renewed a lease without its proxy's URL", "lease", leaseID, "error", err)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) release(w http.ResponseWriter, r *http.Request, id *Identity) {
	leaseID, _, _, _, err := s.leaseOf(r, id)
	if err != nil {
		s.fail(w, err)
		return
	}
	if err := s.Leases.Release(r.Context(), leaseID, id.User); err != nil {
		s.fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// report records a crawler's verdict on its leased proxy for a domain. A
// ban is a Lease object in the API server, so every replica honours it.
func (s *Server) report(w http.ResponseWriter, r *http.Request, id *Identity) {
	leaseID, ns, fleet, p, err := s.leaseOf(r, id)
	if err != nil {
		s.fail(w, err)
		return
	}
	proxy := p.Name
	// Only a crawler holding the lease may report through it.
	if _, err := s.Leases.Get(r.Context(), leaseID, id.User); err != nil {
		s.fail(w, err)
		return
	}
	req := &apiv1.ReportRequest{}
	if err := decode(r, req); err != nil {
		s.fail(w, err)
		return
	}
	if !domainRe.MatchString(req.Domain) {
		s.fail(w, &badRequest{"domain", fmt.Sprintf("%q is not a domain name", req.Domain)})
		return
	}
	switch req.Outcome {
	case "banned":
		cooldown, err := parseTTL("cooldown", req.Cooldown, 30*time.Minute, 7*24*time.Hour)
		if err != nil {
			s.fail(w, err)
			return
		}
		if err := s.ban(r.Context(), ns, fleet, proxy, req.Domain, cooldown, id); err != nil {
			s.fail(w, err)
			return
		}
		s.Metrics.Bans.Inc()
	case "ok":
		if err := s.Leases.Unban(r.Context(), ns, proxy, req.Domain); err != nil {
			s.fail(w, err)
			return
		}
	default:
		s.fail(w, &badRequest{"outcome", fmt.Sprintf("%q must be banned or ok", req.Outcome)})
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

//go:embed status.html
var statusHTML string

var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"pct": func(a, b int) int {
		if b == 0 {
			return 0
		}
		return 100 * a / b
	},
}).Parse(statusHTML))

type statusProxy struct {
	member
	Leases int
	Bans   []string
}

type statusFleet struct {
	Namespace, Name string
	Proxies         []statusProxy
	Healthy         int
}

// status renders the status page: fleets, proxies, health, latency, egress
// IP, lease use against maxLeases and bans, without JavaScript.
func (s *Server) status(w http.ResponseWriter, r *http.Request, id *Identity) {
	all, err := s.Catalog.All(r.Context())
	if err != nil {
		s.fail(w, err)
		return
	}
	var fleets []statusFleet
	for key, ms := range all {
		ns, name, _ := strings.Cut(key, "/")
		if s.Auth.Authorize(r.Context(), id, ns, name) != nil {
			continue
		}
		slots, err := s.Leases.Slots(r.Context(), ns, name)
		if err != nil {
			s.fail(w, err)
			return
		}
		bans, err := s.Leases.Bans(r.Context(), ns, name)
		if err != nil {
			s.fail(w, err)
			return
		}
		f := statusFleet{Namespace: ns, Name: name}
		for _, m := range ms {
			if m.Healthy {
				f.Healthy++
			}
			f.Proxies = append(f.Proxies, statusProxy{member: m, Leases: len(slots[m.Name]), Bans: bans[m.Name]})
		}
		fleets = append(fleets, f)
	}
	sort.Slice(fleets, func(i, j int) bool { return fleets[i].Namespace+fleets[i].Name < fleets[j].Namespace+fleets[j].Name })
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := statusTemplate.Execute(w, struct {
		Fleets []statusFleet
		Now    string
	}{fleets, s.now().UTC().Format(time.RFC3339)}); err != nil {
		s.Log.Info("Cannot render status page", "error", err)
	}
}

// Metrics of the discovery API.
type Metrics struct {
	Acquisitions   prometheus.Counter
	Denials        *prometheus.CounterVec
	AcquireLatency prometheus.Histogram
	Bans           prometheus.Counter
}

// NewMetrics returns the API's metrics, unregistered.
func NewMetrics() *Metrics {
	return &Metrics{
		Acquisitions: prometheus.NewCounter(prometheus.CounterOpts{Name: "egress_discovery_lease_acquisitions_total", Help: "Leases granted."}),
		Denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egress_discovery_lease_denials_total", Help: "Lease requests refused, by reason (unavailable, forbidden, not-found, invalid, error).",
		}, []string{"reason"}),
		AcquireLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "egress_discovery_acquire_duration_seconds", Help: "Time to grant a lease.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5},
		}),
		Bans: prometheus.NewCounter(prometheus.CounterOpts{Name: "egress_discovery_bans_total", Help: "Proxies reported banned for a domain."}),
	}
}

// Collectors returns every collector, for registration.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Acquisitions, m.Denials, m.AcquireLatency, m.Bans}
}
