package proxy

import (
	"cmp"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/kubernetes"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
)

// Defaults of a ProviderConfig's policy, for what it leaves empty.
var (
	// defaultNodeSelectorKeys: the zone a fleet's spread selects.
	defaultNodeSelectorKeys = []string{corev1.LabelTopologyZone}
	// defaultMachineTypes: small shared-core machines, enough for Squid.
	defaultMachineTypes = []string{"e2-micro", "e2-small", "e2-medium"}
)

// admit checks a Proxy against its ProviderConfig before anything is made
// for it: where its pod may run and what it may run, what its VM may be
// and join, and which private networks it may reach. The error names the
// Proxy's field, its value and the policy that refuses it.
func admit(p *v1alpha1.Proxy, pc *config) error {
	if err := permitted(p, pc); err != nil {
		return err
	}
	var pol v1alpha1.Policy
	if pc.Spec.Policy != nil {
		pol = *pc.Spec.Policy
	}
	if ns := p.GetNamespace(); pc.Namespace == "" && len(pol.AllowedProxyNamespaces) > 0 && !slices.Contains(pol.AllowedProxyNamespaces, ns) {
		return errors.Errorf("metadata.namespace %q may not use %s %s: its spec.policy.allowedProxyNamespaces allows %q; ask the platform team for a configuration of your own",
			ns, pc.Kind, pc.Name, pol.AllowedProxyNamespaces)
	}
	fp := p.Spec.ForProvider
	if err := admitProbeSources(p, pc); err != nil {
		return err
	}
	switch {
	case fp.Local != nil:
		return admitLocal(fp.Local, pc, pol.Local)
	case fp.Kubernetes != nil:
		return admitPod(p, pc, pol.Kubernetes)
	case fp.GCP != nil:
		return admitVM(fp.GCP, pc, pol.GCP)
	case fp.AWS != nil:
		return admitEC2(fp.AWS, pc, pol.AWS)
	}
	return nil
}

// defaultInstanceTypes are the EC2 types a policy without its own list
// allows: small burstable ones, enough for a proxy.
var defaultInstanceTypes = []string{"t3.micro", "t3.small", "t3a.micro", "t3a.small"}

// admitEC2 checks an instance's placement against the policy: its type,
// image, subnet, extra security groups and own user data.
func admitEC2(a *v1alpha1.AWSPlacement, pc *config, pol *v1alpha1.AWSPolicy) error {
	if pol == nil {
		pol = &v1alpha1.AWSPolicy{}
	}
	if err := ownStartup(a.UserData != nil, pol.AllowUserData, "aws.userData", "aws.allowUserData", "instances", pc); err != nil {
		return err
	}
	if pc.Spec.AWS != nil && !strings.HasPrefix(a.Zone, pc.Spec.AWS.Region) {
		return errors.Errorf(errFmtZoneOutsideRegion, a.Zone, pc.Spec.AWS.Region, pc.Kind, pc.Name, pc.Spec.AWS.Region, pc.Spec.AWS.Region)
	}
	for _, c := range []choice{
		{field: "aws.instanceType", value: a.InstanceType, def: v1alpha1.DefaultAWSInstanceType, list: "aws.allowedInstanceTypes", allowed: pol.AllowedInstanceTypes, defs: defaultInstanceTypes},
		{field: "aws.image", value: a.Image, def: v1alpha1.DefaultAWSImage, list: "aws.allowedImages", allowed: pol.AllowedImages, defs: []string{v1alpha1.DefaultAWSImage}},
	} {
		if err := c.admit(pc); err != nil {
			return err
		}
	}
	if a.Subnet != "" {
		if err := admitEach("aws.subnet", []string{a.Subnet}, "aws.allowedSubnets", pol.AllowedSubnets, pc, nil); err != nil {
			return err
		}
	}
	return admitEach("aws.securityGroups", a.SecurityGroups, "aws.allowedSecurityGroups", pol.AllowedSecurityGroups, pc, nil)
}

