package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	egressv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
)

// Defaults that Go code applies where no apiserver has defaulted the XR
// (crossplane render does not). The kubebuilder default markers state the
// same values; defaults_test.go fails when the two disagree.
const (
	DefaultReplicas              int32 = 3
	DefaultMaxSurge              int32 = 1
	DefaultMaxUnavailable        int32 = 0
	DefaultReplaceUnhealthyAfter       = 5 * time.Minute
	DefaultProgressDeadline            = 10 * time.Minute
	DefaultLeaseTTL                    = 10 * time.Minute
	DefaultMaxLeaseTTL                 = time.Hour
	DefaultMaxBanCooldown              = 24 * time.Hour
	// Autoscaling defaults, as a HorizontalPodAutoscaler's: scale up at
	// once, scale down after 5 minutes of asking for fewer.
	DefaultMinReplicas            int32 = 1
	DefaultTargetUtilization            = 0.7
	DefaultScaleUpStabilization         = time.Duration(0)
	DefaultScaleDownStabilization       = 5 * time.Minute
	// MinLeaseTTL and MaxLeaseTTL bound every lease TTL: a Lease object's
	// duration is whole seconds, and a lease is not a way to own a proxy.
	MinLeaseTTL               = time.Second
	MaxLeaseTTL               = 7 * 24 * time.Hour
	DefaultProviderConfigName = "default"
	// MaxReplicas bounds spec.replicas (and spec.autoscaling.maxReplicas)
	// of a pooled fleet; MaxUnpooledReplicas what one level of Proxies
	// holds, as the message bound below allows with maxSurge 1.
	MaxReplicas         = 10000
	MaxUnpooledReplicas = 242
	// MaxProxiesPerPool bounds spec.pools.proxiesPerPool, so that a pool's
	// RunFunctionRequest (its Proxies and leased proxies, the rule below
	// with PoolMessageBudget) stays within a quarter of 4 MiB; MaxPools bounds how many pools a fleet has: each
	// observed pool adds up to PoolMessageBytes to the fleet's request
	// (most of it Crossplane's reference to each of its Proxies, in
	// spec.crossplane.resourceRefs), so MaxPools
	// of them stay within a quarter of the function's default receive
	// limit, 16 MiB (internal/function's DefaultMaxRecvMessageMiB).
	MaxProxiesPerPool = 120
	MaxPools          = 96
	PoolMessageBytes  = 30600
	// PoolOrdinalSpan is how many ordinals each pool has: pool k names its
	// Proxies <fleet>-<ordinal> with ordinals from k x PoolOrdinalSpan on,
	// so that no two pools ever name one Proxy, a Proxy never moves between
	// pools, and a fleet composed before pools (ordinals from 0) never
	// meets a pooled one's. Ordinals stay within ten digits.
	PoolOrdinalSpan = 10_000_000
	// ProxyMessageBytes bounds what one Proxy, as the apiserver returns it
	// (managedFields included), adds to the RunFunctionRequest Crossplane
	// sends the function; LeasedProxyMessageBytes what one leased proxy
	// adds to egress-discovery's LeaseSummaries sent beside it, however
	// many leases are held on it (a summary counts them), with three
	// replicas' summaries listing it (two, and one rolling over). Leases
	// themselves are not sent. BenchmarkMessageSizes measures both, and
	// TestMessageSizesBounded holds them to these figures (with the longest
	// names allowed). MessageBudget is half of the 4 MiB the function took
	// when these bounds were set (16 MiB by default now): the XRD refuses a fleet whose (replicas + maxSurge) x
	// (ProxyMessageBytes + LeasedProxyMessageBytes + its inline cloud-init)
	// exceeds it. The rule's text spells these numbers;
	// TestMessageBudgetRule keeps it in step.
	ProxyMessageBytes       = 7400
	LeasedProxyMessageBytes = 1200
	MessageBudget           = 2 << 20
	PoolMessageBudget       = 1 << 20
	// MaxNameLength bounds a fleet's name (a claim's, for a legacy fleet):
	// its Proxies are named <fleet>-<ordinal> and their Lease objects
	// <proxy>-slot-<n> and <proxy>-ban-<12 hex>, all within Kubernetes' 253
	// characters for ordinals of up to ten digits.
	MaxNameLength = 253 - len("-") - 10 - len("-ban-") - 12
)

