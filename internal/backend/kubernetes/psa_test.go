package kubernetes_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/kubernetes"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// TestPodsPassRestrictedPodSecurity creates a proxy's pod in a namespace
// that enforces the Pod Security Standard "restricted". Pod Security
// admission runs in kube-apiserver, so the real apiserver judges it. A pod
// without the hardening is refused there, which shows the check is live.
func TestPodsPassRestrictedPodSecurity(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "psa-restricted", Labels: map[string]string{
		"pod-security.kubernetes.io/enforce":         "restricted",
		"pod-security.kubernetes.io/enforce-version": "latest",
	}}}
	if err := bed.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}

	// The check has power: a plain pod running as the image's user is
	// refused.
	plain := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "plain"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "squid", Image: "squid"}}},
	}
	if err := bed.Client.Create(ctx, plain); !kerrors.IsForbidden(err) || !strings.Contains(err.Error(), "restricted") {
		t.Fatalf("a pod without hardening must be refused by Pod Security admission, got %v", err)
	}

	b := kubernetes.New(kubernetes.Config{Client: bed.Client, ClusterID: "psa"})
	uid := types.UID("5e0a7a4c-1111-4222-8333-944455556666")
	s := podSpec(ns.Name, "psa", uid)
	s.Owner.Fleet = "crawlers"
	s.AllowedSourceRanges, s.AllowedPrivateDestinations = []string{"10.0.0.0/8"}, []string{"10.1.0.0/16"}
	s.Kubernetes.ClientNamespaces = []string{"crawlers"}
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatalf("the proxy's pod must pass the restricted Pod Security Standard: %v", err)
	}
	np := &networkingv1.NetworkPolicy{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns.Name, Name: s.Name}, np); err != nil {
		t.Fatal(err)
	}
	from := np.Spec.Ingress[0].From
	if len(from) != 2 || from[0].IPBlock == nil || from[0].IPBlock.CIDR != "10.0.0.0/8" ||
		from[1].NamespaceSelector == nil || from[1].NamespaceSelector.MatchExpressions[0].Values[0] != "crawlers" {
		t.Errorf("ingress from the allowed ranges and the client namespaces only: %+v", from)
	}
	to := np.Spec.Egress[1].To
	if last := to[len(to)-1].IPBlock; last == nil || last.CIDR != "10.1.0.0/16" {
		t.Errorf("egress to the permitted private destination: %+v", to)
	}
	pod := &corev1.Pod{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns.Name, Name: s.Name}, pod); err != nil {
		t.Fatal(err)
	}
	sc := pod.Spec.SecurityContext
	if sc.RunAsUser == nil || *sc.RunAsUser == 0 || sc.RunAsGroup == nil {
		t.Errorf("the pod must name a non-root user and group explicitly: %+v", sc)
	}
	if c := pod.Spec.Containers[0].SecurityContext; c.ReadOnlyRootFilesystem == nil || !*c.ReadOnlyRootFilesystem {
		t.Errorf("the root filesystem must be read-only: %+v", c)
	}
}

// TestOrphansListed leaves what a create cut short, or a Proxy deleted
// while the provider was down, would leave: a network policy and config
// Secret without their pod, or a config Secret alone. ListOwned reports
// each instance once, with its owner, so that the orphan collector deletes
// it through Delete, which removes all of it.
func TestOrphansListed(t *testing.T) {
	for name, c := range map[string]struct {
		uid    types.UID
		remove []func(metav1.ObjectMeta) client.Object
	}{
		"PolicyAndSecretWithoutPod": {uid: "6f1b8b5d-1111-4222-8333-944455556666", remove: []func(metav1.ObjectMeta) client.Object{
			func(m metav1.ObjectMeta) client.Object { return &corev1.Pod{ObjectMeta: m} },
		}},
		"SecretAlone": {uid: "8b3d0d7f-1111-4222-8333-944455556666", remove: []func(metav1.ObjectMeta) client.Object{
			func(m metav1.ObjectMeta) client.Object { return &corev1.Pod{ObjectMeta: m} },
			func(m metav1.ObjectMeta) client.Object { return &networkingv1.NetworkPolicy{ObjectMeta: m} },
		}},
	} {
		t.Run(name, func(t *testing.T) {
			bed := sharedBed.Env(t)
			ctx := context.Background()
			ns := bed.Namespace(t)
			b := kubernetes.New(kubernetes.Config{Client: bed.Client, ClusterID: "leak"})
			s := podSpec(ns, "leak", c.uid)
			if _, err := b.Create(ctx, s); err != nil {
				t.Fatal(err)
			}
			for _, o := range c.remove {
				if err := bed.Client.Delete(ctx, o(metav1.ObjectMeta{Namespace: ns, Name: s.Name})); err != nil {
					t.Fatal(err)
				}
			}
			owned, err := b.ListOwned(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var found []backend.Instance
			for _, i := range owned {
				if i.Name == s.Name && i.Namespace == ns {
					found = append(found, i)
				}
			}
			if len(found) != 1 || found[0].Owner.UID != c.uid {
				t.Fatalf("what is left is not listed once with its owner: %+v", found)
			}
			if err := b.Delete(ctx, found[0].Ref); err != nil {
				t.Fatal(err)
			}
			for _, o := range []client.Object{&networkingv1.NetworkPolicy{}, &corev1.Secret{}} {
				if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: s.Name}, o); !kerrors.IsNotFound(err) {
					t.Errorf("Delete must remove the %T: %v", o, err)
				}
			}
		})
	}
}

// TestSetRetain: marking an instance to outlive its Proxy labels its pod,
// config Secret and network policy, and the mark reads back through
// ListOwned; unmarking removes the label.
func TestSetRetain(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	b := kubernetes.New(kubernetes.Config{Client: bed.Client, ClusterID: "keep"})
	uid := types.UID("7a2c9c6e-1111-4222-8333-944455556666")
	s := podSpec(ns, "keep", uid)
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	for _, retain := range []bool{true, false} {
		if err := b.SetRetain(ctx, s.Ref, retain); err != nil {
			t.Fatal(err)
		}
		key := types.NamespacedName{Namespace: ns, Name: s.Name}
		for _, o := range []client.Object{&corev1.Pod{}, &corev1.Secret{}, &networkingv1.NetworkPolicy{}} {
			if err := bed.Client.Get(ctx, key, o); err != nil {
				t.Fatal(err)
			}
			if got := o.GetLabels()[ownership.LabelRetain] == "true"; got != retain {
				t.Errorf("%T retain label: want %v, got %v", o, retain, o.GetLabels())
			}
		}
		i, err := b.Get(ctx, s.Ref)
		if err != nil || i.Owner.Retain != retain {
			t.Errorf("the mark reads back: want %v, got %+v, %v", retain, i, err)
		}
	}
}

// podSpec is the spec of a plain proxy pod of the Proxy with uid, in ns,
// made by the control plane named cluster.
func podSpec(ns, cluster string, uid types.UID) backend.Spec {
	return backend.Spec{
		Ref:   backend.Ref{Name: ownership.InstanceName(uid), Namespace: ns},
		Owner: ownership.Owner{ClusterID: cluster, Namespace: ns, Name: "p", UID: uid}, Port: 3128,
		Credentials: &backend.Credentials{Username: "crawler", Password: "pw"},
		Kubernetes:  &v1alpha1.KubernetesPlacement{}, Hash: "h",
	}
}
