package gateway

import (
	"context"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// Backend is what the gateway needs of egress-discovery: the allocator
// its seats and sessions are granted by (with the catalogue, metrics, log
// and clock it holds), the authenticator of Proxy-Authorization tokens,
// the lease store its leases are renewed, shared and given back in
// (Leases), and the rate limits per identity its connections count
// against (auth.IdentityLimits, nil without limits). The REST server
// (discovery.Server) is one; the gateway is generic over it so that its
// owner keeps the concrete type (discovery.Gateway), and calls none of the
// REST server's own code.
type Backend interface {
	Allocator() *allocator.Allocator
	Authenticator() auth.Authenticator
	Store() Leases
	IdentityLimits() *auth.IdentityLimits
}

// Leases is what the gateway does with its leases once granted
// (lease.Store): renew them, find and share a session's, and give them
// back.
type Leases interface {
	Renew(ctx context.Context, id, identity string, ttl time.Duration) (*lease.Grant, error)
	Release(ctx context.Context, id, identity string) error
	HeldBy(ctx context.Context, namespace, fleet, holder, identity string) (*lease.Grant, error)
	Share(ctx context.Context, id, identity string, ttl time.Duration, replica string) (*lease.Grant, error)
	Leave(ctx context.Context, id, identity, replica string, granter bool) (bool, error)
}
