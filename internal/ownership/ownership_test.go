package ownership

import (
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestLabelsRoundTrip(t *testing.T) {
	long := strings.Repeat("very-long-proxy-name-", 10)
	cases := map[string]struct {
		reason string
		owner  Owner
	}{
		"Short": {
			reason: "Short names are carried as they are.",
			owner:  Owner{ClusterID: "c1", Namespace: "crawl-team", Name: "crawlers-abc12", UID: "0b7c6a2e-1111-4222-8333-944455556666", Fleet: "crawlers"},
		},
		"Retained": {
			reason: "An instance made to outlive its Proxy says so on both backends.",
			owner:  Owner{ClusterID: "c1", Namespace: "crawl-team", Name: "p", UID: "0b7c6a2e-1111-4222-8333-944455556666", Retain: true},
		},
		"Adopted": {
			reason: "An imported instance names its adopter, and its maker's UID stays.",
			owner:  Owner{ClusterID: "c1", Namespace: "crawl-team", Name: "p2", UID: "0b7c6a2e-1111-4222-8333-944455556666", Adopter: "7e1d2c3b-1111-4222-8333-944455556666"},
		},
		"Long": {
			reason: "Names longer than a label value are hashed, and the UID still round-trips.",
			owner:  Owner{ClusterID: "Cluster_ONE", Namespace: "ns", Name: long, UID: "0b7c6a2e-1111-4222-8333-944455556666"},
		},
	}
	gcpKey := regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l := tc.owner.Labels()
			for k, v := range l {
				if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
					t.Errorf("%s\nlabel %s=%q is invalid: %v", tc.reason, k, v, errs)
				}
			}
			g := tc.owner.GCPLabels()
			for k, v := range g {
				if !gcpKey.MatchString(k) || !gcpValue.MatchString(v) {
					t.Errorf("%s\nGCP label %s=%q breaks GCP's rules", tc.reason, k, v)
				}
			}
			for _, labels := range []map[string]string{l, g} {
				got, ok := FromLabels(labels)
				if !ok {
					t.Fatalf("%s\nFromLabels(%v) did not recognise the scheme", tc.reason, labels)
				}
				if got.UID != tc.owner.UID || got.Retain != tc.owner.Retain || got.Holder() != tc.owner.Holder() {
					t.Errorf("%s\nUID, retain, holder: want %s %v %s, got %s %v %s", tc.reason, tc.owner.UID, tc.owner.Retain, tc.owner.Holder(), got.UID, got.Retain, got.Holder())
				}
			}
		})
	}
}

func TestFromLabelsForeign(t *testing.T) {
	for _, l := range []map[string]string{
		nil,
		{"app": "squid"},
		{LabelManagedBy: "someone-else", LabelUID: "x"},
		{LabelManagedBy: ManagedBy},
	} {
		if _, ok := FromLabels(l); ok {
			t.Errorf("FromLabels(%v) must not claim foreign or incomplete labels", l)
		}
	}
}

func TestInstanceName(t *testing.T) {
	a := InstanceName(types.UID("0b7c6a2e-1111-4222-8333-944455556666"))
	if diff := cmp.Diff(a, InstanceName(types.UID("0b7c6a2e-1111-4222-8333-944455556666"))); diff != "" {
		t.Errorf("the name must be deterministic: %s", diff)
	}
	if a == InstanceName("another-uid") {
		t.Error("different owners must get different names")
	}
	if !regexp.MustCompile(`^egress-[a-z2-7]{16}$`).MatchString(a) {
		t.Errorf("name %q must be egress- plus 16 lowercase base32 characters", a)
	}
	if errs := validation.IsDNS1123Label(a); len(errs) > 0 {
		t.Errorf("name %q must be a DNS label (pods, GCP instances): %v", a, errs)
	}
}

// FuzzLabelValue holds LabelValue to its promise for any name: a valid
// Kubernetes label value, the name itself when that is one, and a GCP label
// value that fits.
func FuzzLabelValue(f *testing.F) {
	for _, seed := range []string{"", "crawlers", "é", "日本語クローラー", "@@@", "-x", "x.", strings.Repeat("a", 64), "system:serviceaccount:ns/sa", "Example.COM"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, name string) {
		v := LabelValue(name)
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Fatalf("LabelValue(%q) = %q is not a label value: %v", name, v, errs)
		}
		if len(validation.IsValidLabelValue(name)) == 0 && v != name {
			t.Fatalf("LabelValue(%q) = %q changed a valid label value", name, v)
		}
		if g := fit(name, gcpValue, true); !gcpValue.MatchString(g) {
			t.Fatalf("GCP label value of %q = %q does not fit", name, g)
		}
	})
}
