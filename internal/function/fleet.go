package function

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
)

// Fleet is a validated ProxyFleet spec with every default applied, so the
// function behaves the same whether or not an apiserver defaulted the XR
// (crossplane render does not).
type Fleet struct {
	Name      string
	Namespace string
	Replicas  int
	Zones     []string
	// spec has every default applied.
	spec *fleetv1alpha1.ProxyFleetSpec

	MaxAge                time.Duration // zero: no age-based rotation
	MaxSurge              int
	MaxUnavailable        int
	ReplaceUnhealthyAfter time.Duration
	// Revision names the proxy template (templateRevision).
	Revision string
	// Paused holds back the replacements a template change or a removed
	// zone asks for.
	Paused bool
	// ProgressDeadline is how long a rollout may make no progress before
	// it is reported stalled.
	ProgressDeadline time.Duration
	// Warnings say what in the spec was taken otherwise than written.
	Warnings []string
	// autoscale is spec.autoscaling; nil when spec.replicas sizes the
	// fleet. While set, Replicas is what it chose.
	autoscale *autoscaler
	// Pool is the name of the ProxyPool being composed, "" for a fleet
	// composing its Proxies itself; OrdinalBase is where the ordinals of
	// its Proxies start.
	Pool        string
	OrdinalBase int
	// readyFloor is how many Ready proxies make a pool Ready: its fleet's
	// floor for it, whatever budget it holds. repairs is how many of its
	// replacements of proxies that are down may be under way at once.
	readyFloor, repairs int
	// poolRecycling is a pool's burned Proxies and recycle grant, from
	// its fleet; nil for none.
	poolRecycling *poolRecycling
}

// servingFloor is how many proxies must serve (be Ready, or healthy to
// start a recycle): replicas - maxUnavailable; a pool's own, whatever
// budget its fleet grants it.
func (f *Fleet) servingFloor() int {
	if f.Pool != "" {
		return f.readyFloor
	}
	return f.Replicas - f.MaxUnavailable
}

// repairLimit is how many replacements of proxies that are down may be
// under way at once: max(maxSurge, 1) for a fleet, what its fleet granted
// for a pool.
func (f *Fleet) repairLimit() int {
	if f.Pool != "" {
		return f.repairs
	}
	return max(f.MaxSurge, 1)
}

// templateRevision hashes what each of a fleet's Proxies is made from,
// besides its zone, as a Deployment hashes its pod template: the
// ProviderConfig, the placement, the proxy settings and the health check,
// all with their defaults applied. A Proxy of another revision is replaced
// by one of this revision, never rewritten in place. Leases per proxy are
// left out: they change nothing on the proxy, and reach every Proxy in
// place; so is the credential grace period. The credentials themselves are
// not in the spec: a proxy that cannot change them in place says so in its
// status (CredentialsOutdated), and is replaced as one of another revision.
func templateRevision(s *fleetv1alpha1.ProxyFleetSpec) string {
	proxy := *s.Proxy.DeepCopy()
	proxy.CredentialGracePeriod = nil
	in := struct {
		Ref         *fleetv1alpha1.ProviderConfigReference `json:"ref"`
		Placement   fleetv1alpha1.Placement                `json:"placement"`
		Proxy       fleetv1alpha1.ProxySettings            `json:"proxy"`
		HealthCheck v1alpha1.HealthCheck                   `json:"healthCheck"`
	}{Ref: s.ProviderConfigRef, Placement: s.Placement, Proxy: proxy, HealthCheck: s.HealthCheck}
	b, _ := json.Marshal(in) //nolint:errchkjson // Plain structs always marshal.
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:10]
}

// credentialGracePeriod is how long the fleet's proxies accept their
// previous credentials after a change: spec.proxy.credentialGracePeriod,
// or else the longest lease; nil without credentials.
func (f *Fleet) credentialGracePeriod() *metav1.Duration {
	switch {
	case f.spec.Proxy.AuthSecretRef == nil:
		return nil
	case f.spec.Proxy.CredentialGracePeriod != nil:
		return f.spec.Proxy.CredentialGracePeriod
	default:
		return f.spec.Leases.MaxTTL
	}
}

var zoneName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// fieldError is bad input: it names the field and the fix.
func fieldError(field, format string, args ...any) error {
	return errors.Errorf("%s %s", field, fmt.Sprintf(format, args...))
}

