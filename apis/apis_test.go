package apis_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

var sharedBed testbed.Lazy

func TestMain(m *testing.M) { sharedBed.Main(m) }

func TestCRDsEstablished(t *testing.T) {
	bed := sharedBed.Env(t)
	want := []string{
		"clusterproviderconfigs.egress.crawl.example.com",
		"clusterproviderconfigusages.egress.crawl.example.com",
		"leasesummaries.egress.crawl.example.com",
		"providerconfigs.egress.crawl.example.com",
		"providerconfigusages.egress.crawl.example.com",
		"proxies.egress.crawl.example.com",
		"proxyfleetclaims.crawl.example.com",
		"proxyfleets.crawl.example.com",
		"proxypools.crawl.example.com",
		"xproxyfleets.crawl.example.com",
	}
	l := &extv1.CustomResourceDefinitionList{}
	if err := bed.Client.List(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, crd := range l.Items {
		for _, c := range crd.Status.Conditions {
			if c.Type == extv1.Established && c.Status == extv1.ConditionTrue {
				got = append(got, crd.Name)
			}
		}
	}
	sort.Strings(got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("established CRDs: -want, +got:\n%s", diff)
	}
}

// readObjects reads every object of a multi-document YAML file.
func readObjects(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close() //nolint:errcheck // Read only.
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var objs []*unstructured.Unstructured
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &u.Object); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

func TestExamplesAccepted(t *testing.T) {
	bed := sharedBed.Env(t)
	var files []string
	// The inputs of crossplane render (the Development-runtime Function and
	// the observed fixtures) are proven by the render test and make validate;
	// a bare apiserver has no Function kind to accept them.
	renderOnly := func(p string) bool {
		rel, _ := filepath.Rel(filepath.Join(bed.Root, "examples"), p)
		return rel == "functions.yaml" || strings.HasPrefix(rel, "render"+string(filepath.Separator))
	}
	err := filepath.WalkDir(filepath.Join(bed.Root, "examples"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".yaml") && !renderOnly(p) {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no examples found")
	}

	var objs []*unstructured.Unstructured
	for _, f := range files {
		objs = append(objs, readObjects(t, f)...)
	}
	// Namespaces first, as kubectl apply -R would need them.
	sort.SliceStable(objs, func(i, j int) bool {
		return objs[i].GetKind() == "Namespace" && objs[j].GetKind() != "Namespace"
	})
	ctx := context.Background()
	for _, o := range objs {
		if o.GetNamespace() != "" {
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.GetNamespace()}}
			if err := bed.Client.Create(ctx, ns); err != nil && !kerrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
		}
		if err := bed.Client.Create(ctx, o); err != nil && !kerrors.IsAlreadyExists(err) {
			t.Errorf("example %s %s/%s rejected: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
}

// validProxy is the smallest Proxy the API accepts.
const validProxy = `
apiVersion: egress.crawl.example.com/v1alpha1
kind: Proxy
metadata:
  generateName: p-
spec:
  forProvider:
    local: {}
    authSecretRef: {name: auth}
    healthCheck:
      url: https://example.com/ip
`

const validProviderConfig = `
apiVersion: egress.crawl.example.com/v1alpha1
kind: ProviderConfig
metadata:
  generateName: pc-
spec:
  backend: Local
`

const validClusterProviderConfig = `
apiVersion: egress.crawl.example.com/v1alpha1
kind: ClusterProviderConfig
metadata:
  generateName: cpc-
spec:
  backend: Local
`

const validFleet = `
apiVersion: crawl.example.com/v1alpha1
kind: ProxyFleet
metadata:
  generateName: f-
spec:
  zones: [a]
  placement:
    local: {}
  proxy:
    authSecretRef: {name: auth}
  healthCheck:
    url: https://example.com/ip
`

func TestProxyDefaults(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	p := &v1alpha1.Proxy{}
	if err := yaml.Unmarshal([]byte(validProxy), p); err != nil {
		t.Fatal(err)
	}
	p.SetNamespace(bed.Namespace(t))
	if err := bed.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	got := &v1alpha1.Proxy{}
	if err := bed.Client.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil {
		t.Fatal(err)
	}
	want := v1alpha1.ProxySpec{
		ManagedResourceSpec: xpv2.ManagedResourceSpec{
			ProviderConfigReference: &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "default"},
			ManagementPolicies:      xpv2.ManagementPolicies{xpv2.ManagementActionAll},
		},
		ForProvider: v1alpha1.ProxyParameters{
			Mode:          v1alpha1.ProxyModeManaged,
			Local:         &v1alpha1.LocalPlacement{BindAddress: "127.0.0.1"},
			Port:          3128,
			AuthSecretRef: &v1alpha1.AuthSecretReference{Name: "auth", UsernameKey: "username", PasswordKey: "password"},
			HealthCheck: v1alpha1.HealthCheck{
				URL:              "https://example.com/ip",
				Interval:         &metav1.Duration{Duration: 30 * time.Second},
				Timeout:          &metav1.Duration{Duration: 5 * time.Second},
				SuccessThreshold: 1,
				FailureThreshold: 3,
				ExpectedStatus:   200,
			},
			MaxLeases: 1,
		},
	}
	if diff := cmp.Diff(want, got.Spec); diff != "" {
		t.Errorf("defaulted spec: -want, +got:\n%s", diff)
	}
}

func TestProxyModeImmutable(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	p := &v1alpha1.Proxy{}
	if err := yaml.Unmarshal([]byte(validProxy), p); err != nil {
		t.Fatal(err)
	}
	p.SetNamespace(bed.Namespace(t))
	if err := bed.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p.Spec.ForProvider.Mode = v1alpha1.ProxyModeExternal
	p.Spec.ForProvider.Local = nil
	p.Spec.ForProvider.Endpoint = &v1alpha1.Endpoint{Host: "proxy.example.net", Port: 8080}
	err := bed.Client.Update(ctx, p)
	if err == nil || !strings.Contains(err.Error(), "mode is immutable") {
		t.Errorf("switching mode must be refused with a clear message; got %v", err)
	}
}

// TestProxyConfigKindImmutable: a Proxy created on a tenant's own
// ProviderConfig cannot be moved to a ClusterProviderConfig (whose
// backends' addresses the probe and the gateway trust further) while it
// keeps the address its tenant chose, nor back; its name may change.
func TestProxyConfigKindImmutable(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	for _, kinds := range [][2]string{
		{v1alpha1.ProviderConfigKind, v1alpha1.ClusterProviderConfigKind},
		{v1alpha1.ClusterProviderConfigKind, v1alpha1.ProviderConfigKind},
	} {
		p := &v1alpha1.Proxy{}
		if err := yaml.Unmarshal([]byte(validProxy), p); err != nil {
			t.Fatal(err)
		}
		p.SetNamespace(bed.Namespace(t))
		p.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: kinds[0], Name: "tenant"})
		if err := bed.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: kinds[0], Name: "other"})
		if err := bed.Client.Update(ctx, p); err != nil {
			t.Fatalf("renaming the %s: %v", kinds[0], err)
		}
		p.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: kinds[1], Name: "platform"})
		err := bed.Client.Update(ctx, p)
		if err == nil || !strings.Contains(err.Error(), "providerConfigRef.kind is immutable") {
			t.Errorf("moving a Proxy from a %s to a %s must be refused naming the field; got %v", kinds[0], kinds[1], err)
		}
	}
}

