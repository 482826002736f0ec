package discovery

import (
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/gateway"
)

// The names egress-discovery's callers knew before its packages split by
// concern, kept so that cmd/discovery, hack/ and the tests read as they
// did: each is the package's own.
type (
	// Gateway is the gateway of this REST server's fleets.
	Gateway = gateway.Gateway[*Server]
	// GatewayUser is gateway.GatewayUser.
	GatewayUser = gateway.GatewayUser
	// Identity is auth.Identity.
	Identity = auth.Identity
	// Authenticator is auth.Authenticator.
	Authenticator = auth.Authenticator
	// Kubernetes is auth.Kubernetes.
	Kubernetes = auth.Kubernetes
	// StaticTokens is auth.StaticTokens.
	StaticTokens = auth.StaticTokens
	// IdentityLimits is auth.IdentityLimits.
	IdentityLimits = auth.IdentityLimits
	// Catalog is catalog.Catalog.
	Catalog = catalog.Catalog
	// SecretError is catalog.SecretError.
	SecretError = catalog.SecretError
	// FleetSizing is catalog.FleetSizing.
	FleetSizing = catalog.FleetSizing
)

// DefaultAudience is auth.DefaultAudience; MetricsPath is auth.MetricsPath.
const (
	DefaultAudience = auth.DefaultAudience
	MetricsPath     = auth.MetricsPath
)

var (
	// ParseGatewayUser, GatewaySessionHolder and GatewaySeatHolder are
	// gateway's.
	ParseGatewayUser     = gateway.ParseGatewayUser
	GatewaySessionHolder = gateway.GatewaySessionHolder
	GatewaySeatHolder    = gateway.GatewaySeatHolder
	// LoadStaticTokens is auth.LoadStaticTokens.
	LoadStaticTokens = auth.LoadStaticTokens
	// WithClientAddress is auth.WithClientAddress.
	WithClientAddress = auth.WithClientAddress
	// ErrForbidden, ErrUnauthenticated and ErrWrongAudience are auth's.
	ErrForbidden       = auth.ErrForbidden
	ErrUnauthenticated = auth.ErrUnauthenticated
	ErrWrongAudience   = auth.ErrWrongAudience
	// ProxyExists is catalog.ProxyExists.
	ProxyExists = catalog.ProxyExists
	// ProxyOwner is catalog.ProxyOwner.
	ProxyOwner = catalog.ProxyOwner
	// ProxyServing is catalog.ProxyServing.
	ProxyServing = catalog.ProxyServing
	// CacheOptions is catalog.CacheOptions.
	CacheOptions = catalog.CacheOptions
)