// choice is one field of a cloud placement that a policy's list bounds:
// its value (def when unset), and the list (defs when the policy sets
// none), compared by same (nil: equal).
type choice struct {
	field, value, def string
	list              string
	allowed, defs     []string
	same              func(value string, allowed []string) bool
}

// admit refuses a value the list does not allow, naming the field and the
// list.
func (c choice) admit(pc *config) error {
	value, allowed := cmp.Or(c.value, c.def), c.allowed
	if len(allowed) == 0 {
		allowed = c.defs
	}
	same := c.same
	if same == nil {
		same = func(v string, l []string) bool { return slices.Contains(l, v) }
	}
	if !same(value, allowed) {
		return refusal(c.field, value, pc, c.list, allowed, len(c.allowed) == 0)
	}
	return nil
}

// admitEach refuses the first of values the policy's list does not allow
// (an unset list allows none), compared by same (nil: equal).
func admitEach(field string, values []string, list string, allowed []string, pc *config, same func(value string, allowed []string) bool) error {
	for _, v := range values {
		if err := (choice{field: field, value: v, list: list, allowed: allowed, same: same}).admit(pc); err != nil {
			return err
		}
	}
	return nil
}

// ownStartup refuses a start-up of the tenant's own (EC2 user data, GCP
// cloud-init) unless the policy allows it: without, instances run only
// the generated Squid configuration.
func ownStartup(set, allow bool, field, policy, what string, pc *config) error {
	if set && !allow {
		return errors.Errorf(errFmtOwnStartup,
			field, pc.Kind, pc.Name, policy, what)
	}
	return nil
}

// admitProbeSources refuses to let the provider's probe into a proxy
// without credentials from a public range: adding the range to the
// proxy's client ACL and firewall would open the proxy to everyone behind
// that address (a NAT shared by the whole cluster, say).
func admitProbeSources(p *v1alpha1.Proxy, pc *config) error {
	fp := p.Spec.ForProvider
	if pc.Spec.Probe == nil || len(fp.AllowedSourceRanges) == 0 || fp.AuthSecretRef != nil {
		return nil
	}
	ranges := make([]string, 0, len(pc.Spec.Probe.SourceRanges))
	for _, r := range pc.Spec.Probe.SourceRanges {
		ranges = append(ranges, string(r))
	}
	public, err := squid.PublicSources(ranges)
	if err != nil {
		return errors.Wrapf(err, "%s %s spec.probe.sourceRanges", pc.Kind, pc.Name)
	}
	if len(public) > 0 {
		return errors.Errorf("%s %s spec.probe.sourceRanges %q is not private, loopback or CGNAT space, and this Proxy has no spec.forProvider.authSecretRef: letting the probe in would open the proxy to every client behind that address; give the Proxy credentials, or probe from a private range",
			pc.Kind, pc.Name, public[0])
	}
	return nil
}

// What a policy refuses of a Proxy: a value not permitted (the field, the
// value, the ProviderConfig's kind and name, and which of its policy's
// lists, in one of the which* forms: the policy field and its list), a
// start-up of the tenant's own (the field, the kind and name, the policy
// field, what runs), an EC2 zone outside the region (the zone, the region,
// the kind and name, the region twice).
const (
	errFmtNotPermitted      = "spec.forProvider.%s %q is not permitted by %s %s: %s; ask the platform team to permit it or remove it"
	whichFmtAllows          = "its spec.policy.%s allows %q"
	whichFmtUnset           = "its spec.policy.%s is unset, which allows %q"
	whichFmtNone            = "its spec.policy.%s allows none"
	errFmtOwnStartup        = "spec.forProvider.%s is not permitted by %s %s: its spec.policy.%s is false, so %s run only the generated Squid configuration; ask the platform team to allow it or remove it"
	errFmtZoneOutsideRegion = "spec.forProvider.aws.zone %q is not in region %s of %s %s: use one of its zones (%sa, %sb, ...)"
)