// parseFleet reads and validates a fleet spec. Every error names the field
// and says what to do.
func parseFleet(name, namespace string, spec map[string]any) (*Fleet, error) {
	if len(name) > fleetv1alpha1.MaxNameLength {
		return nil, fieldError("metadata.name", "is %d characters long; a fleet's name may have at most %d, so that the names of its Proxies and Leases fit Kubernetes' 253", len(name), fleetv1alpha1.MaxNameLength)
	}
	given, err := fleetv1alpha1.SpecFrom(spec)
	if err != nil {
		return nil, err
	}
	s := given.WithDefaults()
	f := &Fleet{Name: name, Namespace: namespace, spec: s, Replicas: int(*s.Replicas), Zones: s.Zones, Revision: templateRevision(s)}
	f.Paused, f.ProgressDeadline = s.Rollout.Paused, s.Rollout.ProgressDeadline.Duration
	if f.autoscale, err = newAutoscaler(s.Autoscaling); err != nil {
		return nil, err
	}
	c := (*fleetSpec)(s)
	for _, check := range []func() error{
		f.checkScale, c.checkPlacement, c.checkProxy, c.checkHealthCheck, f.checkRotation, c.checkLeases,
	} {
		if err := check(); err != nil {
			return nil, err
		}
	}
	if n := recycleNote(f); n != "" {
		f.Warnings = append(f.Warnings, n)
	}
	return f, nil
}

// checkScale checks replicas and zones.
func (f *Fleet) checkScale() error {
	if f.Replicas < 0 || f.Replicas > fleetv1alpha1.MaxReplicas {
		return fieldError("spec.replicas", "must be between 0 and %d, not %d", fleetv1alpha1.MaxReplicas, f.Replicas)
	}
	if f.Replicas > 0 && len(f.Zones) == 0 && f.autoscale == nil {
		return fieldError("spec.zones", "must not be empty when spec.replicas > 0: list the zones to spread proxies over")
	}
	if f.autoscale != nil && len(f.Zones) == 0 {
		return fieldError("spec.zones", "must not be empty when spec.autoscaling is set: list the zones to spread proxies over")
	}
	if p := f.spec.Pools; p != nil {
		per := int(p.ProxiesPerPool)
		if per < 1 || per > fleetv1alpha1.MaxProxiesPerPool {
			return fieldError("spec.pools.proxiesPerPool", "must be between 1 and %d, not %d", fleetv1alpha1.MaxProxiesPerPool, per)
		}
		most := f.Replicas
		if f.autoscale != nil {
			most = f.autoscale.Max
		}
		if most > per*fleetv1alpha1.MaxPools {
			return fieldError("spec.pools.proxiesPerPool", "(%d) x %d pools holds %d proxies, fewer than the fleet's %d: raise proxiesPerPool", per, fleetv1alpha1.MaxPools, per*fleetv1alpha1.MaxPools, most)
		}
	}
	seen := map[string]bool{}
	for i, z := range f.Zones {
		if !zoneName.MatchString(z) || len(z) > 63 {
			return fieldError(fmt.Sprintf("spec.zones[%d]", i), "%q must be a lowercase DNS label such as europe-west1-b", z)
		}
		if seen[z] {
			return fieldError(fmt.Sprintf("spec.zones[%d]", i), "%q is listed twice", z)
		}
		seen[z] = true
	}
	return nil
}

// fleetSpec adds the function's checks to the API type.
type fleetSpec fleetv1alpha1.ProxyFleetSpec

