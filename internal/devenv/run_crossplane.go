package devenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
)

// Secrets `crossplane core init` fills: its CA, and the client certificate
// Crossplane presents to functions.
const (
	caSecret     = "crossplane-root-ca"
	clientSecret = "crossplane-tls-client"
	serverSecret = "crossplane-tls-server"
)

func (s *Stack) startCrossplane(ctx context.Context) error {
	if err := s.ensureNamespace(ctx, crossplaneNamespace); err != nil {
		return err
	}
	// The first init after the CRDs are created can fail with `no matches
	// for kind "Lock"`: its REST mapping predates the CRD. A retry sees it.
	args := []string{"core", "init",
		"--cr-ds-path=" + s.bin("crossplane-crds"),
		"--enable-webhooks=false",
		"--tlsca-secret-name=" + caSecret,
		"--tls-client-secret-name=" + clientSecret,
		"--tls-server-secret-name=" + serverSecret,
		"--activation=*",
	}
	var err error
	for attempt := 1; attempt <= 5; attempt++ {
		if err = s.run(ctx, "crossplane-init", s.bin("crossplane-core"), args...); err == nil {
			break
		}
		s.Logf("  crossplane core init attempt %d failed, retrying: %s", attempt, firstLine(err.Error()))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt) * time.Second):
		}
	}
	if err != nil {
		return errors.Wrap(err, "crossplane core init failed five times")
	}

	// Crossplane caches pulled packages here and fails to unpack any when
	// the folder is missing.
	if err := os.MkdirAll(s.path(binCrossplane, "xpkg-cache"), 0o700); err != nil {
		return errors.Wrap(err, "cannot create Crossplane's package cache")
	}
	certs := s.path(binCrossplane, "tls-client")
	if err := s.writeSecret(ctx, clientSecret, certs); err != nil {
		return err
	}
	ports, err := s.ports("crossplane-metrics", "crossplane-health")
	if err != nil {
		return err
	}
	metrics, health := ports[0], ports[1]
	args = append([]string{"core", "start",
		"--package-runtime=External",
		"--enable-webhooks=false",
		"--tls-client-certs-dir=" + certs,
		"--xpkg-cache-dir=" + s.path(binCrossplane, "xpkg-cache"),
		fmt.Sprintf("--metrics-port=%d", metrics),
		fmt.Sprintf("--health-probe-port=%d", health),
		// Every status change of a fleet's Proxies, and of the fleet, is a
		// watch event for the fleet, and Crossplane throttles an XR after
		// 100 events at 1/s. A fleet of N proxies takes about 16N events to
		// create (more while Crossplane's own status writes ping-pong on a
		// stale cache), so a few scale-ups would throttle it for minutes.
		// docs/install.md says to size this for real clusters too.
		"--circuit-breaker-burst=1000",
		"--circuit-breaker-refill-rate=10",
	}, s.opts.CrossplaneArgs...)
	p, err := s.start(binCrossplane, s.bin("crossplane-core"), args, "POD_NAMESPACE="+crossplaneNamespace)
	if err != nil {
		return err
	}
	return waitHTTP(ctx, p, fmt.Sprintf("http://127.0.0.1:%d/healthz", health), 2*time.Minute)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// writeSecret writes a TLS Secret of Crossplane's namespace to a folder as
// tls.crt, tls.key and ca.crt.
func (s *Stack) writeSecret(ctx context.Context, name, dir string) error {
	sec := &corev1.Secret{}
	if err := s.Client.Get(ctx, types.NamespacedName{Namespace: crossplaneNamespace, Name: name}, sec); err != nil {
		return errors.Wrapf(err, "cannot get Secret %s", name)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return errors.Wrap(err, "cannot create the certificate folder")
	}
	for _, k := range []string{"tls.crt", "tls.key", caFile} {
		if len(sec.Data[k]) == 0 {
			return errors.Errorf("Secret %s has no %s", name, k)
		}
		if err := os.WriteFile(filepath.Join(dir, k), sec.Data[k], 0o600); err != nil {
			return errors.Wrapf(err, "cannot write %s", k)
		}
	}
	return nil
}

// startRegistry serves an OCI registry on loopback from memory and pushes
// the three packages into it. go-containerregistry, which Crossplane pulls
// with, speaks plain http to 127.0.0.1.
func (s *Stack) startRegistry(ctx context.Context) error {
	port, err := s.port("registry")
	if err != nil {
		return err
	}
	if _, err := s.serveRegistry(fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
		return err
	}
	return s.pushPackages(ctx, s.opts.Packages, PackageVersion)
}

