// Package v1alpha1 holds the crawl.example.com API: the ProxyFleet composite
// resource's spec and status. These Go types are the only definition of a
// ProxyFleet: `make generate` derives both XRDs (the namespaced ProxyFleet
// and the LegacyCluster XProxyFleet with its claim) from them, and
// function-proxyfleet and egress-discovery read fleets through them.
// +kubebuilder:object:generate=true
// +groupName=crawl.example.com
// +versionName=v1alpha1
package v1alpha1
