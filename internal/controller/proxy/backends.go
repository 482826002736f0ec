package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"google.golang.org/api/option"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	awsbackend "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/aws"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/kubernetes"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/local"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
)

// BackendsConfig is what NewBackends builds Backends from.
type BackendsConfig struct {
	// Kube reaches the cluster the provider runs in.
	Kube client.Client
	// Config is the provider's own rest config, for in-cluster identity.
	Config *rest.Config
	// ClusterID is stamped on every instance.
	ClusterID string
	// StateDir is where local proxies live when a ProviderConfig names no
	// state dir.
	StateDir string
	// RestartDelay is how long a dead local Squid stays down before its
	// supervisor restarts it; zero means the local backend's default.
	RestartDelay time.Duration
	// GCPClientOptions are added to every Compute API client, after the
	// credentials; tests point them at a fake of the API.
	GCPClientOptions []option.ClientOption
	// GCPOperationTimeout bounds how long a GCP Create waits for its
	// insert operations; zero means the backend's default.
	GCPOperationTimeout time.Duration
	// AWSEndpoint replaces EC2's regional endpoint; tests point it at a
	// fake of the API. AWSMaxAttempts bounds the SDK's retries (zero: its
	// default).
	AWSEndpoint    string
	AWSMaxAttempts int
	// AWSListingMaxAge is how old the shared listing of a region's
	// instances may be when an observation answers from it (zero: the
	// backend's default, 10 s).
	AWSListingMaxAge time.Duration
	// RetireAfter is how long a replaced backend is kept open for those
	// still using it; zero means DefaultRetireAfter.
	RetireAfter time.Duration
	// Logger for backends.
	Logger logging.Logger
}

// Backends builds, and keeps, the backend of each configuration. Local
// backends supervise processes, so there is exactly one per state dir for
// the life of the provider; clients of other clusters are reused until their
// configuration changes. Build them with NewBackends.
type Backends struct {
	BackendsConfig

	mu    sync.Mutex
	local map[string]*local.Backend
	// remote holds the backends that are API clients (pods, VMs), by
	// configuration UID; each with the version of the configuration and of
	// its credentials Secret it was built from.
	remote map[types.UID]remoteBackend
	// retired counts replaced backends closed.
	retired int
}

// NewBackends builds Backends, their zero settings taking their defaults.
func NewBackends(cfg BackendsConfig) *Backends {
	if cfg.RetireAfter <= 0 {
		cfg.RetireAfter = DefaultRetireAfter
	}
	return &Backends{BackendsConfig: cfg, local: map[string]*local.Backend{}, remote: map[types.UID]remoteBackend{}}
}

type remoteBackend struct {
	version string
	backend backend.Backend
}

// Clients returns how many API-client backends are live.
func (b *Backends) Clients() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.remote)
}

// cached returns pc's backend if it was built from pc's current version
// and credentials; a backend built from an older one is closed and
// forgotten. The version is the configuration's generation, which status
// writes (status.users) leave alone, and its Secret's resourceVersion, so a
// rotated key is picked up.
func (b *Backends) cached(ctx context.Context, pc *config, sel *xpv2.CommonCredentialSelectors) (backend.Backend, string) {
	version := pc.Version
	if sel != nil && sel.SecretRef != nil {
		s := &corev1.Secret{}
		ns := sel.SecretRef.Namespace
		if pc.Namespace != "" {
			ns = pc.Namespace
		}
		if err := b.Kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: sel.SecretRef.Name}, s); err != nil {
			// A Secret that cannot be read now changes nothing: the
			// client built from it goes on, and building a new one
			// reports the error.
			if old, ok := b.remote[pc.UID]; ok && strings.HasPrefix(old.version, version+"/") {
				return old.backend, old.version
			}
		} else {
			version += "/" + s.ResourceVersion
		}
	}
	old, ok := b.remote[pc.UID]
	if ok && old.version == version {
		return old.backend, version
	}
	if ok {
		b.retire(old.backend)
		delete(b.remote, pc.UID)
	}
	return nil, version
}

// retire closes a replaced backend once nobody can be using it any more:
// reconciles and orphan collection that took it before it was replaced
// run at most a reconcile's deadline (its bounded waits included), and a
// client closed under them would fail, or worse, mid-create.
func (b *Backends) retire(old backend.Backend) {
	c, ok := old.(io.Closer)
	if !ok {
		return
	}
	time.AfterFunc(b.RetireAfter, func() {
		_ = c.Close()
		b.mu.Lock()
		b.retired++
		b.mu.Unlock()
	})
}

