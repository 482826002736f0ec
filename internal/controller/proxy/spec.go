package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
)

// config is a resolved ProviderConfig or ClusterProviderConfig.
type config struct {
	Kind string
	Name string
	// Namespace is empty for a ClusterProviderConfig.
	Namespace string
	UID       types.UID
	// Version is the configuration's generation: it changes whenever the
	// spec does, and not with status writes.
	Version string
	Spec    v1alpha1.ProviderConfigSpec
}

// instanceRef locates a Proxy's instance. It needs no Secret, so a Proxy
// whose auth Secret is gone can still be observed and deleted.
func instanceRef(p *v1alpha1.Proxy, pc *config) backend.Ref {
	r := backend.Ref{Name: ownership.InstanceName(p.GetUID())}
	fp := p.Spec.ForProvider
	switch {
	case fp.Kubernetes != nil:
		r.Namespace = fp.Kubernetes.Namespace
		if r.Namespace == "" && pc.Spec.Kubernetes != nil {
			r.Namespace = pc.Spec.Kubernetes.Namespace
		}
		if r.Namespace == "" {
			r.Namespace = p.GetNamespace()
		}
	case fp.GCP != nil:
		r.Zone = fp.GCP.Zone
		r.NetworkProject = gcp.NetworkProject(fp.GCP.Network)
	case fp.AWS != nil:
		r.Zone = fp.AWS.Zone
	}
	return r
}

// Recorded instance references, as the provider writes them to
// status.atProvider.providerID: a GCP VM's projects/P/zones/Z/instances/N,
// a pod's NS/NAME, a local instance's local/NAME (local/PORT before
// instance names were recorded, which names no instance here).
var (
	recordedVM    = regexp.MustCompile(`^projects/([^/]+)/zones/([a-z0-9-]+)/instances/([a-z0-9-]+)$`)
	recordedPod   = regexp.MustCompile(`^([a-z0-9-]+)/([a-z0-9.-]+)$`)
	recordedLocal = regexp.MustCompile(`^local/(egress-[a-z2-7]{16})$`)
	// An EC2 instance is recorded by its zone and ID (aws:///ZONE/ID) and
	// found by its name tag, which is the Proxy's.
	recordedEC2 = regexp.MustCompile(`^aws:///([a-z0-9-]+)/(i-[0-9a-f]+)$`)
)

// parseRecorded reads a providerID of the Proxy's backend into a
// reference: the location and name it names, the rest as instanceRef has
// it. It reports false for anything else.
func parseRecorded(p *v1alpha1.Proxy, pc *config, id string) (backend.Ref, bool) {
	r := instanceRef(p, pc)
	fp := p.Spec.ForProvider
	switch {
	case fp.GCP != nil:
		if m := recordedVM.FindStringSubmatch(id); m != nil {
			r.Zone, r.Name = m[2], m[3]
			return r, true
		}
	case fp.Kubernetes != nil:
		if m := recordedPod.FindStringSubmatch(id); m != nil {
			r.Namespace, r.Name = m[1], m[2]
			return r, true
		}
	case fp.Local != nil:
		if m := recordedLocal.FindStringSubmatch(id); m != nil {
			r.Name = m[1]
			return r, true
		}
	case fp.AWS != nil:
		if m := recordedEC2.FindStringSubmatch(id); m != nil {
			r.Zone, r.ID = m[1], m[2]
			return r, true
		}
	}
	return r, false
}

// recordedRef locates the instance the Proxy has: where the provider
// recorded it (status.atProvider.providerID, which the provider writes and
// a tenant editing the Proxy's spec or annotations cannot), which differs
// from where the spec now wants it after a placement change (a zone, a
// namespace), and names an imported instance, whose name is not derived
// from the Proxy's UID. Observe, Update and Delete use it, so that a moved
// Proxy replaces its instance instead of leaving it behind. The record is
// not trusted with whose instance it names: Observe acts on an instance of
// another name only while its labels say it is this Proxy's (checkHeld).
func recordedRef(p *v1alpha1.Proxy, pc *config) backend.Ref {
	r, _ := parseRecorded(p, pc, p.Status.AtProvider.ProviderID)
	return r
}

