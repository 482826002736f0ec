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
	// GatewayConfig is gateway.Config.
	GatewayConfig = gateway.Config[*Server]
	// GatewayUser is gateway.User.
	GatewayUser = gateway.User
	// Identity is auth.Identity.
	Identity = auth.Identity
	// Authenticator is auth.Authenticator.
	Authenticator = auth.Authenticator
	// Kubernetes is auth.Kubernetes.
	Kubernetes = auth.Kubernetes
	// KubernetesConfig is auth.KubernetesConfig.
	KubernetesConfig = auth.KubernetesConfig
	// StaticTokens is auth.StaticTokens.
	StaticTokens = auth.StaticTokens
	// IdentityLimits is auth.IdentityLimits.
	IdentityLimits = auth.IdentityLimits
	// Catalog is catalog.Catalog.
	Catalog = catalog.Catalog
	// CatalogConfig is catalog.Config.
	CatalogConfig = catalog.Config
	// SecretError is catalog.SecretError.
	SecretError = catalog.SecretError
	// FleetSizing is catalog.FleetSizing.
	FleetSizing = catalog.FleetSizing
)

// DefaultAudience, MetricsPath and TokenCookie are auth's.
const (
	DefaultAudience = auth.DefaultAudience
	MetricsPath     = auth.MetricsPath
	TokenCookie     = auth.TokenCookie
)

var (
	// ParseGatewayUser is gateway.ParseUser.
	ParseGatewayUser = gateway.ParseUser
	// GatewaySessionHolder is gateway.SessionHolder.
	GatewaySessionHolder = gateway.SessionHolder
	// GatewaySeatHolder is gateway.SeatHolder.
	GatewaySeatHolder = gateway.SeatHolder
	// NewKubernetes is auth.NewKubernetes.
	NewKubernetes = auth.NewKubernetes
	// NewGateway is gateway.New.
	NewGateway = gateway.New[*Server]
	// NewCatalog is catalog.New.
	NewCatalog = catalog.New
	// LoadStaticTokens is auth.LoadStaticTokens.
	LoadStaticTokens = auth.LoadStaticTokens
	// WithClientAddress is auth.WithClientAddress.
	WithClientAddress = auth.WithClientAddress
	// ErrForbidden is auth.ErrForbidden.
	ErrForbidden = auth.ErrForbidden
	// ErrUnauthenticated is auth.ErrUnauthenticated.
	ErrUnauthenticated = auth.ErrUnauthenticated
	// ErrWrongAudience is auth.ErrWrongAudience.
	ErrWrongAudience = auth.ErrWrongAudience
	// ProxyExists is catalog.ProxyExists.
	ProxyExists = catalog.ProxyExists
	// ProxyOwner is catalog.ProxyOwner.
	ProxyOwner = catalog.ProxyOwner
	// ProxyController is catalog.ProxyController.
	ProxyController = catalog.ProxyController
	// ProxyServing is catalog.ProxyServing.
	ProxyServing = catalog.ProxyServing
	// WatchVersion is catalog.WatchVersion.
	WatchVersion = catalog.WatchVersion
	// CacheOptions is catalog.CacheOptions.
	CacheOptions = catalog.CacheOptions
)
