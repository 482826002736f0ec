package devenv

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
)

// Release is an earlier release built from git, for Options.Packages and
// Options.Function: a Stack that starts from it can Upgrade to this
// checkout.
type Release struct {
	// Packages holds the release's own Configuration package, beside this
	// checkout's provider and function packages (the External runtime
	// runs neither package's image, and the provider is upgraded first).
	Packages string
	// Function is the release's function-proxyfleet binary.
	Function string
}

// BuildRelease builds the release of a commit of the repository at root
// into out: its function-proxyfleet, and its Configuration package (its
// XRDs and Compositions, staged as its hack/packages.sh staged them). It
// needs the repository's history (a shallow clone lacks the commit).
func BuildRelease(ctx context.Context, root, commit, out string) (Release, error) {
	src, pkgs := filepath.Join(out, "src"), filepath.Join(out, "packages")
	for _, d := range []string{src, pkgs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return Release{}, errors.Wrap(err, "cannot create the release's folders")
		}
	}
	run := func(dir, name string, args ...string) error {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return errors.Wrapf(err, "%s %s: %s", name, strings.Join(args, " "), out)
	}
	if err := run(root, "bash", "-c", fmt.Sprintf("set -o pipefail; git archive --format=tar %s | tar -x -C %q", commit, src)); err != nil {
		return Release{}, errors.Wrapf(err, "cannot read release %s from git (a shallow clone lacks it: git fetch --unshallow)", commit)
	}
	rel := Release{Packages: pkgs, Function: filepath.Join(out, binFunction)}
	if err := run(src, "go", "build", "-o", rel.Function, "./cmd/function"); err != nil {
		return Release{}, errors.Wrapf(err, "cannot build the function of %s", commit)
	}
	stage := filepath.Join(out, "configuration-root")
	files := map[string]string{"crossplane.yaml": "crossplane.yaml"}
	for dir, to := range map[string]string{"apis/fleet": "namespaced", "apis/fleet/legacy": "legacy", "apis/fleet/pool": "pool"} {
		for _, f := range []string{"definition.yaml", "composition.yaml"} {
			if _, err := os.Stat(filepath.Join(src, dir, f)); err == nil {
				files[filepath.Join(dir, f)] = filepath.Join(to, f)
			}
		}
	}
	for from, to := range files {
		if err := copyFile(filepath.Join(src, from), filepath.Join(stage, to)); err != nil {
			return Release{}, err
		}
	}
	cfg := filepath.Join(pkgs, "configuration-proxyfleet.xpkg")
	if err := run(src, filepath.Join(root, "bin", binCrossplane), "xpkg", "build", "--package-root="+stage,
		"--examples-root="+filepath.Join(src, "examples"), "--package-file="+cfg); err != nil {
		return Release{}, errors.Wrapf(err, "cannot build the Configuration of %s", commit)
	}
	if err := run(root, "go", "run", "./hack/xpkgraw", "-package", cfg, "-root", stage); err != nil {
		return Release{}, errors.Wrapf(err, "cannot keep the XRDs of %s as written", commit)
	}
	for _, p := range []string{binProvider, binFunction} {
		if err := copyFile(filepath.Join(root, "_output", p+".xpkg"), filepath.Join(pkgs, p+".xpkg")); err != nil {
			return Release{}, err
		}
	}
	return rel, nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from) //nolint:gosec // Paths the caller chose.
	if err != nil {
		return errors.Wrapf(err, "cannot read %s", from)
	}
	defer in.Close() //nolint:errcheck // Read only.
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return errors.Wrapf(err, "cannot create the folder of %s", to)
	}
	out, err := os.Create(to) //nolint:gosec // Paths the caller chose.
	if err != nil {
		return errors.Wrapf(err, "cannot create %s", to)
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return errors.Wrapf(err, "cannot copy %s", from)
	}
	return errors.Wrapf(out.Close(), "cannot write %s", to)
}

