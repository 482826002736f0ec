package discovery

import "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"

// The names egress-discovery's callers knew before its packages split by
// concern, kept so that cmd/discovery, hack/ and the tests read as they
// did: each is the package's own.
type (
	// Catalog is catalog.Catalog.
	Catalog = catalog.Catalog
	// SecretError is catalog.SecretError.
	SecretError = catalog.SecretError
	// FleetSizing is catalog.FleetSizing.
	FleetSizing = catalog.FleetSizing
)

var (
	// ProxyExists is catalog.ProxyExists.
	ProxyExists = catalog.ProxyExists
	// ProxyOwner is catalog.ProxyOwner.
	ProxyOwner = catalog.ProxyOwner
	// ProxyServing is catalog.ProxyServing.
	ProxyServing = catalog.ProxyServing
	// CacheOptions is catalog.CacheOptions.
	CacheOptions = catalog.CacheOptions
)