// recordedElsewhere says why the instance the provider recorded cannot be
// reached through the Proxy's configuration now, or "": a VM recorded in
// another GCP project than the ProviderConfig's (the Proxy moved to another
// configuration, or the configuration to another project).
func recordedElsewhere(p *v1alpha1.Proxy, pc *config) string {
	if p.Spec.ForProvider.GCP == nil || pc == nil || pc.Spec.GCP == nil {
		return ""
	}
	id := p.Status.AtProvider.ProviderID
	m := recordedVM.FindStringSubmatch(id)
	if m == nil || m[1] == pc.Spec.GCP.Project {
		return ""
	}
	return fmt.Sprintf("instance %s is in project %s, but %s %s now uses project %s: no second VM is made while the first runs unobserved, "+
		"and a deleted Proxy keeps its finalizer while its VM may still run; point the configuration back at project %s, "+
		"or delete the VM there and then remove the Proxy's finalizer", id, m[1], pc.Kind, pc.Name, pc.Spec.GCP.Project, m[1])
}

// usedSecrets are the Secrets a Proxy's instance is made from: its auth
// and cloud-init Secrets, and its ProviderConfig's credentials Secret.
func usedSecrets(p *v1alpha1.Proxy, pc *config) []types.NamespacedName {
	var out []types.NamespacedName
	fp := p.Spec.ForProvider
	if fp.AuthSecretRef != nil {
		out = append(out, types.NamespacedName{Namespace: p.GetNamespace(), Name: fp.AuthSecretRef.Name})
	}
	if fp.GCP != nil && fp.GCP.CloudInit != nil && fp.GCP.CloudInit.SecretRef != nil {
		out = append(out, types.NamespacedName{Namespace: p.GetNamespace(), Name: fp.GCP.CloudInit.SecretRef.Name})
	}
	if fp.AWS != nil && fp.AWS.UserData != nil && fp.AWS.UserData.SecretRef != nil {
		out = append(out, types.NamespacedName{Namespace: p.GetNamespace(), Name: fp.AWS.UserData.SecretRef.Name})
	}
	if pc == nil {
		return out
	}
	var sel *xpv2.CommonCredentialSelectors
	switch {
	case pc.Spec.GCP != nil && pc.Spec.GCP.Credentials.Source == xpv2.CredentialsSourceSecret:
		sel = &pc.Spec.GCP.Credentials.CommonCredentialSelectors
	case pc.Spec.AWS != nil && pc.Spec.AWS.Credentials.Source == xpv2.CredentialsSourceSecret:
		sel = &pc.Spec.AWS.Credentials.CommonCredentialSelectors
	case pc.Spec.Kubernetes != nil && pc.Spec.Kubernetes.Credentials != nil && pc.Spec.Kubernetes.Credentials.Source == xpv2.CredentialsSourceSecret:
		sel = &pc.Spec.Kubernetes.Credentials.CommonCredentialSelectors
	}
	if sel != nil && sel.SecretRef != nil {
		ns := sel.SecretRef.Namespace
		if pc.Namespace != "" {
			ns = pc.Namespace
		}
		out = append(out, types.NamespacedName{Namespace: ns, Name: sel.SecretRef.Name})
	}
	return out
}

// credentials reads the Proxy's auth Secret; nil when the Proxy has none.
func credentials(ctx context.Context, kube client.Client, p *v1alpha1.Proxy) (*backend.Credentials, error) {
	ref := p.Spec.ForProvider.AuthSecretRef
	if ref == nil {
		return nil, nil
	}
	uk, pk := ref.Keys()
	s := &corev1.Secret{}
	if err := kube.Get(ctx, types.NamespacedName{Namespace: p.GetNamespace(), Name: ref.Name}, s); err != nil {
		if kerrors.IsNotFound(err) {
			return nil, errors.Errorf("auth secret %s/%s not found: create it with keys %q and %q and the label %s=true, or fix spec.forProvider.authSecretRef", p.GetNamespace(), ref.Name, uk, pk, v1alpha1.LabelProxySecret)
		}
		return nil, errors.Wrapf(err, "cannot get auth secret %s/%s", p.GetNamespace(), ref.Name)
	}
	if err := v1alpha1.UsableSecret(s); err != nil {
		return nil, errors.Wrap(err, "spec.forProvider.authSecretRef")
	}
	c := &backend.Credentials{
		Username: string(s.Data[uk]),
		Password: string(s.Data[pk]),
	}
	if c.Username == "" || c.Password == "" {
		return nil, errors.Errorf("auth secret %s/%s needs non-empty keys %q and %q", p.GetNamespace(), ref.Name, uk, pk)
	}
	// Refused here, before anything is done to the instance: an htpasswd
	// file cannot hold them.
	if strings.ContainsAny(c.Username, ":\r\n") || strings.ContainsAny(c.Password, "\r\n") || strings.ContainsAny(c.Username[:1], "# \t") {
		return nil, errors.Errorf("auth secret %s/%s: the username may not hold ':' or a line break, nor begin with '#', a space or a tab (Squid's helper reads such a line as a comment), nor the password hold a line break (a Secret made with --from-file keeps the file's last newline)", p.GetNamespace(), ref.Name)
	}
	return c, nil
}

