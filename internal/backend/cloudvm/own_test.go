package cloudvm_test

import (
	"maps"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/cloudvm"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// TestAdopted: an import moves the owner labels (in either cloud's form)
// to the new Proxy and keeps the others; an import tried again is
// allowed; an instance another Proxy holds is refused, changing nothing.
func TestAdopted(t *testing.T) {
	maker := ownership.Owner{ClusterID: "c1", Namespace: "team", Name: "old", UID: "uid-old"}
	to := ownership.Owner{ClusterID: "c1", Namespace: "team", Name: "new", UID: "uid-new"}
	for _, gcp := range []bool{true, false} {
		have := maker.Labels()
		if gcp {
			have = maker.GCPLabels()
		}
		have["team-label"] = "kept"
		before := maps.Clone(have)
		got, err := cloudvm.Adopted("VM x", have, "uid-old", to, gcp)
		if err != nil {
			t.Fatalf("gcp=%v: adopted from its holder: %v", gcp, err)
		}
		if o, _ := ownership.FromLabels(got); o.Holder() != "uid-new" || got["team-label"] != "kept" {
			t.Errorf("gcp=%v: the labels name %s, other labels %q", gcp, o.Holder(), got["team-label"])
		}
		if !maps.Equal(have, before) {
			t.Errorf("gcp=%v: the labels read were changed", gcp)
		}
		if again, err := cloudvm.Adopted("VM x", got, "uid-old", to, gcp); err != nil || !maps.Equal(again, got) {
			t.Errorf("gcp=%v: an import tried again: %v, %v", gcp, again, err)
		}
		if _, err := cloudvm.Adopted("VM x", got, "uid-old", ownership.Owner{UID: "uid-third"}, gcp); !errors.Is(err, backend.ErrHeldElsewhere) {
			t.Errorf("gcp=%v: an import of what another holds: %v, want ErrHeldElsewhere", gcp, err)
		}
	}
}

// TestRetained sets and removes the mark, leaving the rest.
func TestRetained(t *testing.T) {
	have := map[string]string{"a": "b"}
	on := cloudvm.Retained(have, true, true)
	if !maps.Equal(on, map[string]string{"a": "b", "egress-retain": "true"}) || len(have) != 1 {
		t.Errorf("retain: %v (read: %v)", on, have)
	}
	if off := cloudvm.Retained(on, false, true); !maps.Equal(off, have) {
		t.Errorf("let go: %v", off)
	}
	if nilIn := cloudvm.Retained(nil, true, false); nilIn[ownership.LabelRetain] != "true" {
		t.Errorf("from no labels: %v", nilIn)
	}
}

// TestUnused: openings a listed instance holds (its own, the one it
// records, one a cloud lists besides) are kept; the others are the
// orphan collector's, terminated and never retained.
func TestUnused(t *testing.T) {
	vms := []backend.Instance{
		{Ref: backend.Ref{Name: "egress-a"}},
		{Ref: backend.Ref{Name: "egress-b", Rule: "egress-fleet-1"}},
	}
	openings := []cloudvm.Opening{
		{Name: "egress-a", ProviderID: "p/a"},
		{Name: "egress-fleet-1", ProviderID: "p/f1"},
		{Name: "egress-sg-attached", ProviderID: "p/att"},
		{Name: "egress-fleet-2", ProviderID: "p/f2", Owner: ownership.Owner{Fleet: "gone", Retain: true}},
	}
	got := cloudvm.Unused(openings, cloudvm.Used(vms, "egress-sg-attached"))
	if len(got) != 1 || got[0].Name != "egress-fleet-2" || got[0].ProviderID != "p/f2" || got[0].Zone != "" ||
		got[0].Phase != v1alpha1.InstancePhaseTerminated || got[0].Owner.Retain || got[0].Owner.Fleet != "gone" {
		t.Errorf("unused: %+v", got)
	}
}