// installConfiguration points Crossplane's pulls of the published packages
// at the local registry with an ImageConfig, installs the Configuration as a
// user would, and waits until the Provider and the Function it depends on
// are installed and the APIs they bring exist.
func (s *Stack) installConfiguration(ctx context.Context) error {
	if err := s.applyImageConfig(ctx); err != nil {
		return err
	}

	cfg := &unstructured.Unstructured{}
	cfg.SetAPIVersion("pkg.crossplane.io/v1")
	cfg.SetKind(kindConfiguration)
	err := s.Client.Get(ctx, types.NamespacedName{Name: ConfigurationName}, cfg)
	switch {
	case kerrors.IsNotFound(err):
		if err := s.run(ctx, "crossplane-xpkg-install", s.bin(binCrossplane), "xpkg", "install", "configuration", s.ref("configuration-proxyfleet"), ConfigurationName); err != nil {
			return err
		}
	case err != nil:
		return errors.Wrap(err, "cannot get the Configuration")
	default:
		// A second run: the registry may have moved to another port.
		if pkg, _, _ := unstructured.NestedString(cfg.Object, "spec", "package"); pkg != s.ref("configuration-proxyfleet") {
			patch := []byte(fmt.Sprintf(`{"spec":{"package":%q}}`, s.ref("configuration-proxyfleet")))
			if err := s.Client.Patch(ctx, cfg, client.RawPatch(types.MergePatchType, patch)); err != nil {
				return errors.Wrap(err, "cannot point the Configuration at the local registry")
			}
		}
	}

	for _, pkg := range []struct{ kind, name string }{
		{kindConfiguration, ConfigurationName},
		{kindProvider, providerName},
		{kindFunction, FunctionName},
	} {
		if err := wait(ctx, 3*time.Minute, pkg.kind+" "+pkg.name+" installed", func() (bool, string, error) {
			return s.packageInstalled(ctx, pkg.kind, pkg.name)
		}); err != nil {
			return err
		}
	}
	if err := wait(ctx, time.Minute, "function-proxyfleet serving Crossplane", func() (bool, string, error) {
		return s.functionReady(ctx)
	}); err != nil {
		return err
	}
	return s.waitEstablished(ctx, 2*time.Minute, fleetv1alpha1.ProxyFleetResource+"."+fleetv1alpha1.Group, "proxies.egress.crawl.example.com", "providerconfigs.egress.crawl.example.com")
}

