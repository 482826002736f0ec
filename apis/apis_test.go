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

// object parses base and sets each path (dot-separated) to its YAML value;
// a nil value removes the field.
func object(t *testing.T, base string, set map[string]any) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(base), &u.Object); err != nil {
		t.Fatal(err)
	}
	for path, v := range set {
		fields := strings.Split(path, ".")
		if v == nil {
			unstructured.RemoveNestedField(u.Object, fields...)
			continue
		}
		if err := unstructured.SetNestedField(u.Object, v, fields...); err != nil {
			t.Fatalf("cannot set %s: %v", path, err)
		}
	}
	return u
}

func TestInvalidObjectsRejected(t *testing.T) {
	bed := sharedBed.Env(t)
	cases := map[string]struct {
		reason string
		base   string
		set    map[string]any
		// want are substrings the apiserver's message must hold: the field
		// and what to do.
		want []string
	}{
		"ProxyPortZero": {
			reason: "A port must be between 1 and 65535.",
			base:   validProxy, set: map[string]any{"spec.forProvider.port": int64(0)},
			want: []string{"spec.forProvider.port", "greater than or equal to 1"},
		},
		"ProxyPortTooHigh": {
			reason: "A port must be between 1 and 65535.",
			base:   validProxy, set: map[string]any{"spec.forProvider.port": int64(70000)},
			want: []string{"spec.forProvider.port", "less than or equal to 65535"},
		},
		"ProxyNoPlacement": {
			reason: "A Managed proxy needs a backend placement.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil},
			want: []string{"spec.forProvider", "exactly one backend placement"},
		},
		"ProxyTwoPlacements": {
			reason: "A Managed proxy has exactly one backend placement.",
			base:   validProxy, set: map[string]any{"spec.forProvider.gcp": map[string]any{"zone": "europe-west1-b"}},
			want: []string{"spec.forProvider", "exactly one backend placement"},
		},
		"ManagedWithEndpoint": {
			reason: "An endpoint is only for External proxies.",
			base:   validProxy, set: map[string]any{"spec.forProvider.endpoint": map[string]any{"host": "h", "port": int64(1)}},
			want: []string{"spec.forProvider", "endpoint is only for mode External"},
		},
		"ExternalWithoutEndpoint": {
			reason: "An External proxy needs an endpoint.",
			base:   validProxy, set: map[string]any{"spec.forProvider.mode": "External", "spec.forProvider.local": nil},
			want: []string{"spec.forProvider", "endpoint is required when mode is External"},
		},
		"ExternalWithPlacement": {
			reason: "An External proxy takes no placement.",
			base:   validProxy, set: map[string]any{"spec.forProvider.mode": "External", "spec.forProvider.endpoint": map[string]any{"host": "h", "port": int64(1)}},
			want: []string{"spec.forProvider", "External proxy takes no backend placement"},
		},
		"UnknownMode": {
			reason: "Mode is Managed or External.",
			base:   validProxy, set: map[string]any{"spec.forProvider.mode": "Sometimes"},
			want: []string{"spec.forProvider.mode", `supported values: "Managed", "External"`},
		},
		"SuccessThresholdZero": {
			reason: "Thresholds are at least 1.",
			base:   validProxy, set: map[string]any{"spec.forProvider.healthCheck.successThreshold": int64(0)},
			want: []string{"spec.forProvider.healthCheck.successThreshold", "greater than or equal to 1"},
		},
		"FailureThresholdZero": {
			reason: "Thresholds are at least 1.",
			base:   validProxy, set: map[string]any{"spec.forProvider.healthCheck.failureThreshold": int64(0)},
			want: []string{"spec.forProvider.healthCheck.failureThreshold", "greater than or equal to 1"},
		},
		"TimeoutNotShorterThanInterval": {
			reason: "A probe must finish before the next one starts.",
			base:   validProxy, set: map[string]any{"spec.forProvider.healthCheck.interval": "10s", "spec.forProvider.healthCheck.timeout": "10s"},
			want: []string{"spec.forProvider.healthCheck", "timeout must be shorter than interval"},
		},
		"IntervalNotADuration": {
			reason: "Durations are Go-style strings.",
			base:   validProxy, set: map[string]any{"spec.forProvider.healthCheck.interval": "often"},
			want: []string{"spec.forProvider.healthCheck.interval", "should match"},
		},
		"ProbeURLNotHTTP": {
			reason: "The probe goes through an HTTP proxy, so its URL is http(s).",
			base:   validProxy, set: map[string]any{"spec.forProvider.healthCheck.url": "ftp://example.com/ip"},
			want: []string{"spec.forProvider.healthCheck.url", "http:// or https:// URL"},
		},
		"ProbeURLRelative": {
			reason: "The probe URL is absolute.",
			base:   validProxy, set: map[string]any{"spec.forProvider.healthCheck.url": "/ip"},
			want: []string{"spec.forProvider.healthCheck.url", "http:// or https:// URL"},
		},
		"ProbeURLMissing": {
			reason: "There is no health without a probe URL.",
			base:   validProxy, set: map[string]any{"spec.forProvider.healthCheck.url": nil},
			want: []string{"spec.forProvider.healthCheck.url", "Required value"},
		},
		"MaxLeasesZero": {
			reason: "At least one crawler may hold a proxy.",
			base:   validProxy, set: map[string]any{"spec.forProvider.maxLeases": int64(0)},
			want: []string{"spec.forProvider.maxLeases", "greater than or equal to 1"},
		},
		"OpenProxy": {
			reason: "A managed proxy without credentials or source ranges would be open.",
			base:   validProxy, set: map[string]any{"spec.forProvider.authSecretRef": nil},
			want: []string{"spec.forProvider", "refusing an open proxy"},
		},
		"OpenToTheWorld": {
			reason: "0.0.0.0/0 without credentials is as open as no restriction.",
			base:   validProxy, set: map[string]any{"spec.forProvider.authSecretRef": nil, "spec.forProvider.allowedSourceRanges": []any{"0.0.0.0/0"}},
			want: []string{"spec.forProvider", "allowedSourceRanges: without authSecretRef every range must lie in private, loopback or CGNAT space"},
		},
		"OpenToHalvesOfTheWorld": {
			reason: "Two halves of the internet without credentials are as open as 0.0.0.0/0: the rule does arithmetic, not string comparison.",
			base:   validProxy, set: map[string]any{"spec.forProvider.authSecretRef": nil, "spec.forProvider.allowedSourceRanges": []any{"0.0.0.0/1", "128.0.0.0/1"}},
			want: []string{"spec.forProvider", "allowedSourceRanges: without authSecretRef every range must lie in private, loopback or CGNAT space"},
		},
		"OpenToPublicIPv6": {
			reason: "A public IPv6 client range needs credentials.",
			base:   validProxy, set: map[string]any{"spec.forProvider.authSecretRef": nil, "spec.forProvider.allowedSourceRanges": []any{"10.0.0.0/8", "2001:db8::/32"}},
			want: []string{"spec.forProvider", "allowedSourceRanges: without authSecretRef every range must lie in private, loopback or CGNAT space"},
		},
		"BadCIDR": {
			reason: "Source ranges are CIDRs.",
			base:   validProxy, set: map[string]any{"spec.forProvider.allowedSourceRanges": []any{"10.0.0.300/8"}},
			want: []string{"spec.forProvider.allowedSourceRanges[0]", "CIDR notation"},
		},
		"BadBindAddress": {
			reason: "A bind address is an IP.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local.bindAddress": "localhost"},
			want: []string{"spec.forProvider.local.bindAddress", "IPv4 or IPv6 address"},
		},
		"BadGCPZone": {
			reason: "A GCP zone looks like europe-west1-b.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil, "spec.forProvider.gcp": map[string]any{"zone": "Europe West"}},
			want: []string{"spec.forProvider.gcp.zone", "should match"},
		},
		"GCPIPv6SourceRange": {
			reason: "A GCP firewall rule takes IPv4 ranges only.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil, "spec.forProvider.gcp": map[string]any{"zone": "europe-west1-b"}, "spec.forProvider.allowedSourceRanges": []any{"10.0.0.0/8", "fd00::/8"}},
			want: []string{"spec.forProvider", "GCP proxy's firewall rule takes IPv4 ranges only"},
		},
		"GCPPrivilegedPort": {
			reason: "A GCP proxy listens on 1024 or above.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil, "spec.forProvider.gcp": map[string]any{"zone": "europe-west1-b"}, "spec.forProvider.port": int64(443)},
			want: []string{"spec.forProvider", "port: a GCP proxy listens on 1024 or above"},
		},
		"GCPPrivateRangesAtExternalIP": {
			reason: "Clients in a VPC never reach the external IP from a private address.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil, "spec.forProvider.gcp": map[string]any{"zone": "europe-west1-b"}, "spec.forProvider.allowedSourceRanges": []any{"10.0.0.0/8", "100.64.0.0/10"}},
			want: []string{"spec.forProvider", "set gcp.publishedAddress: Internal"},
		},
		"GCPSubnetworkOfAnotherRegion": {
			reason: "A subnetwork is regional: it must be in the zone's region.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil, "spec.forProvider.gcp": map[string]any{"zone": "europe-west1-b", "subnetwork": "regions/us-central1/subnetworks/crawl"}},
			want: []string{"spec.forProvider.gcp", "subnetwork must be in the zone's region"},
		},
		"GCPSharedSubnetworkWithoutHostNetwork": {
			reason: "A host project's subnetwork needs the host project's network, where the rule is made.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil, "spec.forProvider.gcp": map[string]any{"zone": "europe-west1-b", "subnetwork": "projects/net-host-proj/regions/europe-west1/subnetworks/crawl"}},
			want: []string{"spec.forProvider.gcp", "Shared VPC"},
		},
		"GCPBadSubnetwork": {
			reason: "A subnetwork is regions/R/subnetworks/NAME.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil, "spec.forProvider.gcp": map[string]any{"zone": "europe-west1-b", "subnetwork": "crawl"}},
			want: []string{"spec.forProvider.gcp.subnetwork", "should match"},
		},
		"GCPBootDiskType": {
			reason: "Boot disk types are a closed list.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil, "spec.forProvider.gcp": map[string]any{"zone": "europe-west1-b", "bootDiskType": "local-ssd"}},
			want: []string{"spec.forProvider.gcp.bootDiskType", "Unsupported value"},
		},
		"CloudInitBoth": {
			reason: "User cloud-init comes inline or from a Secret, not both.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil, "spec.forProvider.gcp": map[string]any{
				"zone": "europe-west1-b", "cloudInit": map[string]any{"inline": "#!/bin/sh", "secretRef": map[string]any{"name": "s", "key": "k"}},
			}},
			want: []string{"spec.forProvider.gcp", "exactly one of inline or secretRef"},
		},
		"TenantSquidPath": {
			reason: "A tenant's ProviderConfig cannot choose the binary the provider runs on its host.",
			base:   validProviderConfig, set: map[string]any{"spec.local": map[string]any{"squidPath": "/tmp/evil"}},
			want: []string{"spec.local.squidPath, stateDir and portRange may be set only on a ClusterProviderConfig"},
		},
		"TenantStateDir": {
			reason: "A tenant's ProviderConfig cannot choose where the provider writes on its host.",
			base:   validProviderConfig, set: map[string]any{"spec.local": map[string]any{"stateDir": "/etc"}},
			want: []string{"may be set only on a ClusterProviderConfig"},
		},
		"TenantPortRange": {
			reason: "A tenant's ProviderConfig cannot choose the provider host's ports.",
			base:   validProviderConfig, set: map[string]any{"spec.local": map[string]any{"portRange": map[string]any{"from": int64(30000), "to": int64(30010)}}},
			want: []string{"may be set only on a ClusterProviderConfig"},
		},
		"TenantInjectedIdentityPods": {
			reason: "A tenant's ProviderConfig cannot borrow the provider's identity to make pods.",
			base:   validProviderConfig, set: map[string]any{"spec.backend": "Kubernetes", "spec.kubernetes": map[string]any{"credentials": map[string]any{"source": "InjectedIdentity"}}},
			want: []string{"spec.kubernetes.credentials.source must be Secret"},
		},
		"TenantDefaultIdentityPods": {
			reason: "Without credentials a kubernetes ProviderConfig would use the provider's identity.",
			base:   validProviderConfig, set: map[string]any{"spec.backend": "Kubernetes", "spec.kubernetes": map[string]any{"namespace": "x"}},
			want: []string{"spec.kubernetes.credentials.source must be Secret"},
		},
		"TenantInjectedIdentityGCP": {
			reason: "A tenant's ProviderConfig cannot borrow the provider's identity in any project.",
			base:   validProviderConfig, set: map[string]any{"spec.backend": "GCP", "spec.gcp": map[string]any{"project": "platform-proj", "credentials": map[string]any{"source": "InjectedIdentity"}}},
			want: []string{"spec.gcp.credentials.source must be Secret"},
		},
		"TenantLoopback": {
			reason: "A tenant's ProviderConfig cannot let its proxies reach the provider host's loopback.",
			base:   validProviderConfig, set: map[string]any{"spec.policy": map[string]any{"local": map[string]any{"allowLoopbackDestinations": true}}},
			want: []string{"spec.policy.local and spec.policy.allowedProxyNamespaces may be set only on a ClusterProviderConfig"},
		},
		"ProviderConfigUnknownBackend": {
			reason: "The backend is one of the four the provider has.",
			base:   validProviderConfig, set: map[string]any{"spec.backend": "Azure"},
			want: []string{"spec.backend", `supported values: "Local", "Kubernetes", "GCP", "AWS"`},
		},
		"ProviderConfigAWSWithoutSettings": {
			reason: "The AWS backend needs a region and credentials.",
			base:   validProviderConfig, set: map[string]any{"spec.backend": "AWS"},
			want: []string{"spec", "aws is required when backend is AWS"},
		},
		"ProxyTwoPlacementsWithAWS": {
			reason: "An AWS placement is one of exactly one.",
			base:   validProxy, set: map[string]any{"spec.forProvider.aws": map[string]any{"zone": "us-east-1a"}},
			want: []string{"a Managed proxy needs exactly one backend placement: set one of local, kubernetes, gcp or aws"},
		},
		"ProviderConfigMismatchedBlock": {
			reason: "Settings for another backend are a mistake, not ignored.",
			base:   validProviderConfig, set: map[string]any{"spec.gcp": map[string]any{"project": "my-project-1", "credentials": map[string]any{"source": "InjectedIdentity"}}},
			want: []string{"spec", "gcp is set but backend is not GCP"},
		},
		"ProviderConfigGCPWithoutSettings": {
			reason: "The GCP backend needs a project.",
			base:   validProviderConfig, set: map[string]any{"spec.backend": "GCP"},
			want: []string{"spec", "gcp is required when backend is GCP"},
		},
		"ProviderConfigSecretWithoutRef": {
			reason: "Secret credentials need a secretRef.",
			base:   validProviderConfig, set: map[string]any{"spec.backend": "GCP", "spec.gcp": map[string]any{"project": "my-project-1", "credentials": map[string]any{"source": "Secret"}}},
			want: []string{"spec.gcp.credentials", "secretRef is required when source is Secret"},
		},
		"ProviderConfigPortRangeReversed": {
			reason: "A port range runs upwards.",
			base:   validClusterProviderConfig, set: map[string]any{"spec.local": map[string]any{"portRange": map[string]any{"from": int64(40000), "to": int64(30000)}}},
			want: []string{"spec.local.portRange", "from must not be greater than to"},
		},
		"ProviderConfigRelativeSquidPath": {
			reason: "The Squid binary is an absolute path.",
			base:   validClusterProviderConfig, set: map[string]any{"spec.local": map[string]any{"squidPath": "squid"}},
			want: []string{"spec.local.squidPath", "absolute path"},
		},
		"PacingIntervalTooShort": {
			reason: "A pacing interval is between 100ms and 1h.",
			base:   validFleet, set: map[string]any{"spec.gateway": map[string]any{"pacing": []any{map[string]any{"domains": []any{"shop.example"}, "interval": "10ms"}}}},
			want: []string{"spec.gateway.pacing[0].interval", "between 100ms and 1h"},
		},
		"PacingDomainNotAName": {
			reason: "A pacing domain is a host name or *. and one.",
			base:   validFleet, set: map[string]any{"spec.gateway": map[string]any{"pacing": []any{map[string]any{"domains": []any{"shop.example/cart"}, "interval": "1s"}}}},
			want: []string{"spec.gateway.pacing[0].domains[0]", "should match"},
		},
		"RecyclingWithoutThreshold": {
			reason: "spec.recycling says when an address is burned.",
			base:   validFleet, set: map[string]any{"spec.recycling": map[string]any{"maxPerHour": int64(2)}},
			want: []string{"spec.recycling", "bannedByDomains or bannedTimes"},
		},
		"RecyclingUnbounded": {
			reason: "At most 10 recycles an hour.",
			base:   validFleet, set: map[string]any{"spec.recycling": map[string]any{"bannedByDomains": int64(2), "maxPerHour": int64(100)}},
			want: []string{"spec.recycling.maxPerHour", "less than or equal to 10"},
		},
		"RecyclingWindowTooLong": {
			reason: "Bans are kept 7 days: a longer window counts nothing more.",
			base:   validFleet, set: map[string]any{"spec.recycling": map[string]any{"bannedTimes": int64(3), "window": "200h"}},
			want: []string{"spec.recycling.window", "between 1m and 168h"},
		},
		"RecyclingWithoutSurge": {
			reason: "A recycle replaces through a surge proxy: without one nothing is ever recycled.",
			base:   validFleet, set: map[string]any{"spec.recycling": map[string]any{"bannedByDomains": int64(2)}, "spec.rotation": map[string]any{"maxSurge": int64(0), "maxUnavailable": int64(1)}},
			want: []string{"spec.rotation.maxSurge must be at least 1 with spec.recycling"},
		},
		"ReplaceBeyondLimitLocal": {
			reason: "A replaced local proxy leaves from the same address: replacing it draws nothing new.",
			base:   validFleet, set: map[string]any{"spec.diversity": map[string]any{"maxPerIPv4Prefix": int64(2), "replaceBeyondLimit": true}},
			want: []string{"spec.diversity.replaceBeyondLimit needs a backend that gives each proxy an address of its own"},
		},
		"DiversityCapZero": {
			reason: "A cap of zero proxies per network would flag every proxy.",
			base:   validFleet, set: map[string]any{"spec.diversity": map[string]any{"maxPerIPv4Prefix": int64(0)}},
			want: []string{"spec.diversity.maxPerIPv4Prefix", "greater than or equal to 1"},
		},
		"BanStatusNotAnError": {
			reason: "Only error answers ban.",
			base:   validFleet, set: map[string]any{"spec.gateway": map[string]any{"banStatusCodes": []any{int64(200)}}},
			want: []string{"spec.gateway.banStatusCodes[0]", "greater than or equal to 400"},
		},
		"UnknownRotation": {
			reason: "The rotation strategies are four.",
			base:   validFleet, set: map[string]any{"spec.gateway": map[string]any{"rotation": "fastest"}},
			want: []string{"spec.gateway.rotation", "leastRecentlyUsed"},
		},
		"FleetWithoutZones": {
			reason: "A fleet with replicas needs zones to spread over.",
			base:   validFleet, set: map[string]any{"spec.zones": nil},
			want: []string{"spec", "spec.zones must not be empty when spec.replicas > 0"},
		},
		"FleetOpenProxy": {
			reason: "A fleet of open proxies is refused.",
			base:   validFleet, set: map[string]any{"spec.proxy": map[string]any{"port": int64(3128)}},
			want: []string{"spec.proxy", "refusing an open proxy"},
		},
		"FleetOpenToHalvesOfTheWorld": {
			reason: "A fleet open to 0.0.0.0/1 and 128.0.0.0/1 without credentials is refused by arithmetic.",
			base:   validFleet, set: map[string]any{"spec.proxy": map[string]any{"allowedSourceRanges": []any{"0.0.0.0/1", "128.0.0.0/1"}}},
			want: []string{"spec.proxy", "without authSecretRef every range must lie in private, loopback or CGNAT space"},
		},
		"FleetGCPIPv6SourceRange": {
			reason: "A GCP fleet's firewall rules take IPv4 ranges only.",
			base:   validFleet, set: map[string]any{"spec.placement": map[string]any{"gcp": map[string]any{}}, "spec.proxy": map[string]any{"authSecretRef": map[string]any{"name": "a"}, "allowedSourceRanges": []any{"2001:db8::/32"}}},
			want: []string{"spec", "GCP proxy's firewall rule takes IPv4 ranges only"},
		},
		"FleetGCPPrivilegedPort": {
			reason: "A GCP fleet's proxies listen on 1024 or above.",
			base:   validFleet, set: map[string]any{"spec.placement": map[string]any{"gcp": map[string]any{}}, "spec.proxy": map[string]any{"authSecretRef": map[string]any{"name": "a"}, "port": int64(80)}},
			want: []string{"spec", "spec.proxy.port: a GCP proxy listens on 1024 or above"},
		},
		"FleetGCPPrivateRangesAtExternalIP": {
			reason: "A GCP fleet open to private networks only publishes its internal addresses.",
			base:   validFleet, set: map[string]any{"spec.placement": map[string]any{"gcp": map[string]any{}}, "spec.proxy": map[string]any{"allowedSourceRanges": []any{"172.16.0.0/12"}}},
			want: []string{"spec", "set spec.placement.gcp.publishedAddress: Internal"},
		},
		"FleetSubnetworkOutsideZones": {
			reason: "A fleet's subnetwork must serve every zone it spreads over.",
			base:   validFleet, set: map[string]any{"spec.zones": []any{"europe-west1-b", "us-central1-a"}, "spec.placement": map[string]any{"gcp": map[string]any{"subnetwork": "regions/europe-west1/subnetworks/crawl"}}},
			want: []string{"spec", "subnetwork must be in the region of every zone"},
		},
		"FleetReplacesUnhealthyTooSoon": {
			reason: "A proxy needs time to boot: replacing unhealthy ones sooner than 1m would storm the backend.",
			base:   validFleet, set: map[string]any{"spec.rotation": map[string]any{"replaceUnhealthyAfter": "30s"}},
			want: []string{"spec.rotation.replaceUnhealthyAfter", "must be at least 1m"},
		},
		"FleetRotationStuck": {
			reason: "Replacement with neither surge nor unavailability could never progress.",
			base:   validFleet, set: map[string]any{"spec.rotation": map[string]any{"maxSurge": int64(0), "maxUnavailable": int64(0)}},
			want: []string{"spec.rotation", "cannot both be 0"},
		},
		"FleetTooBigForOneMessage": {
			reason: "A fleet whose Proxies would not fit Crossplane's message to the function with a 2x margin is refused.",
			base:   validFleet, set: map[string]any{"spec.replicas": int64(300), "spec.leases": map[string]any{"maxLeasesPerProxy": int64(10)}},
			want: []string{"must not exceed 2 MiB", "at most 242 replicas, or 120 proxies per pool, however many leases per proxy"},
		},
		"FleetTooManyReplicasForOneMessage": {
			reason: "With maxSurge 1 the bound is 242 replicas.",
			base:   validFleet, set: map[string]any{"spec.replicas": int64(243)},
			want: []string{"must not exceed 2 MiB"},
		},
		"FleetDefaultTTLAboveMax": {
			reason: "The default TTL cannot exceed the longest allowed.",
			base:   validFleet, set: map[string]any{"spec.leases": map[string]any{"defaultTTL": "2h", "maxTTL": "1h"}},
			want: []string{"spec.leases", "defaultTTL must not exceed spec.leases.maxTTL"},
		},
		"FleetTwoPlacements": {
			reason: "A fleet runs on one backend.",
			base:   validFleet, set: map[string]any{"spec.placement.kubernetes": map[string]any{}},
			want: []string{"spec.placement", "exactly one of local, kubernetes, gcp or aws"},
		},
		"FleetAWSUserDataInline": {
			reason: "A fleet's own user data would ride in every Proxy to the function: a Secret instead.",
			base:   validFleet, set: map[string]any{"spec.placement": map[string]any{"aws": map[string]any{"userData": map[string]any{"inline": "#!/bin/sh"}}}},
			want: []string{"spec.placement", "userData.inline is not taken by a fleet"},
		},
		"FleetAWSPrivateOnly": {
			reason: "Private clients never reach an instance's public IP from a private address.",
			base:   validFleet, set: map[string]any{"spec.placement": map[string]any{"aws": map[string]any{}}, "spec.proxy.allowedSourceRanges": []any{"10.0.0.0/8"}},
			want: []string{"an AWS proxy open to private networks only"},
		},
	}

	ns := bed.Namespace(t)
	ctx := context.Background()
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			u := object(t, tc.base, tc.set)
			u.SetNamespace(ns)
			err := bed.Client.Create(ctx, u)
			if err == nil {
				t.Fatalf("%s\nthe apiserver accepted %s", tc.reason, name)
			}
			if !kerrors.IsInvalid(err) {
				t.Fatalf("%s\nwant an Invalid error, got: %v", tc.reason, err)
			}
			t.Logf("rejected as expected: %v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s\nthe message must contain %q; got: %v", tc.reason, w, err)
				}
			}
		})
	}

	// Nothing invalid was half-created.
	var proxies v1alpha1.ProxyList
	if err := bed.Client.List(ctx, &proxies, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(proxies.Items) != 0 {
		t.Errorf("rejected Proxies must not exist; found %d", len(proxies.Items))
	}
}

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
