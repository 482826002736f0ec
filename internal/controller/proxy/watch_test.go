package proxy

import (
	"context"
	"sort"
	"testing"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientfake "sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
)

// TestWatchMapsToProxies: a changed Secret or ProviderConfig reaches the
// Proxies made from it, and only those.
func TestWatchMapsToProxies(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = corev1.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	proxy := func(ns, name, auth, kind, pc string) *v1alpha1.Proxy {
		p := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if auth != "" {
			p.Spec.ForProvider.AuthSecretRef = &v1alpha1.AuthSecretReference{Name: auth}
		}
		p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: kind, Name: pc}
		return p
	}
	sa := func(ns, name string) v1alpha1.GCPCredentials {
		return v1alpha1.GCPCredentials{Source: xpv2.CredentialsSourceSecret, CommonCredentialSelectors: xpv2.CommonCredentialSelectors{
			SecretRef: &xpv2.SecretKeySelector{SecretReference: xpv2.SecretReference{Namespace: ns, Name: name}, Key: "k"}}}
	}
	kube := clientfake.NewClientBuilder().WithScheme(scheme).
		WithIndex(&v1alpha1.Proxy{}, indexSecrets, proxySecrets).
		WithIndex(&v1alpha1.Proxy{}, indexConfig, proxyConfig).
		WithObjects(
			proxy("team-a", "uses-auth", "auth", v1alpha1.ClusterProviderConfigKind, "platform"),
			proxy("team-b", "same-name-elsewhere", "auth", v1alpha1.ProviderConfigKind, "own"),
			proxy("team-b", "no-auth", "", v1alpha1.ProviderConfigKind, "own"),
			&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "platform"}, Spec: v1alpha1.ProviderConfigSpec{
				Backend: v1alpha1.BackendGCP, GCP: &v1alpha1.GCPBackend{Project: "p", Credentials: sa("crossplane-system", "platform-sa")}}},
			&v1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "own"}, Spec: v1alpha1.ProviderConfigSpec{
				Backend: v1alpha1.BackendGCP, GCP: &v1alpha1.GCPBackend{Project: "p", Credentials: sa("ignored", "team-sa")}}},
		).Build()
	w := watcher{kube: kube}
	got := func(reqs []reconcile.Request) []string {
		var out []string
		for _, r := range reqs {
			out = append(out, r.String())
		}
		sort.Strings(out)
		return out
	}
	ctx := context.Background()
	secret := func(ns, name string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	cases := map[string]struct {
		reqs []reconcile.Request
		want []string
	}{
		"AuthSecret":            {reqs: w.forSecret(ctx, secret("team-a", "auth")), want: []string{"team-a/uses-auth"}},
		"OtherNamespacesAuth":   {reqs: w.forSecret(ctx, secret("team-b", "auth")), want: []string{"team-b/same-name-elsewhere"}},
		"PlatformCredentials":   {reqs: w.forSecret(ctx, secret("crossplane-system", "platform-sa")), want: []string{"team-a/uses-auth"}},
		"TenantCredentials":     {reqs: w.forSecret(ctx, secret("team-b", "team-sa")), want: []string{"team-b/no-auth", "team-b/same-name-elsewhere"}},
		"UnrelatedSecret":       {reqs: w.forSecret(ctx, secret("team-a", "other")), want: nil},
		"ClusterProviderConfig": {reqs: w.forConfig(ctx, &v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "platform"}}), want: []string{"team-a/uses-auth"}},
		"ProviderConfig":        {reqs: w.forConfig(ctx, &v1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "own"}}), want: []string{"team-b/no-auth", "team-b/same-name-elsewhere"}},
		"SameNameOtherTenant":   {reqs: w.forConfig(ctx, &v1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "own"}}), want: nil},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, got(tc.reqs)); diff != "" {
				t.Errorf("-want +got:\n%s", diff)
			}
		})
	}
}