// waitEstablished waits up to timeout for each CRD named to be established
// (served): a package's revision may be healthy before its kinds are.
func (s *Stack) waitEstablished(ctx context.Context, timeout time.Duration, crds ...string) error {
	for _, crd := range crds {
		if err := wait(ctx, timeout, "CRD "+crd+" established", func() (bool, string, error) {
			c := &extv1.CustomResourceDefinition{}
			if err := s.Client.Get(ctx, types.NamespacedName{Name: crd}, c); err != nil {
				return false, err.Error(), nil
			}
			for _, cond := range c.Status.Conditions {
				if cond.Type == extv1.Established && cond.Status == extv1.ConditionTrue {
					return true, "", nil
				}
			}
			return false, "not established", nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// tlsServerSecret names the Secret holding a package's server certificate,
// as Crossplane's Deployment runtime would.
func tlsServerSecret(pkg string) string { return pkg + "-tls-server" }

// issueServerSecret issues a server certificate for a package from the CA
// Crossplane trusts and keeps it in the package's TLS server Secret, which
// the package revision names in its status.
func (s *Stack) issueServerSecret(ctx context.Context, pkg string) (*corev1.Secret, error) {
	ca := &corev1.Secret{}
	if err := s.Client.Get(ctx, types.NamespacedName{Namespace: crossplaneNamespace, Name: caSecret}, ca); err != nil {
		return nil, errors.Wrap(err, "cannot get Crossplane's CA")
	}
	auth, err := loadAuthority(ca.Data["tls.crt"], ca.Data["tls.key"])
	if err != nil {
		return nil, err
	}
	crt, key, err := auth.issue(pkg)
	if err != nil {
		return nil, err
	}
	sec := &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Namespace: crossplaneNamespace, Name: tlsServerSecret(pkg)},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{"tls.crt": crt, "tls.key": key, caFile: auth.certPEM},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(sec)
	if err != nil {
		return nil, errors.Wrap(err, "cannot convert the Secret")
	}
	return sec, errors.Wrapf(s.apply(ctx, &unstructured.Unstructured{Object: obj}), "cannot apply Secret %s", sec.Name)
}

// functionRuntime is a function-proxyfleet process serving one package
// version: what that version's FunctionRevision points at.
type functionRuntime struct {
	endpoint string
	proc     *process
}

// functionPorts names the gRPC and metrics ports of the function serving
// version: PackageVersion keeps the names make run has always saved.
func functionPorts(version string) [2]string {
	return [2]string{"function" + versionSuffix(version), "function-metrics" + versionSuffix(version)}
}

// versionSuffix tells apart what a function process of another release
// than this checkout's has of its own (ports, certificates, log): "-" and
// the version, or nothing for this checkout's, whose names stay as make
// run has always had them.
func versionSuffix(version string) string {
	if version == PackageVersion || version == "" {
		return ""
	}
	return "-" + version
}

// functionVersion is the newest version a function process serves.
func (s *Stack) functionVersion() string {
	s.fnMu.Lock()
	defer s.fnMu.Unlock()
	return s.fnVersion
}

// functionFor is the process serving version or, for a version none
// serves (a revision a developer pointed elsewhere), the newest; nil
// before any runs.
func (s *Stack) functionFor(version string) *functionRuntime {
	s.fnMu.Lock()
	defer s.fnMu.Unlock()
	if fn, ok := s.functions[version]; ok {
		return fn
	}
	return s.functions[s.fnVersion]
}

// startFunction runs function-proxyfleet for PackageVersion, then starts
// acting as the External package runtime.
func (s *Stack) startFunction(ctx context.Context) error {
	if err := s.runFunction(ctx, s.opts.Function, PackageVersion); err != nil {
		return err
	}
	return s.startExternalRuntime(ctx)
}

// runFunction runs bin as function-proxyfleet of a package version, with
// a server certificate issued from the CA Crossplane trusts (which also
// signed the client certificate Crossplane presents, and the function
// checks); the external runtime points that version's FunctionRevision at
// it.
func (s *Stack) runFunction(ctx context.Context, bin, version string) error {
	sec, err := s.issueServerSecret(ctx, FunctionName)
	if err != nil {
		return err
	}
	dir := s.path("function-tls" + versionSuffix(version))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return errors.Wrap(err, "cannot create the function's certificate folder")
	}
	for f, b := range sec.Data {
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			return errors.Wrapf(err, "cannot write %s", f)
		}
	}
	names := functionPorts(version)
	ports, err := s.ports(names[0], names[1])
	if err != nil {
		return err
	}
	grpcPort, metrics := ports[0], ports[1]
	endpoint := fmt.Sprintf("127.0.0.1:%d", grpcPort)
	p, err := s.start(binFunction+versionSuffix(version), bin, []string{
		"--tls-certs-dir=" + dir, "--address=" + endpoint, fmt.Sprintf("--metrics-address=127.0.0.1:%d", metrics),
	})
	if err != nil {
		return err
	}
	if err := waitTCP(ctx, p, endpoint, 30*time.Second); err != nil {
		return err
	}
	s.fnMu.Lock()
	defer s.fnMu.Unlock()
	if s.functions == nil {
		s.functions = map[string]*functionRuntime{}
	}
	s.functions[version] = &functionRuntime{endpoint: endpoint, proc: p}
	s.fnVersion = version
	return nil
}

// startExternalRuntime issues the provider's TLS server Secret (the
// function's was issued for its process) and keeps the package revisions'
// status as a runtime would, every second until ctx ends.
func (s *Stack) startExternalRuntime(ctx context.Context) error {
	if _, err := s.issueServerSecret(ctx, providerName); err != nil {
		return err
	}
	go func() {
		for {
			if err := s.externalRuntime(ctx); err != nil && ctx.Err() == nil {
				s.Logf("  external runtime: %v", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return nil
}

// externalRuntime does for the package revisions what Crossplane's
// Deployment runtime would, except running anything: it names each
// revision's TLS server Secret (Crossplane waits for it before it installs
// the package's objects), points an active FunctionRevision at the
// function process of its package's version, and reports whether the
// local process of an active revision runs, as RuntimeHealthy, which the
// package's Healthy follows.
func (s *Stack) externalRuntime(ctx context.Context) error {
	for _, kind := range []struct{ list, pkg string }{
		{"FunctionRevisionList", FunctionName},
		{"ProviderRevisionList", providerName},
	} {
		l, err := s.revisions(ctx, kind.list, kind.pkg)
		if err != nil {
			return err
		}
		for i := range l.Items {
			r := &l.Items[i]
			before := r.DeepCopy()
			_ = unstructured.SetNestedField(r.Object, tlsServerSecret(kind.pkg), "status", "tlsServerSecretName")
			if active, _, _ := unstructured.NestedString(r.Object, "spec", "desiredState"); active == revisionActive {
				proc := s.providerProc.Load()
				if kind.pkg == FunctionName {
					image, _, _ := unstructured.NestedString(r.Object, "spec", "image")
					proc = nil
					if fn := s.functionFor(tagOf(image)); fn != nil {
						proc = fn.proc
						_ = unstructured.SetNestedField(r.Object, fn.endpoint, "status", "endpoint")
					}
				}
				setCondition(r, runtimeHealth(proc))
			}
			if equality.Semantic.DeepEqual(before.Object, r.Object) {
				continue
			}
			// An update, not a patch: it fails on a conflict with Crossplane's
			// own status writes instead of undoing them, and is retried.
			if err := s.Client.Status().Update(ctx, r); err != nil && !kerrors.IsConflict(err) {
				return errors.Wrapf(err, "cannot update the status of %s", r.GetName())
			}
		}
	}
	return nil
}

// tagOf is the tag of a package reference: v0.1.0 of
// host:port/kacerr/function-proxyfleet:v0.1.0.
func tagOf(ref string) string {
	if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
		return ref[i+1:]
	}
	return ""
}

// runtimeHealth is the RuntimeHealthy condition of a package whose runtime
// is the local process p (nil: not started yet).
func runtimeHealth(p *process) map[string]any {
	c := map[string]any{"type": "RuntimeHealthy", "status": condTrue, "reason": "HealthyPackageRevision",
		"message": "runs as a local process (External package runtime)"}
	if p == nil {
		c["status"], c["reason"], c["message"] = "Unknown", "UnknownPackageRevisionHealth", "the local process has not started yet"
		return c
	}
	if done, err := p.exited(); done {
		c["status"], c["reason"], c["message"] = "False", "UnhealthyPackageRevision", fmt.Sprintf("the local process exited (%v); see its log", err)
	}
	return c
}

// setCondition sets a condition on an unstructured object's status, keeping
// its lastTransitionTime unless its status changes.
func setCondition(u *unstructured.Unstructured, c map[string]any) {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for i, x := range conds {
		old, _ := x.(map[string]any)
		if old["type"] != c["type"] {
			continue
		}
		c["lastTransitionTime"] = old["lastTransitionTime"]
		if old["status"] != c["status"] || c["lastTransitionTime"] == nil {
			c["lastTransitionTime"] = time.Now().UTC().Format(time.RFC3339)
		}
		conds[i] = c
		_ = unstructured.SetNestedSlice(u.Object, conds, "status", "conditions")
		return
	}
	c["lastTransitionTime"] = time.Now().UTC().Format(time.RFC3339)
	_ = unstructured.SetNestedSlice(u.Object, append(conds, c), "status", "conditions")
}

// revisions lists the revisions of one package; list is the kind of the
// list, FunctionRevisionList or ProviderRevisionList.
func (s *Stack) revisions(ctx context.Context, list, pkg string) (*unstructured.UnstructuredList, error) {
	l := &unstructured.UnstructuredList{}
	l.SetAPIVersion("pkg.crossplane.io/v1")
	l.SetKind(list)
	err := s.Client.List(ctx, l, client.MatchingLabels{"pkg.crossplane.io/package": pkg})
	return l, errors.Wrapf(err, "cannot list %s", list)
}

// functionReady reports whether the active FunctionRevision points at the
// function and is healthy.
func (s *Stack) functionReady(ctx context.Context) (bool, string, error) {
	l, err := s.revisions(ctx, "FunctionRevisionList", FunctionName)
	if err != nil {
		return false, err.Error(), nil
	}
	for _, r := range l.Items {
		if state, _, _ := unstructured.NestedString(r.Object, "spec", "desiredState"); state != revisionActive {
			continue
		}
		if ep, _, _ := unstructured.NestedString(r.Object, "status", "endpoint"); ep == "" {
			return false, "active FunctionRevision " + r.GetName() + " has no endpoint yet", nil
		}
		return true, "", nil
	}
	return false, "no active FunctionRevision yet", nil
}
