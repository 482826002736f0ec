package discovery_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/function"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestManifests renders cluster/discovery with the real `kubectl kustomize`
// and applies every object to the real apiserver with server-side dry-run.
func TestManifests(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	kinds := map[string]int{}
	for _, u := range testbed.Kustomize(t, bed, "discovery") {
		kinds[u.GetKind()]++
		opts := []client.CreateOption{client.DryRunAll}
		if u.GetKind() == "Namespace" {
			opts = nil // namespaced objects can only be dry-run into an existing namespace
		}
		if err := bed.Client.Create(ctx, u, opts...); err != nil && !kerrors.IsAlreadyExists(err) {
			t.Errorf("%s %s rejected by the apiserver: %v", u.GetKind(), u.GetName(), err)
		}
		if u.GetKind() == "Deployment" {
			d := &appsv1.Deployment{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, d); err != nil {
				t.Fatal(err)
			}
			c := d.Spec.Template.Spec.Containers[0]
			sc := d.Spec.Template.Spec.SecurityContext
			if *d.Spec.Replicas != 2 || sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
				c.ReadinessProbe == nil || c.LivenessProbe == nil || c.Resources.Requests.Cpu().IsZero() {
				t.Errorf("the Deployment runs 2 non-root replicas with probes and requests: %+v", d.Spec)
			}
		}
	}
	// Three admission policies: discovery's own Leases, its labelled
	// Leases by discovery only, and LeaseSummaries by discovery only.
	for k, n := range map[string]int{"Namespace": 1, "ServiceAccount": 1, "ClusterRole": 1, "ClusterRoleBinding": 1, "Deployment": 1, "Service": 1,
		"PodDisruptionBudget": 1, "ValidatingAdmissionPolicy": 3, "ValidatingAdmissionPolicyBinding": 3} {
		if kinds[k] != n {
			t.Errorf("want %d %s in cluster/discovery, got %d", n, k, kinds[k])
		}
	}
}

// TestAdmissionPolicyNamesDiscovery: the admission policies that keep
// egress-discovery to its own Leases, and everyone else from its
// LeaseSummaries, match the ServiceAccount that
// cluster/discovery creates and that function-proxyfleet grants by
// default; were they to drift apart, the policy would silently match
// nobody.
func TestAdmissionPolicyNamesDiscovery(t *testing.T) {
	bed := sharedBed.Env(t)
	raw, err := os.ReadFile(filepath.Join(bed.Root, "cluster", "discovery", "admission.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sa := function.DefaultDiscoveryServiceAccount
	// Every policy: discovery's own Leases, its labelled Leases, and
	// LeaseSummaries.
	want := `"system:serviceaccount:` + sa.Namespace + `:` + sa.Name + `"`
	if n := bytes.Count(raw, []byte("request.userInfo.username == "+want)) + bytes.Count(raw, []byte("request.userInfo.username != "+want)); n != 3 {
		t.Errorf("all three policies of cluster/discovery/admission.yaml must match %s: %d do", want, n)
	}
	kust, err := os.ReadFile(filepath.Join(bed.Root, "cluster", "discovery", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(kust, []byte("namespace: "+sa.Namespace+"\n")) {
		t.Errorf("cluster/discovery installs into %s, where the function's default grant names it", sa.Namespace)
	}
}
