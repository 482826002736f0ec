package cloudvm_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/cloudvm"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// TestKeys: what an instance records, in either cloud's form, reads back
// as the spec it was made from; what a cloud does not record (GCP the
// name, which is its own) or an instance never had (credentials, a shared
// opening) reads back empty; a value no Record wrote (a port a user
// edited out of range) reads as none rather than wrapping.
func TestKeys(t *testing.T) {
	owner := ownership.Owner{ClusterID: "c1", Namespace: "team", Name: "p", UID: "4a2b3c4d-0000-4111-8222-933344445555", Fleet: "f"}
	s := backend.Spec{Ref: backend.Ref{Name: ownership.InstanceName(owner.UID)}, Owner: owner, Port: 3128, Hash: "h1", CredentialsSum: "c1sum"}
	for name, c := range map[string]struct {
		keys     cloudvm.Keys
		opening  string
		wantName string
	}{
		"GCP, a rule of its own": {cloudvm.Keys{SpecHash: "egress-spec-hash", Credentials: "egress-credentials", Port: "egress-port", Opening: "egress-rule", GCPForm: true}, "", ""},
		"GCP, the fleet's rule":  {cloudvm.Keys{SpecHash: "egress-spec-hash", Credentials: "egress-credentials", Port: "egress-port", Opening: "egress-rule", GCPForm: true}, "egress-fleet-x", ""},
		"EC2":                    {cloudvm.Keys{Name: "x/instance", SpecHash: "x/spec-hash", Credentials: "x/credentials", Port: "x/port", Opening: "x/security-group", GCPForm: false}, "egress-sg-y", s.Name},
	} {
		rec := c.keys.Record(s, c.opening)
		var got backend.Instance
		c.keys.Observe(rec, &got)
		want := backend.Instance{Ref: backend.Ref{Name: c.wantName, Rule: c.opening}, Port: 3128, SpecHash: "h1", CredentialsSum: "c1sum", Owner: owner}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("%s: read back (-want +got):\n%s", name, d)
		}
		wantOwner := owner.Labels()
		if c.keys.GCPForm {
			wantOwner = owner.GCPLabels()
		}
		for k, v := range wantOwner {
			if rec[k] != v {
				t.Errorf("%s: the owner's %s is recorded as %q, want %q (GCP form %v)", name, k, rec[k], v, c.keys.GCPForm)
			}
		}

		none := s
		none.CredentialsSum = ""
		rec = c.keys.Record(none, c.opening)
		if _, ok := rec[c.keys.Credentials]; ok {
			t.Errorf("%s: an instance without credentials records a credentials sum: %v", name, rec)
		}
		rec[c.keys.Port] = "4294967296"
		got = backend.Instance{}
		c.keys.Observe(rec, &got)
		if got.Port != 0 {
			t.Errorf("%s: a port out of range reads as %d, want 0", name, got.Port)
		}
	}
}
