// Package v1 holds the egress-discovery REST API's request and response
// types, and a small Go client for crawlers.
//
// types.go holds the requests, answers and error reasons of the API;
// client.go the Go client (acquire, renew, release, report, list);
// gateway.go the grammar of the gateway's usernames (fleet, session,
// zone and rotation options) and its parser.
package v1

import "time"

// Fleet is a ProxyFleet a caller may use.
type Fleet struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Proxies   int    `json:"proxies"`
	Healthy   int    `json:"healthy"`
	// Usage is the caller's leases of the fleet and its quota; only GET
	// /v1/fleets/{namespace}/{name} fills it.
	Usage *Usage `json:"usage,omitempty"`
	// Admission says whether new leases are granted now; only GET
	// /v1/fleets/{namespace}/{name} fills it.
	Admission *Admission `json:"admission,omitempty"`
}

// Usage is what a caller holds of a fleet.
type Usage struct {
	// Identity is the caller, as leases record it.
	Identity string `json:"identity"`
	// Leases is how many live leases of the fleet the caller holds.
	Leases int `json:"leases"`
	// Quota is how many it may hold at once; absent means no bound.
	Quota *int `json:"quota,omitempty"`
	// QuotaFrom names the spec field the quota comes from.
	QuotaFrom string `json:"quotaFrom,omitempty"`
}

// Admission is the state of a fleet's admission control.
type Admission struct {
	// Admitting is false while too few proxies are healthy for new leases.
	Admitting bool `json:"admitting"`
	// HealthyFraction is the share of the fleet's proxies that are healthy
	// and not being replaced.
	HealthyFraction float64 `json:"healthyFraction"`
	// MinHealthyFraction is the fleet's spec.leases.admission setting.
	MinHealthyFraction float64 `json:"minHealthyFraction"`
	// MaxWaitSeconds is how long an acquisition may wait for a slot.
	MaxWaitSeconds float64 `json:"maxWaitSeconds"`
	// Waiting is how many acquisitions wait on the replica that answers.
	Waiting int `json:"waiting"`
}

// FleetList is the answer of GET /v1/fleets.
type FleetList struct {
	Items []Fleet `json:"items"`
}

// Proxy is one healthy proxy of a fleet.
type Proxy struct {
	Name      string   `json:"name"`
	Zone      string   `json:"zone,omitempty"`
	Endpoint  string   `json:"endpoint"`
	EgressIP  string   `json:"egressIP,omitempty"`
	LatencyMs int64    `json:"latencyMilliseconds"`
	Leases    int      `json:"leases"`
	MaxLeases int      `json:"maxLeases"`
	BannedFor []string `json:"bannedFor,omitempty"`
}

// ProxyList is the answer of GET /v1/fleets/{namespace}/{name}/proxies.
type ProxyList struct {
	Items []Proxy `json:"items"`
}

// AcquireRequest asks for a lease on a fleet's proxy.
type AcquireRequest struct {
	// Fleet is <namespace>/<name>.
	Fleet string `json:"fleet"`
	// Holder names the crawler, for the status page and the Lease object.
	Holder string `json:"holder"`
	// TTL is a duration such as 10m; empty means the fleet's defaultTTL.
	TTL string `json:"ttl,omitempty"`
	// Zone restricts the choice to one zone.
	Zone string `json:"zone,omitempty"`
	// StickyKey prefers the proxy this key was last given.
	StickyKey string `json:"stickyKey,omitempty"`
	// Domain skips proxies banned for this domain.
	Domain string `json:"domain,omitempty"`
	// MaxWait is how long the request may wait for a free slot, such as
	// 10s, up to the fleet's spec.leases.admission.maxWait; empty means
	// that, and 0 answers at once.
	MaxWait string `json:"maxWait,omitempty"`
}

// Lease is a granted lease.
type Lease struct {
	LeaseID   string    `json:"leaseID"`
	Proxy     string    `json:"proxy"`
	ProxyURL  string    `json:"proxyURL"`
	ExpiresAt time.Time `json:"expiresAt"`
	// TTLSeconds is how long the lease runs from the moment it was granted
	// or renewed. A client plans its renewals from it on its own clock,
	// never by comparing ExpiresAt, which is the server's clock, with its
	// own.
	TTLSeconds int64 `json:"ttlSeconds"`
	// Pacing, when the request named a domain the fleet paces, is the rule
	// and when the proxy's egress IP may next be used for it.
	Pacing *LeasePacing `json:"pacing,omitempty"`
}