// cidrs returns the CIDRs as sorted strings.
func cidrs(in []v1alpha1.CIDR) []string {
	out := make([]string, 0, len(in))
	for _, c := range in {
		out = append(out, string(c))
	}
	sort.Strings(out)
	return out
}

// permitted checks that every private destination the Proxy asks for lies
// within one its ProviderConfig's policy permits, by arithmetic on the
// CIDRs. Its error names both fields.
func permitted(p *v1alpha1.Proxy, pc *config) error {
	want := p.Spec.ForProvider.AllowedPrivateDestinations
	if len(want) == 0 {
		return nil
	}
	public, err := squid.NotPrivateDestinations(cidrs(want))
	if err != nil {
		return errors.Wrap(err, "spec.forProvider.allowedPrivateDestinations")
	}
	if len(public) > 0 {
		return errors.Errorf("spec.forProvider.allowedPrivateDestinations %q is not a private network (nor may it be the proxy host itself): public destinations need no exception", public[0])
	}
	var allowed []netip.Prefix
	var listed []string
	if pc.Spec.Policy != nil {
		for _, c := range pc.Spec.Policy.AllowedPrivateDestinations {
			if a, err := netip.ParsePrefix(string(c)); err == nil {
				allowed = append(allowed, a.Masked())
				listed = append(listed, string(c))
			}
		}
	}
	for _, c := range want {
		w, err := netip.ParsePrefix(string(c))
		if err != nil {
			return errors.Errorf("spec.forProvider.allowedPrivateDestinations %q is not a CIDR", c)
		}
		if !squid.Within(w.Masked(), allowed) {
			return errors.Errorf("spec.forProvider.allowedPrivateDestinations %q is not permitted by %s %s: its spec.policy.allowedPrivateDestinations allows %v; ask the platform team to permit it or remove it",
				c, pc.Kind, pc.Name, listed)
		}
	}
	return nil
}

// userData reads a VM Proxy's own start-up configuration (gcp.cloudInit,
// aws.userData), inline or from its Secret.
func userData(ctx context.Context, kube client.Client, p *v1alpha1.Proxy) (string, error) {
	var ci *v1alpha1.CloudInit
	field := ""
	switch fp := p.Spec.ForProvider; {
	case fp.GCP != nil:
		ci, field = fp.GCP.CloudInit, "spec.forProvider.gcp.cloudInit"
	case fp.AWS != nil:
		ci, field = fp.AWS.UserData, "spec.forProvider.aws.userData"
	}
	if ci == nil {
		return "", nil
	}
	if ci.Inline != nil {
		return *ci.Inline, nil
	}
	ref := ci.SecretRef
	if ref == nil {
		return "", errors.Errorf("%s needs inline or secretRef", field)
	}
	s := &corev1.Secret{}
	if err := kube.Get(ctx, types.NamespacedName{Namespace: p.GetNamespace(), Name: ref.Name}, s); err != nil {
		return "", errors.Wrapf(err, "cannot get the secret %s/%s of %s", p.GetNamespace(), ref.Name, field)
	}
	if err := v1alpha1.UsableSecret(s); err != nil {
		return "", errors.Wrap(err, field+".secretRef")
	}
	v, ok := s.Data[ref.Key]
	if !ok {
		return "", errors.Errorf("secret %s/%s of %s has no key %q", p.GetNamespace(), ref.Name, field, ref.Key)
	}
	return string(v), nil
}