// DefaultRetireAfter is well past the reconcile deadline (1 minute) and an
// orphan collection pass.
const DefaultRetireAfter = 10 * time.Minute

// Retired returns how many replaced backends were closed.
func (b *Backends) Retired() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.retired
}

// prune retires the backends of configurations that no longer exist.
func (b *Backends) prune(live map[types.UID]bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for uid, rb := range b.remote {
		if !live[uid] {
			b.retire(rb.backend)
			delete(b.remote, uid)
		}
	}
}

// For returns pc's backend.
func (b *Backends) For(ctx context.Context, pc *config) (backend.Backend, error) {
	if err := tenantConfig(pc); err != nil {
		return nil, backend.Wrap(backend.ClassPermanent, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch pc.Spec.Backend {
	case v1alpha1.BackendLocal:
		cfg := local.Config{StateDir: b.StateDir, ClusterID: b.ClusterID, RestartDelay: b.RestartDelay, Logger: b.Logger}
		if l := pc.Spec.Local; l != nil {
			cfg.SquidPath, cfg.PortRange = l.SquidPath, l.PortRange
			if l.StateDir != "" {
				cfg.StateDir = l.StateDir
			}
		}
		if cfg.StateDir == "" {
			return nil, backend.Errorf(backend.ClassPermanent, "no state dir: set spec.local.stateDir or start the provider with --state-dir")
		}
		cfg.StateDir = filepath.Clean(cfg.StateDir)
		if lb, ok := b.local[cfg.StateDir]; ok {
			// One backend supervises a state dir's processes; the
			// platform's changed binary or port range is applied to it,
			// not ignored until the provider restarts. Only a
			// ClusterProviderConfig that names them does: a tenant's
			// ProviderConfig (which may not set them) sharing the dir
			// must not reset them.
			if pc.Kind == v1alpha1.ClusterProviderConfigKind && pc.Spec.Local != nil {
				if err := lb.Reconfigure(cfg.SquidPath, cfg.PortRange); err != nil {
					return nil, err
				}
			}
			return lb, nil
		}
		lb, err := local.New(cfg)
		if err != nil {
			return nil, err
		}
		b.local[cfg.StateDir] = lb
		return lb, nil
	case v1alpha1.BackendKubernetes:
		var sel *xpv2.CommonCredentialSelectors
		if k := pc.Spec.Kubernetes; k != nil && k.Credentials != nil && k.Credentials.Source == xpv2.CredentialsSourceSecret {
			sel = &k.Credentials.CommonCredentialSelectors
		}
		kb, version := b.cached(ctx, pc, sel)
		if kb != nil {
			return kb, nil
		}
		c, err := b.kubeClient(ctx, pc)
		if err != nil {
			return nil, err
		}
		kb = kubernetes.New(kubernetes.Config{Client: c, ClusterID: b.ClusterID})
		b.remote[pc.UID] = remoteBackend{version: version, backend: kb}
		return kb, nil
	case v1alpha1.BackendGCP:
		return b.gcpBackend(ctx, pc)
	case v1alpha1.BackendAWS:
		return b.awsBackend(ctx, pc)
	default:
		return nil, backend.Errorf(backend.ClassPermanent, "the %s backend is not available in this provider version", pc.Spec.Backend)
	}
}

// gcpBackend returns the GCP backend of pc, made once per configuration
// version. The caller holds b.mu.
func (b *Backends) gcpBackend(ctx context.Context, pc *config) (backend.Backend, error) {
	g := pc.Spec.GCP
	if g == nil {
		return nil, backend.Errorf(backend.ClassPermanent, "%s %s has no gcp settings: set spec.gcp.project and spec.gcp.credentials", pc.Kind, pc.Name)
	}
	return b.cloudBackend(ctx, pc, g.Credentials.Source, g.Credentials.CommonCredentialSelectors, "the service-account key", func(key []byte) (backend.Backend, error) {
		var opts []option.ClientOption
		if key != nil {
			o, err := gcp.ServiceAccountKey(key, pc.Namespace != "")
			if err != nil {
				return nil, backend.Wrap(backend.ClassPermanent, errors.Wrapf(err, "%s %s", pc.Kind, pc.Name))
			}
			opts = append(opts, o)
		}
		opts = append(opts, b.GCPClientOptions...)
		return gcp.New(ctx, gcp.Config{Project: g.Project, ClusterID: b.ClusterID, ClientOptions: opts, OperationTimeout: b.GCPOperationTimeout})
	})
}

// cloudBackend returns the backend of a cloud VM configuration pc, made
// once per configuration version (which covers its credentials Secret's):
// made by build from the credentials read from their Secret (what names
// them in an error), or from nil when they are not a Secret's (the pod's
// own identity). The caller holds b.mu.
func (b *Backends) cloudBackend(ctx context.Context, pc *config, source xpv2.CredentialsSource, sel xpv2.CommonCredentialSelectors, what string, build func(secret []byte) (backend.Backend, error)) (backend.Backend, error) {
	var secret *xpv2.CommonCredentialSelectors
	if source == xpv2.CredentialsSourceSecret {
		secret = &sel
	}
	cached, version := b.cached(ctx, pc, secret)
	if cached != nil {
		return cached, nil
	}
	var creds []byte
	if secret != nil {
		var err error
		if creds, err = b.credentials(ctx, pc, source, sel); err != nil {
			return nil, errors.Wrapf(err, "cannot read %s", what)
		}
		if len(creds) == 0 {
			// A Secret without the key reads as nothing, which build
			// would take for the pod's own identity: never for a
			// configuration that names a Secret.
			return nil, backend.Errorf(backend.ClassPermanent, "%s %s: %s", pc.Kind, pc.Name, errMissingKey(sel, what))
		}
	}
	made, err := build(creds)
	if err != nil {
		return nil, err
	}
	b.remote[pc.UID] = remoteBackend{version: version, backend: made}
	return made, nil
}

// credentials reads a configuration's credentials from their source; a
// namespaced ProviderConfig's Secret is always of its own namespace,
// whatever its selector says.
func (b *Backends) credentials(ctx context.Context, pc *config, source xpv2.CredentialsSource, sel xpv2.CommonCredentialSelectors) ([]byte, error) {
	if sel.SecretRef != nil && pc.Namespace != "" {
		sel.SecretRef = sel.SecretRef.DeepCopy()
		sel.SecretRef.Namespace = pc.Namespace
	}
	return resource.CommonCredentialExtractor(ctx, source, b.Kube, sel)
}

// errMissingKey says which key of which Secret should hold what.
func errMissingKey(sel xpv2.CommonCredentialSelectors, what string) string {
	if sel.SecretRef == nil {
		return "the credentials name no Secret"
	}
	return fmt.Sprintf("the Secret %s has no key %q, or it is empty: it must hold %s", sel.SecretRef.Name, sel.SecretRef.Key, what)
}

// awsBackend returns the AWS backend of pc, made once per configuration
// version. The caller holds b.mu.
func (b *Backends) awsBackend(ctx context.Context, pc *config) (backend.Backend, error) {
	a := pc.Spec.AWS
	if a == nil {
		return nil, backend.Errorf(backend.ClassPermanent, "%s %s has no aws settings: set spec.aws.region and spec.aws.credentials", pc.Kind, pc.Name)
	}
	return b.cloudBackend(ctx, pc, a.Credentials.Source, a.Credentials.CommonCredentialSelectors, "the AWS access key", func(file []byte) (backend.Backend, error) {
		cfg := awsbackend.Config{Region: a.Region, ClusterID: b.ClusterID, Endpoint: b.AWSEndpoint, MaxAttempts: b.AWSMaxAttempts, ListingMaxAge: b.AWSListingMaxAge, Namespace: pc.Namespace}
		if file != nil {
			creds, err := awsbackend.SharedCredentials(file)
			if err != nil {
				return nil, backend.Wrap(backend.ClassPermanent, errors.Wrapf(err, "%s %s", pc.Kind, pc.Name))
			}
			cfg.Credentials = creds
		}
		return awsbackend.New(ctx, cfg)
	})
}

// kubeClient returns an uncached client for the pods' cluster: proxy pods
// are read one at a time, which does not warrant a cluster-wide pod cache.
func (b *Backends) kubeClient(ctx context.Context, pc *config) (client.Client, error) {
	cfg := b.Config
	if k := pc.Spec.Kubernetes; k != nil && k.Credentials != nil && k.Credentials.Source == xpv2.CredentialsSourceSecret {
		sel := k.Credentials.CommonCredentialSelectors
		if sel.SecretRef != nil && pc.Namespace != "" {
			// A namespaced ProviderConfig may only read Secrets of its own
			// namespace.
			sel.SecretRef = sel.SecretRef.DeepCopy()
			sel.SecretRef.Namespace = pc.Namespace
		}
		kc, err := resource.CommonCredentialExtractor(ctx, k.Credentials.Source, b.Kube, sel)
		if err != nil {
			return nil, errors.Wrap(err, "cannot read kubeconfig")
		}
		if pc.Namespace != "" {
			// A tenant's kubeconfig must not make the provider run a
			// program, read its files or send its token anywhere.
			if err := inlineKubeconfig(kc); err != nil {
				return nil, backend.Wrap(backend.ClassPermanent, errors.Wrapf(err, "%s %s/%s", pc.Kind, pc.Namespace, pc.Name))
			}
		}
		if cfg, err = clientcmd.RESTConfigFromKubeConfig(kc); err != nil {
			return nil, backend.Wrap(backend.ClassPermanent, errors.Wrap(err, "cannot parse kubeconfig"))
		}
		if pc.Namespace != "" {
			cfg.ExecProvider, cfg.AuthProvider, cfg.BearerTokenFile = nil, nil, ""
			if u, err := url.Parse(cfg.Host); err != nil || u.Scheme != "https" {
				return nil, backend.Errorf(backend.ClassPermanent, "%s %s/%s: the kubeconfig's server %q must be an https URL", pc.Kind, pc.Namespace, pc.Name, cfg.Host)
			}
			// Checked at every connection, after DNS: a name that
			// resolves to the provider's host or a metadata server
			// later is refused then.
			cfg.Dial = (&net.Dialer{Timeout: 30 * time.Second, Control: refuseHostAndMetadata}).DialContext
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: b.Kube.Scheme()})
	return c, errors.Wrap(err, "cannot create client for the pod cluster")
}

// Close stops supervising local processes without stopping them, so the
// next provider re-adopts them.
func (b *Backends) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, lb := range b.local {
		lb.Close()
	}
}

// refuseHostAndMetadata refuses a connection to the provider's own host,
// link-local addresses or a cloud metadata server, where a tenant's
// kubeconfig could otherwise point the provider.
func refuseHostAndMetadata(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return errors.Errorf("cannot tell where %s is", address)
	}
	if squid.HostOrMetadata(ap.Addr()) {
		return errors.Errorf("a namespaced ProviderConfig's kubeconfig may not reach %s: it is the provider's host, link-local or a metadata server", ap.Addr())
	}
	return nil
}