// TestProxyPlacementImmutable: a Proxy cannot change its backend
// placement (local, kubernetes, gcp), which the address rule of its probe
// and of the gateway goes by: a tenant's pod proxy made local would be
// reached on loopback and private addresses at the host it published. Its
// settings within a placement may change.
func TestProxyPlacementImmutable(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	p := &v1alpha1.Proxy{}
	if err := yaml.Unmarshal([]byte(validProxy), p); err != nil {
		t.Fatal(err)
	}
	if p.Spec.ForProvider.Local == nil {
		t.Fatal("the valid Proxy is not local: the test would prove nothing")
	}
	p.SetNamespace(bed.Namespace(t))
	if err := bed.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p.Spec.ForProvider.Local.BindAddress = "127.0.0.2"
	if err := bed.Client.Update(ctx, p); err != nil {
		t.Fatalf("changing the local bind address: %v", err)
	}
	p.Spec.ForProvider.Local = nil
	p.Spec.ForProvider.Kubernetes = &v1alpha1.KubernetesPlacement{}
	err := bed.Client.Update(ctx, p)
	if err == nil || !strings.Contains(err.Error(), "the backend placement is immutable") {
		t.Errorf("moving a local Proxy to kubernetes must be refused naming the placement; got %v", err)
	}
}

// TestReplaceBeyondLimitOnVMs: a fleet of GCP or AWS VMs may replace its
// proxies beyond spec.diversity's caps.
func TestReplaceBeyondLimitOnVMs(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	for _, placement := range []string{"gcp", "aws"} {
		u := object(t, validFleet, map[string]any{"spec.placement": map[string]any{placement: map[string]any{}},
			"spec.diversity": map[string]any{"maxPerIPv4Prefix": int64(2), "replaceBeyondLimit": true}})
		u.SetNamespace(ns)
		if err := bed.Client.Create(context.Background(), u); err != nil {
			t.Errorf("a %s fleet replacing proxies beyond its caps must be accepted: %v", placement, err)
		}
	}
}

