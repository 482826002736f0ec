package function

import (
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// Names of the composed resources that give egress-discovery its access to
// one fleet.
const (
	resourceAccessRole    = "discovery-access-role"
	resourceAccessBinding = "discovery-access-binding"
	accessSuffix          = "-egress-discovery"
)

// DefaultDiscoveryServiceAccount is egress-discovery's ServiceAccount as
// cluster/discovery installs it.
var DefaultDiscoveryServiceAccount = types.NamespacedName{Namespace: "egress-system", Name: "egress-discovery"}

// ParseServiceAccount reads "namespace/name"; "" means none, which it
// returns as a name with nothing in it (Config.Discovery's none: nil there
// means the default).
func ParseServiceAccount(s string) (*types.NamespacedName, error) {
	if s == "" {
		return &types.NamespacedName{}, nil
	}
	ns, name, ok := strings.Cut(s, "/")
	if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return nil, errors.Errorf("service account %q is not <namespace>/<name>", s)
	}
	return &types.NamespacedName{Namespace: ns, Name: name}, nil
}

// access composes, in the fleet's namespace, what egress-discovery needs
// to serve this fleet and nothing more: get on exactly the fleet's auth
// Secret, and the Lease verbs of leasing (its ClusterRole only reads
// Leases). A deleted fleet takes its grant with it; the Leases themselves
// are owned by their Proxies and go with them.
func (f *Function) access(fleet *Fleet) (map[string]*fnv1.Resource, error) {
	sa := f.discovery
	if sa == nil {
		return nil, nil
	}
	name := fleet.Name + accessSuffix
	rules := []rbacv1.PolicyRule{{
		APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
		// patch: a renewal is a JSON patch guarded by the grant's UID.
		Verbs: []string{"get", "create", "update", "patch", "delete"},
	}}
	if ref := fleet.spec.Proxy.AuthSecretRef; ref != nil {
		rules = append(rules, rbacv1.PolicyRule{
			APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{ref.Name}, Verbs: []string{"get"},
		})
	}
	meta := metav1.ObjectMeta{
		Name: name, Namespace: fleet.Namespace,
		Labels:      map[string]string{fleetv1alpha1.LabelFleet: ownership.LabelValue(fleet.Name)},
		Annotations: map[string]string{fleetv1alpha1.AnnotationFleet: fleet.Name},
	}
	objs := map[string]any{
		resourceAccessRole: &rbacv1.Role{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"}, ObjectMeta: meta, Rules: rules},
		resourceAccessBinding: &rbacv1.RoleBinding{
			TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"}, ObjectMeta: meta,
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}},
		},
	}
	out := make(map[string]*fnv1.Resource, len(objs))
	for key, obj := range objs {
		v, err := toValue(obj)
		if err != nil {
			return nil, errors.Wrapf(err, "cannot compose %s", key)
		}
		st := v.GetStructValue()
		// Typed objects carry an empty creationTimestamp; leave it out.
		delete(st.GetFields()["metadata"].GetStructValue().GetFields(), "creationTimestamp")
		// RBAC objects have no status: they are ready once they exist.
		out[key] = &fnv1.Resource{Resource: st, Ready: fnv1.Ready_READY_TRUE}
	}
	return out, nil
}

// grantAccess composes the Role and RoleBinding that let egress-discovery
// serve the fleet.
func (f *Function) grantAccess(rsp *fnv1.RunFunctionResponse, fleet *Fleet) error {
	grant, err := f.access(fleet)
	if err != nil {
		return err
	}
	desired := desiredResources(rsp)
	delete(desired, resourceAccessRole)
	delete(desired, resourceAccessBinding)
	for name, r := range grant {
		desired[name] = r
	}
	return nil
}
