package kubernetes_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

var sharedBed testbed.Lazy

func TestMain(m *testing.M) { sharedBed.Main(m) }

// TestProviderRBAC applies cluster/provider-rbac to the real apiserver and
// asks it, through SubjectAccessReviews, what the provider may now do.
func TestProviderRBAC(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	dir := filepath.Join(bed.Root, "cluster", "provider-rbac")
	role, binding := &rbacv1.ClusterRole{}, &rbacv1.ClusterRoleBinding{}
	for file, obj := range map[string]any{"clusterrole.yaml": role, "clusterrolebinding.yaml": binding} {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(b, obj); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	// TestProviderAdmission applies the same files to the shared apiserver.
	for _, o := range []client.Object{role, binding} {
		if err := bed.Client.Create(ctx, o); err != nil && !kerrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}

	sa := "system:serviceaccount:crossplane-system:provider-egressproxy"
	// The apiserver's RBAC authorizer learns of new roles through its
	// informers: wait until the binding counts.
	testbed.Eventually(t, 10*time.Second, "the binding in force", func() (bool, string) {
		sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User: sa, ResourceAttributes: &authzv1.ResourceAttributes{Namespace: "team-a", Verb: "create", Resource: "pods"},
		}}
		if err := bed.Client.Create(ctx, sar); err != nil {
			return false, err.Error()
		}
		return sar.Status.Allowed, sar.Status.Reason
	})
	cases := map[string]struct {
		reason string
		attrs  authzv1.ResourceAttributes
		want   bool
	}{
		"CreatePods":          {reason: "It runs one pod per Proxy.", attrs: authzv1.ResourceAttributes{Namespace: "team-a", Verb: "create", Resource: "pods"}, want: true},
		"GetPods":             {reason: "It observes its pods.", attrs: authzv1.ResourceAttributes{Namespace: "team-a", Verb: "get", Resource: "pods"}, want: true},
		"DeletePods":          {reason: "It deletes its pods.", attrs: authzv1.ResourceAttributes{Namespace: "team-b", Verb: "delete", Resource: "pods"}, want: true},
		"ListPodsEverywhere":  {reason: "Orphan collection lists pods in every namespace.", attrs: authzv1.ResourceAttributes{Verb: "list", Resource: "pods"}, want: true},
		"WatchPods":           {reason: "Watching pods is part of managing them.", attrs: authzv1.ResourceAttributes{Verb: "watch", Resource: "pods"}, want: true},
		"ReadKubeSystem":      {reason: "The kube-system UID names the cluster.", attrs: authzv1.ResourceAttributes{Verb: "get", Resource: "namespaces", Name: "kube-system"}, want: true},
		"UpdatePods":          {reason: "Pods are replaced, never edited.", attrs: authzv1.ResourceAttributes{Namespace: "team-a", Verb: "update", Resource: "pods"}, want: false},
		"LabelPods":           {reason: "It marks a pod to outlive its Proxy (the retain label).", attrs: authzv1.ResourceAttributes{Namespace: "team-a", Verb: "patch", Resource: "pods"}, want: true},
		"LabelNetworkPolicy":  {reason: "And its NetworkPolicy alike.", attrs: authzv1.ResourceAttributes{Namespace: "team-a", Verb: "patch", Group: "networking.k8s.io", Resource: "networkpolicies"}, want: true},
		"ExecIntoPods":        {reason: "No exec into pods.", attrs: authzv1.ResourceAttributes{Namespace: "team-a", Verb: "create", Resource: "pods", Subresource: "exec"}, want: false},
		"PodLogs":             {reason: "No pod logs.", attrs: authzv1.ResourceAttributes{Namespace: "team-a", Verb: "get", Resource: "pods", Subresource: "log"}, want: false},
		"OtherNamespaces":     {reason: "Only kube-system may be read.", attrs: authzv1.ResourceAttributes{Verb: "get", Resource: "namespaces", Name: "default"}, want: false},
		"Secrets":             {reason: "Secrets come from Crossplane's own provider role, not from this file.", attrs: authzv1.ResourceAttributes{Namespace: "team-a", Verb: "get", Resource: "secrets"}, want: false},
		"NetworkPolicies":     {reason: "It confines each pod with a NetworkPolicy.", attrs: authzv1.ResourceAttributes{Namespace: "team-a", Verb: "create", Group: "networking.k8s.io", Resource: "networkpolicies"}, want: true},
		"ListNetworkPolicies": {reason: "Orphan collection finds policies left without their pod.", attrs: authzv1.ResourceAttributes{Verb: "list", Group: "networking.k8s.io", Resource: "networkpolicies"}, want: true},
		"EditNetworkPolicy":   {reason: "Policies are replaced with their pod, never edited.", attrs: authzv1.ResourceAttributes{Namespace: "team-a", Verb: "update", Group: "networking.k8s.io", Resource: "networkpolicies"}, want: false},
		"Deployments":         {reason: "Nothing beyond pods.", attrs: authzv1.ResourceAttributes{Namespace: "team-a", Verb: "create", Group: "apps", Resource: "deployments"}, want: false},
		"Nodes":               {reason: "Nothing cluster-wide beyond pods.", attrs: authzv1.ResourceAttributes{Verb: "list", Resource: "nodes"}, want: false},
		"Escalate":            {reason: "No RBAC rights.", attrs: authzv1.ResourceAttributes{Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "clusterrolebindings"}, want: false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
				User: sa, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:crossplane-system", "system:authenticated"},
				ResourceAttributes: &tc.attrs,
			}}
			if err := bed.Client.Create(ctx, sar); err != nil {
				t.Fatal(err)
			}
			if sar.Status.Allowed != tc.want {
				t.Errorf("%s\nallowed: want %v, got %v (%s)", tc.reason, tc.want, sar.Status.Allowed, sar.Status.Reason)
			}
		})
	}
}
