// Package ownership is the one labelling scheme every backend puts on the
// instances it creates, so that the orphan collector can tell which Proxy
// (by UID) owns each pod, VM or process, and which cluster created it.
package ownership

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// Kubernetes label keys of the scheme.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelCluster   = "egress.crawl.example.com/cluster"
	LabelNamespace = "egress.crawl.example.com/proxy-namespace"
	LabelName      = "egress.crawl.example.com/proxy-name"
	LabelUID       = "egress.crawl.example.com/proxy-uid"
	// LabelOwnerFleet names the fleet of the owning Proxy on an instance.
	LabelOwnerFleet = "egress.crawl.example.com/fleet"
	// LabelRetain marks an instance made while its Proxy's management
	// policies left out Delete: it outlives its Proxy, and the orphan
	// collector never takes it.
	LabelRetain = "egress.crawl.example.com/retain"
	// LabelAdopter names the UID of the Proxy that imported an instance
	// another Proxy made (through its external-name): the instance is the
	// adopter's from then on, while LabelUID keeps naming its maker, from
	// whose UID the instance's name and a pod's network policy selector
	// derive.
	LabelAdopter = "egress.crawl.example.com/adopted-by"

	// ManagedBy is the value of LabelManagedBy.
	ManagedBy = "provider-egressproxy"
)

// Owner identifies the Proxy an instance belongs to.
type Owner struct {
	// ClusterID names the control plane that created the instance, so that
	// two clusters sharing a GCP project never collect each other's VMs.
	ClusterID string
	Namespace string
	Name      string
	UID       types.UID
	Fleet     string
	// Retain says the instance outlives its Proxy (LabelRetain).
	Retain bool
	// Adopter is the UID of the Proxy that imported the instance
	// (LabelAdopter); empty while it belongs to the Proxy that made it.
	// Namespace, Name and Fleet then name the adopter.
	Adopter types.UID
}

// Holder is the UID of the Proxy the instance belongs to now: its adopter,
// or else its maker.
func (o Owner) Holder() types.UID {
	if o.Adopter != "" {
		return o.Adopter
	}
	return o.UID
}

// keys maps each Kubernetes key to its GCP form: GCP label keys allow
// neither dots nor slashes.
var keys = []struct{ k8s, gcp string }{
	{LabelManagedBy, "managed-by"},
	{LabelCluster, "egress-cluster"},
	{LabelNamespace, "egress-proxy-namespace"},
	{LabelName, "egress-proxy-name"},
	{LabelUID, "egress-proxy-uid"},
	{LabelOwnerFleet, "egress-fleet"},
	{LabelRetain, "egress-retain"},
	{LabelAdopter, "egress-adopted-by"},
}

// RetainKey is LabelRetain as a cloud's labels carry it: GCP's form when
// gcp.
func RetainKey(gcp bool) string {
	for _, k := range keys {
		if gcp && k.k8s == LabelRetain {
			return k.gcp
		}
	}
	return LabelRetain
}

func (o Owner) values() map[string]string {
	return map[string]string{
		LabelManagedBy:  ManagedBy,
		LabelCluster:    o.ClusterID,
		LabelNamespace:  o.Namespace,
		LabelName:       o.Name,
		LabelUID:        string(o.UID),
		LabelOwnerFleet: o.Fleet,
		LabelRetain:     map[bool]string{true: "true"}[o.Retain],
		LabelAdopter:    string(o.Adopter),
	}
}

var (
	k8sValue = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	gcpValue = regexp.MustCompile(`^[a-z0-9_-]{0,63}$`)
)

// fit returns v when valid is true of it, and otherwise a readable prefix
// plus a hash, so that long names still make valid, distinct label values.
func fit(v string, valid *regexp.Regexp, lower bool) string {
	if valid.MatchString(v) {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	h := hex.EncodeToString(sum[:])[:10]
	p := v
	if lower {
		p = strings.ToLower(p)
	}
	p = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || !lower && (r >= 'A' && r <= 'Z' || r == '.' || r == '_') {
			return r
		}
		return '-'
	}, p)
	if len(p) > 40 {
		p = p[:40]
	}
	// A value must start with a letter or digit: a name with nothing
	// readable in it (all punctuation, or not ASCII) gets a fixed prefix.
	if p = strings.Trim(p, "-._"); p == "" {
		p = "h"
	}
	return p + "-" + h
}

