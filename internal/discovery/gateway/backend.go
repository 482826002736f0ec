package gateway

import (
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// Backend is what the gateway needs of egress-discovery: the allocator
// its seats and sessions are granted by (with the catalogue, metrics, log
// and clock it holds), the authenticator of Proxy-Authorization tokens,
// the lease store its leases are renewed, shared and given back in, and
// the rate limit per identity its connections count against. The REST
// server (discovery.Server) is one; the gateway is generic over it so that
// its owner keeps the concrete type (discovery.Gateway).
type Backend interface {
	Allocator() *allocator.Allocator
	Authenticator() auth.Authenticator
	Store() *lease.Store
	Limit(id *auth.Identity) error
}
