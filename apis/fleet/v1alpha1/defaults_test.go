package v1alpha1

import (
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	egressv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
)

// schemaAt reads the openAPIV3Schema of the first version of a generated
// XRD or CRD.
func schemaAt(t *testing.T, path string) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	obj := map[string]any{}
	if err := yaml.Unmarshal(raw, &obj); err != nil {
		t.Fatal(err)
	}
	v := obj["spec"].(map[string]any)["versions"].([]any)[0].(map[string]any)
	return v["schema"].(map[string]any)["openAPIV3Schema"].(map[string]any)
}

// defaultAt returns the schema default at a path of property names.
func defaultAt(t *testing.T, s map[string]any, path ...string) any {
	t.Helper()
	for _, p := range path {
		props, ok := s["properties"].(map[string]any)
		if !ok {
			t.Fatalf("no properties above %q", p)
		}
		if s, ok = props[p].(map[string]any); !ok {
			t.Fatalf("no property %q in %v", p, path)
		}
	}
	return s["default"]
}

// TestDefaultsMatchSchema holds the Go defaults, which code applies where
// no apiserver defaulted an object, to the defaults the generated schemas
// declare, so that the markers and the constants cannot drift apart.
func TestDefaultsMatchSchema(t *testing.T) {
	xrd := schemaAt(t, "../definition.yaml")
	crd := schemaAt(t, "../../../package/provider/crds/egress.crawl.example.com_proxies.yaml")
	cases := map[string]struct {
		schema map[string]any
		path   []string
		want   any
	}{
		"replicas":              {xrd, []string{"spec", "replicas"}, float64(DefaultReplicas)},
		"port":                  {xrd, []string{"spec", "proxy", "port"}, float64(egressv1alpha1.DefaultPort)},
		"usernameKey":           {xrd, []string{"spec", "proxy", "authSecretRef", "usernameKey"}, egressv1alpha1.DefaultUsernameKey},
		"passwordKey":           {xrd, []string{"spec", "proxy", "authSecretRef", "passwordKey"}, egressv1alpha1.DefaultPasswordKey},
		"maxSurge":              {xrd, []string{"spec", "rotation", "maxSurge"}, float64(DefaultMaxSurge)},
		"maxUnavailable":        {xrd, []string{"spec", "rotation", "maxUnavailable"}, float64(DefaultMaxUnavailable)},
		"replaceUnhealthyAfter": {xrd, []string{"spec", "rotation", "replaceUnhealthyAfter"}, DefaultReplaceUnhealthyAfter.String()},
		"rotation": {xrd, []string{"spec", "rotation"}, map[string]any{
			"maxSurge": float64(DefaultMaxSurge), "maxUnavailable": float64(DefaultMaxUnavailable), "replaceUnhealthyAfter": "5m",
		}},
		"progressDeadline":  {xrd, []string{"spec", "rollout", "progressDeadline"}, DefaultProgressDeadline.String()},
		"rollout":           {xrd, []string{"spec", "rollout"}, map[string]any{"progressDeadline": "10m"}},
		"maxLeasesPerProxy": {xrd, []string{"spec", "leases", "maxLeasesPerProxy"}, float64(egressv1alpha1.DefaultMaxLeases)},
		"leases": {xrd, []string{"spec", "leases"}, map[string]any{
			"maxLeasesPerProxy": float64(egressv1alpha1.DefaultMaxLeases), "defaultTTL": "10m", "maxTTL": "1h", "maxBanCooldown": "24h",
		}},
		"providerConfigRef": {xrd, []string{"spec", "providerConfigRef"}, map[string]any{
			"kind": egressv1alpha1.ClusterProviderConfigKind, "name": DefaultProviderConfigName,
		}},
		"minReplicas":            {xrd, []string{"spec", "autoscaling", "minReplicas"}, float64(DefaultMinReplicas)},
		"targetUtilization":      {xrd, []string{"spec", "autoscaling", "targetUtilization"}, DefaultTargetUtilization},
		"scaleUpStabilization":   {xrd, []string{"spec", "autoscaling", "scaleUpStabilization"}, DefaultScaleUpStabilization.String()},
		"scaleDownStabilization": {xrd, []string{"spec", "autoscaling", "scaleDownStabilization"}, DefaultScaleDownStabilization.String()},
		"proxy port":             {crd, []string{"spec", "forProvider", "port"}, float64(egressv1alpha1.DefaultPort)},
		"proxy maxLeases":        {crd, []string{"spec", "forProvider", "maxLeases"}, float64(egressv1alpha1.DefaultMaxLeases)},
		"proxy usernameKey":      {crd, []string{"spec", "forProvider", "authSecretRef", "usernameKey"}, egressv1alpha1.DefaultUsernameKey},
		"proxy passwordKey":      {crd, []string{"spec", "forProvider", "authSecretRef", "passwordKey"}, egressv1alpha1.DefaultPasswordKey},
		"gcp machineType":        {crd, []string{"spec", "forProvider", "gcp", "machineType"}, egressv1alpha1.DefaultGCPMachineType},
		"gcp image":              {crd, []string{"spec", "forProvider", "gcp", "image"}, egressv1alpha1.DefaultGCPImage},
		"gcp network":            {crd, []string{"spec", "forProvider", "gcp", "network"}, egressv1alpha1.DefaultGCPNetwork},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := defaultAt(t, tc.schema, tc.path...)
			if s, ok := got.(string); ok {
				// Durations are compared as durations: "5m" is 5m0s.
				if gd, err := time.ParseDuration(s); err == nil {
					got = gd.String()
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("schema default of %v: -go +schema:\n%s", tc.path, diff)
			}
		})
	}

	// The object defaults spell durations as the schema does; check they
	// parse to the constants.
	leases := defaultAt(t, xrd, "spec", "leases").(map[string]any)
	for k, want := range map[string]time.Duration{"defaultTTL": DefaultLeaseTTL, "maxTTL": DefaultMaxLeaseTTL, "maxBanCooldown": DefaultMaxBanCooldown} {
		if got, err := time.ParseDuration(leases[k].(string)); err != nil || got != want {
			t.Errorf("spec.leases default %s = %v, want %s", k, leases[k], want)
		}
	}
}

