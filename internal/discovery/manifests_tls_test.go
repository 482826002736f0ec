package discovery_test

import (
	"path"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestManifestsServeTLS: cluster/discovery serves the API over HTTPS only,
// with the certificate and key of the Secret egress-discovery-tls mounted
// read-only, on a port named https that the Service targets, the gateway
// with the same certificate on the port named gateway, and keeps the
// container's root filesystem read-only. It only renders the manifests, so
// it needs no apiserver; TestManifests applies them.
func TestManifestsServeTLS(t *testing.T) {
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var d *appsv1.Deployment
	var svc *corev1.Service
	for _, u := range testbed.Kustomize(t, &testbed.Env{Root: root}, "discovery") {
		var into any
		switch u.GetKind() {
		case "Deployment":
			d = &appsv1.Deployment{}
			into = d
		case "Service":
			svc = &corev1.Service{}
			into = svc
		default:
			continue
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
			t.Fatal(err)
		}
	}
	if d == nil || svc == nil {
		t.Fatal("cluster/discovery must render a Deployment and a Service")
	}
	// A gateway session is a replica's: one client's connections must
	// reach one replica.
	if svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP {
		t.Errorf("the Service's sessionAffinity is %q, want ClientIP for gateway sessions", svc.Spec.SessionAffinity)
	}
	c := d.Spec.Template.Spec.Containers[0]
	flags := map[string]string{}
	for _, a := range c.Args {
		if k, v, ok := strings.Cut(a, "="); ok {
			flags[k] = v
		}
	}

	// Both files come from one read-only mount of the Secret.
	certFile, keyFile := flags["--tls-cert-file"], flags["--tls-key-file"]
	if path.Base(certFile) != corev1.TLSCertKey || path.Base(keyFile) != corev1.TLSPrivateKeyKey || path.Dir(certFile) != path.Dir(keyFile) {
		t.Fatalf("want --tls-cert-file and --tls-key-file naming %s and %s of one folder, got %q and %q", corev1.TLSCertKey, corev1.TLSPrivateKeyKey, certFile, keyFile)
	}
	var mount *corev1.VolumeMount
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == path.Dir(certFile) {
			mount = &c.VolumeMounts[i]
		}
	}
	if mount == nil || !mount.ReadOnly {
		t.Fatalf("want a read-only mount at %s, got %+v", path.Dir(certFile), c.VolumeMounts)
	}
	var secret *corev1.SecretVolumeSource
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == mount.Name {
			secret = v.Secret
		}
	}
	if secret == nil || secret.SecretName != "egress-discovery-tls" || len(secret.Items) != 0 {
		t.Errorf("the mount %s must be the whole Secret egress-discovery-tls, got %+v", mount.Name, secret)
	}

	// The API listens on the port named https, which the Service targets;
	// nothing is served in the clear.
	var https *corev1.ContainerPort
	for i, p := range c.Ports {
		if p.Name == "https" {
			https = &c.Ports[i]
		}
		if p.Name == "http" {
			t.Errorf("the container must not name a port http: %+v", c.Ports)
		}
	}
	if https == nil || !strings.HasSuffix(flags["--address"], ":"+strconv.Itoa(int(https.ContainerPort))) {
		t.Errorf("want --address on the port named https, got %q and %+v", flags["--address"], c.Ports)
	}
	// The gateway serves TLS too: the port named gateway, without
	// --gateway-plain-http.
	var gateway *corev1.ContainerPort
	for i, p := range c.Ports {
		if p.Name == "gateway" {
			gateway = &c.Ports[i]
		}
	}
	if gateway == nil || !strings.HasSuffix(flags["--gateway-address"], ":"+strconv.Itoa(int(gateway.ContainerPort))) {
		t.Errorf("want --gateway-address on the port named gateway, got %q and %+v", flags["--gateway-address"], c.Ports)
	}
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--gateway-plain-http") {
			t.Errorf("the gateway must serve TLS, got %s", a)
		}
	}
	if len(svc.Spec.Ports) != 2 {
		t.Errorf("the Service must serve the ports named https and gateway only, got %+v", svc.Spec.Ports)
	}
	for _, p := range svc.Spec.Ports {
		if (p.Name != "https" && p.Name != "gateway") || p.TargetPort.String() != p.Name {
			t.Errorf("the Service must serve the ports named https and gateway only, got %+v", svc.Spec.Ports)
		}
	}

	if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("the container keeps a read-only root filesystem and no privilege escalation: %+v", sc)
	}
}