// desiredSpec is what the Proxy asks of its backend. userData is its own
// cloud-init, already read; a change to it replaces the VM.
func desiredSpec(p *v1alpha1.Proxy, pc *config, clusterID string, creds *backend.Credentials, userData string) backend.Spec {
	fp := p.Spec.ForProvider
	ranges := make([]string, 0, len(fp.AllowedSourceRanges))
	for _, r := range fp.AllowedSourceRanges {
		ranges = append(ranges, string(r))
	}
	// The provider's own probe must get in where the Proxy restricts its
	// clients; where it lists none, any client with credentials does.
	var probes []string
	if len(ranges) > 0 && pc.Spec.Probe != nil {
		for _, r := range pc.Spec.Probe.SourceRanges {
			if !slices.Contains(ranges, string(r)) {
				probes = append(probes, string(r))
			}
		}
		ranges = append(ranges, probes...)
		sort.Strings(probes)
	}
	sort.Strings(ranges)
	s := backend.Spec{
		Ref: instanceRef(p, pc),
		Owner: ownership.Owner{
			ClusterID: clusterID, Namespace: p.GetNamespace(), Name: p.GetName(), UID: p.GetUID(),
			Fleet: fleetv1alpha1.FleetName(p), Retain: !mayDelete(p),
		},
		Port:                       fp.Port,
		Credentials:                creds,
		AllowedSourceRanges:        ranges,
		ProbeSourceRanges:          probes,
		AllowedPrivateDestinations: cidrs(fp.AllowedPrivateDestinations),
		Local:                      fp.Local,
		Kubernetes:                 fp.Kubernetes,
		GCP:                        fp.GCP,
		AWS:                        fp.AWS,
		AllowLoopbackDestinations:  loopbackAllowed(pc),
	}
	if s.Port == 0 {
		s.Port = v1alpha1.DefaultPort
	}
	s.UserData = userData
	s.Hash = specHash(s)
	s.CredentialsSum = credentialsSum(creds, s.Name)
	return s
}

// credentialsSum says which credentials an instance named name accepts.
func credentialsSum(c *backend.Credentials, name string) string {
	if c == nil {
		return ""
	}
	return squid.CredentialsSum(c.Username, c.Password, name)
}

// specHash covers exactly what replaces an instance when it changes: the
// placement, the port and the resolved proxy configuration (source ranges,
// and whether there are credentials). The credentials themselves are
// Spec.CredentialsSum: they change in place where the backend can. Labels,
// annotations and health-check settings change nothing on the instance, so
// they are left out.
// hashedGCP is the part of a GCP placement the hash covers: fields added
// later count only when they differ from their defaults, so that the
// apiserver defaulting them on existing Proxies after an upgrade does not
// replace every VM at once.
func hashedGCP(g *v1alpha1.GCPPlacement) *v1alpha1.GCPPlacement {
	if g == nil {
		return nil
	}
	c := g.DeepCopy()
	if c.BootDiskType == v1alpha1.DefaultGCPBootDiskType {
		c.BootDiskType = ""
	}
	if c.ShieldedVM != nil && *c.ShieldedVM {
		c.ShieldedVM = nil
	}
	if c.PublishedAddress == v1alpha1.GCPPublishedExternal {
		c.PublishedAddress = ""
	}
	return c
}

func specHash(s backend.Spec) string { return hashSpec(s, false) }

// legacySpecHash is the spec hash of instances made before credentials
// rotated in place, which held the username and the password's digest
// rather than whether there are credentials: such an instance, whose hash
// matches with the current credentials, runs them, and is not replaced
// for the change of formula.
func legacySpecHash(s backend.Spec) string { return hashSpec(s, true) }

func hashSpec(s backend.Spec, legacy bool) string {
	in := struct {
		Local       *v1alpha1.LocalPlacement      `json:"local,omitempty"`
		Kubernetes  *v1alpha1.KubernetesPlacement `json:"kubernetes,omitempty"`
		GCP         *v1alpha1.GCPPlacement        `json:"gcp,omitempty"`
		AWS         *v1alpha1.AWSPlacement        `json:"aws,omitempty"`
		Port        int32                         `json:"port"`
		Ranges      []string                      `json:"ranges,omitempty"`
		Private     []string                      `json:"private,omitempty"`
		Generation  int                           `json:"generation"`
		Loopback    bool                          `json:"loopback,omitempty"`
		Username    string                        `json:"username,omitempty"`
		PasswordSum string                        `json:"passwordSum,omitempty"`
		Auth        bool                          `json:"auth,omitempty"`
		UserDataSum string                        `json:"userDataSum,omitempty"`
	}{Local: s.Local, Kubernetes: s.Kubernetes, GCP: hashedGCP(s.GCP), AWS: s.AWS, Port: s.Port, Ranges: s.AllowedSourceRanges, Private: s.AllowedPrivateDestinations, Generation: squid.ConfigGeneration, Loopback: s.AllowLoopbackDestinations && s.Local != nil}
	if s.UserData != "" {
		sum := sha256.Sum256([]byte(s.UserData))
		in.UserDataSum = hex.EncodeToString(sum[:])
	}
	switch {
	case s.Credentials != nil && legacy:
		in.Username = s.Credentials.Username
		sum := sha256.Sum256([]byte(s.Credentials.Password))
		in.PasswordSum = hex.EncodeToString(sum[:])
	case s.Credentials != nil:
		in.Auth = true
	}
	b, _ := json.Marshal(in) //nolint:errchkjson // Plain structs always marshal.
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}
