// Package packaging_test builds the three Crossplane packages with the real
// `crossplane xpkg build` and checks, with crossplane-runtime's own parser and
// linters, that each parses and holds what it should, and that the provider
// and function packages embed runtime images that can run.
package packaging_test

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	pkgmetav1 "github.com/crossplane/crossplane/apis/v2/pkg/meta/v1"

	"github.com/crossplane/crossplane-runtime/v2/pkg/xpkg"
	"github.com/crossplane/crossplane-runtime/v2/pkg/xpkg/parser"
)

type contents struct {
	MetaKind string
	MetaName string
	Objects  []string // kind/name, sorted
}

// runtimeFacts is what a runtime image must hold to run in a cluster.
type runtimeFacts struct {
	User       string
	Entrypoint []string
	// Files that must exist; a binary among them must be statically linked.
	Files []string
	// Static reports whether the entrypoint binary has no ELF interpreter.
	Static bool
}

func runtimeFactsFor(binary string) *runtimeFacts {
	return &runtimeFacts{
		User:       "65532:65532",
		Entrypoint: []string{"/usr/local/bin/" + binary},
		Files:      []string{"etc/passwd", "etc/ssl/certs/ca-certificates.crt", "usr/local/bin/" + binary},
		Static:     true,
	}
}

// inspectRuntime reads an image's config and flattened filesystem.
func inspectRuntime(t *testing.T, img v1.Image, want []string) *runtimeFacts {
	t.Helper()
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatalf("cannot read the image config: %v", err)
	}
	got := &runtimeFacts{User: cfg.Config.User, Entrypoint: cfg.Config.Entrypoint}
	if len(got.Entrypoint) == 0 {
		return got
	}
	entry := strings.TrimPrefix(got.Entrypoint[0], "/")
	tr := tar.NewReader(mutate.Extract(img))
	seen := map[string]bool{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("cannot read the image filesystem: %v", err)
		}
		name := strings.TrimPrefix(h.Name, "./")
		if h.Typeflag == tar.TypeReg && h.Size > 0 {
			seen[name] = true
		}
		if name == entry {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			f, err := elf.NewFile(bytes.NewReader(b))
			if err != nil {
				t.Fatalf("%s is not an ELF binary: %v", name, err)
			}
			got.Static = true
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP {
					got.Static = false
				}
			}
		}
	}
	for _, f := range want {
		if seen[f] {
			got.Files = append(got.Files, f)
		}
	}
	return got
}

func build(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "bin", "crossplane")); err != nil {
		t.Fatalf("bin/crossplane is missing: run `make tools` (it builds the Crossplane CLI from the Go module proxy)")
	}
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "hack", "packages.sh"), out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/packages.sh: %v\n%s", err, b)
	}
	return out
}

func parse(t *testing.T, path string, l parser.Linter) (*parser.Package, contents) {
	t.Helper()
	img, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		t.Fatalf("cannot read package %s: %v", path, err)
	}
	rc, err := xpkg.ExtractPackageYAML(img)
	if err != nil {
		t.Fatalf("cannot extract package.yaml from %s: %v", path, err)
	}
	metaScheme, err := xpkg.BuildMetaScheme()
	if err != nil {
		t.Fatal(err)
	}
	objScheme, err := xpkg.BuildObjectScheme()
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := parser.New(metaScheme, objScheme).Parse(context.Background(), rc)
	if err != nil {
		t.Fatalf("cannot parse %s: %v", path, err)
	}
	if err := l.Lint(pkg); err != nil {
		t.Fatalf("%s does not lint: %v", path, err)
	}

	got := contents{}
	for _, m := range pkg.GetMeta() {
		got.MetaKind = m.GetObjectKind().GroupVersionKind().Kind
		got.MetaName = name(t, m)
	}
	for _, o := range pkg.GetObjects() {
		got.Objects = append(got.Objects, o.GetObjectKind().GroupVersionKind().Kind+"/"+name(t, o))
	}
	sort.Strings(got.Objects)
	return pkg, got
}

func name(t *testing.T, o runtime.Object) string {
	t.Helper()
	a, err := meta.Accessor(o)
	if err != nil {
		t.Fatal(err)
	}
	return a.GetName()
}

