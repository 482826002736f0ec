package gcpfake

import (
	"encoding/json"
	"testing"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"k8s.io/utils/ptr"
)

// TestInstanceFieldsAsJSON: the fields a listing compares without
// encoding a VM are those of its JSON form, absent where it has none.
func TestInstanceFieldsAsJSON(t *testing.T) {
	for name, vm := range map[string]*computepb.Instance{
		"Full":     {Name: ptr.To("a-1"), Status: ptr.To("RUNNING"), Labels: map[string]string{"egress-rule": "egress-fw-x", "k": ""}, CanIpForward: ptr.To(false)},
		"NoStatus": {Name: ptr.To("a-2"), Labels: map[string]string{"egress-rule": "egress-fw-x"}},
		"Bare":     {Name: ptr.To("")},
	} {
		b, err := protojson.Marshal(vm)
		if err != nil {
			t.Fatal(err)
		}
		full := map[string]any{}
		if err := json.Unmarshal(b, &full); err != nil {
			t.Fatal(err)
		}
		want := map[string]any{}
		for _, k := range []string{"name", "status", "labels"} {
			if v, ok := full[k]; ok {
				want[k] = v
			}
		}
		if diff := cmp.Diff(want, instanceFields(vm)); diff != "" {
			t.Errorf("%s: instanceFields differs from the JSON form (-json +fields):\n%s", name, diff)
		}
	}
	e, err := parseFilter(`(labels.egress-rule = "x") AND (name != "a") AND (status != "STOPPING")`)
	if err != nil || !e.onlyOf("name", "status", "labels.") {
		t.Errorf("a filter of labels, name and status takes the short way: %v", err)
	}
	if e, _ := parseFilter(`(labels.egress-rule = "x") AND (zone = "b")`); e.onlyOf("name", "status", "labels.") {
		t.Error("a filter of another field takes the JSON form")
	}
}
