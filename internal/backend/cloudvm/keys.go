package cloudvm

import (
	"strconv"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// Keys are the labels (GCP) or tags (EC2) under which an instance records
// what the reconciler needs to read back from it: its owner, the spec and
// credentials it was made from, its port and the opening it uses. A cloud
// names them its own way (GCP's label keys are lowercase words, EC2's tag
// keys may be prefixed names); Record and Observe are written once.
type Keys struct {
	// Name records the instance's name (ownership.InstanceName) where the
	// cloud's own name for it is not that (EC2's i-...); empty where it is
	// (GCP).
	Name string
	// SpecHash records backend.Spec.Hash; Credentials
	// backend.Spec.CredentialsSum; Port the proxy's port.
	SpecHash, Credentials, Port string
	// Opening names the opening (firewall rule, security group) the
	// instance uses.
	Opening string
	// GCPForm records the owner as GCP labels (ownership.GCPLabels):
	// lowercase keys and values.
	GCPForm bool
}

// Record is what an instance of s records: the owner's labels, the spec
// hash, the credentials sum (when there are credentials), the port, its
// name where the cloud needs it, and opening, when not empty.
func (k Keys) Record(s backend.Spec, opening string) map[string]string {
	m := s.Owner.Labels()
	if k.GCPForm {
		m = s.Owner.GCPLabels()
	}
	if k.Name != "" {
		m[k.Name] = s.Name
	}
	m[k.SpecHash] = s.Hash
	if s.CredentialsSum != "" {
		m[k.Credentials] = s.CredentialsSum
	}
	m[k.Port] = strconv.Itoa(int(s.Port))
	if opening != "" {
		m[k.Opening] = opening
	}
	return m
}

// Observe reads what Record wrote (have, as the cloud lists the
// instance's labels or tags) into i: owner, port, spec hash, credentials
// sum, opening, and the name where the cloud records it. What the cloud
// reports itself (zone, address, phase, times) is the cloud's to fill.
func (k Keys) Observe(have map[string]string, i *backend.Instance) {
	i.Owner, _ = ownership.FromLabels(have)
	if port, err := strconv.ParseInt(have[k.Port], 10, 32); err == nil {
		i.Port = int32(port)
	}
	i.SpecHash = have[k.SpecHash]
	i.CredentialsSum = have[k.Credentials]
	i.Rule = have[k.Opening]
	if k.Name != "" {
		i.Name = have[k.Name]
	}
}
