package function

import (
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"time"

	"github.com/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
)

// fleetSpec is the ProxyFleet's spec as the XRD defines it.
type fleetSpec struct {
	Replicas          *int32               `json:"replicas,omitempty"`
	ProviderConfigRef *providerConfigRef   `json:"providerConfigRef,omitempty"`
	Zones             []string             `json:"zones,omitempty"`
	Placement         placement            `json:"placement"`
	Proxy             proxySettings        `json:"proxy"`
	HealthCheck       v1alpha1.HealthCheck `json:"healthCheck"`
	Rotation          rotation             `json:"rotation"`
	Leases            leases               `json:"leases"`
}

type providerConfigRef struct {
	Kind string `json:"kind,omitempty"`
	Name string `json:"name,omitempty"`
}

type placement struct {
	Local      *v1alpha1.LocalPlacement      `json:"local,omitempty"`
	Kubernetes *v1alpha1.KubernetesPlacement `json:"kubernetes,omitempty"`
	GCP        *gcpPlacement                 `json:"gcp,omitempty"`
}

// gcpPlacement is GCPPlacement without the zone, which comes from zones.
type gcpPlacement struct {
	MachineType string                `json:"machineType,omitempty"`
	Image       string                `json:"image,omitempty"`
	Network     string                `json:"network,omitempty"`
	NetworkTags []v1alpha1.NetworkTag `json:"networkTags,omitempty"`
	CloudInit   *v1alpha1.CloudInit   `json:"cloudInit,omitempty"`
}

type proxySettings struct {
	Port                *int32                        `json:"port,omitempty"`
	AuthSecretRef       *v1alpha1.AuthSecretReference `json:"authSecretRef,omitempty"`
	AllowedSourceRanges []v1alpha1.CIDR               `json:"allowedSourceRanges,omitempty"`
}

type rotation struct {
	MaxAge                string `json:"maxAge,omitempty"`
	MaxSurge              *int32 `json:"maxSurge,omitempty"`
	MaxUnavailable        *int32 `json:"maxUnavailable,omitempty"`
	ReplaceUnhealthyAfter string `json:"replaceUnhealthyAfter,omitempty"`
}

type leases struct {
	MaxLeasesPerProxy *int32 `json:"maxLeasesPerProxy,omitempty"`
}

// Fleet is a validated ProxyFleet spec with every default applied, so the
// function behaves the same whether or not an apiserver defaulted the XR
// (crossplane render does not).
type Fleet struct {
	Name      string
	Namespace string
	Replicas  int
	Zones     []string
	spec      fleetSpec

	MaxAge                time.Duration // zero: no age-based rotation
	MaxSurge              int
	MaxUnavailable        int
	ReplaceUnhealthyAfter time.Duration
}

var zoneName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// fieldError is bad input: it names the field and the fix.
func fieldError(field, format string, args ...any) error {
	return errors.Errorf("%s %s", field, fmt.Sprintf(format, args...))
}

func parseDuration(field, v string, def time.Duration) (time.Duration, error) {
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fieldError(field, "must be a duration such as 30s, 5m or 24h, not %q", v)
	}
	return d, nil
}

func i32(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}

