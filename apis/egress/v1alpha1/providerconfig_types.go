package v1alpha1

import (
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BackendType names where a ProviderConfig's proxies run.
// +kubebuilder:validation:Enum=Local;Kubernetes;GCP
type BackendType string

// Backends.
const (
	// BackendLocal runs each proxy as a Squid process on the provider's host.
	BackendLocal BackendType = "Local"
	// BackendKubernetes runs each proxy as a Squid pod.
	BackendKubernetes BackendType = "Kubernetes"
	// BackendGCP runs each proxy on a Compute Engine VM.
	BackendGCP BackendType = "GCP"
)

// ProviderConfigSpec chooses a backend and holds its settings and credentials.
// +kubebuilder:validation:XValidation:rule="!has(self.local) || self.backend == 'Local'",message="local is set but backend is not Local: remove local or set backend: Local"
// +kubebuilder:validation:XValidation:rule="!has(self.kubernetes) || self.backend == 'Kubernetes'",message="kubernetes is set but backend is not Kubernetes: remove kubernetes or set backend: Kubernetes"
// +kubebuilder:validation:XValidation:rule="!has(self.gcp) || self.backend == 'GCP'",message="gcp is set but backend is not GCP: remove gcp or set backend: GCP"
// +kubebuilder:validation:XValidation:rule="self.backend != 'GCP' || has(self.gcp)",message="gcp is required when backend is GCP: set gcp.project and gcp.credentials"
type ProviderConfigSpec struct {
	// Backend the proxies of this configuration run on.
	Backend BackendType `json:"backend"`

	// Local backend settings.
	// +optional
	Local *LocalBackend `json:"local,omitempty"`

	// Kubernetes backend settings.
	// +optional
	Kubernetes *KubernetesBackend `json:"kubernetes,omitempty"`

	// GCP backend settings.
	// +optional
	GCP *GCPBackend `json:"gcp,omitempty"`

	// Policy bounds what the proxies of this configuration may ask for.
	// +optional
	Policy *Policy `json:"policy,omitempty"`
}

// Policy is what the platform permits the proxies, and so the fleets, of a
// configuration.
type Policy struct {
	// AllowedPrivateDestinations are the private networks a proxy may ask to
	// reach (spec.forProvider.allowedPrivateDestinations), for crawling an
	// internal site. Empty: none; every proxy reaches the public internet
	// only.
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +optional
	AllowedPrivateDestinations []CIDR `json:"allowedPrivateDestinations,omitempty"`
}

// LocalBackend configures Squid processes on the provider's host.
type LocalBackend struct {
	// SquidPath is the Squid binary.
	// +kubebuilder:default="/usr/sbin/squid"
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/')",message="must be an absolute path"
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	SquidPath string `json:"squidPath,omitempty"`

	// StateDir holds one directory per proxy (config, htpasswd, pid file).
	// Empty means the provider's --state-dir.
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/')",message="must be an absolute path"
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	StateDir string `json:"stateDir,omitempty"`

	// PortRange, when set, makes the local backend give each proxy a free
	// port from this range instead of spec.forProvider.port, so that many
	// proxies can share one host. The port in use is in status.atProvider.
	// +optional
	PortRange *PortRange `json:"portRange,omitempty"`
}

// PortRange is an inclusive range of TCP ports.
// +kubebuilder:validation:XValidation:rule="self.from <= self.to",message="from must not be greater than to"
type PortRange struct {
	// From is the first port of the range.
	// +kubebuilder:validation:Minimum=1024
	// +kubebuilder:validation:Maximum=65535
	From int32 `json:"from"`

	// To is the last port of the range.
	// +kubebuilder:validation:Minimum=1024
	// +kubebuilder:validation:Maximum=65535
	To int32 `json:"to"`
}

// KubernetesBackend configures Squid pods.
type KubernetesBackend struct {
	// Namespace pods are created in when a Proxy names none. Empty means the
	// Proxy's own namespace.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	Namespace string `json:"namespace,omitempty"`

	// Credentials for the cluster the pods run in.
	// +optional
	Credentials *KubernetesCredentials `json:"credentials,omitempty"`
}

// KubernetesCredentials say how to reach the cluster pods run in.
// +kubebuilder:validation:XValidation:rule="self.source != 'Secret' || has(self.secretRef)",message="secretRef is required when source is Secret: name a Secret key holding a kubeconfig"
type KubernetesCredentials struct {
	// Source of the credentials: the provider's own in-cluster identity, or
	// a kubeconfig in a Secret.
	// +kubebuilder:validation:Enum=InjectedIdentity;Secret
	// +kubebuilder:default=InjectedIdentity
	Source xpv2.CredentialsSource `json:"source"`

	xpv2.CommonCredentialSelectors `json:",inline"`
}

// GCPBackend configures Compute Engine VMs.
type GCPBackend struct {
	// Project the VMs run in.
	// +kubebuilder:validation:Pattern=`^[a-z][-a-z0-9]{4,28}[a-z0-9]$`
	Project string `json:"project"`

	// Credentials for the Compute Engine API.
	Credentials GCPCredentials `json:"credentials"`
}

// GCPCredentials say how to authenticate to the Compute Engine API.
// +kubebuilder:validation:XValidation:rule="self.source != 'Secret' || has(self.secretRef)",message="secretRef is required when source is Secret: name a Secret key holding a service-account JSON key"
type GCPCredentials struct {
	// Source of the credentials: a service-account JSON key in a Secret, or
	// the provider's injected identity (ADC, workload identity).
	// +kubebuilder:validation:Enum=Secret;InjectedIdentity
	Source xpv2.CredentialsSource `json:"source"`

	xpv2.CommonCredentialSelectors `json:",inline"`
}

// A ProviderConfigStatus is the observed state of a ProviderConfig.
type ProviderConfigStatus struct {
	xpv2.ProviderConfigStatus `json:",inline"`
}

// A ProviderConfig configures the backend of the Proxies in its namespace.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,categories={crossplane,provider,egress}
// +kubebuilder:printcolumn:name="BACKEND",type="string",JSONPath=".spec.backend"
// +kubebuilder:printcolumn:name="USERS",type="integer",JSONPath=".status.users"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
type ProviderConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ProviderConfigSpec   `json:"spec"`
	Status ProviderConfigStatus `json:"status,omitempty"`
}

