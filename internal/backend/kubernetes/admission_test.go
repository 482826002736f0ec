package kubernetes_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/kubernetes"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

const providerSA = "system:serviceaccount:crossplane-system:provider-egressproxy"

// TestProviderAdmission installs cluster/provider-rbac as `kubectl apply -k`
// would, admission policy included, and runs the kubernetes backend as the
// provider's ServiceAccount against the real apiserver: everything the
// backend does passes; anything else RBAC would let it do to pods and
// NetworkPolicies is refused.
func TestProviderAdmission(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	for _, u := range testbed.Kustomize(t, bed, "provider-rbac") {
		switch u.GetKind() {
		case "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			if err := bed.Client.Create(ctx, u); err != nil && !kerrors.IsAlreadyExists(err) {
				t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
			}
		}
	}
	// Secrets come from Crossplane's own provider role; this test's
	// namespace is enough here.
	for _, o := range []client.Object{
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "test:provider-secrets"}, Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"*"}}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "test:provider-secrets"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "test:provider-secrets"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "crossplane-system", Name: "provider-egressproxy"}}},
	} {
		if err := bed.Client.Create(ctx, o); err != nil && !kerrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	sa := testbed.Impersonating(t, bed, providerSA)

	// Somebody else's pod in the same namespace, which RBAC lets the
	// provider reach.
	bystander := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bystander", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "web:1"}}}}
	if err := bed.Client.Create(ctx, bystander); err != nil {
		t.Fatal(err)
	}
	// The policy is in force once the apiserver has loaded it: until then
	// an unlabelled pod would be created, and is removed again.
	testbed.Eventually(t, 30*time.Second, "the admission policy refusing an unlabelled pod", func() (bool, string) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unlabelled"}, Spec: bystander.Spec}
		err := sa.Create(ctx, p)
		if err == nil {
			_ = bed.Client.Delete(ctx, p)
			return false, "created"
		}
		return refusedByPolicy(err), err.Error()
	})

	// What the backend does, as the provider.
	b := kubernetes.New(kubernetes.Config{Client: sa, ClusterID: "adm"})
	uid := types.UID("5d1e7c0a-2222-4333-8444-955566667777")
	s := podSpec(ns, "adm", uid)
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatalf("the backend's create is refused: %v", err)
	}
	for _, retain := range []bool{true, false} {
		if err := b.SetRetain(ctx, s.Ref, retain); err != nil {
			t.Fatalf("the backend's retain mark (%v) is refused: %v", retain, err)
		}
	}
	importer := ownership.Owner{ClusterID: "adm", Namespace: ns, Name: "importer", UID: "6e2f8d1b-2222-4333-8444-955566667777"}
	if err := b.Adopt(ctx, s.Ref, uid, importer); err != nil {
		t.Fatalf("the backend's import is refused: %v", err)
	}
	if i, err := b.Get(ctx, s.Ref); err != nil || i.Owner.Holder() != importer.UID {
		t.Fatalf("the imported pod must belong to its importer: %+v %v", i, err)
	}
	rotated := s
	rotated.Owner = s.Owner.AdoptedBy(importer)
	rotated.Credentials = &backend.Credentials{Username: "crawler", Password: "rotated"}
	rotated.CredentialsSum = "rotated"
	until := time.Now().Add(time.Hour)
	for _, now := range []time.Time{time.Now(), until} {
		if _, err := b.RotateCredentials(ctx, rotated, until, now); err != nil {
			t.Fatalf("the backend's rotation (at %v) is refused: %v", now, err)
		}
	}
	if _, err := b.ListOwned(ctx); err != nil {
		t.Fatalf("the backend's listing is refused: %v", err)
	}

	// Anything else, as the provider, here and in another namespace.
	other := bed.Namespace(t)
	confined := corev1.PodSpec{
		AutomountServiceAccountToken: ptr.To(false),
		SecurityContext:              &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true)},
		Containers: []corev1.Container{{Name: "x", Image: "x", SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		}}},
	}
	key := types.NamespacedName{Namespace: ns, Name: s.Name}
	patch := func(o client.Object, body string) error {
		if err := bed.Client.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
			t.Fatal(err)
		}
		return sa.Patch(ctx, o, client.RawPatch(types.MergePatchType, []byte(body)))
	}
	own := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	ownPolicy := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	refused := map[string]func() error{
		"LabelOwnPod":         func() error { return patch(own, `{"metadata":{"labels":{"app":"other"}}}`) },
		"DropOwnership":       func() error { return patch(own, `{"metadata":{"labels":{"app.kubernetes.io/managed-by":null}}}`) },
		"RetainOtherThanTrue": func() error { return patch(own, `{"metadata":{"labels":{"egress.crawl.example.com/retain":"false"}}}`) },
		"ChangeMakersUID": func() error {
			return patch(own, `{"metadata":{"labels":{"egress.crawl.example.com/proxy-uid":"other"}}}`)
		},
		"MoveToAnotherNamespace": func() error {
			return patch(own, `{"metadata":{"labels":{"egress.crawl.example.com/proxy-namespace":"kube-system"}}}`)
		},
		"AnnotateOwnPod": func() error { return patch(own, `{"metadata":{"annotations":{"note":"x"}}}`) },
		"CredentialsAndAnotherAnnotation": func() error {
			return patch(own, `{"metadata":{"annotations":{"egress.crawl.example.com/credentials":"x","note":"x"}}}`)
		},
		"DropSpecHash": func() error {
			return patch(own, `{"metadata":{"annotations":{"egress.crawl.example.com/spec-hash":null}}}`)
		},
		"RetainAndAnotherLabel": func() error {
			return patch(own, `{"metadata":{"labels":{"egress.crawl.example.com/retain":"true","app":"other"}}}`)
		},
		"OpenOwnPolicy": func() error { return patch(ownPolicy, `{"spec":{"ingress":[{}]}}`) },
		"LabelBystander": func() error {
			return patch(bystander, `{"metadata":{"labels":{"egress.crawl.example.com/retain":"true"}}}`)
		},
		"DeleteBystander": func() error { return sa.Delete(ctx, bystander.DeepCopy()) },
		"PrivilegedPodElsewhere": func() error {
			p := labelled(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "root"}, Spec: corev1.PodSpec{
				HostNetwork: true, HostPID: true, AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{Name: "x", Image: "x", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}},
				Volumes:    []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}},
			}})
			return sa.Create(ctx, p)
		},
		"PodWithAnotherServiceAccount": func() error {
			p := labelled(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "token"}, Spec: *confined.DeepCopy()})
			p.Spec.ServiceAccountName = "controller"
			p.Spec.AutomountServiceAccountToken = ptr.To(true)
			return sa.Create(ctx, p)
		},
		"PodJoiningAnotherService": func() error {
			p := labelled(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "joiner"}, Spec: *confined.DeepCopy()})
			p.Labels["app"] = "web"
			return sa.Create(ctx, p)
		},
		"PolicySelectingEveryPod": func() error {
			return sa.Create(ctx, labelled(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "isolate"},
				Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}}}))
		},
		"CreateUnlabelledPolicy": func() error {
			return sa.Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "allow-all"},
				Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{}}}})
		},
	}
	for name, try := range refused {
		t.Run(name, func(t *testing.T) {
			err := try()
			if !refusedByPolicy(err) {
				t.Errorf("want refused by the admission policy, got %v", err)
			}
		})
	}

	// The backend's delete, last.
	if err := b.Delete(ctx, s.Ref); err != nil {
		t.Fatalf("the backend's delete is refused: %v", err)
	}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "bystander"}, &corev1.Pod{}); err != nil {
		t.Errorf("the bystander pod must be left alone: %v", err)
	}
}

