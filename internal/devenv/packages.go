package devenv

import (
	"context"
	"fmt"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ref is where the local registry serves a package at PackageVersion.
func (s *core) ref(pkg string) string { return s.refAt(pkg, PackageVersion) }

// refAt is where the local registry serves a package at a version.
func (s *core) refAt(pkg, version string) string {
	return fmt.Sprintf("%s/kacerr/%s:%s", s.Registry, pkg, version)
}

// packageInstalled reports whether a package object says Installed, and
// otherwise what its conditions say.
func (s *core) packageInstalled(ctx context.Context, kind, name string) (bool, string, error) {
	return s.packageIs(ctx, kind, name, "Installed")
}

// packageIs reports whether a package object has every one of the
// conditions True, and otherwise what its conditions say.
func (s *core) packageIs(ctx context.Context, kind, name string, want ...string) (bool, string, error) {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("pkg.crossplane.io/v1")
	u.SetKind(kind)
	if err := s.Client.Get(ctx, types.NamespacedName{Name: name}, u); err != nil {
		return false, err.Error(), nil
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	var says []string
	met := 0
	for _, c := range conds {
		m, _ := c.(map[string]any)
		says = append(says, fmt.Sprintf("%v=%v %v %v", m["type"], m["status"], m["reason"], m["message"]))
		for _, w := range want {
			if m["type"] == w && m["status"] == condTrue {
				met++
			}
		}
	}
	return met == len(want), strings.Join(says, "; "), nil
}

// apply server-side applies an object as the environment's field manager.
func (s *core) apply(ctx context.Context, u *unstructured.Unstructured) error {
	return s.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.ForceOwnership, client.FieldOwner("egress-devenv"))
}

// applyImageConfig rewrites Crossplane's pulls of the published packages
// to the local registry.
func (s *core) applyImageConfig(ctx context.Context) error {
	ic := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "pkg.crossplane.io/v1beta1",
		"kind":       "ImageConfig",
		"metadata":   map[string]any{"name": "egress-local-registry"},
		"spec": map[string]any{
			"matchImages":  []any{map[string]any{"type": "Prefix", imageConfigMatch: upstreamPrefix}},
			"rewriteImage": map[string]any{imageConfigMatch: s.Registry + "/kacerr/"},
		},
	}}
	return errors.Wrap(s.apply(ctx, ic), "cannot apply the ImageConfig")
}

// Kinds of Crossplane's package objects, and the desired state of a
// package's revision that runs.
const (
	kindConfiguration = "Configuration"
	kindProvider      = "Provider"
	kindFunction      = "Function"
	revisionActive    = "Active"
)

// Names of the packages Crossplane installs as the Configuration's
// dependencies, after their repositories.
const providerName = "kacerr-provider-egressproxy"
