package v1alpha1

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	egressv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
)

// durationType is the Go type of every duration field of the spec.
var durationType = reflect.TypeOf(&metav1.Duration{})

// durationFields lists the JSON paths of every duration field below t.
func durationFields(t reflect.Type, prefix []string) [][]string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var out [][]string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		path := prefix
		if name != "" {
			path = append(append([]string{}, prefix...), name)
		}
		if f.Type == durationType {
			out = append(out, path)
			continue
		}
		out = append(out, durationFields(f.Type, path)...)
	}
	return out
}

// specDurations are the duration fields of a ProxyFleet spec, found once.
var specDurations = durationFields(reflect.TypeOf(ProxyFleetSpec{}), nil)

// SpecFrom reads a fleet spec from an XR's or claim's unstructured spec.
// Fields Crossplane adds (spec.crossplane, compositionRef, ...) are ignored.
// A duration that does not parse is named by its field, since JSON decoding
// would not say which one failed.
func SpecFrom(spec map[string]any) (*ProxyFleetSpec, error) {
	for _, path := range specDurations {
		v, ok, _ := unstructured.NestedFieldNoCopy(spec, path...)
		if !ok || v == nil {
			continue
		}
		str, isString := v.(string)
		d, err := time.ParseDuration(str)
		if !isString || err != nil || d < 0 {
			return nil, errors.Errorf("spec.%s must be a duration such as 30s, 5m or 24h, not %s", strings.Join(path, "."), quoted(v))
		}
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, errors.Wrap(err, "cannot read spec")
	}
	s := &ProxyFleetSpec{}
	if err := json.Unmarshal(raw, s); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			// Named as the fleet's author wrote it, not as Go calls it
			// (found by FuzzFunction).
			return nil, errors.Errorf("spec.%s must be %s, not %s: spec does not match the ProxyFleet schema", te.Field, kindOf(te.Type), article(te.Value))
		}
		return nil, errors.Wrap(err, "spec does not match the ProxyFleet schema")
	}
	return s, nil
}

// kindOf says what JSON a Go type is read from.
func kindOf(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Float32, reflect.Float64:
		return "a number"
	default:
		return "an integer"
	}
}

// article puts "a" or "an" before what encoding/json says it found
// ("array", "string", "number 1.5").
func article(v string) string {
	if v != "" && strings.ContainsRune("aeiou", rune(v[0])) {
		return "an " + v
	}
	return "a " + v
}

// WithDefaults returns a copy of the spec with every default applied, as
// the apiserver would, so that code behaves the same whether or not an
// apiserver defaulted the XR (crossplane render does not). Every pointer of
// the result is set, except Rotation.MaxAge (unset: no age-based rotation),
// Autoscaling (unset: spec.replicas sizes the fleet) and the placement
// blocks.
func (s *ProxyFleetSpec) WithDefaults() *ProxyFleetSpec {
	d := s.DeepCopy()
	if d.Replicas == nil {
		d.Replicas = ptr.To(DefaultReplicas)
	}
	if d.ProviderConfigRef == nil {
		d.ProviderConfigRef = &ProviderConfigReference{Name: DefaultProviderConfigName}
	}
	if d.ProviderConfigRef.Kind == "" {
		d.ProviderConfigRef.Kind = egressv1alpha1.ClusterProviderConfigKind
	}
	if d.Proxy.Port == nil {
		d.Proxy.Port = ptr.To(egressv1alpha1.DefaultPort)
	}
	if r := d.Proxy.AuthSecretRef; r != nil {
		r.UsernameKey, r.PasswordKey = r.Keys()
	}
	if d.Rotation == nil {
		d.Rotation = &Rotation{}
	}
	if d.Rotation.MaxSurge == nil {
		d.Rotation.MaxSurge = ptr.To(DefaultMaxSurge)
	}
	if d.Rotation.MaxUnavailable == nil {
		d.Rotation.MaxUnavailable = ptr.To(DefaultMaxUnavailable)
	}
	if d.Rotation.ReplaceUnhealthyAfter == nil {
		d.Rotation.ReplaceUnhealthyAfter = &metav1.Duration{Duration: DefaultReplaceUnhealthyAfter}
	}
	if d.Rollout == nil {
		d.Rollout = &Rollout{}
	}
	if d.Rollout.ProgressDeadline == nil {
		d.Rollout.ProgressDeadline = &metav1.Duration{Duration: DefaultProgressDeadline}
	}
	if d.Leases == nil {
		d.Leases = &Leases{}
	}
	if d.Leases.MaxLeasesPerProxy == nil {
		d.Leases.MaxLeasesPerProxy = ptr.To(egressv1alpha1.DefaultMaxLeases)
	}
	if d.Leases.DefaultTTL == nil {
		d.Leases.DefaultTTL = &metav1.Duration{Duration: DefaultLeaseTTL}
	}
	if d.Leases.MaxTTL == nil {
		d.Leases.MaxTTL = &metav1.Duration{Duration: DefaultMaxLeaseTTL}
	}
	if d.Leases.MaxBanCooldown == nil {
		d.Leases.MaxBanCooldown = &metav1.Duration{Duration: DefaultMaxBanCooldown}
	}
	d.Autoscaling.withDefaults()
	return d
}

// withDefaults applies the autoscaling defaults in place; nil stays nil.
func (a *Autoscaling) withDefaults() {
	if a == nil {
		return
	}
	if a.MinReplicas == nil {
		a.MinReplicas = ptr.To(DefaultMinReplicas)
	}
	if a.TargetUtilization == nil {
		a.TargetUtilization = ptr.To(DefaultTargetUtilization)
	}
	if a.ScaleUpStabilization == nil {
		a.ScaleUpStabilization = &metav1.Duration{Duration: DefaultScaleUpStabilization}
	}
	if a.ScaleDownStabilization == nil {
		a.ScaleDownStabilization = &metav1.Duration{Duration: DefaultScaleDownStabilization}
	}
}

// BanCooldown is the longest ban a report may ask for in the fleet.
func (l *Leases) BanCooldown() time.Duration {
	if l == nil || l.MaxBanCooldown == nil {
		return DefaultMaxBanCooldown
	}
	return min(max(l.MaxBanCooldown.Duration, time.Second), MaxLeaseTTL)
}

// TTLs returns the lease TTL a crawler gets when it asks for none and the
// longest it may ask for, with the defaults for those unset, both within
// [MinLeaseTTL, MaxLeaseTTL] and the first no longer than the second, even
// for a fleet that no schema validated.
func (l *Leases) TTLs() (def, maxTTL time.Duration) {
	def, maxTTL = DefaultLeaseTTL, DefaultMaxLeaseTTL
	if l != nil && l.DefaultTTL != nil {
		def = l.DefaultTTL.Duration
	}
	if l != nil && l.MaxTTL != nil {
		maxTTL = l.MaxTTL.Duration
	}
	maxTTL = min(max(maxTTL, MinLeaseTTL), MaxLeaseTTL)
	def = min(max(def, MinLeaseTTL), maxTTL)
	return def, maxTTL
}

func quoted(v any) string {
	if s, ok := v.(string); ok {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%v", v)
}