// parseFleet reads and validates a fleet spec. Every error names the field
// and says what to do.
func parseFleet(name, namespace string, spec map[string]any) (*Fleet, error) {
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read spec")
	}
	s := fleetSpec{}
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, errors.Wrap(err, "spec does not match the ProxyFleet schema")
	}
	f := &Fleet{Name: name, Namespace: namespace, spec: s, Replicas: int(i32(s.Replicas, 3)), Zones: s.Zones}

	if f.Replicas < 0 || f.Replicas > 10000 {
		return nil, fieldError("spec.replicas", "must be between 0 and 10000, not %d", f.Replicas)
	}
	if f.Replicas > 0 && len(f.Zones) == 0 {
		return nil, fieldError("spec.zones", "must not be empty when spec.replicas > 0: list the zones to spread proxies over")
	}
	seen := map[string]bool{}
	for i, z := range f.Zones {
		if !zoneName.MatchString(z) || len(z) > 63 {
			return nil, fieldError(fmt.Sprintf("spec.zones[%d]", i), "%q must be a lowercase DNS label such as europe-west1-b", z)
		}
		if seen[z] {
			return nil, fieldError(fmt.Sprintf("spec.zones[%d]", i), "%q is listed twice", z)
		}
		seen[z] = true
	}

	n := 0
	for _, set := range []bool{s.Placement.Local != nil, s.Placement.Kubernetes != nil, s.Placement.GCP != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return nil, fieldError("spec.placement", "needs exactly one of local, kubernetes or gcp")
	}
	if gcp := s.Placement.GCP; gcp != nil && gcp.CloudInit != nil && (gcp.CloudInit.Inline != nil) == (gcp.CloudInit.SecretRef != nil) {
		return nil, fieldError("spec.placement.gcp.cloudInit", "needs exactly one of inline or secretRef")
	}
	if ref := s.ProviderConfigRef; ref != nil && ref.Kind != "" && ref.Kind != v1alpha1.ProviderConfigKind && ref.Kind != v1alpha1.ClusterProviderConfigKind {
		return nil, fieldError("spec.providerConfigRef.kind", "must be ProviderConfig or ClusterProviderConfig, not %q", ref.Kind)
	}

	if p := i32(s.Proxy.Port, 3128); p < 1 || p > 65535 {
		return nil, fieldError("spec.proxy.port", "must be between 1 and 65535, not %d", p)
	}
	if s.Proxy.AuthSecretRef == nil && len(s.Proxy.AllowedSourceRanges) == 0 {
		return nil, fieldError("spec.proxy", "refuses an open proxy: set authSecretRef (credentials) and/or allowedSourceRanges")
	}
	if s.Proxy.AuthSecretRef != nil && s.Proxy.AuthSecretRef.Name == "" {
		return nil, fieldError("spec.proxy.authSecretRef.name", "must name a Secret in the fleet's namespace")
	}

	hc := s.HealthCheck
	if hc.URL == "" {
		return nil, fieldError("spec.healthCheck.url", "is required: an http(s) URL fetched through each proxy, such as https://ifconfig.me/ip")
	}
	if u, err := url.Parse(hc.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fieldError("spec.healthCheck.url", "must be an absolute http:// or https:// URL, not %q", hc.URL)
	}
	interval, timeout := 30*time.Second, 5*time.Second
	if hc.Interval != nil {
		interval = hc.Interval.Duration
	}
	if hc.Timeout != nil {
		timeout = hc.Timeout.Duration
	}
	if timeout >= interval {
		return nil, fieldError("spec.healthCheck.timeout", "(%s) must be shorter than spec.healthCheck.interval (%s)", timeout, interval)
	}
	for field, v := range map[string]int32{"spec.healthCheck.successThreshold": hc.SuccessThreshold, "spec.healthCheck.failureThreshold": hc.FailureThreshold} {
		if v < 0 {
			return nil, fieldError(field, "must be at least 1, not %d", v)
		}
	}

	if f.MaxAge, err = parseDuration("spec.rotation.maxAge", s.Rotation.MaxAge, 0); err != nil {
		return nil, err
	}
	if f.ReplaceUnhealthyAfter, err = parseDuration("spec.rotation.replaceUnhealthyAfter", s.Rotation.ReplaceUnhealthyAfter, 5*time.Minute); err != nil {
		return nil, err
	}
	f.MaxSurge, f.MaxUnavailable = int(i32(s.Rotation.MaxSurge, 1)), int(i32(s.Rotation.MaxUnavailable, 0))
	if f.MaxSurge < 0 || f.MaxUnavailable < 0 {
		return nil, fieldError("spec.rotation", "maxSurge and maxUnavailable must not be negative")
	}
	if f.MaxSurge == 0 && f.MaxUnavailable == 0 {
		return nil, fieldError("spec.rotation", "maxSurge and maxUnavailable cannot both be 0: replacement could never make progress")
	}
	if m := i32(s.Leases.MaxLeasesPerProxy, 1); m < 1 {
		return nil, fieldError("spec.leases.maxLeasesPerProxy", "must be at least 1, not %d", m)
	}
	return f, nil
}
