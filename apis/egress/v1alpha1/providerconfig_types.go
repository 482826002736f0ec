package v1alpha1

import (
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BackendType names where a ProviderConfig's proxies run.
// +kubebuilder:validation:Enum=Local;Kubernetes;GCP;AWS
type BackendType string

// Backends.
const (
	// BackendLocal runs each proxy as a Squid process on the provider's host.
	BackendLocal BackendType = "Local"
	// BackendKubernetes runs each proxy as a Squid pod.
	BackendKubernetes BackendType = "Kubernetes"
	// BackendGCP runs each proxy on a Compute Engine VM.
	BackendGCP BackendType = "GCP"
	// BackendAWS runs each proxy on an EC2 instance.
	BackendAWS BackendType = "AWS"
)

// ProviderConfigSpec chooses a backend and holds its settings and credentials.
// +kubebuilder:validation:XValidation:rule="!has(self.local) || self.backend == 'Local'",message="local is set but backend is not Local: remove local or set backend: Local"
// +kubebuilder:validation:XValidation:rule="!has(self.kubernetes) || self.backend == 'Kubernetes'",message="kubernetes is set but backend is not Kubernetes: remove kubernetes or set backend: Kubernetes"
// +kubebuilder:validation:XValidation:rule="!has(self.gcp) || self.backend == 'GCP'",message="gcp is set but backend is not GCP: remove gcp or set backend: GCP"
// +kubebuilder:validation:XValidation:rule="self.backend != 'GCP' || has(self.gcp)",message="gcp is required when backend is GCP: set gcp.project and gcp.credentials"
// +kubebuilder:validation:XValidation:rule="!has(self.aws) || self.backend == 'AWS'",message="aws is set but backend is not AWS: remove aws or set backend: AWS"
// +kubebuilder:validation:XValidation:rule="self.backend != 'AWS' || has(self.aws)",message="aws is required when backend is AWS: set aws.region and aws.credentials"
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

	// AWS backend settings.
	// +optional
	AWS *AWSBackend `json:"aws,omitempty"`

	// Policy bounds what the proxies of this configuration may ask for.
	// +optional
	Policy *Policy `json:"policy,omitempty"`

	// Probe says where the provider's own probe reaches this
	// configuration's proxies from, so that each proxy lets it in.
	// +optional
	Probe *ProbeSource `json:"probe,omitempty"`
}

// ProbeSource is where the provider's probe comes from, as the proxies see
// it.
type ProbeSource struct {
	// SourceRanges the provider's probe reaches proxies from: the address
	// its traffic leaves the provider's network with (a Cloud NAT's or
	// NAT gateway's address, a node's external IP), as a /32 or a range.
	// Each is added, beside spec.forProvider.allowedSourceRanges, to every
	// proxy's firewall rule (GCP) and to its Squid's client ACL, so that a
	// Proxy that restricts its clients can still be probed; a Proxy that
	// lists no source ranges admits any client with credentials, the probe
	// included, and gets nothing added. Like allowedSourceRanges, a range
	// outside private, loopback and CGNAT space needs the proxy's
	// credentials. A change replaces the proxies whose ranges it changes.
	// +kubebuilder:validation:MaxItems=16
	// +listType=set
	// +optional
	SourceRanges []CIDR `json:"sourceRanges,omitempty"`
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

	// AllowedProxyNamespaces are the namespaces whose Proxies (and so
	// fleets) may use this configuration. Empty: every namespace. A
	// namespaced ProviderConfig serves its own namespace only.
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=set
	// +optional
	AllowedProxyNamespaces []string `json:"allowedProxyNamespaces,omitempty"`

	// Local bounds the Squid processes of the local backend.
	// +optional
	Local *LocalPolicy `json:"local,omitempty"`

	// Kubernetes bounds the pods of the kubernetes backend.
	// +optional
	Kubernetes *KubernetesPolicy `json:"kubernetes,omitempty"`

	// GCP bounds the VMs of the GCP backend.
	// +optional
	GCP *GCPPolicy `json:"gcp,omitempty"`

	// AWS bounds the instances of the AWS backend.
	// +optional
	AWS *AWSPolicy `json:"aws,omitempty"`
}

// LocalPolicy is what a Proxy's local Squid may ask for. The provider
// refuses a Proxy that asks for more, before anything is started.
type LocalPolicy struct {
	// AllowedBindAddresses a local proxy may listen on. Empty: loopback
	// (127.0.0.1 and ::1) only, so that nobody off the provider's host
	// can reach a local proxy.
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +optional
	AllowedBindAddresses []IPAddress `json:"allowedBindAddresses,omitempty"`

	// AllowLoopbackDestinations lets local proxies bound to loopback reach
	// the provider host's own loopback services, where local targets (and
	// this project's tests) live. Off by default: they would reach every
	// service of the host that listens on loopback. Only a
	// ClusterProviderConfig can turn it on.
	// +optional
	AllowLoopbackDestinations bool `json:"allowLoopbackDestinations,omitempty"`
}

