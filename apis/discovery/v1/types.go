// Package v1 holds the egress-discovery REST API's request and response
// types, and a small Go client for crawlers.
package v1

import "time"

// Fleet is a ProxyFleet a caller may use.
type Fleet struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Proxies   int    `json:"proxies"`
	Healthy   int    `json:"healthy"`
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
}

// Lease is a granted lease.
type Lease struct {
	LeaseID   string    `json:"leaseID"`
	Proxy     string    `json:"proxy"`
	ProxyURL  string    `json:"proxyURL"`
	ExpiresAt time.Time `json:"expiresAt"`
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
	// Field names the request field at fault, for 400 answers.
	Field string `json:"field,omitempty"`
}
