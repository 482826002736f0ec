package v1alpha1

import (
	"reflect"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

// Package type metadata.
const (
	Group   = "egress.crawl.example.com"
	Version = "v1alpha1"
)

var (
	// SchemeGroupVersion is the group version used to register these objects.
	SchemeGroupVersion = schema.GroupVersion{Group: Group, Version: Version}

	// SchemeBuilder registers the Go types of this package with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: SchemeGroupVersion}

	// AddToScheme adds every type of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Proxy type metadata.
var (
	ProxyKind             = reflect.TypeOf(Proxy{}).Name()
	ProxyGroupKind        = schema.GroupKind{Group: Group, Kind: ProxyKind}.String()
	ProxyKindAPIVersion   = ProxyKind + "." + SchemeGroupVersion.String()
	ProxyGroupVersionKind = SchemeGroupVersion.WithKind(ProxyKind)
)

// ProviderConfig type metadata.
var (
	ProviderConfigKind             = reflect.TypeOf(ProviderConfig{}).Name()
	ProviderConfigGroupVersionKind = SchemeGroupVersion.WithKind(ProviderConfigKind)

	ClusterProviderConfigKind             = reflect.TypeOf(ClusterProviderConfig{}).Name()
	ClusterProviderConfigGroupVersionKind = SchemeGroupVersion.WithKind(ClusterProviderConfigKind)

	ProviderConfigUsageKind                 = reflect.TypeOf(ProviderConfigUsage{}).Name()
	ProviderConfigUsageGroupVersionKind     = SchemeGroupVersion.WithKind(ProviderConfigUsageKind)
	ProviderConfigUsageListKind             = reflect.TypeOf(ProviderConfigUsageList{}).Name()
	ProviderConfigUsageListGroupVersionKind = SchemeGroupVersion.WithKind(ProviderConfigUsageListKind)

	ClusterProviderConfigUsageKind                 = reflect.TypeOf(ClusterProviderConfigUsage{}).Name()
	ClusterProviderConfigUsageGroupVersionKind     = SchemeGroupVersion.WithKind(ClusterProviderConfigUsageKind)
	ClusterProviderConfigUsageListKind             = reflect.TypeOf(ClusterProviderConfigUsageList{}).Name()
	ClusterProviderConfigUsageListGroupVersionKind = SchemeGroupVersion.WithKind(ClusterProviderConfigUsageListKind)
)

// LeaseSummary type metadata.
var (
	LeaseSummaryKind             = reflect.TypeOf(LeaseSummary{}).Name()
	LeaseSummaryGroupVersionKind = SchemeGroupVersion.WithKind(LeaseSummaryKind)
)

func init() {
	SchemeBuilder.Register(&Proxy{}, &ProxyList{})
	SchemeBuilder.Register(&LeaseSummary{}, &LeaseSummaryList{})
	SchemeBuilder.Register(&ProviderConfig{}, &ProviderConfigList{})
	SchemeBuilder.Register(&ClusterProviderConfig{}, &ClusterProviderConfigList{})
	SchemeBuilder.Register(&ProviderConfigUsage{}, &ProviderConfigUsageList{})
	SchemeBuilder.Register(&ClusterProviderConfigUsage{}, &ClusterProviderConfigUsageList{})
}