// ProviderConfigReference names the ProviderConfig or ClusterProviderConfig
// that chooses the backend a fleet's proxies run on.
type ProviderConfigReference struct {
	// Kind of the referenced configuration.
	// +kubebuilder:validation:Enum=ProviderConfig;ClusterProviderConfig
	// +kubebuilder:default=ClusterProviderConfig
	// +optional
	Kind string `json:"kind,omitempty"`

	// Name of the referenced configuration.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// Placement says where each proxy runs: exactly one backend block, matching
// the backend of the referenced ProviderConfig.
// +kubebuilder:validation:XValidation:rule="(has(self.local) ? 1 : 0) + (has(self.kubernetes) ? 1 : 0) + (has(self.gcp) ? 1 : 0) + (has(self.aws) ? 1 : 0) == 1",message="spec.placement needs exactly one of local, kubernetes, gcp or aws"
// +kubebuilder:validation:XValidation:rule="!has(self.aws) || !has(self.aws.userData) || !has(self.aws.userData.inline)",message="spec.placement.aws.userData.inline is not taken by a fleet, whose every Proxy would carry it to the function: put it in a Secret and use userData.secretRef"
type Placement struct {
	// Local runs Squid processes on the provider's host.
	// +optional
	Local *egressv1alpha1.LocalPlacement `json:"local,omitempty"`

	// Kubernetes runs Squid pods.
	// +optional
	Kubernetes *egressv1alpha1.KubernetesPlacement `json:"kubernetes,omitempty"`

	// GCP runs Compute Engine VMs, each with its own external IP; their
	// zones come from spec.zones.
	// +optional
	GCP *egressv1alpha1.GCPInstance `json:"gcp,omitempty"`

	// AWS runs EC2 instances, each with its own public IPv4 address; their
	// availability zones come from spec.zones, all of the
	// ProviderConfig's region.
	// +optional
	AWS *egressv1alpha1.AWSInstance `json:"aws,omitempty"`
}

// MaxCredentialGracePeriod bounds spec.proxy.credentialGracePeriod.
const MaxCredentialGracePeriod = 168 * time.Hour

// ProxySettings say how each proxy serves crawlers. Set authSecretRef,
// allowedSourceRanges or both; open proxies are refused.
// +kubebuilder:validation:XValidation:rule="has(self.authSecretRef) || (has(self.allowedSourceRanges) && size(self.allowedSourceRanges) > 0)",message="spec.proxy: refusing an open proxy: set authSecretRef (credentials) and/or allowedSourceRanges"
// +kubebuilder:validation:XValidation:rule="has(self.authSecretRef) || !has(self.allowedSourceRanges) || self.allowedSourceRanges.all(r, ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10', '127.0.0.0/8', '::1/128', 'fc00::/7', 'fe80::/10'].exists(p, cidr(p).containsCIDR(r)))",message="spec.proxy.allowedSourceRanges: without authSecretRef every range must lie in private, loopback or CGNAT space; a public client range is an open proxy: add authSecretRef or narrow the ranges"
type ProxySettings struct {
	// Port each proxy listens on.
	// +kubebuilder:default=3128
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port *int32 `json:"port,omitempty"`

	// AuthSecretRef names a Secret in the fleet's namespace with the
	// username and password crawlers present.
	// +optional
	AuthSecretRef *egressv1alpha1.AuthSecretReference `json:"authSecretRef,omitempty"`

	// CredentialGracePeriod is how long each proxy keeps accepting the
	// previous credentials after the auth Secret's change, besides the new
	// ones, where a proxy's credentials change in place (local processes
	// and pods); GCP VMs are replaced in a rollout instead. Zero refuses
	// the previous credentials at once. Defaults to spec.leases.maxTTL, so
	// that a crawler holding a lease taken before the change can finish
	// with it. Changing it changes no proxy's template.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('168h')",message="spec.proxy.credentialGracePeriod must be at most 168h"
	// +optional
	CredentialGracePeriod *metav1.Duration `json:"credentialGracePeriod,omitempty"`

	// AllowedSourceRanges are the client networks allowed to use the
	// proxies.
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +optional
	AllowedSourceRanges []egressv1alpha1.CIDR `json:"allowedSourceRanges,omitempty"`

	// AllowedPrivateDestinations are private networks the proxies may reach
	// after all, for crawling an internal site; the ProviderConfig's
	// spec.policy.allowedPrivateDestinations must permit every one.
	// +kubebuilder:validation:MaxItems=16
	// +listType=set
	// +optional
	AllowedPrivateDestinations []egressv1alpha1.CIDR `json:"allowedPrivateDestinations,omitempty"`
}

// Rotation says when and how proxies are replaced.
// +kubebuilder:validation:XValidation:rule="self.maxSurge > 0 || self.maxUnavailable > 0",message="spec.rotation.maxSurge and spec.rotation.maxUnavailable cannot both be 0: replacement could never make progress"
type Rotation struct {
	// MaxAge replaces proxies older than this (a fresh egress IP). Unset
	// means no age-based rotation.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m')",message="must be at least 1m"
	// +optional
	MaxAge *metav1.Duration `json:"maxAge,omitempty"`

	// MaxSurge is how many proxies above replicas may exist during
	// replacement.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	MaxSurge *int32 `json:"maxSurge,omitempty"`

	// MaxUnavailable is how many ready proxies below replicas replacement
	// may cause.
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	MaxUnavailable *int32 `json:"maxUnavailable,omitempty"`

	// ReplaceUnhealthyAfter replaces a proxy unhealthy for longer than this.
	// A replacement that never turns Ready is itself replaced after twice
	// as long, and so on, up to an hour, so that a backend that cannot run
	// proxies is not flooded with them.
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m')",message="must be at least 1m: a proxy needs time to boot"
	// +optional
	ReplaceUnhealthyAfter *metav1.Duration `json:"replaceUnhealthyAfter,omitempty"`
}

// Rollout says how a template change rolls out. Proxies of the new
// template replace the old ones as surge replacements, within the rotation's
// maxSurge and maxUnavailable, and an old proxy goes only once its
// replacement is Ready and no crawler holds a lease on it.
type Rollout struct {
	// Paused holds back the replacements a template change or a removed
	// zone asks for; unhealthy and aged proxies are still replaced, from
	// the current template.
	// +optional
	Paused bool `json:"paused,omitempty"`

	// ProgressDeadline is how long a rollout may make no progress (no old
	// proxy replaced, no new one turning Ready) before the fleet reports
	// RolloutStalled, naming what blocks it.
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m')",message="must be at least 1m"
	// +optional
	ProgressDeadline *metav1.Duration `json:"progressDeadline,omitempty"`
}

// RolloutStatus is the progress of a rollout under way.
type RolloutStatus struct {
	// Remaining is how many proxies of an old template revision or a
	// removed zone are left to replace.
	Remaining int32 `json:"remaining,omitempty"`
	// UpdatedReady is how many proxies of the current revision are Ready.
	UpdatedReady int32 `json:"updatedReady,omitempty"`
	// LastProgressTime is when Remaining last fell or UpdatedReady last
	// rose.
	// +kubebuilder:validation:Format=date-time
	LastProgressTime string `json:"lastProgressTime,omitempty"`
}

// Leases say how crawlers lease proxies through egress-discovery.
// +kubebuilder:validation:XValidation:rule="duration(self.defaultTTL) <= duration(self.maxTTL)",message="spec.leases.defaultTTL must not exceed spec.leases.maxTTL"
type Leases struct {
	// MaxLeasesPerProxy is how many crawlers may share one proxy at once.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +optional
	MaxLeasesPerProxy *int32 `json:"maxLeasesPerProxy,omitempty"`

	// DefaultTTL is the lease TTL when a crawler asks for none.
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('168h')",message="must be between 1s and 168h"
	// +optional
	DefaultTTL *metav1.Duration `json:"defaultTTL,omitempty"`

	// MaxTTL is the longest TTL a crawler may ask for.
	// +kubebuilder:default="1h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('168h')",message="must be between 1s and 168h"
	// +optional
	MaxTTL *metav1.Duration `json:"maxTTL,omitempty"`

	// MaxBanCooldown is the longest a crawler's ban report may keep a
	// proxy from being handed out for a domain; a report asking longer is
	// refused (400). Live bans are also bounded in number, by
	// egress-discovery's flags.
	// +kubebuilder:default="24h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('168h')",message="must be between 1s and 168h"
	// +optional
	MaxBanCooldown *metav1.Duration `json:"maxBanCooldown,omitempty"`

	// Admission holds new leases back while too few proxies are healthy,
	// and lets an acquisition wait for a slot instead of being refused at
	// once, so that when proxies drop out the survivors are not handed
	// every crawler and banned in turn (the waterfall effect).
	// +optional
	Admission *Admission `json:"admission,omitempty"`

	// Quotas bound the leases one caller identity may hold at once, so
	// that teams sharing a fleet cannot starve each other.
	// +optional
	Quotas *Quotas `json:"quotas,omitempty"`
}

// Admission says when egress-discovery grants new leases. Renewals are
// always honoured, except on proxies a rollout drains.
type Admission struct {
	// MinHealthyFraction is the share of the fleet's proxies (of
	// spec.replicas, or of the proxies that exist if more) that must be
	// healthy for a new lease to be granted; below it, acquisitions wait
	// up to maxWait and are then refused (409, reason TooFewHealthy). 0
	// admits whatever the fleet's health.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1
	// +optional
	MinHealthyFraction *float64 `json:"minHealthyFraction,omitempty"`

	// MaxWait is how long an acquisition may wait for a free slot, or for
	// enough healthy proxies, before it is refused (a long poll). Waiting
	// acquisitions are served first come, first served within a discovery
	// replica. A request may ask to wait less. 0 refuses at once.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('20s')",message="must be at most 20s: a longer wait outlasts discovery's request timeout"
	// +optional
	MaxWait *metav1.Duration `json:"maxWait,omitempty"`
}

// Quotas bound the concurrent leases of each caller identity in a fleet.
// +kubebuilder:validation:XValidation:rule="!has(self.overrides) || self.overrides.all(o, [has(o.serviceAccount), has(o.group), has(o.staticToken)].filter(x, x).size() == 1)",message="spec.leases.quotas.overrides: each override names exactly one of serviceAccount, group or staticToken"
type Quotas struct {
	// MaxLeasesPerIdentity is how many leases of the fleet one identity
	// may hold at once, unless an override says otherwise. Unset or 0
	// sets no bound.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxLeasesPerIdentity *int32 `json:"maxLeasesPerIdentity,omitempty"`

	// Overrides set the bound for particular subjects. A ServiceAccount's
	// or a static token's override wins over a group's; of several
	// groups' overrides, the largest applies.
	// +kubebuilder:validation:MaxItems=256
	// +listType=atomic
	// +optional
	Overrides []QuotaOverride `json:"overrides,omitempty"`
}

// QuotaOverride is the lease bound of one subject.
type QuotaOverride struct {
	// ServiceAccount is <namespace>/<name>.
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=317
	// +optional
	ServiceAccount string `json:"serviceAccount,omitempty"`
	// Group is a Kubernetes group the caller is in.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Group string `json:"group,omitempty"`
	// StaticToken is the name a static token is given in discovery's
	// token file.
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=63
	// +optional
	StaticToken string `json:"staticToken,omitempty"`
	// MaxLeases is the subject's bound; 0 forbids it leases.
	// +kubebuilder:validation:Minimum=0
	MaxLeases int32 `json:"maxLeases"`
}

// Autoscaling sizes a fleet from its lease demand: the leases crawlers
// hold, and the acquisitions waiting for a slot or refused one lately, as
// egress-discovery publishes them. While it is set the function owns the
// fleet's size and spec.replicas is ignored.
// +kubebuilder:validation:XValidation:rule="self.minReplicas <= self.maxReplicas",message="spec.autoscaling.minReplicas must not exceed spec.autoscaling.maxReplicas"
type Autoscaling struct {
	// MinReplicas is the fewest proxies the fleet keeps. 0 lets it scale
	// to zero: its first acquisition then waits (spec.leases.admission.
	// maxWait) while a proxy is made.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	// +optional
	MinReplicas *int32 `json:"minReplicas,omitempty"`

	// MaxReplicas is the most proxies the fleet grows to.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	MaxReplicas int32 `json:"maxReplicas"`

	// TargetUtilization is the share of the fleet's lease capacity
	// (healthy proxies x maxLeasesPerProxy) the fleet aims to have in use.
	// +kubebuilder:default=0.7
	// +kubebuilder:validation:Minimum=0.05
	// +kubebuilder:validation:Maximum=1
	// +optional
	TargetUtilization *float64 `json:"targetUtilization,omitempty"`

	// ScaleUpStabilization is how long demand must ask for more proxies
	// before the fleet grows: the lowest size asked for within it wins.
	// +kubebuilder:default="0s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('1h')",message="must be at most 1h"
	// +optional
	ScaleUpStabilization *metav1.Duration `json:"scaleUpStabilization,omitempty"`

	// ScaleDownStabilization is how long demand must ask for fewer
	// proxies before the fleet shrinks: the highest size asked for within
	// it wins. Only proxies no crawler holds a lease on are removed.
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('1h')",message="must be at most 1h"
	// +optional
	ScaleDownStabilization *metav1.Duration `json:"scaleDownStabilization,omitempty"`
}

// ProxyFleetSpec is the desired fleet.
// +kubebuilder:validation:XValidation:rule="!has(self.placement.gcp) || (has(self.placement.gcp.publishedAddress) && self.placement.gcp.publishedAddress == 'Internal') || has(self.placement.gcp.cloudInit) || !has(self.proxy.allowedSourceRanges) || size(self.proxy.allowedSourceRanges) == 0 || self.proxy.allowedSourceRanges.exists(r, !['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10'].exists(p, cidr(p).containsCIDR(r)))",message="spec.proxy.allowedSourceRanges: a GCP proxy open to private networks only cannot serve at its external IP, which clients inside a VPC reach only from an external address: set spec.placement.gcp.publishedAddress: Internal, or list the crawlers' external ranges"
// +kubebuilder:validation:XValidation:rule="!has(self.placement.gcp) || !has(self.proxy.port) || self.proxy.port >= 1024",message="spec.proxy.port: a GCP proxy listens on 1024 or above: a lower port needs privileges the distribution's Squid AppArmor profile may deny, and the VM's proxy would never come up"
// +kubebuilder:validation:XValidation:rule="!has(self.placement.gcp) || !has(self.proxy.allowedSourceRanges) || self.proxy.allowedSourceRanges.all(r, cidr(r).ip().family() == 4)",message="spec.proxy.allowedSourceRanges: a GCP proxy's firewall rule takes IPv4 ranges only, and its VM has an IPv4 address only: remove the IPv6 ranges"
// +kubebuilder:validation:XValidation:rule="!has(self.placement.aws) || !has(self.proxy.allowedSourceRanges) || self.proxy.allowedSourceRanges.all(r, cidr(r).ip().family() == 4)",message="spec.proxy.allowedSourceRanges: an AWS proxy's security group is opened to IPv4 ranges only, and its instance has an IPv4 address only: remove the IPv6 ranges"
// +kubebuilder:validation:XValidation:rule="!has(self.placement.aws) || !has(self.proxy.port) || self.proxy.port >= 1024",message="spec.proxy.port: an AWS proxy listens on 1024 or above: a lower port needs privileges the distribution's Squid AppArmor profile may deny, and the instance's proxy would never come up"
// +kubebuilder:validation:XValidation:rule="!has(self.placement.aws) || has(self.placement.aws.userData) || !has(self.proxy.allowedSourceRanges) || size(self.proxy.allowedSourceRanges) == 0 || self.proxy.allowedSourceRanges.exists(r, !['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10'].exists(p, cidr(p).containsCIDR(r)))",message="spec.proxy.allowedSourceRanges: an AWS proxy open to private networks only cannot serve at its public IP, which clients inside a VPC reach only from a public address: list the crawlers' external ranges (with spec.proxy.authSecretRef)"
// +kubebuilder:validation:XValidation:rule="!has(self.placement.gcp) || !has(self.placement.gcp.subnetwork) || self.zones.all(z, ('/' + self.placement.gcp.subnetwork).contains('/regions/' + z.substring(0, z.lastIndexOf('-')) + '/subnetworks/'))",message="spec.placement.gcp.subnetwork must be in the region of every zone in spec.zones: a subnetwork is regional"
// +kubebuilder:validation:XValidation:rule="self.rotation.maxSurge > 0 || (!has(self.recycling) && (!has(self.diversity) || !has(self.diversity.replaceBeyondLimit) || !self.diversity.replaceBeyondLimit))",message="spec.rotation.maxSurge must be at least 1 with spec.recycling or spec.diversity.replaceBeyondLimit: a recycle replaces a serving proxy through a surge proxy, never in place, and with maxSurge 0 nothing would ever be recycled"
// +kubebuilder:validation:XValidation:rule="!has(self.diversity) || !has(self.diversity.replaceBeyondLimit) || !self.diversity.replaceBeyondLimit || has(self.placement.gcp) || has(self.placement.aws)",message="spec.diversity.replaceBeyondLimit needs a backend that gives each proxy an address of its own (spec.placement.gcp or aws): a replaced local or Kubernetes proxy leaves from the same address"
// +kubebuilder:validation:XValidation:rule="(self.replicas == 0 && !has(self.autoscaling)) || size(self.zones) > 0",message="spec.zones must not be empty when spec.replicas > 0 or spec.autoscaling is set: list the zones to spread proxies over"
// +kubebuilder:validation:XValidation:rule="((has(self.pools) ? self.pools.proxiesPerPool : self.replicas) + self.rotation.maxSurge) * (7400 + 1200 + (has(self.placement.gcp) && has(self.placement.gcp.cloudInit) && has(self.placement.gcp.cloudInit.inline) ? size(self.placement.gcp.cloudInit.inline) : 0)) <= (has(self.pools) ? 1048576 : 2097152) || (oldSelf.hasValue() && self.replicas <= oldSelf.value().replicas && self.rotation.maxSurge <= oldSelf.value().rotation.maxSurge && (has(self.placement.gcp) && has(self.placement.gcp.cloudInit) && has(self.placement.gcp.cloudInit.inline) ? size(self.placement.gcp.cloudInit.inline) : 0) <= (has(oldSelf.value().placement.gcp) && has(oldSelf.value().placement.gcp.cloudInit) && has(oldSelf.value().placement.gcp.cloudInit.inline) ? size(oldSelf.value().placement.gcp.cloudInit.inline) : 0))",message="(spec.replicas, or spec.pools.proxiesPerPool in a pooled fleet, + spec.rotation.maxSurge) times (7400 + 1200 + the size of spec.placement.gcp.cloudInit.inline) bytes must not exceed 2 MiB (1 MiB in a pooled fleet): Crossplane sends the function every Proxy of the fleet, with egress-discovery's summary of their leases, (of its pool, in a pooled fleet) in one gRPC message, and this keeps it within 2 MiB (1 MiB for a pool; with maxSurge 1: at most 242 replicas, or 120 proxies per pool, however many leases per proxy); set spec.pools.proxiesPerPool (when creating a fleet) to grow past that. A fleet stored before this rule may keep its size or shrink, but not grow",optionalOldSelf=true
// +kubebuilder:validation:XValidation:rule="!has(self.autoscaling) || ((has(self.pools) ? self.pools.proxiesPerPool : self.autoscaling.maxReplicas) + self.rotation.maxSurge) * (7400 + 1200 + (has(self.placement.gcp) && has(self.placement.gcp.cloudInit) && has(self.placement.gcp.cloudInit.inline) ? size(self.placement.gcp.cloudInit.inline) : 0)) <= (has(self.pools) ? 1048576 : 2097152)",message="(spec.autoscaling.maxReplicas, or spec.pools.proxiesPerPool in a pooled fleet, + spec.rotation.maxSurge) times (7400 + 1200 + the size of spec.placement.gcp.cloudInit.inline) bytes must not exceed 2 MiB (1 MiB in a pooled fleet), as for spec.replicas: lower maxReplicas or set spec.pools.proxiesPerPool when creating the fleet"
// +kubebuilder:validation:XValidation:rule="!has(self.pools) || self.replicas <= self.pools.proxiesPerPool * 96",message="spec.replicas must not exceed spec.pools.proxiesPerPool x 96: a fleet has at most 96 pools; raise proxiesPerPool"
// +kubebuilder:validation:XValidation:rule="!has(self.pools) || !has(self.autoscaling) || self.autoscaling.maxReplicas <= self.pools.proxiesPerPool * 96",message="spec.autoscaling.maxReplicas must not exceed spec.pools.proxiesPerPool x 96: a fleet has at most 96 pools; raise proxiesPerPool"
// +kubebuilder:validation:XValidation:rule="has(self.pools) == has(oldSelf.pools) && (!has(self.pools) || self.pools.proxiesPerPool == oldSelf.pools.proxiesPerPool)",message="spec.pools cannot be added, removed or changed once the fleet exists: its Proxies would have to move between pools; create a new fleet with the pools it needs"
type ProxyFleetSpec struct {
	// Replicas is how many proxies the fleet keeps, unless spec.autoscaling
	// is set, which then sizes the fleet. kubectl scale and a
	// HorizontalPodAutoscaler set it through the scale subresource.
	// A fleet without spec.pools holds at most 242 (one level of Proxies);
	// a pooled one up to 10 000.
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// ProviderConfigRef chooses the backend the proxies run on.
	// +kubebuilder:default={kind: ClusterProviderConfig, name: default}
	// +optional
	ProviderConfigRef *ProviderConfigReference `json:"providerConfigRef,omitempty"`

	// Zones the proxies are spread over evenly. For GCP these are Compute
	// Engine zones, for AWS availability zones (us-east-1a); for Kubernetes they select nodes by
	// topology.kubernetes.io/zone; for the local backend they are labels
	// only.
	// +kubebuilder:default={}
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=set
	// +optional
	Zones []string `json:"zones,omitempty"`

	// Placement says where each proxy runs. Set exactly one backend block;
	// it must match the backend of the referenced ProviderConfig.
	Placement Placement `json:"placement"`

	// Proxy says how each proxy serves crawlers.
	Proxy ProxySettings `json:"proxy"`

	// HealthCheck says how each proxy is probed, through the proxy itself.
	HealthCheck egressv1alpha1.HealthCheck `json:"healthCheck"`

	// Rotation says when and how proxies are replaced.
	// +kubebuilder:default={maxSurge: 1, maxUnavailable: 0, replaceUnhealthyAfter: "5m"}
	// +optional
	Rotation *Rotation `json:"rotation,omitempty"`

	// Rollout says how a change of the proxy template (placement, proxy
	// settings, health check, ProviderConfig) or of the zones reaches the
	// fleet's proxies.
	// +kubebuilder:default={progressDeadline: "10m"}
	// +optional
	Rollout *Rollout `json:"rollout,omitempty"`

	// Leases say how crawlers lease proxies through egress-discovery.
	// +kubebuilder:default={maxLeasesPerProxy: 1, defaultTTL: "10m", maxTTL: "1h", maxBanCooldown: "24h"}
	// +optional
	Leases *Leases `json:"leases,omitempty"`

	// Autoscaling sizes the fleet from lease demand between its bounds;
	// spec.replicas is then ignored.
	// +optional
	Autoscaling *Autoscaling `json:"autoscaling,omitempty"`

	// Pools split the fleet into ProxyPools of at most proxiesPerPool
	// Proxies each, which is how a fleet grows past 242 proxies: the fleet
	// sizes, spreads and hands out the rollout budget; each pool composes,
	// rotates and replaces its own Proxies. Set it when the fleet is
	// created: it cannot be added, removed or changed later (yet).
	// +optional
	Pools *Pools `json:"pools,omitempty"`

	// Gateway says how egress-discovery's gateway serves the fleet.
	// +optional
	Gateway *Gateway `json:"gateway,omitempty"`

	// Diversity caps how many of the fleet's proxies may leave from one
	// network as targets group clients: one IPv4 /24, one IPv6 /64, one
	// autonomous system. Proxies beyond a cap are flagged
	// (status.proxies[].beyondDiversityLimit, the EgressDiversity
	// condition) and handed out last, like proxies sharing an IP. The
	// oldest proxies keep their places, so the choice is stable.
	// +optional
	Diversity *Diversity `json:"diversity,omitempty"`

	// Recycling replaces the proxies whose egress IP targets keep
	// banning (burned), so that the new one draws another address on a
	// backend that gives one (GCP, AWS): through the rollout machinery
	// (surge first, lease-aware, within maxUnavailable), at most
	// maxPerHour in any hour with a back-off after each, and none while
	// the fleet's healthy proxies are below replicas - maxUnavailable.
	// status.egress.recycles lists the last day's. A pooled fleet holds
	// the bound over all its pools, granting them recycles one at a time.
	// +optional
	Recycling *Recycling `json:"recycling,omitempty"`
}

// Recycling says when an egress IP is burned and how fast a fleet
// recycles.
// +kubebuilder:validation:XValidation:rule="has(self.bannedByDomains) || has(self.bannedTimes)",message="spec.recycling needs bannedByDomains or bannedTimes: when is an address burned?"
type Recycling struct {
	// BannedByDomains: an address banned by at least this many distinct
	// domains within window is burned.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	BannedByDomains *int32 `json:"bannedByDomains,omitempty"`
	// BannedTimes: an address banned by one domain at least this many
	// times within window is burned.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +optional
	BannedTimes *int32 `json:"bannedTimes,omitempty"`
	// Window is how far back bans count (at most 7 days, as long as an
	// address's ban history is kept).
	// +kubebuilder:default="1h"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('168h')",message="must be between 1m and 168h"
	// +optional
	Window *metav1.Duration `json:"window,omitempty"`
	// MaxPerHour bounds the recycles the fleet starts in any hour.
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10
	// +optional
	MaxPerHour *int32 `json:"maxPerHour,omitempty"`
	// Backoff is the least wait after a recycle before the next, doubled
	// for each other recycle of the last hour.
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('24h')",message="must be between 0s and 24h"
	// +optional
	Backoff *metav1.Duration `json:"backoff,omitempty"`
}

// Diversity caps the proxies per network a fleet leaves from.
type Diversity struct {
	// MaxPerIPv4Prefix is the most proxies that may leave from one IPv4
	// /24: rate limiters and bot defences key IPv4 clients by /24.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	MaxPerIPv4Prefix *int32 `json:"maxPerIPv4Prefix,omitempty"`
	// MaxPerIPv6Prefix is the most proxies that may leave from one IPv6
	// /64, the block one subscriber or one VM gets.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	MaxPerIPv6Prefix *int32 `json:"maxPerIPv6Prefix,omitempty"`
	// MaxPerASN is the most proxies that may leave from one autonomous
	// system. It is counted only where the platform gives
	// function-proxyfleet and egress-discovery an IP-to-ASN database
	// (--asn-database, MaxMind DB format); none is shipped.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	MaxPerASN *int32 `json:"maxPerASN,omitempty"`
	// ReplaceBeyondLimit replaces a proxy beyond a cap so that its
	// replacement draws another address, on a backend that gives each
	// proxy its own (spec.placement.gcp or aws), as spec.recycling
	// recycles a burned one: surge first, lease-aware, within
	// maxUnavailable, and within spec.recycling's bounds (maxPerHour and
	// backoff, their defaults without spec.recycling), which it shares;
	// status.egress.recycles lists these too. Off by default: a proxy
	// beyond a cap is then only flagged and handed out last. In a pooled
	// fleet each pool replaces those beyond its caps (pools count their
	// own addresses), within the fleet's bounds.
	// +optional
	ReplaceBeyondLimit bool `json:"replaceBeyondLimit,omitempty"`
}

// Gateway says how egress-discovery's gateway serves a fleet.
type Gateway struct {
	// Rotation is how a gateway connection without a session chooses its
	// proxy, among those that serve it: leastRecentlyUsed, the proxy
	// whose egress IP the caller used longest ago for the target's domain;
	// roundRobin, the fleet's proxies in turn; random; leastConnections,
	// the proxy with the fewest of the gateway replica's connections. A
	// username may choose another (_rotate_<strategy>).
	// +kubebuilder:validation:Enum=leastRecentlyUsed;roundRobin;random;leastConnections
	// +kubebuilder:default=leastRecentlyUsed
	// +optional
	Rotation string `json:"rotation,omitempty"`

	// Pacing spaces out what leaves one egress IP for a target: per rule,
	// the domains it covers and the least interval between two
	// connections (a CONNECT tunnel, or a plain-HTTP request) that leave
	// one egress IP for any of them, with a burst. The gateway sends a
	// connection through a proxy whose IP is not paced for its domain, and
	// only when every one that serves it is, waits (up to 2 s) or answers
	// 429 with Retry-After. The first rule that covers a domain applies.
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Pacing []PacingRule `json:"pacing,omitempty"`

	// BanStatusCodes are the status codes of an origin's answer to a
	// plain-HTTP request through the gateway that count as a ban of the
	// proxy's egress IP for the request's domain, as a crawler's banned
	// report does (cooldown 30m, or maxBanCooldown when shorter). The
	// gateway cannot read answers inside a CONNECT tunnel (HTTPS): report
	// those bans through the API. An empty list records none.
	// +kubebuilder:default={403, 429}
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Minimum=400
	// +kubebuilder:validation:items:Maximum=599
	// +listType=set
	// +optional
	BanStatusCodes []int32 `json:"banStatusCodes,omitempty"`
}

// PacingRule paces the connections that leave one egress IP for a set of
// domains.
type PacingRule struct {
	// Domains are host names ("shop.example") or, with a leading "*.",
	// every name under one ("*.example.com", not example.com itself).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Pattern=`^(\*\.)?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`
	// +kubebuilder:validation:items:MaxLength=253
	Domains []string `json:"domains"`

	// Interval is the least time between two connections from one egress
	// IP to these domains, once the burst is spent: 100ms to 1h.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('100ms') && duration(self) <= duration('1h')",message="spec.gateway.pacing[].interval must be between 100ms and 1h"
	Interval metav1.Duration `json:"interval"`

	// Burst is how many connections may leave one egress IP for these
	// domains at once before the interval applies (default 1).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +kubebuilder:default=1
	// +optional
	Burst int32 `json:"burst,omitempty"`
}

// Pools split a fleet into ProxyPools.
type Pools struct {
	// ProxiesPerPool is the most Proxies one pool holds, surge aside: the
	// fleet fills its pools in order, so only the last is partly full. A
	// fleet of 10 000 takes 105 to 120.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=120
	ProxiesPerPool int32 `json:"proxiesPerPool"`
}

// ProxyStatus is one proxy of the fleet as the fleet's status shows it.
type ProxyStatus struct {
	// Name of the Proxy.
	Name string `json:"name,omitempty"`
	// Endpoint is host:port.
	Endpoint string `json:"endpoint,omitempty"`
	// Zone of the proxy.
	Zone string `json:"zone,omitempty"`
	// EgressIP the probe target saw.
	EgressIP string `json:"egressIP,omitempty"`
	// DuplicateEgressIP is set when another proxy of the fleet leaves from
	// the same egress IP: to a target, the two are one client.
	DuplicateEgressIP bool `json:"duplicateEgressIP,omitempty"`
	// BeyondDiversityLimit says which cap of spec.diversity the proxy is
	// beyond (its network holds the most proxies allowed already): it is
	// handed out last.
	// +optional
	BeyondDiversityLimit string `json:"beyondDiversityLimit,omitempty"`
	// Healthy is the probe verdict.
	Healthy bool `json:"healthy,omitempty"`
	// CreatedAt is when the Proxy was created.
	// +kubebuilder:validation:Format=date-time
	CreatedAt string `json:"createdAt,omitempty"`
}

// ProxyFleetStatus is the observed fleet.
type ProxyFleetStatus struct {
	// Replicas is how many proxies exist.
	Replicas int32 `json:"replicas,omitempty"`
	// ReadyReplicas is how many proxies run and pass their probe.
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// HealthyReplicas is how many proxies' probe verdict is healthy.
	HealthyReplicas int32 `json:"healthyReplicas,omitempty"`
	// UpdatedReplicas is how many proxies were made from the current
	// template revision.
	UpdatedReplicas int32 `json:"updatedReplicas,omitempty"`
	// ObservedRevision is the current template revision.
	ObservedRevision string `json:"observedRevision,omitempty"`
	// Rollout is the progress of the rollout under way, if one is.
	// +optional
	Rollout *RolloutStatus `json:"rollout,omitempty"`
	// DesiredReplicas is how many proxies the fleet aims at: spec.replicas,
	// or what spec.autoscaling chose.
	// +optional
	DesiredReplicas *int32 `json:"desiredReplicas,omitempty"`
	// Autoscaling is the demand the fleet was last sized by, and the
	// recent sizes it asked for, which the stabilization windows look back
	// over.
	// +optional
	Autoscaling *AutoscalingStatus `json:"autoscaling,omitempty"`
	// Proxies has one entry per proxy, in a fleet without pools; a pooled
	// fleet lists its pools instead (each Proxy's detail is on the Proxy).
	// +optional
	Proxies []ProxyStatus `json:"proxies,omitempty"`
	// LeasedReplicas counts proxies a crawler holds a lease on, in a pooled
	// fleet, as egress-discovery's summaries of the fleet count them;
	// absent while no fresh summary counts them.
	// +optional
	LeasedReplicas *int32 `json:"leasedReplicas,omitempty"`
	// DuplicateEgressIPs counts proxies whose egress IP another proxy of
	// their pool shares, in a pooled fleet.
	// +optional
	DuplicateEgressIPs *int32 `json:"duplicateEgressIPs,omitempty"`
	// Egress counts the distinct addresses and networks the fleet's
	// healthy proxies leave from, and those beyond spec.diversity.
	// +optional
	Egress *EgressStatus `json:"egress,omitempty"`
	// Pools has one entry per pool of a pooled fleet.
	// +kubebuilder:validation:MaxItems=96
	// +optional
	Pools []PoolSummary `json:"pools,omitempty"`
}

// EgressStatus counts a fleet's egress addresses as targets group them.
type EgressStatus struct {
	// Addresses, IPv4Prefixes and IPv6Prefixes count the distinct egress
	// IPs, IPv4 /24s and IPv6 /64s of the healthy proxies; absent in a
	// pooled fleet, whose status reads no Proxy (egress-discovery's
	// metrics and status page count every fleet whole).
	// +optional
	Addresses *int32 `json:"addresses,omitempty"`
	// +optional
	IPv4Prefixes *int32 `json:"ipv4Prefixes,omitempty"`
	// +optional
	IPv6Prefixes *int32 `json:"ipv6Prefixes,omitempty"`
	// ASNs counts their autonomous systems, where an ASN database is
	// given.
	// +optional
	ASNs *int32 `json:"asns,omitempty"`
	// BeyondLimit counts the proxies beyond a cap of spec.diversity.
	BeyondLimit int32 `json:"beyondLimit"`
	// Recycles are the proxies spec.recycling replaced in the last day,
	// newest last (at most 100), with their address and why.
	// +kubebuilder:validation:MaxItems=100
	// +optional
	Recycles []RecycleRecord `json:"recycles,omitempty"`
	// SeenAgain counts the proxies leaving from an address a recycle of
	// the last day gave back: the cloud handed it out again.
	// +kubebuilder:validation:Minimum=0
	// +optional
	SeenAgain int32 `json:"seenAgain,omitempty"`
	// Burned counts the proxies due for a recycle (an address
	// spec.recycling judges burned, or one beyond a cap of a fleet with
	// spec.diversity.replaceBeyondLimit) that no recycle replaces yet;
	// RecycleWaiting says why they wait (the hourly bound and its back-off, the floor, a paused
	// rollout, an address a recycle gave back already, a proxy that does
	// not serve).
	// +kubebuilder:validation:Minimum=0
	// +optional
	Burned int32 `json:"burned,omitempty"`
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	RecycleWaiting string `json:"recycleWaiting,omitempty"`
	// RecyclesAtBound: some of them wait for the hourly bound or the
	// back-off alone (not the floor, a pause or a surge slot): targets
	// burn addresses faster than the fleet may recycle them.
	// +optional
	RecyclesAtBound bool `json:"recyclesAtBound,omitempty"`
}

// RecycleRecord is one recycle of a burned address.
type RecycleRecord struct {
	// Proxy replaced.
	Proxy string `json:"proxy"`
	// EgressIP it left from.
	EgressIP string `json:"egressIP"`
	// Reason the address was burned.
	// +kubebuilder:validation:MaxLength=256
	Reason string `json:"reason"`
	// Time the replacement was started.
	// +kubebuilder:validation:Format=date-time
	Time string `json:"time"`
}

// PoolSummary is one pool as its fleet's status shows it.
type PoolSummary struct {
	// Name of the ProxyPool.
	Name string `json:"name"`
	// Replicas, ReadyReplicas, HealthyReplicas and UpdatedReplicas are the
	// pool's, as it last reported them.
	Replicas        int32 `json:"replicas,omitempty"`
	ReadyReplicas   int32 `json:"readyReplicas,omitempty"`
	HealthyReplicas int32 `json:"healthyReplicas,omitempty"`
	UpdatedReplicas int32 `json:"updatedReplicas,omitempty"`
	// Budget is the share of the fleet's rollout budget it holds.
	// +optional
	Budget *PoolBudget `json:"budget,omitempty"`
}

// AutoscalingStatus is the demand a fleet was last sized by.
type AutoscalingStatus struct {
	// Reason says why the fleet has the size it aims at, for example
	// "utilization 0.92 > 0.70".
	Reason string `json:"reason,omitempty"`
	// Held is how many leases crawlers hold on the fleet's proxies.
	Held int32 `json:"held,omitempty"`
	// Waiting is how many acquisitions wait for a slot, over every
	// egress-discovery replica.
	Waiting int32 `json:"waiting,omitempty"`
	// Refused is how many acquisitions were refused for want of a slot or
	// of healthy proxies within the last minute.
	Refused int32 `json:"refused,omitempty"`
	// Capacity is healthy proxies x maxLeasesPerProxy.
	Capacity int32 `json:"capacity,omitempty"`
	// Recommendations are the sizes demand asked for lately, each from
	// when it was first asked for until the next.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Recommendations []Recommendation `json:"recommendations,omitempty"`
}

// Recommendation is a size demand asked for, from a time on.
type Recommendation struct {
	// Time it was first asked for.
	// +kubebuilder:validation:Format=date-time
	Time string `json:"time"`
	// Replicas asked for.
	Replicas int32 `json:"replicas"`
}

// A ProxyFleet is a fleet of egress forward proxies with distinct egress
// IPs, kept healthy by probing through each proxy and handed to crawlers
// through leases.
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced
type ProxyFleet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired fleet.
	Spec ProxyFleetSpec `json:"spec"`
	// Status is the observed fleet.
	Status ProxyFleetStatus `json:"status,omitempty"`
}