// TestFleetMessageBoundAccepted: fleets right at the message bound are
// accepted (the rule is not stricter than it says), and a fleet may not
// grow past it by an update.
func TestFleetMessageBoundAccepted(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	ctx := context.Background()
	for i, set := range []map[string]any{
		{"spec.replicas": int64(242)},
		{"spec.replicas": int64(242), "spec.leases": map[string]any{"maxLeasesPerProxy": int64(100)}},
	} {
		u := object(t, validFleet, set)
		u.SetNamespace(ns)
		u.SetName(fmt.Sprintf("at-bound-%d", i))
		if err := bed.Client.Create(ctx, u); err != nil {
			t.Fatalf("a fleet at the bound must be accepted (%v): %v", set, err)
		}
	}
	u := object(t, validFleet, nil)
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "at-bound-0"}, u); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(u.Object, int64(2), "spec", "rotation", "maxSurge"); err != nil {
		t.Fatal(err)
	}
	if err := bed.Client.Update(ctx, u); err == nil || !strings.Contains(err.Error(), "must not exceed 2 MiB") {
		t.Errorf("raising maxSurge past the bound must be refused: %v", err)
	}
	// Nor may an inline cloud-init, copied into every Proxy, grow past it.
	vm := object(t, validFleet, map[string]any{"spec.replicas": int64(200), "spec.placement": map[string]any{"gcp": map[string]any{"cloudInit": map[string]any{"inline": "#!/bin/sh"}}}})
	vm.SetNamespace(ns)
	if err := bed.Client.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(vm.Object, strings.Repeat("#", 5000), "spec", "placement", "gcp", "cloudInit", "inline"); err != nil {
		t.Fatal(err)
	}
	if err := bed.Client.Update(ctx, vm); err == nil || !strings.Contains(err.Error(), "must not exceed 2 MiB") {
		t.Errorf("growing the inline cloud-init past the bound must be refused: %v", err)
	}
}

// TestPooledFleetBounds: a pooled fleet of 10 000 proxies with 10 leases
// each is accepted; the bounds say what they guard, naming the field; and
// spec.pools is set when a fleet is made, not added, changed or removed
// later, while a fleet made without it keeps scaling within its bound.
func TestPooledFleetBounds(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	ctx := context.Background()
	create := func(name string, set map[string]any) error {
		u := object(t, validFleet, set)
		u.SetNamespace(ns)
		u.SetName(name)
		return bed.Client.Create(ctx, u)
	}
	pooled := map[string]any{"spec.replicas": int64(10000), "spec.pools": map[string]any{"proxiesPerPool": int64(105)},
		"spec.leases": map[string]any{"maxLeasesPerProxy": int64(10)}}
	if err := create("ten-thousand", pooled); err != nil {
		t.Fatalf("a fleet of 10 000 in pools of 105 with 10 leases per proxy must be accepted: %v", err)
	}
	for name, c := range map[string]struct {
		set  map[string]any
		want string
	}{
		"too-few-pools": {map[string]any{"spec.replicas": int64(10000), "spec.pools": map[string]any{"proxiesPerPool": int64(100)}},
			"spec.replicas must not exceed spec.pools.proxiesPerPool x 96"},
		"unpooled-too-big": {map[string]any{"spec.replicas": int64(243)}, "set spec.pools.proxiesPerPool (when creating a fleet) to grow past that"},
		"pool-too-big":     {map[string]any{"spec.replicas": int64(1000), "spec.pools": map[string]any{"proxiesPerPool": int64(121)}}, "spec.pools.proxiesPerPool"},
		"pool-message": {map[string]any{"spec.replicas": int64(1000), "spec.pools": map[string]any{"proxiesPerPool": int64(120)}, "spec.rotation": map[string]any{"maxSurge": int64(5)}},
			"must not exceed 2 MiB (1 MiB in a pooled fleet)"},
		"past-10000": {map[string]any{"spec.replicas": int64(10001), "spec.pools": map[string]any{"proxiesPerPool": int64(110)}}, "spec.replicas"},
	} {
		if err := create(name, c.set); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: want a refusal saying %q, got %v", name, c.want, err)
		}
	}

	if err := create("one-level", map[string]any{"spec.replicas": int64(3)}); err != nil {
		t.Fatal(err)
	}
	patch := func(name, body string) error {
		u := object(t, validFleet, nil)
		u.SetNamespace(ns)
		u.SetName(name)
		return bed.Client.Patch(ctx, u, client.RawPatch(types.MergePatchType, []byte(body)))
	}
	if err := patch("one-level", `{"spec":{"replicas":242}}`); err != nil {
		t.Errorf("a fleet without pools scales within its bound: %v", err)
	}
	for name, body := range map[string]string{
		"one-level":    `{"spec":{"pools":{"proxiesPerPool":100}}}`,
		"ten-thousand": `{"spec":{"pools":{"proxiesPerPool":110}}}`,
	} {
		if err := patch(name, body); err == nil || !strings.Contains(err.Error(), "spec.pools cannot be added, removed or changed") {
			t.Errorf("%s: %s must be refused naming spec.pools, got %v", name, body, err)
		}
	}
	if err := patch("ten-thousand", `{"spec":{"pools":null,"replicas":100}}`); err == nil || !strings.Contains(err.Error(), "spec.pools cannot be added, removed or changed") {
		t.Errorf("removing spec.pools must be refused, got %v", err)
	}
	if err := patch("ten-thousand", `{"spec":{"replicas":5000}}`); err != nil {
		t.Errorf("a pooled fleet scales: %v", err)
	}
}