func (s *fleetSpec) checkPlacement() error {
	n := 0
	for _, set := range []bool{s.Placement.Local != nil, s.Placement.Kubernetes != nil, s.Placement.GCP != nil, s.Placement.AWS != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return fieldError("spec.placement", "needs exactly one of local, kubernetes, gcp or aws")
	}
	if d := s.Diversity; d != nil && d.ReplaceBeyondLimit && s.Placement.GCP == nil && s.Placement.AWS == nil {
		return fieldError("spec.diversity.replaceBeyondLimit", "needs a backend that gives each proxy an address of its own (spec.placement.gcp or aws): a replaced local or Kubernetes proxy leaves from the same address")
	}
	if aws := s.Placement.AWS; aws != nil && aws.UserData != nil && (aws.UserData.Inline != nil || aws.UserData.SecretRef == nil) {
		return fieldError("spec.placement.aws.userData", "takes secretRef only in a fleet")
	}
	if gcp := s.Placement.GCP; gcp != nil && gcp.CloudInit != nil && (gcp.CloudInit.Inline != nil) == (gcp.CloudInit.SecretRef != nil) {
		return fieldError("spec.placement.gcp.cloudInit", "needs exactly one of inline or secretRef")
	}
	if ref := s.ProviderConfigRef; ref.Kind != v1alpha1.ProviderConfigKind && ref.Kind != v1alpha1.ClusterProviderConfigKind {
		return fieldError("spec.providerConfigRef.kind", "must be ProviderConfig or ClusterProviderConfig, not %q", ref.Kind)
	}
	if s.ProviderConfigRef.Name == "" {
		return fieldError("spec.providerConfigRef.name", "must name a ProviderConfig or ClusterProviderConfig")
	}
	return nil
}

func (s *fleetSpec) checkProxy() error {
	if p := *s.Proxy.Port; p < 1 || p > 65535 {
		return fieldError("spec.proxy.port", "must be between 1 and 65535, not %d", p)
	}
	if s.Proxy.AuthSecretRef == nil && len(s.Proxy.AllowedSourceRanges) == 0 {
		return fieldError("spec.proxy", "refuses an open proxy: set authSecretRef (credentials) and/or allowedSourceRanges")
	}
	if g := s.Proxy.CredentialGracePeriod; g != nil && (g.Duration < 0 || g.Duration > fleetv1alpha1.MaxCredentialGracePeriod) {
		return fieldError("spec.proxy.credentialGracePeriod", "must be between 0s and %s, not %s", fleetv1alpha1.MaxCredentialGracePeriod, g.Duration)
	}
	ranges := make([]string, 0, len(s.Proxy.AllowedSourceRanges))
	for _, r := range s.Proxy.AllowedSourceRanges {
		ranges = append(ranges, string(r))
	}
	public, err := squid.PublicSources(ranges)
	if err != nil {
		return fieldError("spec.proxy.allowedSourceRanges", "%v", err)
	}
	if s.Proxy.AuthSecretRef == nil && len(public) > 0 {
		return fieldError("spec.proxy.allowedSourceRanges", "%q is not private, loopback or CGNAT space: without authSecretRef that is an open proxy; add authSecretRef or narrow the range", public[0])
	}
	private := make([]string, 0, len(s.Proxy.AllowedPrivateDestinations))
	for _, c := range s.Proxy.AllowedPrivateDestinations {
		private = append(private, string(c))
	}
	notPrivate, err := squid.NotPrivateDestinations(private)
	if err != nil {
		return fieldError("spec.proxy.allowedPrivateDestinations", "%v", err)
	}
	if len(notPrivate) > 0 {
		return fieldError("spec.proxy.allowedPrivateDestinations", "%q is not a private network (nor may it be the proxy host itself): public destinations need no exception", notPrivate[0])
	}
	if s.Proxy.AuthSecretRef != nil && s.Proxy.AuthSecretRef.Name == "" {
		return fieldError("spec.proxy.authSecretRef.name", "must name a Secret in the fleet's namespace")
	}
	return nil
}

func (s *fleetSpec) checkHealthCheck() error {
	hc := s.HealthCheck
	if hc.URL == "" {
		return fieldError("spec.healthCheck.url", "is required: an http(s) URL fetched through each proxy, such as https://ifconfig.me/ip")
	}
	if u, err := url.Parse(hc.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fieldError("spec.healthCheck.url", "must be an absolute http:// or https:// URL, not %q", hc.URL)
	}
	if interval, timeout := hc.IntervalOrDefault(), hc.TimeoutOrDefault(); timeout >= interval {
		return fieldError("spec.healthCheck.timeout", "(%s) must be shorter than spec.healthCheck.interval (%s)", timeout, interval)
	}
	for field, v := range map[string]int32{"spec.healthCheck.successThreshold": hc.SuccessThreshold, "spec.healthCheck.failureThreshold": hc.FailureThreshold} {
		if v < 0 {
			return fieldError(field, "must be at least 1, not %d", v)
		}
	}
	return nil
}

