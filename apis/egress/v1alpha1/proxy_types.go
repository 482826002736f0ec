package v1alpha1

import (
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Defaults that Go code applies where no apiserver has defaulted an object
// (crossplane render does not). The kubebuilder default markers state the
// same values; apis_test.go fails when the two disagree.
const (
	// DefaultPort is the port a proxy listens on.
	DefaultPort int32 = 3128
	// DefaultMaxLeases is how many crawlers may share one proxy.
	DefaultMaxLeases int32 = 1
	// DefaultGCPMachineType, DefaultGCPImage and DefaultGCPNetwork are
	// what a proxy's VM is when its Proxy names none.
	DefaultGCPMachineType = "e2-micro"
	DefaultGCPImage       = "projects/debian-cloud/global/images/family/debian-12"
	// GCPPublishedExternal and GCPPublishedInternal are the values of
	// GCPInstance.PublishedAddress.
	GCPPublishedExternal = "External"
	GCPPublishedInternal = "Internal"
	DefaultGCPNetwork    = "global/networks/default"
	// DefaultGCPBootDiskType is a VM's boot disk type unless its Proxy
	// names another.
	DefaultGCPBootDiskType = "pd-balanced"
	// ReasonNotPermitted is the Ready reason of a Proxy its
	// ProviderConfig's policy refuses: nothing is made for it, and a
	// replacement would be refused alike.
	ReasonNotPermitted = "NotPermitted"
	// ReasonAwaitingProbe is the Ready reason of a Proxy whose instance
	// runs but has not yet passed its first probe (or the check that it
	// demands credentials): it is still booting.
	ReasonAwaitingProbe = "AwaitingProbe"
	// LabelProxySecret marks a Secret that proxies may use: as credentials
	// (authSecretRef) or as cloud-init. Only someone who may write the
	// Secret can set it, so a fleet author cannot point a proxy, and
	// through egress-discovery its crawlers, at another Secret of the
	// namespace.
	LabelProxySecret = "egress.crawl.example.com/proxy-secret"
	// DefaultUsernameKey is the auth Secret's key holding the username.
	DefaultUsernameKey = "username"
	// DefaultPasswordKey is the auth Secret's key holding the password.
	DefaultPasswordKey = "password"
	// DefaultProbeInterval is the time between probes.
	DefaultProbeInterval = 30 * time.Second
	// DefaultProbeTimeout bounds one probe.
	DefaultProbeTimeout = 5 * time.Second
)

// ProxyMode says who runs a proxy's instance.
// +kubebuilder:validation:Enum=Managed;External
type ProxyMode string

// Proxy modes.
const (
	// ProxyModeManaged means the provider creates the instance on the
	// backend chosen by the ProviderConfig, and deletes it with the Proxy.
	ProxyModeManaged ProxyMode = "Managed"

	// ProxyModeExternal means somebody else runs the proxy; the provider only
	// probes its endpoint and never creates or deletes anything.
	ProxyModeExternal ProxyMode = "External"
)

// CIDR is an IPv4 or IPv6 network in CIDR notation.
// +kubebuilder:validation:MaxLength=49
// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="must be a network in CIDR notation, such as 10.0.0.0/8 or 2001:db8::/32"
type CIDR string

// IPAddress is an IPv4 or IPv6 address.
// +kubebuilder:validation:MaxLength=45
// +kubebuilder:validation:XValidation:rule="isIP(self)",message="must be an IPv4 or IPv6 address, such as 127.0.0.1"
type IPAddress string

// NetworkTag is a GCP network tag: lowercase letters, digits and dashes.
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:Pattern=`^[a-z]([-a-z0-9]*[a-z0-9])?$`
type NetworkTag string

// ProxyParameters are the configurable fields of a Proxy.
// +kubebuilder:validation:XValidation:rule="self.mode != 'External' || has(self.endpoint)",message="endpoint is required when mode is External: set endpoint.host and endpoint.port of the proxy you run"
// +kubebuilder:validation:XValidation:rule="self.mode != 'External' || !(has(self.local) || has(self.kubernetes) || has(self.gcp) || has(self.aws))",message="an External proxy takes no backend placement: remove local, kubernetes, gcp and aws, or use mode Managed"
// +kubebuilder:validation:XValidation:rule="self.mode == 'External' || !has(self.endpoint)",message="endpoint is only for mode External: a Managed proxy gets its endpoint from its backend"
// +kubebuilder:validation:XValidation:rule="self.mode == 'External' || (has(self.local) ? 1 : 0) + (has(self.kubernetes) ? 1 : 0) + (has(self.gcp) ? 1 : 0) + (has(self.aws) ? 1 : 0) == 1",message="a Managed proxy needs exactly one backend placement: set one of local, kubernetes, gcp or aws"
// +kubebuilder:validation:XValidation:rule="self.mode == 'External' || has(self.authSecretRef) || (has(self.allowedSourceRanges) && size(self.allowedSourceRanges) > 0)",message="refusing an open proxy: set authSecretRef (credentials) and/or allowedSourceRanges"
// +kubebuilder:validation:XValidation:rule="has(self.authSecretRef) || !has(self.allowedSourceRanges) || self.allowedSourceRanges.all(r, ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10', '127.0.0.0/8', '::1/128', 'fc00::/7', 'fe80::/10'].exists(p, cidr(p).containsCIDR(r)))",message="allowedSourceRanges: without authSecretRef every range must lie in private, loopback or CGNAT space; a public client range is an open proxy: add authSecretRef or narrow the ranges"
// +kubebuilder:validation:XValidation:rule="!has(self.gcp) || (has(self.gcp.publishedAddress) && self.gcp.publishedAddress == 'Internal') || has(self.gcp.cloudInit) || !has(self.allowedSourceRanges) || size(self.allowedSourceRanges) == 0 || self.allowedSourceRanges.exists(r, !['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10'].exists(p, cidr(p).containsCIDR(r)))",message="allowedSourceRanges: a GCP proxy open to private networks only cannot serve at its external IP, which clients inside a VPC reach only from an external address: set gcp.publishedAddress: Internal, or list the crawlers' external ranges"
// +kubebuilder:validation:XValidation:rule="!has(self.gcp) || !has(self.port) || self.port >= 1024",message="port: a GCP proxy listens on 1024 or above: a lower port needs privileges the distribution's Squid AppArmor profile may deny, and the VM's proxy would never come up"
// +kubebuilder:validation:XValidation:rule="!has(self.gcp) || !has(self.allowedSourceRanges) || self.allowedSourceRanges.all(r, cidr(r).ip().family() == 4)",message="allowedSourceRanges: a GCP proxy's firewall rule takes IPv4 ranges only, and its VM has an IPv4 address only: remove the IPv6 ranges"
// +kubebuilder:validation:XValidation:rule="!has(self.aws) || !has(self.allowedSourceRanges) || self.allowedSourceRanges.all(r, cidr(r).ip().family() == 4)",message="allowedSourceRanges: an AWS proxy's security group is opened to IPv4 ranges only, and its instance has an IPv4 address only: remove the IPv6 ranges"
// +kubebuilder:validation:XValidation:rule="!has(self.aws) || !has(self.port) || self.port >= 1024",message="port: an AWS proxy listens on 1024 or above: a lower port needs privileges the distribution's Squid AppArmor profile may deny, and the instance's proxy would never come up"
// +kubebuilder:validation:XValidation:rule="!has(self.aws) || has(self.aws.userData) || !has(self.allowedSourceRanges) || size(self.allowedSourceRanges) == 0 || self.allowedSourceRanges.exists(r, !['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10'].exists(p, cidr(p).containsCIDR(r)))",message="allowedSourceRanges: an AWS proxy open to private networks only cannot serve at its public IP, which clients inside a VPC reach only from a public address: list the crawlers' external ranges (with authSecretRef)"
// +kubebuilder:validation:XValidation:rule="has(self.local) == has(oldSelf.local) && has(self.kubernetes) == has(oldSelf.kubernetes) && has(self.gcp) == has(oldSelf.gcp) && has(self.aws) == has(oldSelf.aws)",message="the backend placement is immutable: a Proxy keeps the one of local, kubernetes, gcp or aws it was created with (the address rule of its probe and of the gateway goes by it); create a new Proxy instead"
type ProxyParameters struct {
	// Mode says who runs the proxy. Managed proxies are created on the
	// ProviderConfig's backend; External proxies are only probed.
	// +kubebuilder:default=Managed
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="mode is immutable: create a new Proxy instead"
	// +optional
	Mode ProxyMode `json:"mode,omitempty"`

	// Local places the proxy as a Squid process on the provider's host.
	// +optional
	Local *LocalPlacement `json:"local,omitempty"`

	// Kubernetes places the proxy as a Squid pod.
	// +optional
	Kubernetes *KubernetesPlacement `json:"kubernetes,omitempty"`

	// GCP places the proxy on a Compute Engine VM with its own external IP.
	// +optional
	GCP *GCPPlacement `json:"gcp,omitempty"`

	// AWS places the proxy on an EC2 instance with its own public IPv4
	// address.
	// +optional
	AWS *AWSPlacement `json:"aws,omitempty"`

	// Port the proxy listens on.
	// +kubebuilder:default=3128
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`

	// AuthSecretRef names a Secret in the Proxy's namespace holding the
	// username and password clients must present (HTTP basic proxy auth).
	// +optional
	AuthSecretRef *AuthSecretReference `json:"authSecretRef,omitempty"`

	// CredentialGracePeriod is how long a proxy whose credentials change
	// keeps accepting the previous ones besides the new, where its backend
	// changes them in place (local processes and pods; a GCP VM is
	// replaced instead). Zero refuses the previous credentials at once.
	// Defaults to 1h; a fleet sets its leases' maxTTL.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('168h')",message="credentialGracePeriod must be at most 168h"
	// +optional
	CredentialGracePeriod *metav1.Duration `json:"credentialGracePeriod,omitempty"`

	// AllowedSourceRanges restricts which client networks may use the proxy.
	// Empty means any source that presents credentials.
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +optional
	AllowedSourceRanges []CIDR `json:"allowedSourceRanges,omitempty"`

	// AllowedPrivateDestinations are private networks the proxy may reach
	// after all, for crawling an internal site; every one must lie within
	// the ProviderConfig's spec.policy.allowedPrivateDestinations. By default
	// a proxy reaches the public internet only.
	// +kubebuilder:validation:MaxItems=16
	// +listType=set
	// +optional
	AllowedPrivateDestinations []CIDR `json:"allowedPrivateDestinations,omitempty"`

	// HealthCheck says how the provider probes through the proxy.
	HealthCheck HealthCheck `json:"healthCheck"`

	// MaxLeases is how many crawlers may hold a lease on this proxy at once.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +optional
	MaxLeases int32 `json:"maxLeases,omitempty"`

	// Endpoint of a proxy somebody else runs; only for mode External.
	// +optional
	Endpoint *Endpoint `json:"endpoint,omitempty"`
}

// LocalPlacement places a proxy as a Squid process on the provider's host.
type LocalPlacement struct {
	// BindAddress is the address Squid listens on.
	// +kubebuilder:default="127.0.0.1"
	// +optional
	BindAddress IPAddress `json:"bindAddress,omitempty"`

	// OutgoingAddress is the local address Squid sends requests from
	// (tcp_outgoing_address), for hosts with several egress addresses.
	// +optional
	OutgoingAddress IPAddress `json:"outgoingAddress,omitempty"`
}

// KubernetesPlacement places a proxy as a Squid pod.
type KubernetesPlacement struct {
	// Namespace the pod runs in. Defaults to the ProviderConfig's pod
	// namespace, then to the Proxy's own namespace.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	Namespace string `json:"namespace,omitempty"`

	// NodeSelector constrains the nodes the pod may run on, for example to
	// nodes whose NAT gives them a distinct egress IP.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Image overrides the pinned Squid image.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Image string `json:"image,omitempty"`

	// ClientNamespaces are namespaces whose pods may connect to the proxy,
	// besides allowedSourceRanges, in the pod's NetworkPolicy. With neither,
	// any client may connect and must present the credentials.
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=set
	// +optional
	ClientNamespaces []string `json:"clientNamespaces,omitempty"`
}

// GCPPlacement places a proxy on a Compute Engine VM.
// +kubebuilder:validation:XValidation:rule="!has(self.subnetwork) || ('/' + self.subnetwork).contains('/regions/' + self.zone.substring(0, self.zone.lastIndexOf('-')) + '/subnetworks/')",message="subnetwork must be in the zone's region: a VM in zone europe-west1-b takes a subnetwork of regions/europe-west1"
type GCPPlacement struct {
	// Zone the VM runs in, such as europe-west1-b.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z]+-[a-z]+[0-9]+-[a-z]$`
	Zone string `json:"zone"`

	GCPInstance `json:",inline"`
}

// GCPInstance is what a proxy's VM is made of, apart from its zone: a
// ProxyFleet sets it once and spreads its Proxies over zones.
// +kubebuilder:validation:XValidation:rule="!has(self.subnetwork) || !self.subnetwork.contains('projects/') || (has(self.network) && self.network.contains('projects/'))",message="a subnetwork of another project (Shared VPC) needs network set to that project's network, projects/HOST/global/networks/NAME: the firewall rule is made there"
type GCPInstance struct {
	// MachineType of the VM.
	// +kubebuilder:default="e2-micro"
	// +kubebuilder:validation:MaxLength=64
	// +optional
	MachineType string `json:"machineType,omitempty"`

	// Image the VM boots, as a full or partial image URL.
	// +kubebuilder:default="projects/debian-cloud/global/images/family/debian-12"
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Image string `json:"image,omitempty"`

	// Network the VM's interface attaches to, and the proxy's firewall
	// rule belongs to: global/networks/NAME in the ProviderConfig's
	// project, or projects/HOST/global/networks/NAME, a Shared VPC's host
	// network (the firewall rule is then made in the host project).
	// +kubebuilder:default="global/networks/default"
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^((https://www\.googleapis\.com/compute/v1/)?(projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/)?global/networks/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`
	// +optional
	Network string `json:"network,omitempty"`

	// Subnetwork the VM's interface attaches to, which custom-mode and
	// Shared VPC networks need: regions/REGION/subnetworks/NAME, or
	// projects/HOST/regions/REGION/subnetworks/NAME in a Shared VPC's host
	// project. It must belong to network, so with a host project's
	// subnetwork set network to that project's network too. Unset: the
	// network's auto-mode subnetwork of the zone's region.
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^(https://www\.googleapis\.com/compute/v1/)?(projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/)?regions/[a-z]+-[a-z]+[0-9]+/subnetworks/[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`
	// +optional
	Subnetwork string `json:"subnetwork,omitempty"`

	// BootDiskType of the VM's boot disk. pd-balanced suits every
	// machine family this backend uses; the newer families (c3, n4, ...)
	// refuse pd-standard, and the older ones (e2, n1) refuse Hyperdisk.
	// +kubebuilder:default=pd-balanced
	// +kubebuilder:validation:Enum=pd-balanced;pd-ssd;pd-standard;hyperdisk-balanced
	// +optional
	BootDiskType string `json:"bootDiskType,omitempty"`

	// ShieldedVM turns on Secure Boot, vTPM and integrity monitoring, as
	// the compute.requireShieldedVm organisation policy demands. The image
	// must support it; Debian's and Ubuntu's public images do.
	// +kubebuilder:default=true
	// +optional
	ShieldedVM *bool `json:"shieldedVM,omitempty"`

	// PublishedAddress is the VM's address crawlers connect to: External
	// (its ephemeral external IP) or Internal (its address in the VPC, for
	// crawlers in the same network or one peered to it). Traffic leaves
	// through the external IP either way. Clients inside the VPC reach an
	// external IP only from their own external address, so a proxy whose
	// allowedSourceRanges are private networks only needs Internal.
	// +kubebuilder:default=External
	// +kubebuilder:validation:Enum=External;Internal
	// +optional
	PublishedAddress string `json:"publishedAddress,omitempty"`

	// NetworkTags put on the VM; the proxy's firewall rule targets them.
	// +kubebuilder:validation:MaxItems=16
	// +listType=set
	// +optional
	NetworkTags []NetworkTag `json:"networkTags,omitempty"`

	// CloudInit replaces the generated Squid startup script, for teams with
	// their own proxy image. Content starting with #cloud-config goes to
	// the user-data metadata key, which cloud-init reads (Ubuntu and
	// Container-Optimized OS images run cloud-init; Debian's do not);
	// anything else goes to startup-script, which the guest agent of
	// every Google public image runs.
	// +optional
	CloudInit *CloudInit `json:"cloudInit,omitempty"`
}

// CloudInit is user-supplied VM start-up configuration.
// +kubebuilder:validation:XValidation:rule="has(self.inline) != has(self.secretRef)",message="cloudInit needs exactly one of inline or secretRef"
type CloudInit struct {
	// Inline cloud-init or startup script.
	// +kubebuilder:validation:MaxLength=262144
	// +optional
	Inline *string `json:"inline,omitempty"`

	// SecretRef names a key of a Secret in the Proxy's namespace holding it.
	// A change to that Secret replaces the VM.
	// +optional
	SecretRef *xpv2.LocalSecretKeySelector `json:"secretRef,omitempty"`
}

// AuthSecretReference names a Secret holding proxy credentials.
type AuthSecretReference struct {
	// Name of the Secret, in the Proxy's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// UsernameKey is the Secret key holding the username.
	// +kubebuilder:default=username
	// +optional
	UsernameKey string `json:"usernameKey,omitempty"`

	// PasswordKey is the Secret key holding the password.
	// +kubebuilder:default=password
	// +optional
	PasswordKey string `json:"passwordKey,omitempty"`
}

// Keys returns the Secret keys holding the username and the password, with
// the defaults for those left empty.
func (r *AuthSecretReference) Keys() (username, password string) {
	username, password = r.UsernameKey, r.PasswordKey
	if username == "" {
		username = DefaultUsernameKey
	}
	if password == "" {
		password = DefaultPasswordKey
	}
	return username, password
}

// HealthCheck says how to probe through a proxy.
// +kubebuilder:validation:XValidation:rule="!has(self.timeout) || !has(self.interval) || duration(self.timeout) < duration(self.interval)",message="timeout must be shorter than interval"
type HealthCheck struct {
	// URL fetched through the proxy: CONNECT for https, GET for http. A
	// target that answers with the caller's IP as plain text also reveals
	// the proxy's egress IP.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''",message="must be an absolute http:// or https:// URL, such as https://ifconfig.me/ip"
	URL string `json:"url"`

	// Interval between probes; it also sets how often the Proxy is polled.
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="must be at least 1s"
	// +optional
	Interval *metav1.Duration `json:"interval,omitempty"`

	// Timeout of one probe.
	// +kubebuilder:default="5s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// SuccessThreshold is how many consecutive passing probes turn an
	// unhealthy proxy healthy.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	SuccessThreshold int32 `json:"successThreshold,omitempty"`

	// FailureThreshold is how many consecutive failing probes turn a
	// healthy proxy unhealthy.
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	FailureThreshold int32 `json:"failureThreshold,omitempty"`

	// ExpectedStatus is the HTTP status the probe target must answer.
	// +kubebuilder:default=200
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=599
	// +optional
	ExpectedStatus int32 `json:"expectedStatus,omitempty"`
}

// IntervalOrDefault is the time between probes.
func (h *HealthCheck) IntervalOrDefault() time.Duration {
	if h.Interval != nil && h.Interval.Duration > 0 {
		return h.Interval.Duration
	}
	return DefaultProbeInterval
}

// TimeoutOrDefault bounds one probe.
func (h *HealthCheck) TimeoutOrDefault() time.Duration {
	if h.Timeout != nil && h.Timeout.Duration > 0 {
		return h.Timeout.Duration
	}
	return DefaultProbeTimeout
}

// Endpoint is where a proxy listens.
type Endpoint struct {
	// Host name or IP address of the proxy.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Host string `json:"host"`

	// Port of the proxy.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`
}

// InstancePhase is the lifecycle phase of a proxy's instance on its backend.
type InstancePhase string

// Instance phases.
const (
	// InstancePhaseProvisioning means the instance exists but cannot serve
	// yet, including a running instance that has no address.
	InstancePhaseProvisioning InstancePhase = "Provisioning"
	// InstancePhaseRunning means the instance runs and has an address.
	InstancePhaseRunning InstancePhase = "Running"
	// InstancePhaseTerminated means the instance stopped and is recreated.
	InstancePhaseTerminated InstancePhase = "Terminated"
)

// ProxyObservation is the observed state of a Proxy.
type ProxyObservation struct {
	// ProviderID identifies the instance on its backend: local/<name>,
	// <namespace>/<pod>, or projects/P/zones/Z/instances/N.
	ProviderID string `json:"providerID,omitempty"`

	// ImportedFrom is the external-name of the instance the Proxy
	// imported, once it did: it is not imported a second time, and a
	// Proxy whose imported instance is gone makes one of its own.
	ImportedFrom string `json:"importedFrom,omitempty"`

	// Host clients connect to.
	Host string `json:"host,omitempty"`

	// Port clients connect to.
	Port int32 `json:"port,omitempty"`

	// EgressIP is the address the probe target saw, which is what the
	// crawled sites see.
	EgressIP string `json:"egressIP,omitempty"`

	// Phase of the instance on its backend.
	Phase InstancePhase `json:"phase,omitempty"`

	// Healthy is the probe verdict after thresholds.
	Healthy bool `json:"healthy,omitempty"`

	// LatencyMilliseconds of recent successful probes, in coarse steps
	// (1, 2, 5, 10, 20, 50, 100, 200, 500 ... ms): the step nearest the
	// median of the last three probes' latency once that is more than 2.5
	// times and 20ms away from the recorded step. It is informational and
	// never changes the status on its own: it is recorded when a probe
	// changes something else here (the health counters or verdict, the
	// probe error, the egress IP), so on a steady proxy it is as old as
	// lastProbeTime (the provider's probe duration metric has every
	// probe).
	LatencyMilliseconds int64 `json:"latencyMilliseconds,omitempty"`

	// LastProbeTime is when a probe last changed this status. While probes
	// change nothing it stays as it is: a steady proxy's status is not
	// written at all, so that its pool is not composed again for nothing
	// (the provider's probe metrics and the ProbeFailing event say probes
	// run and what they find).
	LastProbeTime *metav1.Time `json:"lastProbeTime,omitempty"`

	// ConsecutiveSuccesses counts passing probes since the last failure, up
	// to the success threshold.
	ConsecutiveSuccesses int32 `json:"consecutiveSuccesses,omitempty"`

	// ConsecutiveFailures counts failing probes since the last success, up
	// to the failure threshold.
	ConsecutiveFailures int32 `json:"consecutiveFailures,omitempty"`

	// LastProbeError says why the last probe failed.
	LastProbeError string `json:"lastProbeError,omitempty"`

	// InstanceCreatedAt is when the current instance was created.
	InstanceCreatedAt *metav1.Time `json:"instanceCreatedAt,omitempty"`

	// PreviousCredentialsUntil is when the instance stops accepting the
	// credentials it had before they last changed in place; unset when it
	// accepts only the current ones.
	PreviousCredentialsUntil *metav1.Time `json:"previousCredentialsUntil,omitempty"`

	// CredentialsOutdated says the instance accepts credentials that are
	// no longer those of its auth Secret, and cannot change them in place
	// (a GCP VM): the fleet replaces it, and discovery hands it to no new
	// crawler meanwhile.
	CredentialsOutdated bool `json:"credentialsOutdated,omitempty"`
}

// DefaultCredentialGracePeriod is how long a Proxy outside a fleet keeps
// accepting its previous credentials after they change in place.
const DefaultCredentialGracePeriod = time.Hour

// GracePeriod is how long the previous credentials stay accepted.
func (p *ProxyParameters) GracePeriod() time.Duration {
	if p.CredentialGracePeriod == nil {
		return DefaultCredentialGracePeriod
	}
	return p.CredentialGracePeriod.Duration
}

// ProxySpec defines the desired state of a Proxy. Its providerConfigRef's
// kind may not change: it says whose backend the proxy's address comes
// from (a namespaced ProviderConfig's is its tenant's to choose), which the
// probe and the gateway judge that address by, and a proxy moved between a
// tenant's backend and the platform's would be judged by the new kind while
// it still has the old one's address.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.providerConfigRef) || (has(self.providerConfigRef) && self.providerConfigRef.kind == oldSelf.providerConfigRef.kind)",message="providerConfigRef.kind is immutable: a Proxy stays on the kind of ProviderConfig it was created with; create a new Proxy instead"
type ProxySpec struct {
	xpv2.ManagedResourceSpec `json:",inline"`

	// ForProvider holds the proxy's configuration.
	ForProvider ProxyParameters `json:"forProvider"`
}

// ProxyStatus represents the observed state of a Proxy.
type ProxyStatus struct {
	xpv2.ManagedResourceStatus `json:",inline"`

	// AtProvider holds what the provider observed of the proxy.
	AtProvider ProxyObservation `json:"atProvider,omitempty"`
}

// A Proxy is one egress forward proxy, kept healthy by probing through it.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,categories={crossplane,managed,egress},shortName=eproxy
// +kubebuilder:printcolumn:name="READY",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].status"
// +kubebuilder:printcolumn:name="SYNCED",type="string",JSONPath=".status.conditions[?(@.type=='Synced')].status"
// +kubebuilder:printcolumn:name="HOST",type="string",JSONPath=".status.atProvider.host"
// +kubebuilder:printcolumn:name="EGRESS-IP",type="string",JSONPath=".status.atProvider.egressIP"
// +kubebuilder:printcolumn:name="LATENCY",type="integer",JSONPath=".status.atProvider.latencyMilliseconds",description="Latency in milliseconds, as of the last status change a probe made"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="MODE",type="string",JSONPath=".spec.forProvider.mode",priority=1
// +kubebuilder:printcolumn:name="PHASE",type="string",JSONPath=".status.atProvider.phase",priority=1
// +kubebuilder:printcolumn:name="PROVIDER-ID",type="string",JSONPath=".status.atProvider.providerID",priority=1
// +kubebuilder:printcolumn:name="EXTERNAL-NAME",type="string",JSONPath=".metadata.annotations.crossplane\\.io/external-name",priority=1
type Proxy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ProxySpec   `json:"spec"`
	Status ProxyStatus `json:"status,omitempty"`
}

// ProxyList contains a list of Proxy.
// +kubebuilder:object:root=true
type ProxyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Proxy `json:"items"`
}
