package devenv

import (
	"context"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/netns"
)

// startClusterRegistry serves the registry on the node's address, where
// containerd (through its certs.d hosts) and Crossplane's pod pull from,
// and pushes the packages and the images under the names the tarballs
// carry, moved from the published registry to this one.
func (s *Cluster) startClusterRegistry(ctx context.Context) error {
	port, err := s.port("registry-push")
	if err != nil {
		return err
	}
	// Pushes go to loopback; the node's address serves pulls only.
	h, err := s.serveRegistry(fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return err
	}
	if err := s.serve("registry (pulls)", registryHost(), readOnly(h)); err != nil {
		return err
	}
	s.Registry = registryHost()
	if err := s.pushPackages(ctx, s.opts.Packages, PackageVersion); err != nil {
		return err
	}
	for _, im := range ClusterImages {
		m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(s.image(im)) })
		if err != nil || len(m) != 1 || len(m[0].RepoTags) != 1 {
			return errors.Errorf("cannot read the tag of %s: %v", s.image(im), err)
		}
		tag := m[0].RepoTags[0]
		if !strings.HasPrefix(tag, upstreamHost+"/") {
			return errors.Errorf("image %s is not under %s", tag, upstreamHost)
		}
		if err := s.push(ctx, s.image(im), s.pushTo+strings.TrimPrefix(tag, upstreamHost)); err != nil {
			return err
		}
	}
	return nil
}

// startDNS applies CoreDNS and waits for it to serve.
func (s *Cluster) startDNS(ctx context.Context) error {
	if err := s.kubectl(ctx, "apply", "-f", filepath.Join(s.opts.Root, "cluster", "node", "coredns.yaml")); err != nil {
		return err
	}
	return s.waitDeployment(ctx, "kube-system", "coredns", 3*time.Minute)
}

// TargetURL of a cluster is the test target host's IP echo.
func targetHostURL() string { return fmt.Sprintf("https://%s:%d/ip", TargetHostIP, TargetHostPort) }

// startTargetHost makes the test target host: a network namespace with one
// veth on the pod network at TargetHostIP and no default route, serving an
// HTTPS IP echo (in this process) with a certificate from a CA made for
// this run. The CA is written to TargetCA and, for the provider's probes,
// to the ConfigMap egress-probe-ca in crossplane-system.
func (s *Cluster) startTargetHost(ctx context.Context) error {
	ns, veth := s.host.targetNetns, s.host.targetVeth
	for _, cmd := range []string{
		"netns add " + ns,
		"link add " + veth + " type veth peer name eth0 netns " + ns,
		"link set " + veth + " master " + s.host.bridge,
		"link set " + veth + " up",
		"-n " + ns + " addr add " + TargetHostIP + "/24 dev eth0",
		"-n " + ns + " link set lo up",
		"-n " + ns + " link set eth0 up",
	} {
		if err := ipCmd(strings.Fields(cmd)...); err != nil {
			return err
		}
	}
	ln, err := netns.Listen(s.host.targetNetns, fmt.Sprintf("%s:%d", TargetHostIP, TargetHostPort))
	if err != nil {
		return errors.Wrap(err, "cannot listen on the target host")
	}
	ca, err := s.serveEcho(ln, "egress-cluster target CA", pkix.Name{CommonName: "egress-target"}, []string{"egress-target"}, []net.IP{net.ParseIP(TargetHostIP)})
	if err != nil {
		return err
	}
	s.TargetURL = targetHostURL()
	if err := s.ensureNamespace(ctx, crossplaneNamespace); err != nil {
		return err
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: crossplaneNamespace, Name: "egress-probe-ca"},
		Data:       map[string]string{caFile: string(ca.certPEM)},
	}
	return errors.Wrap(s.Client.Create(ctx, cm), "cannot create the ConfigMap egress-probe-ca")
}

// startClusterCrossplane applies cluster/crossplane (core and the RBAC
// manager) and cluster/crossplane-rbac, and waits for both to run.
func (s *Cluster) startClusterCrossplane(ctx context.Context) error {
	for _, k := range []string{binCrossplane, "crossplane-rbac"} {
		if err := s.kubectl(ctx, "apply", "-k", filepath.Join(s.opts.Root, "cluster", k)); err != nil {
			return err
		}
	}
	for _, d := range []string{binCrossplane, "crossplane-rbac-manager"} {
		if err := s.waitDeployment(ctx, crossplaneNamespace, d, 5*time.Minute); err != nil {
			return err
		}
	}
	return nil
}