// LeasePacing is the pacing a lease's proxy is under for a domain
// (spec.gateway.pacing): one connection an egress IP every
// IntervalSeconds after a burst, and the next time one may leave.
type LeasePacing struct {
	IntervalSeconds float64   `json:"intervalSeconds"`
	Burst           int       `json:"burst"`
	NextUseAt       time.Time `json:"nextUseAt"`
}

// RenewRequest extends a lease.
type RenewRequest struct {
	TTL string `json:"ttl,omitempty"`
}

// ReportRequest tells how a proxy fared with a domain.
type ReportRequest struct {
	Domain string `json:"domain"`
	// Outcome is banned or ok.
	Outcome string `json:"outcome"`
	// Cooldown is how long a banned proxy is not handed out for the domain;
	// empty means 30m.
	Cooldown string `json:"cooldown,omitempty"`
}

// Error is every error answer's body.
type Error struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail says what went wrong.
type ErrorDetail struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	// Reason is a stable code saying what went wrong, one of the Reason
	// constants, for clients to act on without parsing the message.
	Reason string `json:"reason"`
	// Field names the request field at fault, for 400 answers.
	Field string `json:"field,omitempty"`
}

// Reasons an error answer gives. They do not change between releases.
const (
	// ReasonInvalid is a 400: Field names the field at fault.
	ReasonInvalid = "Invalid"
	// ReasonBodyTooLarge is a 413.
	ReasonBodyTooLarge = "BodyTooLarge"
	// ReasonUnauthenticated is a 401: no bearer token, or one that is not
	// valid (expired, revoked, unknown).
	ReasonUnauthenticated = "Unauthenticated"
	// ReasonWrongAudience is a 401: a valid token issued for another
	// audience, such as the API server's.
	ReasonWrongAudience = "WrongAudience"
	// ReasonForbidden is a 403: the caller may not use the fleet.
	ReasonForbidden = "Forbidden"
	// ReasonNotYourLease is a 403: the lease was granted to another
	// identity.
	ReasonNotYourLease = "NotYourLease"
	// ReasonRateLimited is a 429 with Retry-After: the caller's request
	// rate is over its limit.
	ReasonRateLimited = "RateLimited"
	// ReasonQuotaExceeded is a 429: the caller holds as many leases of the
	// fleet as its quota allows.
	ReasonQuotaExceeded = "QuotaExceeded"
	// ReasonBanLimit is a 429: the fleet, or the caller, holds as many
	// live bans as it may.
	ReasonBanLimit = "BanLimit"
	// ReasonNoFreeSlot is a 409 with Retry-After: every healthy proxy has
	// maxLeases holders.
	ReasonNoFreeSlot = "NoFreeSlot"
	// ReasonTooFewHealthy is a 409 with Retry-After: fewer proxies than the
	// fleet's admission.minHealthyFraction are healthy, so new leases wait.
	ReasonTooFewHealthy = "TooFewHealthy"
	// ReasonDraining is a 409: the lease's proxy is being replaced and its
	// leases are no longer renewed.
	ReasonDraining = "Draining"
	// ReasonFleetNotFound is a 404: no such fleet, or it has no proxies.
	ReasonFleetNotFound = "FleetNotFound"
	// ReasonLeaseNotFound is a 404: the lease expired, was released or
	// was taken over.
	ReasonLeaseNotFound = "LeaseNotFound"
	// ReasonSecretNotFound is a 404: the fleet's auth Secret is missing or
	// unusable; its owner must fix it.
	ReasonSecretNotFound = "SecretNotFound"
	// ReasonNoEndpoint is a 404 for a path the API does not have.
	ReasonNoEndpoint = "NoEndpoint"
	// ReasonOverloaded is a 503 with Retry-After: the replica serves as
	// many requests as it may at once.
	ReasonOverloaded = "Overloaded"
	// ReasonInternal is a 500: egress-discovery is misconfigured (say,
	// its own permissions), which a retry does not mend.
	ReasonInternal = "Internal"
	// ReasonAPIServerUnavailable is a 503: the Kubernetes API server is
	// unreachable or failing.
	ReasonAPIServerUnavailable = "APIServerUnavailable"
)