// refusal says that the Proxy's field asks for value, which the policy
// field of pc does not allow, and what it does allow.
func refusal(field, value string, pc *config, policy string, allowed []string, defaulted bool) error {
	which := fmt.Sprintf(whichFmtAllows, policy, allowed)
	if defaulted {
		which = fmt.Sprintf(whichFmtUnset, policy, allowed)
	}
	if len(allowed) == 0 {
		which = fmt.Sprintf(whichFmtNone, policy)
	}
	return errors.Errorf(errFmtNotPermitted, field, value, pc.Kind, pc.Name, which)
}

// defaultBindAddresses: loopback, so nobody off the host reaches the proxy.
var defaultBindAddresses = []string{"127.0.0.1", "::1"}

func admitLocal(l *v1alpha1.LocalPlacement, pc *config, pol *v1alpha1.LocalPolicy) error {
	allowed := defaultBindAddresses
	if pol != nil && len(pol.AllowedBindAddresses) > 0 && pc.Namespace == "" {
		allowed = make([]string, 0, len(pol.AllowedBindAddresses))
		for _, a := range pol.AllowedBindAddresses {
			allowed = append(allowed, string(a))
		}
	}
	bind := string(l.BindAddress)
	if bind == "" {
		bind = defaultBindAddresses[0]
	}
	want, err := netip.ParseAddr(bind)
	if err != nil {
		return errors.Errorf("spec.forProvider.local.bindAddress %q is not an IP address", bind)
	}
	for _, a := range allowed {
		if ok, err := netip.ParseAddr(a); err == nil && ok.Unmap() == want.Unmap() {
			return nil
		}
	}
	return refusal("local.bindAddress", bind, pc, "local.allowedBindAddresses", allowed, pol == nil || len(pol.AllowedBindAddresses) == 0 || pc.Namespace != "")
}

// loopbackAllowed says whether pc lets its local proxies reach the host's
// loopback services: only a ClusterProviderConfig that says so.
func loopbackAllowed(pc *config) bool {
	return pc.Namespace == "" && pc.Spec.Policy != nil && pc.Spec.Policy.Local != nil && pc.Spec.Policy.Local.AllowLoopbackDestinations
}

func admitPod(p *v1alpha1.Proxy, pc *config, pol *v1alpha1.KubernetesPolicy) error {
	if pol == nil {
		pol = &v1alpha1.KubernetesPolicy{}
	}
	k := p.Spec.ForProvider.Kubernetes
	ns := instanceRef(p, pc).Namespace
	namespaces, defaulted := pol.AllowedNamespaces, len(pol.AllowedNamespaces) == 0
	switch {
	case pc.Namespace != "":
		// A tenant's own configuration places pods in its own namespace
		// only, whatever its policy says.
		namespaces, defaulted = []string{pc.Namespace}, true
	case defaulted && pc.Spec.Kubernetes != nil && pc.Spec.Kubernetes.Namespace != "":
		namespaces = []string{pc.Spec.Kubernetes.Namespace}
	case defaulted:
		namespaces = []string{p.GetNamespace()}
	}
	if !slices.Contains(namespaces, ns) {
		return refusal("kubernetes.namespace", ns, pc, "kubernetes.allowedNamespaces", namespaces, defaulted)
	}

	image := choice{field: "kubernetes.image", value: k.Image, def: kubernetes.DefaultImage, list: "kubernetes.allowedImages", allowed: pol.AllowedImages, defs: []string{kubernetes.DefaultImage}, same: imageAllowed}
	if err := image.admit(pc); err != nil {
		return err
	}

	keys := pol.AllowedNodeSelectorKeys
	if len(keys) == 0 {
		keys = defaultNodeSelectorKeys
	}
	selected := make([]string, 0, len(k.NodeSelector))
	for key := range k.NodeSelector {
		selected = append(selected, key)
	}
	sort.Strings(selected)
	for _, key := range selected {
		if !slices.Contains(keys, key) {
			return refusal("kubernetes.nodeSelector", key, pc, "kubernetes.allowedNodeSelectorKeys", keys, len(pol.AllowedNodeSelectorKeys) == 0)
		}
	}
	return nil
}