// Upgrade moves the running Stack to another release as a platform team
// would: the packages of dir pushed at version, then the Configuration's
// spec.package and after it the Function's set to that version. bin is
// that version's function-proxyfleet, which serves its FunctionRevision.
// It returns once the Configuration's and the Function's active revisions
// are of version and healthy, the release's XRDs are established, and the
// function processes of earlier versions are stopped.
func (s *Stack) Upgrade(ctx context.Context, dir, bin, version string) error {
	s.Logf("upgrading to %s", version)
	if err := s.pushPackages(ctx, dir, version); err != nil {
		return err
	}
	if err := s.runFunction(ctx, bin, version); err != nil {
		return err
	}
	for _, pkg := range []struct{ kind, name, list string }{
		{kindConfiguration, ConfigurationName, "ConfigurationRevisionList"},
		{kindFunction, FunctionName, "FunctionRevisionList"},
	} {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("pkg.crossplane.io/v1")
		u.SetKind(pkg.kind)
		if err := s.Client.Get(ctx, types.NamespacedName{Name: pkg.name}, u); err != nil {
			return errors.Wrapf(err, "cannot get %s %s", pkg.kind, pkg.name)
		}
		from, _, _ := unstructured.NestedString(u.Object, "spec", "package")
		to := strings.TrimSuffix(from, ":"+tagOf(from)) + ":" + version
		patch := fmt.Appendf(nil, `{"spec":{"package":%q}}`, to)
		if err := s.Client.Patch(ctx, u, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return errors.Wrapf(err, "cannot set the package of %s %s to %s", pkg.kind, pkg.name, to)
		}
		s.Logf("  %s %s: %s -> %s", pkg.kind, pkg.name, from, to)
		if err := wait(ctx, 3*time.Minute, pkg.kind+" "+pkg.name+" installed and healthy at "+version, func() (bool, string, error) {
			return s.activeAt(ctx, pkg.kind, pkg.name, pkg.list, version)
		}); err != nil {
			return err
		}
	}
	if err := s.waitEstablished(ctx, time.Minute, fleetv1alpha1.ProxyFleetResource+"."+fleetv1alpha1.Group, "proxypools."+fleetv1alpha1.Group); err != nil {
		return err
	}
	s.fnMu.Lock()
	var old []*process
	for v, fn := range s.functions {
		if v != version {
			old = append(old, fn.proc)
			delete(s.functions, v)
		}
	}
	s.fnMu.Unlock()
	for _, p := range old {
		if err := p.stop(); err != nil {
			s.Logf("  stopping the function of the release before: %v", err)
		}
	}
	return nil
}

// activeAt reports whether a package is Installed and Healthy with its one
// active revision of version, the revision before it left inactive (and,
// for the Function, the active one pointed at the process serving
// version).
func (s *Stack) activeAt(ctx context.Context, kind, name, list, version string) (bool, string, error) {
	if ok, says, err := s.packageIs(ctx, kind, name, "Installed", "Healthy"); !ok || err != nil {
		return false, says, err
	}
	l, err := s.revisions(ctx, list, name)
	if err != nil {
		return false, err.Error(), nil
	}
	var active []string
	endpoint := ""
	for _, r := range l.Items {
		if state, _, _ := unstructured.NestedString(r.Object, "spec", "desiredState"); state != revisionActive {
			continue
		}
		image, _, _ := unstructured.NestedString(r.Object, "spec", "image")
		active = append(active, image)
		endpoint, _, _ = unstructured.NestedString(r.Object, "status", "endpoint")
	}
	if len(active) != 1 || tagOf(active[0]) != version || len(l.Items) < 2 {
		return false, fmt.Sprintf("active revisions %v of %d", active, len(l.Items)), nil
	}
	if fn := s.functionFor(version); kind == kindFunction && (fn == nil || endpoint != fn.endpoint) {
		return false, "the active FunctionRevision is not pointed at the function of " + version + " yet", nil
	}
	return true, "", nil
}