// inlineKubeconfig accepts a kubeconfig that carries everything inline:
// one cluster and one user, authenticated by a token, a client certificate
// or a password given in the file. Exec and auth-provider plugins, token,
// certificate and CA files, and proxies are refused, since they would make
// the provider run a program, read its own files (its ServiceAccount
// token) or send requests where the kubeconfig's author chose.
func inlineKubeconfig(raw []byte) error {
	c, err := clientcmd.Load(raw)
	if err != nil {
		return errors.Wrap(err, "cannot parse kubeconfig")
	}
	for name, u := range c.AuthInfos {
		switch {
		case u.Exec != nil:
			return errors.Errorf("kubeconfig user %q runs an exec plugin: a namespaced ProviderConfig's kubeconfig must carry its credentials inline", name)
		case u.AuthProvider != nil:
			return errors.Errorf("kubeconfig user %q uses an auth provider plugin: a namespaced ProviderConfig's kubeconfig must carry its credentials inline", name)
		case u.TokenFile != "" || u.ClientCertificate != "" || u.ClientKey != "":
			return errors.Errorf("kubeconfig user %q names files on the provider's host: a namespaced ProviderConfig's kubeconfig must carry its credentials inline", name)
		case u.Impersonate != "" || len(u.ImpersonateGroups) > 0 || u.ImpersonateUID != "":
			return errors.Errorf("kubeconfig user %q impersonates: a namespaced ProviderConfig's kubeconfig acts as itself", name)
		}
	}
	for name, cl := range c.Clusters {
		if cl.CertificateAuthority != "" || cl.ProxyURL != "" {
			return errors.Errorf("kubeconfig cluster %q names a CA file or a proxy: a namespaced ProviderConfig's kubeconfig must carry its CA inline and connect directly", name)
		}
	}
	return nil
}