func TestPackages(t *testing.T) {
	out := build(t)

	cases := map[string]struct {
		reason  string
		file    string
		linter  parser.Linter
		want    contents
		runtime *runtimeFacts // nil: no runtime image
	}{
		"Provider": {
			reason: "The provider package carries its metadata and every CRD of the egress API.",
			file:   "provider-egressproxy.xpkg",
			linter: xpkg.NewProviderLinter(),
			want: contents{
				MetaKind: "Provider",
				MetaName: "provider-egressproxy",
				Objects: []string{
					"CustomResourceDefinition/clusterproviderconfigs.egress.crawl.example.com",
					"CustomResourceDefinition/clusterproviderconfigusages.egress.crawl.example.com",
					"CustomResourceDefinition/leasesummaries.egress.crawl.example.com",
					"CustomResourceDefinition/providerconfigs.egress.crawl.example.com",
					"CustomResourceDefinition/providerconfigusages.egress.crawl.example.com",
					"CustomResourceDefinition/proxies.egress.crawl.example.com",
				},
			},
			runtime: runtimeFactsFor("provider"),
		},
		"Function": {
			reason:  "The function package carries its metadata.",
			file:    "function-proxyfleet.xpkg",
			linter:  xpkg.NewFunctionLinter(),
			want:    contents{MetaKind: "Function", MetaName: "function-proxyfleet"},
			runtime: runtimeFactsFor("function"),
		},
		"Configuration": {
			reason: "The configuration carries the fleet, legacy and pool XRDs and their Compositions, and nothing else.",
			file:   "configuration-proxyfleet.xpkg",
			linter: xpkg.NewConfigurationLinter(),
			want: contents{
				MetaKind: "Configuration",
				MetaName: "configuration-proxyfleet",
				Objects: []string{
					"CompositeResourceDefinition/proxyfleets.crawl.example.com",
					"CompositeResourceDefinition/proxypools.crawl.example.com",
					"CompositeResourceDefinition/xproxyfleets.crawl.example.com",
					"Composition/proxyfleet",
					"Composition/proxypool",
					"Composition/xproxyfleet",
				},
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			pkg, got := parse(t, filepath.Join(out, tc.file), tc.linter)
			if name == "Configuration" {
				scaleSurvives(t, pkg)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("%s\n%s: -want, +got:\n%s", tc.reason, tc.file, diff)
			}
			if tc.runtime == nil {
				return
			}
			img, err := tarball.ImageFromPath(filepath.Join(out, tc.file), nil)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.runtime, inspectRuntime(t, img, tc.runtime.Files)); diff != "" {
				t.Errorf("%s embeds a runtime image that runs the static binary as nonroot with the CA bundle: -want, +got:\n%s", tc.file, diff)
			}
		})
	}

	t.Run("DiscoveryImage", func(t *testing.T) {
		img, err := tarball.ImageFromPath(filepath.Join(out, "images", "discovery.tar"), nil)
		if err != nil {
			t.Fatalf("make packages must leave the egress-discovery image tarball in images/: %v", err)
		}
		want := runtimeFactsFor("discovery")
		if diff := cmp.Diff(want, inspectRuntime(t, img, want.Files)); diff != "" {
			t.Errorf("the egress-discovery image: -want, +got:\n%s", diff)
		}
	})

	t.Run("ConfigurationDependencies", func(t *testing.T) {
		configurationDependencies(t, out)
	})
}

func configurationDependencies(t *testing.T, out string) {
	t.Helper()
	pkg, _ := parse(t, filepath.Join(out, "configuration-proxyfleet.xpkg"), xpkg.NewConfigurationLinter())
	cfg, ok := pkg.GetMeta()[0].(*pkgmetav1.Configuration)
	if !ok {
		t.Fatalf("meta is %T, want a v1 Configuration", pkg.GetMeta()[0])
	}
	var got []string
	for _, d := range cfg.Spec.DependsOn {
		if d.Kind == nil || d.Package == nil {
			t.Fatalf("dependency %+v must name its kind and package", d)
		}
		got = append(got, *d.Kind+" "+*d.Package)
	}
	want := []string{
		"Provider gitea.home.hrajfrisbee.cz/kacerr/provider-egressproxy",
		"Function gitea.home.hrajfrisbee.cz/kacerr/function-proxyfleet",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("The configuration must depend on the provider and the function: -want, +got:\n%s", diff)
	}
}

// scaleSurvives: the installed ProxyFleet XRD keeps its scale subresource,
// so that kubectl scale and a HorizontalPodAutoscaler can size a fleet.
// The CLI's xpkg build drops it (hack/xpkgraw puts it back).
func scaleSurvives(t *testing.T, pkg *parser.Package) {
	t.Helper()
	for _, o := range pkg.GetObjects() {
		if name(t, o) != "proxyfleets.crawl.example.com" {
			continue
		}
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			t.Fatal(err)
		}
		versions, _, _ := unstructured.NestedSlice(u, "spec", "versions")
		if len(versions) == 0 {
			t.Fatal("the ProxyFleet XRD has no versions")
		}
		path, _, _ := unstructured.NestedString(versions[0].(map[string]any), "subresources", "scale", "specReplicasPath")
		if path != ".spec.replicas" {
			t.Errorf("the packaged ProxyFleet XRD lost its scale subresource (specReplicasPath %q): kubectl scale proxyfleet would answer NotFound", path)
		}
		return
	}
	t.Error("the Configuration has no ProxyFleet XRD")
}