func admitVM(g *v1alpha1.GCPPlacement, pc *config, pol *v1alpha1.GCPPolicy) error {
	if pol == nil {
		pol = &v1alpha1.GCPPolicy{}
	}
	project := ""
	if pc.Spec.GCP != nil {
		project = pc.Spec.GCP.Project
	}
	if err := ownStartup(g.CloudInit != nil, pol.AllowCloudInit, "gcp.cloudInit", "gcp.allowCloudInit", "VMs", pc); err != nil {
		return err
	}
	network := func(v string, l []string) bool {
		return slices.ContainsFunc(l, func(n string) bool { return normalNetwork(n, project) == normalNetwork(v, project) })
	}
	if err := (choice{field: "gcp.network", value: g.Network, def: v1alpha1.DefaultGCPNetwork, list: "gcp.allowedNetworks", allowed: pol.AllowedNetworks, defs: []string{v1alpha1.DefaultGCPNetwork}, same: network}).admit(pc); err != nil {
		return err
	}
	if g.Subnetwork != "" {
		subnetwork := func(v string, l []string) bool {
			return slices.ContainsFunc(l, func(n string) bool { return normalSubnetwork(n, project) == normalSubnetwork(v, project) })
		}
		if err := admitEach("gcp.subnetwork", []string{g.Subnetwork}, "gcp.allowedSubnetworks", pol.AllowedSubnetworks, pc, subnetwork); err != nil {
			return err
		}
	}
	tags := make([]string, 0, len(g.NetworkTags))
	for _, t := range g.NetworkTags {
		tags = append(tags, string(t))
	}
	allowedTags := make([]string, 0, len(pol.AllowedNetworkTags))
	for _, t := range pol.AllowedNetworkTags {
		allowedTags = append(allowedTags, string(t))
	}
	if err := admitEach("gcp.networkTags", tags, "gcp.allowedNetworkTags", allowedTags, pc, nil); err != nil {
		return err
	}
	// A machine type may be given as a zonal URL; its name is what counts.
	machine := func(v string, l []string) bool {
		m := machineTypeRe.FindStringSubmatch(v)
		return m != nil && slices.Contains(l, m[1])
	}
	image := func(v string, l []string) bool { return imageAllowed(normalImage(v), normalImages(l)) }
	for _, c := range []choice{
		{field: "gcp.machineType", value: g.MachineType, def: v1alpha1.DefaultGCPMachineType, list: "gcp.allowedMachineTypes", allowed: pol.AllowedMachineTypes, defs: defaultMachineTypes, same: machine},
		{field: "gcp.image", value: g.Image, def: v1alpha1.DefaultGCPImage, list: "gcp.allowedImages", allowed: pol.AllowedImages, defs: []string{v1alpha1.DefaultGCPImage}, same: image},
	} {
		if err := c.admit(pc); err != nil {
			return err
		}
	}
	return nil
}

// machineTypeRe is a machine type by name or by zonal URL.
var machineTypeRe = regexp.MustCompile(`^(?:zones/[a-z0-9-]+/machineTypes/)?([a-z0-9-]+)$`)

