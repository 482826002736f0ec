package devenv

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis"
)

// kubernetesServiceIP is the first address of ServiceCIDR, the apiserver's
// `kubernetes` Service.
const kubernetesServiceIP = "10.96.0.1"

// serviceAccountIssuer issues and is the audience of the cluster's tokens.
const serviceAccountIssuer = "https://kubernetes.default.svc." + clusterDomain

// clientCert is one identity of the cluster: a client certificate's CN is
// the user and O the groups.
type clientCert struct {
	file  string
	user  string
	group []string
}

// clusterIdentities are the control plane's and the node's identities,
// each with a kubeconfig beside its certificate.
var clusterIdentities = []clientCert{
	{"admin", "kubernetes-admin", []string{groupMasters}},
	{binKCM, "system:kube-controller-manager", nil},
	{binScheduler, "system:kube-scheduler", nil},
	{binKubeProxy, "system:kube-proxy", nil},
	// The Node authorizer and NodeRestriction know the kubelet by these.
	{binKubelet, "system:node:" + NodeName, []string{"system:nodes"}},
}

// issueClusterPKI makes the cluster's CA and every certificate and key:
// the apiserver's serving certificate (for its Service address and names
// too, as pods dial it there), the identities above, the apiserver's
// client certificate for the kubelet, and the service-account signing key.
func (s *Cluster) issueClusterPKI(_ context.Context) error {
	ca, err := newAuthority("egress-cluster CA")
	if err != nil {
		return err
	}
	s.clusterCA = ca
	dir := s.path("pki")
	write := func(name string, b []byte, mode os.FileMode) error {
		return errors.Wrapf(os.WriteFile(filepath.Join(dir, name), b, mode), "cannot write %s", name)
	}
	if err := write(caFile, ca.certPEM, 0o644); err != nil {
		return err
	}
	pair := func(name string, subject pkix.Name, names []string, ips []net.IP) error {
		crt, key, err := ca.issueFor(subject, names, ips)
		if err != nil {
			return err
		}
		if err := write(name+".crt", crt, 0o644); err != nil {
			return err
		}
		return write(name+".key", key, 0o600)
	}
	node := net.ParseIP(NodeIP)
	if err := pair("apiserver", pkix.Name{CommonName: binAPIServer},
		[]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc." + clusterDomain, localhost},
		[]net.IP{node, net.ParseIP(kubernetesServiceIP), net.IPv4(127, 0, 0, 1)}); err != nil {
		return err
	}
	// etcd serves TLS to clients with certificates of this CA only, the
	// apiserver's, so that no other user of this machine reaches it.
	if err := pair(binEtcd, pkix.Name{CommonName: binEtcd}, []string{localhost}, []net.IP{net.IPv4(127, 0, 0, 1)}); err != nil {
		return err
	}
	if err := pair("apiserver-etcd-client", pkix.Name{CommonName: "kube-apiserver-etcd-client"}, nil, nil); err != nil {
		return err
	}
	if err := pair("apiserver-kubelet-client", pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{groupMasters}}, nil, nil); err != nil {
		return err
	}
	for _, id := range clusterIdentities {
		var names []string
		var ips []net.IP
		if id.file == binKubelet {
			// Also the kubelet's serving certificate.
			names, ips = []string{NodeName}, []net.IP{node}
		}
		if err := pair(id.file, pkix.Name{CommonName: id.user, Organization: id.group}, names, ips); err != nil {
			return err
		}
		crt, _ := os.ReadFile(filepath.Join(dir, id.file+".crt"))
		key, _ := os.ReadFile(filepath.Join(dir, id.file+".key"))
		kc := clientcmdapi.NewConfig()
		kc.Clusters[clusterName] = &clientcmdapi.Cluster{Server: s.APIServerURL(), CertificateAuthorityData: ca.certPEM}
		kc.AuthInfos[id.user] = &clientcmdapi.AuthInfo{ClientCertificateData: crt, ClientKeyData: key}
		kc.Contexts[clusterName] = &clientcmdapi.Context{Cluster: clusterName, AuthInfo: id.user}
		kc.CurrentContext = clusterName
		if err := clientcmd.WriteToFile(*kc, filepath.Join(dir, id.file+".kubeconfig")); err != nil {
			return errors.Wrapf(err, "cannot write the kubeconfig of %s", id.user)
		}
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return errors.Wrap(err, "cannot generate the service-account key")
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return errors.Wrap(err, "cannot encode the service-account key")
	}
	if err := write("sa.key", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}), 0o600); err != nil {
		return err
	}
	if err := write("sa.pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
		return err
	}
	s.Kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	return nil
}

// APIServerURL is where the cluster's apiserver serves.
func (s *Cluster) APIServerURL() string { return fmt.Sprintf("https://%s:%d", NodeIP, APIServerPort) }

// ClusterCA is the PEM file of the cluster's CA, which signed the
// apiserver's and egress-discovery's certificates.
func (s *Cluster) ClusterCA() string { return s.path("pki", caFile) }