// checkRotation checks the rotation settings and keeps them on the fleet.
func (f *Fleet) checkRotation() error {
	r := f.spec.Rotation
	if r.MaxAge != nil {
		if f.MaxAge = r.MaxAge.Duration; f.MaxAge < time.Minute {
			return fieldError("spec.rotation.maxAge", "must be at least 1m, not %s", f.MaxAge)
		}
	}
	switch f.ReplaceUnhealthyAfter = r.ReplaceUnhealthyAfter.Duration; {
	case f.ReplaceUnhealthyAfter < 0:
		return fieldError("spec.rotation.replaceUnhealthyAfter", "must not be negative, not %s", f.ReplaceUnhealthyAfter)
	case f.ReplaceUnhealthyAfter < time.Minute:
		// The schema refuses it now, but a fleet stored before it did
		// keeps being composed, with the shortest hold that lets a proxy
		// boot.
		f.Warnings = append(f.Warnings, fmt.Sprintf("spec.rotation.replaceUnhealthyAfter %s is shorter than 1m: 1m is used, since a proxy needs time to boot; set it to at least 1m", f.ReplaceUnhealthyAfter))
		f.ReplaceUnhealthyAfter = time.Minute
	}
	if f.ProgressDeadline < time.Minute {
		return fieldError("spec.rollout.progressDeadline", "must be at least 1m, not %s", f.ProgressDeadline)
	}
	f.MaxSurge, f.MaxUnavailable = int(*r.MaxSurge), int(*r.MaxUnavailable)
	if f.MaxSurge < 0 || f.MaxUnavailable < 0 {
		return fieldError("spec.rotation", "maxSurge and maxUnavailable must not be negative")
	}
	if f.MaxSurge == 0 && f.MaxUnavailable == 0 {
		return fieldError("spec.rotation", "maxSurge and maxUnavailable cannot both be 0: replacement could never make progress")
	}
	return nil
}

func (s *fleetSpec) checkLeases() error {
	if m := *s.Leases.MaxLeasesPerProxy; m < 1 {
		return fieldError("spec.leases.maxLeasesPerProxy", "must be at least 1, not %d", m)
	}
	def, maxTTL := s.Leases.DefaultTTL.Duration, s.Leases.MaxTTL.Duration
	for field, d := range map[string]time.Duration{"spec.leases.defaultTTL": def, "spec.leases.maxTTL": maxTTL} {
		if d < fleetv1alpha1.MinLeaseTTL || d > fleetv1alpha1.MaxLeaseTTL {
			return fieldError(field, "must be between %s and %s, not %s", fleetv1alpha1.MinLeaseTTL, fleetv1alpha1.MaxLeaseTTL, d)
		}
	}
	if def > maxTTL {
		return fieldError("spec.leases.defaultTTL", "(%s) must not exceed spec.leases.maxTTL (%s)", def, maxTTL)
	}
	return s.checkAdmission()
}

// checkAdmission checks what only egress-discovery reads, so that a fleet
// the schema would refuse is refused where no API server checks it (crossplane
// render) too: discovery would otherwise clamp it silently.
func (s *fleetSpec) checkAdmission() error {
	if a := s.Leases.Admission; a != nil {
		if f := a.MinHealthyFraction; f != nil && (*f < 0 || *f > 1) {
			return fieldError("spec.leases.admission.minHealthyFraction", "must be between 0 and 1, not %g", *f)
		}
		if w := a.MaxWait; w != nil && (w.Duration < 0 || w.Duration > 20*time.Second) {
			return fieldError("spec.leases.admission.maxWait", "must be between 0s and 20s, not %s", w.Duration)
		}
	}
	q := s.Leases.Quotas
	if q == nil {
		return nil
	}
	if m := q.MaxLeasesPerIdentity; m != nil && *m < 0 {
		return fieldError("spec.leases.quotas.maxLeasesPerIdentity", "must not be negative, not %d", *m)
	}
	for i, o := range q.Overrides {
		n := 0
		for _, set := range []bool{o.ServiceAccount != "", o.Group != "", o.StaticToken != ""} {
			if set {
				n++
			}
		}
		field := fmt.Sprintf("spec.leases.quotas.overrides[%d]", i)
		if n != 1 {
			return fieldError(field, "must name exactly one of serviceAccount, group or staticToken, not %d", n)
		}
		if o.MaxLeases < 0 {
			return fieldError(field+".maxLeases", "must not be negative, not %d", o.MaxLeases)
		}
	}
	return nil
}
