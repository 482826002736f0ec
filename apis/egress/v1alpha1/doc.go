// Package v1alpha1 contains the egress.crawl.example.com API: the Proxy
// managed resource and the configuration that chooses its backend.
//
// doc.go holds this comment and the package's markers; register.go the
// group, version and kinds and their scheme registration; proxy_types.go
// the Proxy and its placements, health check and status;
// providerconfig_types.go the ProviderConfig, ClusterProviderConfig,
// their usages and each backend's settings and policy, aws_types.go
// EC2's; leasesummary_types.go the LeaseSummary egress-discovery writes;
// managed.go the methods crossplane-runtime's interfaces ask for;
// secret.go the check that a proxy may use a Secret;
// zz_generated.deepcopy.go the deep-copy methods controller-gen generates.
// +kubebuilder:object:generate=true
// +groupName=egress.crawl.example.com
// +versionName=v1alpha1
package v1alpha1