// imageAllowed reports whether image matches one of allowed: exactly, as a
// tag or digest of an allowed repository, or under an allowed prefix that
// ends in "/". A reference with ".." or whitespace never matches, so that
// no prefix can be escaped.
func imageAllowed(image string, allowed []string) bool {
	if image == "" || strings.Contains(image, "..") || strings.ContainsAny(image, " \t\r\n") {
		return false
	}
	for _, a := range allowed {
		switch {
		case a == image:
			return true
		case strings.HasSuffix(a, "/") && strings.HasPrefix(image, a):
			return true
		case strings.HasPrefix(image, a) && (image[len(a)] == ':' || image[len(a)] == '@') &&
			!strings.ContainsAny(a[strings.LastIndex(a, "/")+1:], ":@") && !strings.Contains(image[len(a):], "/"):
			// A repository admits its tags and digests, but a
			// reference that already has a tag admits no other, and
			// a colon followed by a path is a registry's port, not a
			// tag.
			return true
		}
	}
	return false
}

const computeURL = "https://www.googleapis.com/compute/v1/"

// normalImage strips the API's URL prefix, which GCP accepts on images.
func normalImage(s string) string { return strings.TrimPrefix(s, computeURL) }

func normalImages(in []string) []string {
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = normalImage(s)
	}
	return out
}

// normalNetwork writes a network the way GCP resolves it in project: a bare
// name is global/networks/NAME, and the project's own prefix is dropped.
func normalNetwork(s, project string) string {
	s = strings.TrimPrefix(s, computeURL)
	if !strings.Contains(s, "/") {
		return "global/networks/" + s
	}
	if project != "" {
		s = strings.TrimPrefix(s, "projects/"+project+"/")
	}
	return s
}

// normalSubnetwork writes a subnetwork the way GCP resolves it in
// project: the API's URL prefix and the project's own prefix are dropped.
func normalSubnetwork(s, project string) string {
	s = strings.TrimPrefix(s, computeURL)
	if project != "" {
		s = strings.TrimPrefix(s, "projects/"+project+"/")
	}
	return s
}

// What tenantConfig refuses: the ProviderConfig (kind namespace/name),
// then the field, or the backend and what its Secret names.
const (
	errFmtTenantHostField = "%s sets spec.local.%s, which only a ClusterProviderConfig may set: it runs and writes files on the provider's host"
	errFmtTenantIdentity  = "%s must set spec.%s.credentials.source to Secret, naming %s in its own namespace: only a ClusterProviderConfig may use the provider's own identity"
)

// tenantConfig refuses what only a ClusterProviderConfig, which the
// platform team writes, may set: a namespaced ProviderConfig belongs to a
// tenant, who must not run binaries or write directories on the provider's
// host, nor borrow the provider's own identity.
func tenantConfig(pc *config) error {
	if pc.Namespace == "" {
		return nil
	}
	name := fmt.Sprintf("%s %s/%s", pc.Kind, pc.Namespace, pc.Name)
	if l := pc.Spec.Local; l != nil {
		for _, f := range []struct {
			field string
			set   bool
		}{{"squidPath", l.SquidPath != ""}, {"stateDir", l.StateDir != ""}, {"portRange", l.PortRange != nil}} {
			if f.set {
				return errors.Errorf(errFmtTenantHostField, name, f.field)
			}
		}
	}
	if k := pc.Spec.Kubernetes; pc.Spec.Backend == v1alpha1.BackendKubernetes && (k == nil || k.Credentials == nil || k.Credentials.Source != xpv2.CredentialsSourceSecret) {
		return errors.Errorf(errFmtTenantIdentity, name, "kubernetes", "a kubeconfig")
	}
	if g := pc.Spec.GCP; pc.Spec.Backend == v1alpha1.BackendGCP && g != nil && g.Credentials.Source != xpv2.CredentialsSourceSecret {
		return errors.Errorf(errFmtTenantIdentity, name, "gcp", "a service-account key")
	}
	if a := pc.Spec.AWS; pc.Spec.Backend == v1alpha1.BackendAWS && a != nil && a.Credentials.Source != xpv2.CredentialsSourceSecret {
		return errors.Errorf(errFmtTenantIdentity, name, "aws", "an access key")
	}
	return nil
}