// installClusterConfiguration points Crossplane's pulls at the registry,
// applies the provider's RBAC and runtime config (cluster/node/provider),
// installs the Configuration with crossplane xpkg install, has the
// Provider Crossplane installs as its dependency take that runtime config,
// and waits for the provider's and the function's pods.
func (s *Cluster) installClusterConfiguration(ctx context.Context) error {
	if err := s.applyImageConfig(ctx); err != nil {
		return err
	}
	if err := s.kubectl(ctx, "apply", "-f", filepath.Join(s.opts.Root, "cluster", "provider-rbac", "admission.yaml")); err != nil {
		return err
	}
	if err := s.kubectl(ctx, "apply", "-k", filepath.Join(s.opts.Root, "cluster", "node", "provider")); err != nil {
		return err
	}
	if err := s.run(ctx, "crossplane-xpkg-install", s.bin(binCrossplane), "xpkg", "install", "configuration", s.ref("configuration-proxyfleet"), ConfigurationName); err != nil {
		return err
	}
	prov := &unstructured.Unstructured{}
	prov.SetAPIVersion("pkg.crossplane.io/v1")
	prov.SetKind(kindProvider)
	prov.SetName(providerName)
	// The Configuration may say Installed a moment before the package
	// manager has made the Provider it depends on: wait for both.
	if err := wait(ctx, 5*time.Minute, "Provider "+providerName+" created", func() (bool, string, error) {
		ok, why, err := s.packageInstalled(ctx, kindConfiguration, ConfigurationName)
		if err != nil || !ok {
			return false, "Configuration: " + why, err
		}
		if err := s.Client.Get(ctx, types.NamespacedName{Name: providerName}, prov); err != nil {
			return false, "Provider: " + err.Error(), client.IgnoreNotFound(err)
		}
		return true, "", nil
	}); err != nil {
		return err
	}
	patch := []byte(fmt.Sprintf(`{"spec":{"runtimeConfigRef":{"apiVersion":"pkg.crossplane.io/v1beta1","kind":"DeploymentRuntimeConfig","name":%q}}}`, providerRuntime))
	if err := s.Client.Patch(ctx, prov, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return errors.Wrap(err, "cannot point the Provider at the runtime config provider-egressproxy")
	}
	for _, pkg := range []struct{ kind, name string }{{kindProvider, providerName}, {kindFunction, FunctionName}} {
		if err := wait(ctx, 5*time.Minute, pkg.kind+" "+pkg.name+" healthy", func() (bool, string, error) {
			return s.packageIs(ctx, pkg.kind, pkg.name, "Installed", "Healthy")
		}); err != nil {
			return err
		}
	}
	return s.waitProviderPod(ctx)
}

// waitProviderPod waits until the provider's Deployment runs with the
// ServiceAccount of its runtime config, and is available.
func (s *Cluster) waitProviderPod(ctx context.Context) error {
	var name string
	if err := wait(ctx, 3*time.Minute, "the provider's Deployment on its runtime config", func() (bool, string, error) {
		l := &unstructured.UnstructuredList{}
		l.SetAPIVersion("apps/v1")
		l.SetKind("DeploymentList")
		if err := s.Client.List(ctx, l, client.InNamespace(crossplaneNamespace)); err != nil {
			return false, err.Error(), nil
		}
		// Crossplane names it after the active revision: <provider>-<hash>.
		for _, d := range l.Items {
			if !strings.HasPrefix(d.GetName(), providerName+"-") {
				continue
			}
			if sa, _, _ := unstructured.NestedString(d.Object, "spec", "template", "spec", "serviceAccountName"); sa == providerRuntime {
				name = d.GetName()
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("%d Deployments, none with ServiceAccount provider-egressproxy", len(l.Items)), nil
	}); err != nil {
		return err
	}
	return s.waitDeployment(ctx, crossplaneNamespace, name, 3*time.Minute)
}

// DiscoveryNamespace is where cluster/discovery runs egress-discovery.
const DiscoveryNamespace = "egress-system"

// startClusterDiscovery applies cluster/discovery with a TLS Secret issued
// by the cluster's CA (for its Service names and the node's address) and
// the NodePort of cluster/node, and waits for its replicas.
func (s *Cluster) startClusterDiscovery(ctx context.Context) error {
	if err := s.kubectl(ctx, "apply", "-k", filepath.Join(s.opts.Root, "cluster", "discovery")); err != nil {
		return err
	}
	crt, key, err := s.clusterCA.issueFor(pkix.Name{CommonName: binDiscovery}, []string{
		binDiscovery, "egress-discovery." + DiscoveryNamespace, "egress-discovery." + DiscoveryNamespace + ".svc",
		"egress-discovery." + DiscoveryNamespace + ".svc." + clusterDomain,
	}, []net.IP{net.ParseIP(NodeIP)})
	if err != nil {
		return err
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: DiscoveryNamespace, Name: "egress-discovery-tls"},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key},
	}
	if err := s.Client.Create(ctx, sec); err != nil && !kerrors.IsAlreadyExists(err) {
		return errors.Wrap(err, "cannot create discovery's TLS Secret")
	}
	if err := s.kubectl(ctx, "apply", "-f", filepath.Join(s.opts.Root, "cluster", "node", "discovery-nodeport.yaml")); err != nil {
		return err
	}
	s.DiscoveryURL = fmt.Sprintf("https://%s:%d", NodeIP, DiscoveryNodePort)
	s.GatewayAddress = fmt.Sprintf("%s:%d", NodeIP, GatewayNodePort)
	s.DiscoveryCA = s.ClusterCA()
	return s.waitDeployment(ctx, DiscoveryNamespace, binDiscovery, 3*time.Minute)
}