// labelled gives o the labels of something the provider made.
func labelled[T client.Object](o T) T {
	o.SetLabels(map[string]string{ownership.LabelManagedBy: ownership.ManagedBy, ownership.LabelUID: "u"})
	return o
}

// refusedByPolicy tells a denial of the provider's admission policy from
// any other error.
func refusedByPolicy(err error) bool {
	return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'provider-egressproxy-own-pods'")
}

// TestForeignSecretNeverOverwritten: a Secret of the instance's name that
// is not the Proxy's config (another's, or one made by hand) stops the
// create and keeps its data.
func TestForeignSecretNeverOverwritten(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	uid := types.UID("6e2f8d1b-3333-4444-8555-a66677778888")
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ownership.InstanceName(uid)}, StringData: map[string]string{"token": "theirs"}}
	if err := bed.Client.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	b := kubernetes.New(kubernetes.Config{Client: bed.Client, ClusterID: "adm"})
	_, err := b.Create(ctx, podSpec(ns, "adm", uid))
	if backend.ClassOf(err) != backend.ClassPermanent {
		t.Errorf("want a permanent error, got %v", err)
	}
	got := &corev1.Secret{}
	if err := bed.Client.Get(ctx, client.ObjectKeyFromObject(foreign), got); err != nil {
		t.Fatal(err)
	}
	if string(got.Data["token"]) != "theirs" || len(got.Data) != 1 {
		t.Errorf("the foreign Secret was overwritten: %v", got.Data)
	}
	if err := bed.Client.Get(ctx, client.ObjectKeyFromObject(foreign), &corev1.Pod{}); !kerrors.IsNotFound(err) {
		t.Errorf("no pod may be made beside a foreign Secret: %v", err)
	}
}