// OfCluster reports whether the owner, read back from an instance's
// labels, names clusterID: through the same encoding the label was written
// with (a Kubernetes or a GCP label value), so that a cluster ID such as
// Prod-EU, which no label value can hold as it is, still matches.
func (o Owner) OfCluster(clusterID string) bool {
	return o.ClusterID == clusterID || o.ClusterID == LabelValue(clusterID) || o.ClusterID == fit(clusterID, gcpValue, true)
}

// LabelValue is the one encoding of a name as a Kubernetes label value: the
// name itself when it is a valid label value, else a readable prefix and a
// hash. Fleet and proxy names may be up to 253 characters, label values only
// 63, so every label that carries a name goes through it, on the side that
// writes the label and on the side that selects by it.
func LabelValue(name string) string {
	if name == "" {
		return ""
	}
	return fit(name, k8sValue, false)
}

// Labels returns the owner as Kubernetes labels; empty values are left out.
func (o Owner) Labels() map[string]string {
	out := map[string]string{}
	for k, v := range o.values() {
		if v != "" {
			out[k] = LabelValue(v)
		}
	}
	return out
}

// GCPLabels returns the owner as GCP labels: lowercase keys and values of at
// most 63 characters; empty values are left out.
func (o Owner) GCPLabels() map[string]string {
	v := o.values()
	out := map[string]string{}
	for _, k := range keys {
		if v[k.k8s] != "" {
			out[k.gcp] = fit(v[k.k8s], gcpValue, true)
		}
	}
	return out
}

// FromLabels reads an owner back from Kubernetes or GCP labels. It reports
// false when the labels do not carry this scheme. Long names come back in
// their hashed form; only the UID, which always fits, is exact.
func FromLabels(l map[string]string) (Owner, bool) {
	get := func(k8sKey string) string {
		if v, ok := l[k8sKey]; ok {
			return v
		}
		for _, k := range keys {
			if k.k8s == k8sKey {
				return l[k.gcp]
			}
		}
		return ""
	}
	if get(LabelManagedBy) != ManagedBy || get(LabelUID) == "" {
		return Owner{}, false
	}
	return Owner{
		ClusterID: get(LabelCluster),
		Namespace: get(LabelNamespace),
		Name:      get(LabelName),
		UID:       types.UID(get(LabelUID)),
		Fleet:     get(LabelOwnerFleet),
		Retain:    get(LabelRetain) == "true",
		Adopter:   types.UID(get(LabelAdopter)),
	}, true
}

// AdoptedBy is the owner an instance of o's has once the Proxy to imports
// it: its maker's cluster, namespace and UID stay (the instance's name and
// a pod's network policy derive from that UID), and the rest names the
// adopter. An instance handed back to its maker loses the adopter.
func (o Owner) AdoptedBy(to Owner) Owner {
	n := Owner{ClusterID: o.ClusterID, Namespace: o.Namespace, UID: o.UID, Name: to.Name, Fleet: to.Fleet, Retain: to.Retain, Adopter: to.UID}
	if to.UID == o.UID {
		n.Adopter = ""
	}
	return n
}

// Relabel returns l with the owner labels replaced by o's, as Kubernetes
// labels or, with gcp, as GCP labels; other labels stay.
func (o Owner) Relabel(l map[string]string, gcp bool) map[string]string {
	out := map[string]string{}
	for k, v := range l {
		out[k] = v
	}
	for _, k := range keys {
		delete(out, k.k8s)
		delete(out, k.gcp)
	}
	add := o.Labels()
	if gcp {
		add = o.GCPLabels()
	}
	for k, v := range add {
		out[k] = v
	}
	return out
}

// Selector returns the labels that select everything this cluster owns.
func Selector(clusterID string) map[string]string {
	return map[string]string{LabelManagedBy: ManagedBy, LabelCluster: LabelValue(clusterID)}
}

// GCPFilter returns a Compute Engine list filter for everything this
// cluster owns, in the documented form: each of several expressions in
// parentheses.
func GCPFilter(clusterID string) string {
	return `(labels.managed-by = "` + ManagedBy + `") AND (labels.egress-cluster = "` + fit(clusterID, gcpValue, true) + `")`
}

var lowerBase32 = base32.StdEncoding.WithPadding(base32.NoPadding)

// InstanceName derives an instance's name from its owner's UID: SHA-256,
// base32, 16 lowercase characters. A retried create therefore finds the
// instance it made before instead of making a second one.
func InstanceName(uid types.UID) string {
	sum := sha256.Sum256([]byte(uid))
	return "egress-" + strings.ToLower(lowerBase32.EncodeToString(sum[:]))[:16]
}
