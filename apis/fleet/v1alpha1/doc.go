// Package v1alpha1 holds the crawl.example.com API: the ProxyFleet composite
// resource's spec and status. These Go types are the only definition of a
// ProxyFleet: `make generate` derives both XRDs (the namespaced ProxyFleet
// and the LegacyCluster XProxyFleet with its claim) from them, and
// function-proxyfleet and egress-discovery read fleets through them.
//
// doc.go holds this comment and the package's markers; register.go the
// group, version and kinds, and the labels that name a fleet and a proxy;
// types.go the ProxyFleet spec and status; pool_types.go the ProxyPool a
// pooled fleet composes; defaults.go reads a spec from an XR and applies
// its defaults; zz_generated.deepcopy.go the deep-copy methods
// controller-gen generates.
// +kubebuilder:object:generate=true
// +groupName=crawl.example.com
// +versionName=v1alpha1
package v1alpha1