// ProviderConfigList contains a list of ProviderConfig.
// +kubebuilder:object:root=true
type ProviderConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProviderConfig `json:"items"`
}

// A ClusterProviderConfig configures a backend for Proxies in any namespace.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,categories={crossplane,provider,egress}
// +kubebuilder:printcolumn:name="BACKEND",type="string",JSONPath=".spec.backend"
// +kubebuilder:printcolumn:name="USERS",type="integer",JSONPath=".status.users"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
type ClusterProviderConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ProviderConfigSpec   `json:"spec"`
	Status ProviderConfigStatus `json:"status,omitempty"`
}

// ClusterProviderConfigList contains a list of ClusterProviderConfig.
// +kubebuilder:object:root=true
type ClusterProviderConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterProviderConfig `json:"items"`
}

// A ProviderConfigUsage records that a Proxy uses a ProviderConfig, so the
// ProviderConfig cannot be deleted while in use.
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,categories={crossplane,provider,egress}
// +kubebuilder:printcolumn:name="CONFIG-NAME",type="string",JSONPath=".providerConfigRef.name"
// +kubebuilder:printcolumn:name="RESOURCE-KIND",type="string",JSONPath=".resourceRef.kind"
// +kubebuilder:printcolumn:name="RESOURCE-NAME",type="string",JSONPath=".resourceRef.name"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
type ProviderConfigUsage struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	xpv2.TypedProviderConfigUsage `json:",inline"`
}

// ProviderConfigUsageList contains a list of ProviderConfigUsage.
// +kubebuilder:object:root=true
type ProviderConfigUsageList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProviderConfigUsage `json:"items"`
}

// A ClusterProviderConfigUsage records that a Proxy uses a
// ClusterProviderConfig. It lives in the Proxy's namespace because the Proxy
// owns it.
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,categories={crossplane,provider,egress}
// +kubebuilder:printcolumn:name="CONFIG-NAME",type="string",JSONPath=".providerConfigRef.name"
// +kubebuilder:printcolumn:name="RESOURCE-KIND",type="string",JSONPath=".resourceRef.kind"
// +kubebuilder:printcolumn:name="RESOURCE-NAME",type="string",JSONPath=".resourceRef.name"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
type ClusterProviderConfigUsage struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	xpv2.TypedProviderConfigUsage `json:",inline"`
}

// ClusterProviderConfigUsageList contains a list of ClusterProviderConfigUsage.
// +kubebuilder:object:root=true
type ClusterProviderConfigUsageList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterProviderConfigUsage `json:"items"`
}
