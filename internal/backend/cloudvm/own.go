package cloudvm

import (
	"maps"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// Adopted is what an instance's labels or tags (have; GCP's form when
// gcpForm) become when the Proxy to imports it: its owner moves to to (the
// maker's cluster, namespace and UID stay, as the instance's name derives
// from them), when it is still from's, or to's already (an import tried
// again). Held by any other, the import is refused (backend.HeldElsewhere,
// naming what). Each cloud writes the result its own way: GCP as a
// compare-and-swap on the label fingerprint, EC2 unconditionally and read
// back.
func Adopted(what string, have map[string]string, from types.UID, to ownership.Owner, gcpForm bool) (map[string]string, error) {
	cur, _ := ownership.FromLabels(have)
	if h := cur.Holder(); h != from && h != to.UID {
		return nil, backend.HeldElsewhere(what, h, from)
	}
	return cur.AdoptedBy(to).Relabel(have, gcpForm), nil
}

// Retained is an instance's labels or tags (have; GCP's form when gcpForm)
// with the mark that it outlives its Proxy set (retain) or removed.
func Retained(have map[string]string, retain, gcpForm bool) map[string]string {
	key := ownership.RetainKey(gcpForm)
	want := maps.Clone(have)
	if want == nil {
		want = map[string]string{}
	}
	delete(want, key)
	if retain {
		want[key] = "true"
	}
	return want
}

// Opening is one of a cloud's openings (a GCP firewall rule, an EC2
// security group) that this cluster made, as its listing reads it.
type Opening struct {
	// Name is what instances that use it record (backend.Instance.Rule).
	Name, ProviderID string
	// Owner is the Proxy or fleet it was made for.
	Owner   ownership.Owner
	Created time.Time
}

// Used are the names of the openings the listed instances hold: each
// instance's own (named for it) and the one it records, and extra (what
// a cloud lists of an instance besides, such as EC2's attached groups).
func Used(instances []backend.Instance, extra ...string) map[string]bool {
	used := map[string]bool{}
	for _, i := range instances {
		used[i.Name] = true
		if i.Rule != "" {
			used[i.Rule] = true
		}
	}
	for _, e := range extra {
		used[e] = true
	}
	return used
}

// Unused are the openings used does not name, as the orphan collector
// takes them: instances without a zone, terminated, never retained (an
// opening no live instance uses serves nothing).
func Unused(openings []Opening, used map[string]bool) []backend.Instance {
	var out []backend.Instance
	for _, o := range openings {
		if used[o.Name] {
			continue
		}
		owner := o.Owner
		owner.Retain = false
		out = append(out, backend.Instance{
			Ref: backend.Ref{Name: o.Name}, ProviderID: o.ProviderID,
			Phase: v1alpha1.InstancePhaseTerminated, CreatedAt: o.Created, Owner: owner,
		})
	}
	return out
}