// startClusterControlPlane runs etcd on loopback and kube-apiserver on
// NodeIP, with Node and RBAC authorisation, NodeRestriction, service
// account tokens and the kubelet client certificate (kubectl logs and
// exec work).
func (s *Cluster) startClusterControlPlane(ctx context.Context) error {
	ports, err := s.ports("etcd-client", "etcd-peer")
	if err != nil {
		return err
	}
	pki := func(f string) string { return s.path("pki", f) }
	etcdURL := fmt.Sprintf("https://127.0.0.1:%d", ports[0])
	peerURL := fmt.Sprintf("https://127.0.0.1:%d", ports[1])
	etcd, err := s.start(binEtcd, s.bin(binEtcd), []string{
		"--name=egress-cluster",
		"--data-dir=" + s.path(binEtcd),
		"--listen-client-urls=" + etcdURL,
		"--advertise-client-urls=" + etcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=egress-cluster=" + peerURL,
		"--cert-file=" + pki("etcd.crt"), "--key-file=" + pki("etcd.key"),
		"--client-cert-auth", "--trusted-ca-file=" + pki(caFile),
		"--peer-cert-file=" + pki("etcd.crt"), "--peer-key-file=" + pki("etcd.key"),
		"--peer-client-cert-auth", "--peer-trusted-ca-file=" + pki(caFile),
		"--unsafe-no-fsync",
	})
	if err != nil {
		return err
	}
	if err := waitTCP(ctx, etcd, strings.TrimPrefix(etcdURL, "https://"), time.Minute); err != nil {
		return err
	}
	// Pods get the baseline Pod Security Standard unless their namespace
	// says otherwise, and warnings against restricted.
	admission := s.path("admission.yaml")
	if err := os.WriteFile(admission, []byte(`apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults:
      enforce: baseline
      enforce-version: latest
      audit: restricted
      audit-version: latest
      warn: restricted
      warn-version: latest
    exemptions: {}
`), 0o644); err != nil { //nolint:gosec // Not secret.
		return errors.Wrap(err, "cannot write the admission configuration")
	}
	api, err := s.start(binAPIServer, s.bin(binAPIServer), []string{
		"--etcd-servers=" + etcdURL,
		"--etcd-cafile=" + pki(caFile),
		"--etcd-certfile=" + pki("apiserver-etcd-client.crt"),
		"--etcd-keyfile=" + pki("apiserver-etcd-client.key"),
		"--admission-control-config-file=" + admission,
		"--advertise-address=" + NodeIP,
		"--bind-address=" + NodeIP,
		fmt.Sprintf("--secure-port=%d", APIServerPort),
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--client-ca-file=" + pki(caFile),
		"--tls-cert-file=" + pki("apiserver.crt"),
		"--tls-private-key-file=" + pki("apiserver.key"),
		"--kubelet-client-certificate=" + pki("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + pki("apiserver-kubelet-client.key"),
		"--kubelet-certificate-authority=" + pki(caFile),
		"--kubelet-preferred-address-types=InternalIP",
		"--service-account-issuer=" + serviceAccountIssuer,
		"--service-account-key-file=" + pki("sa.pub"),
		"--service-account-signing-key-file=" + pki("sa.key"),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=false",
		"--profiling=false",
	})
	if err != nil {
		return err
	}
	sch := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apis.AddToScheme, extv1.AddToScheme} {
		if err := add(sch); err != nil {
			return errors.Wrap(err, "cannot build the scheme")
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		return errors.Wrap(err, "cannot read the administrator's kubeconfig")
	}
	cfg.QPS, cfg.Burst = 200, 400
	s.Config = cfg
	if s.Client, err = client.New(cfg, client.Options{Scheme: sch}); err != nil {
		return errors.Wrap(err, "cannot create a client")
	}
	return wait(ctx, 2*time.Minute, "kube-apiserver ready", func() (bool, string, error) {
		if done, err := api.exited(); done {
			return false, "", errors.Errorf("kube-apiserver exited (%v); see logs/kube-apiserver.log", err)
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return false, "", errors.Wrap(err, "cannot create a clientset")
		}
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return false, err.Error() + " " + string(body), nil
		}
		return true, "", nil
	})
}

// startClusterControllers runs kube-controller-manager with its default
// controllers, each with its own service account (the token controller
// signs with the cluster's key), and kube-scheduler.
func (s *Cluster) startClusterControllers(ctx context.Context) error {
	ports, err := s.ports(binKCM, binScheduler)
	if err != nil {
		return err
	}
	pki := func(f string) string { return s.path("pki", f) }
	kcmConfig := pki(binKCM + ".kubeconfig")
	kcm, err := s.start(binKCM, s.bin(binKCM), append([]string{
		"--kubeconfig=" + kcmConfig,
		"--authentication-kubeconfig=" + kcmConfig,
		"--authorization-kubeconfig=" + kcmConfig,
		"--service-account-private-key-file=" + pki("sa.key"),
		"--root-ca-file=" + pki(caFile),
		"--use-service-account-credentials=true",
		"--service-cluster-ip-range=" + ServiceCIDR,
		fmt.Sprintf("--secure-port=%d", ports[0]),
	}, delegatedServing...))
	if err != nil {
		return err
	}
	schedConfig := pki(binScheduler + ".kubeconfig")
	sched, err := s.start(binScheduler, s.bin(binScheduler), append([]string{
		"--kubeconfig=" + schedConfig,
		"--authentication-kubeconfig=" + schedConfig,
		"--authorization-kubeconfig=" + schedConfig,
		fmt.Sprintf("--secure-port=%d", ports[1]),
	}, delegatedServing...))
	if err != nil {
		return err
	}
	if err := waitTCP(ctx, kcm, fmt.Sprintf("127.0.0.1:%d", ports[0]), time.Minute); err != nil {
		return err
	}
	return waitTCP(ctx, sched, fmt.Sprintf("127.0.0.1:%d", ports[1]), time.Minute)
}