// KubernetesPolicy is what a Proxy's pod may ask for. The provider refuses
// a Proxy that asks for more, before anything is created.
type KubernetesPolicy struct {
	// AllowedNamespaces pods may run in. Empty: spec.kubernetes.namespace
	// of a ClusterProviderConfig when set, otherwise the Proxy's own
	// namespace. A namespaced ProviderConfig never places pods outside its
	// own namespace.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=set
	// +optional
	AllowedNamespaces []string `json:"allowedNamespaces,omitempty"`

	// AllowedImages pods may run: a repository (docker.io/ubuntu/squid,
	// which admits any of its tags and digests), an exact reference, or a
	// prefix ending in "/" (registry.example.com/proxies/). Empty: the
	// pinned Squid image only.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=512
	// +listType=set
	// +optional
	AllowedImages []string `json:"allowedImages,omitempty"`

	// AllowedNodeSelectorKeys are the node labels a pod may select on.
	// Empty: topology.kubernetes.io/zone only, which a fleet's zone spread
	// sets.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=317
	// +listType=set
	// +optional
	AllowedNodeSelectorKeys []string `json:"allowedNodeSelectorKeys,omitempty"`
}

// GCPPolicy is what a Proxy's VM may ask for. The provider refuses a Proxy
// that asks for more, before anything is created.
type GCPPolicy struct {
	// AllowedNetworks VMs may attach to, as global/networks/NAME or NAME.
	// Empty: the default network only.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=512
	// +listType=set
	// +optional
	AllowedNetworks []string `json:"allowedNetworks,omitempty"`

	// AllowedSubnetworks VMs may attach to, as regions/R/subnetworks/NAME
	// in the ProviderConfig's project or projects/HOST/regions/R/
	// subnetworks/NAME in a Shared VPC's host project. Empty: none, so VMs
	// attach only to an auto-mode network's own subnetwork.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=512
	// +listType=set
	// +optional
	AllowedSubnetworks []string `json:"allowedSubnetworks,omitempty"`

	// AllowedNetworkTags VMs may carry. Tags can match the project's other
	// firewall rules, so none is allowed unless listed. Empty: none.
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +optional
	AllowedNetworkTags []NetworkTag `json:"allowedNetworkTags,omitempty"`

	// AllowedMachineTypes VMs may use, by name (e2-small). Empty: e2-micro,
	// e2-small and e2-medium.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +listType=set
	// +optional
	AllowedMachineTypes []string `json:"allowedMachineTypes,omitempty"`

	// AllowedImages VMs may boot: an exact image or family URL, or a prefix
	// ending in "/" (projects/my-project/global/images/). Empty: the
	// default Debian 12 family only.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=512
	// +listType=set
	// +optional
	AllowedImages []string `json:"allowedImages,omitempty"`

	// AllowCloudInit lets Proxies replace the generated startup script
	// with their own (spec.forProvider.gcp.cloudInit): code of the fleet
	// author's choosing on a VM with a public IP in this project. Off by
	// default.
	// +optional
	AllowCloudInit bool `json:"allowCloudInit,omitempty"`
}

// LocalBackend configures Squid processes on the provider's host.
type LocalBackend struct {
	// SquidPath is the Squid binary; empty means /usr/sbin/squid. Only a
	// ClusterProviderConfig may set it.
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/')",message="must be an absolute path"
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	SquidPath string `json:"squidPath,omitempty"`

	// StateDir holds one directory per proxy (config, htpasswd, pid file).
	// Empty means the provider's --state-dir. Only a ClusterProviderConfig
	// may set it.
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/')",message="must be an absolute path"
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	StateDir string `json:"stateDir,omitempty"`

	// PortRange, when set, makes the local backend give each proxy a free
	// port from this range instead of spec.forProvider.port, so that many
	// proxies can share one host. The port in use is in status.atProvider.
	// Only a ClusterProviderConfig may set it.
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
// It belongs to the namespace's tenant, so it cannot run or write anything
// on the provider's host, nor borrow the provider's identity.
// +kubebuilder:validation:XValidation:rule="!has(self.spec.local) || (!has(self.spec.local.squidPath) && !has(self.spec.local.stateDir) && !has(self.spec.local.portRange))",message="spec.local.squidPath, stateDir and portRange may be set only on a ClusterProviderConfig"
// +kubebuilder:validation:XValidation:rule="self.spec.backend != 'Kubernetes' || (has(self.spec.kubernetes) && has(self.spec.kubernetes.credentials) && self.spec.kubernetes.credentials.source == 'Secret')",message="spec.kubernetes.credentials.source must be Secret: only a ClusterProviderConfig may use the provider's own identity"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.gcp) || self.spec.gcp.credentials.source == 'Secret'",message="spec.gcp.credentials.source must be Secret: only a ClusterProviderConfig may use the provider's own identity"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.aws) || self.spec.aws.credentials.source == 'Secret'",message="spec.aws.credentials.source must be Secret: only a ClusterProviderConfig may use the provider's own identity"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.policy) || (!has(self.spec.policy.local) && !has(self.spec.policy.allowedProxyNamespaces))",message="spec.policy.local and spec.policy.allowedProxyNamespaces may be set only on a ClusterProviderConfig: a ProviderConfig's local proxies listen on loopback and reach no loopback service, and it serves its own namespace"
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