// TestProxyStatusOnlyByProvider: a Proxy's status says where egress-
// discovery's gateway dials, so cluster/provider-rbac's admission policy
// lets the provider alone write it: a tenant whose role grants
// proxies/status is refused, whatever address it publishes; the provider
// is not.
func TestProxyStatusOnlyByProvider(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	for _, u := range testbed.Kustomize(t, bed, "provider-rbac") {
		if k := u.GetKind(); k == "ValidatingAdmissionPolicy" || k == "ValidatingAdmissionPolicyBinding" {
			if err := bed.Client.Create(ctx, u); err != nil && !kerrors.IsAlreadyExists(err) {
				t.Fatalf("%s %s: %v", k, u.GetName(), err)
			}
		}
	}
	tenant := "system:serviceaccount:" + ns + ":crawler-admin"
	for _, o := range []client.Object{
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "proxies"}, Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.Group}, Resources: []string{"proxies", "proxies/status"}, Verbs: []string{"*"}}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "proxies"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "proxies"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "crawler-admin"}, {Kind: rbacv1.ServiceAccountKind, Namespace: "crossplane-system", Name: "provider-egressproxy"}}},
		&v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}, Spec: v1alpha1.ProxySpec{ForProvider: v1alpha1.ProxyParameters{
			Kubernetes: &v1alpha1.KubernetesPlacement{}, AuthSecretRef: &v1alpha1.AuthSecretReference{Name: "auth"}, HealthCheck: v1alpha1.HealthCheck{URL: "https://example.com/ip"},
		}}},
	} {
		if err := bed.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	publish := func(as client.Client, host string) error {
		p := &v1alpha1.Proxy{}
		if err := as.Get(ctx, types.NamespacedName{Namespace: ns, Name: "p"}, p); err != nil {
			return err
		}
		p.Status.AtProvider.Host, p.Status.AtProvider.Port = host, 3128
		return as.Status().Update(ctx, p)
	}
	as := testbed.Impersonating(t, bed, tenant)
	testbed.Eventually(t, 30*time.Second, "the policy refusing the tenant's status write", func() (bool, string) {
		err := publish(as, "10.96.0.1")
		return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'proxy-status-by-provider'"), fmt.Sprint(err)
	})
	if err := publish(testbed.Impersonating(t, bed, providerSA), "10.244.0.12"); err != nil {
		t.Fatalf("the provider's status write: %v", err)
	}
	p := &v1alpha1.Proxy{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "p"}, p); err != nil || p.Status.AtProvider.Host != "10.244.0.12" {
		t.Fatalf("the Proxy's host: %q (%v), want the provider's", p.Status.AtProvider.Host, err)
	}
}