func TestWithDefaults(t *testing.T) {
	in := &ProxyFleetSpec{Proxy: ProxySettings{AuthSecretRef: &egressv1alpha1.AuthSecretReference{Name: "auth"}}}
	got := in.WithDefaults()
	want := &ProxyFleetSpec{
		Replicas:          ptr.To[int32](3),
		ProviderConfigRef: &ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "default"},
		Proxy: ProxySettings{Port: ptr.To[int32](3128), AuthSecretRef: &egressv1alpha1.AuthSecretReference{
			Name: "auth", UsernameKey: "username", PasswordKey: "password",
		}},
		Rotation: &Rotation{MaxSurge: ptr.To[int32](1), MaxUnavailable: ptr.To[int32](0), ReplaceUnhealthyAfter: &metav1.Duration{Duration: 5 * time.Minute}},
		Rollout:  &Rollout{ProgressDeadline: &metav1.Duration{Duration: 10 * time.Minute}},
		Leases: &Leases{MaxLeasesPerProxy: ptr.To[int32](1), DefaultTTL: &metav1.Duration{Duration: 10 * time.Minute},
			MaxTTL: &metav1.Duration{Duration: time.Hour}, MaxBanCooldown: &metav1.Duration{Duration: 24 * time.Hour}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("WithDefaults: -want +got:\n%s", diff)
	}
	if in.Replicas != nil || in.Proxy.AuthSecretRef.UsernameKey != "" {
		t.Error("WithDefaults changed its receiver")
	}
	if def, maxTTL := (*Leases)(nil).TTLs(); def != DefaultLeaseTTL || maxTTL != DefaultMaxLeaseTTL {
		t.Errorf("nil Leases TTLs = %s, %s", def, maxTTL)
	}
}

func TestSpecFromNamesBadDurations(t *testing.T) {
	if diff := cmp.Diff([][]string{
		{"proxy", "credentialGracePeriod"},
		{"healthCheck", "interval"}, {"healthCheck", "timeout"},
		{"rotation", "maxAge"}, {"rotation", "replaceUnhealthyAfter"},
		{"rollout", "progressDeadline"},
		{"leases", "defaultTTL"}, {"leases", "maxTTL"}, {"leases", "maxBanCooldown"}, {"leases", "admission", "maxWait"},
		{"autoscaling", "scaleUpStabilization"}, {"autoscaling", "scaleDownStabilization"},
		{"recycling", "window"}, {"recycling", "backoff"},
	}, specDurations); diff != "" {
		t.Errorf("duration fields: -want +got:\n%s", diff)
	}
	cases := map[string]struct {
		spec map[string]any
		want string
	}{
		"word":     {map[string]any{"rotation": map[string]any{"maxAge": "a day"}}, `spec.rotation.maxAge must be a duration such as 30s, 5m or 24h, not "a day"`},
		"negative": {map[string]any{"leases": map[string]any{"maxTTL": "-1h"}}, `spec.leases.maxTTL must be a duration such as 30s, 5m or 24h, not "-1h"`},
		"number":   {map[string]any{"healthCheck": map[string]any{"timeout": 5}}, `spec.healthCheck.timeout must be a duration such as 30s, 5m or 24h, not 5`},
		"good":     {map[string]any{"healthCheck": map[string]any{"timeout": "5s"}, "leases": map[string]any{"maxTTL": "2h"}}, ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := SpecFrom(tc.spec)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.want {
				t.Errorf("SpecFrom: got error %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLeaseTTLsBounded(t *testing.T) {
	d := func(v time.Duration) *metav1.Duration { return &metav1.Duration{Duration: v} }
	cases := map[string]struct {
		l           *Leases
		def, maxTTL time.Duration
	}{
		"Unset":          {nil, DefaultLeaseTTL, DefaultMaxLeaseTTL},
		"SubSecond":      {&Leases{DefaultTTL: d(500 * time.Millisecond)}, MinLeaseTTL, DefaultMaxLeaseTTL},
		"Huge":           {&Leases{MaxTTL: d(1000000 * time.Hour)}, DefaultLeaseTTL, MaxLeaseTTL},
		"DefaultOverMax": {&Leases{DefaultTTL: d(2 * time.Hour)}, DefaultMaxLeaseTTL, DefaultMaxLeaseTTL},
		"Zero":           {&Leases{DefaultTTL: d(0), MaxTTL: d(0)}, MinLeaseTTL, MinLeaseTTL},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			def, maxTTL := tc.l.TTLs()
			if def != tc.def || maxTTL != tc.maxTTL {
				t.Errorf("TTLs() = %s, %s; want %s, %s", def, maxTTL, tc.def, tc.maxTTL)
			}
		})
	}
}
