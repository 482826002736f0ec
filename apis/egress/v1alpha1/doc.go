// Package v1alpha1 contains the egress.crawl.example.com API: the Proxy
// managed resource and the configuration that chooses its backend.
// +kubebuilder:object:generate=true
// +groupName=egress.crawl.example.com
// +versionName=v1alpha1
package v1alpha1
