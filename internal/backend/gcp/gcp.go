// Package gcp runs each proxy on a Compute Engine VM with its own ephemeral
// external IP: the only backend whose proxies have truly distinct egress
// IPs. It uses the real cloud.google.com/go/compute REST clients; tests
// point them at an in-process fake of the Compute API.
package gcp

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/googleapis/gax-go/v2/apierror"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/cloudvm"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// GCP labels the backend adds to the ownership labels.
const (
	labelSpecHash = "egress-spec-hash"
	// labelCredentials records Spec.CredentialsSum: which credentials the
	// VM's startup script gave it.
	labelCredentials = "egress-credentials"
	labelPort        = "egress-port"
	// labelRetain is ownership.LabelRetain in GCP's form.
	labelRetain = "egress-retain"
	// labelPublished is "internal" on a VM whose internal address is
	// published (gcp.publishedAddress Internal).
	labelPublished = "egress-published"
	// labelRule names the firewall rule a VM shares with the others of its
	// fleet; a VM without it has a rule of its own, named after it.
	labelRule = "egress-rule"
)

// Where the generated startup script puts Squid's files on the VM: under
// /etc/squid, which Debian's AppArmor profile for Squid lets it read, with
// logs in Squid's own log folder (never /dev/stdout, which Squid cannot
// open under systemd, where stdout is a socket to the journal).
const (
	vmConfig = cloudvm.ConfigFile
	vmSelf   = cloudvm.SelfFile
)

// Config configures a gcp backend.
type Config struct {
	// Project the VMs run in.
	Project string
	// ClusterID is stamped on every VM.
	ClusterID string
	// ClientOptions reach and authenticate to the Compute API.
	ClientOptions []option.ClientOption
	// OperationTimeout bounds how long Create waits for an insert
	// operation; the reconcile's own deadline bounds it too. Zero means
	// DefaultOperationTimeout. An operation still running then is
	// returned in Instance.Operation and checked later.
	OperationTimeout time.Duration
}

// DefaultOperationTimeout is how long Create waits for its VM insert to
// finish: long enough for the errors Compute Engine finds at once (most
// quota refusals) to arrive in the operation, short enough that a scale-up
// of hundreds of VMs does not hold the provider's reconcile workers for
// minutes. An insert still running then is handed off: the Proxy records
// its operation, and the next create looks at how it ended
// (CheckOperation) before inserting again.
const DefaultOperationTimeout = 5 * time.Second

// Backend manages proxy VMs.
type Backend struct {
	cfg       Config
	instances *compute.InstancesClient
	firewalls *compute.FirewallsClient
	ops       *compute.ZoneOperationsClient
	globalOps *compute.GlobalOperationsClient
}

var (
	_ backend.Backend          = &Backend{}
	_ backend.Repairer         = &Backend{}
	_ backend.OperationChecker = &Backend{}
	_ backend.RuleNamer        = &Backend{}
)

// New returns a gcp backend.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	ic, err := compute.NewInstancesRESTClient(ctx, cfg.ClientOptions...)
	if err != nil {
		return nil, backend.Wrap(backend.ClassPermanent, errors.Wrap(err, "cannot create the Compute instances client"))
	}
	fc, err := compute.NewFirewallsRESTClient(ctx, cfg.ClientOptions...)
	if err != nil {
		_ = ic.Close()
		return nil, backend.Wrap(backend.ClassPermanent, errors.Wrap(err, "cannot create the Compute firewalls client"))
	}
	oc, err := compute.NewZoneOperationsRESTClient(ctx, cfg.ClientOptions...)
	if err != nil {
		_, _ = ic.Close(), fc.Close()
		return nil, backend.Wrap(backend.ClassPermanent, errors.Wrap(err, "cannot create the Compute operations client"))
	}
	gc, err := compute.NewGlobalOperationsRESTClient(ctx, cfg.ClientOptions...)
	if err != nil {
		_, _, _ = ic.Close(), fc.Close(), oc.Close()
		return nil, backend.Wrap(backend.ClassPermanent, errors.Wrap(err, "cannot create the Compute global operations client"))
	}
	return &Backend{cfg: cfg, instances: ic, firewalls: fc, ops: oc, globalOps: gc}, nil
}

// Close releases the clients.
func (b *Backend) Close() error {
	return errors.Join(b.instances.Close(), b.firewalls.Close(), b.ops.Close(), b.globalOps.Close())
}

// Classify sorts a Compute API error into the backend taxonomy. Errors that
// arrive in an operation (the client library turns them into the same
// error type, with the operation's codes in the message) are sorted alike:
//
//   - a stockout (ZONE_RESOURCE_POOL_EXHAUSTED*, 503) is ZoneExhausted;
//   - not found is NotFound (Create turns it into Permanent: on an insert
//     it names a missing network, image or subnetwork);
//   - quota (quotaExceeded, QUOTA_EXCEEDED, any *_QUOTA) is QuotaExceeded;
//   - 429 and rate limits are Throttled;
//   - 400 resourceNotReady (an operation still running) is Transient;
//   - 412 conditionNotMet (an organisation policy) is Permanent;
//   - 401 and 403 (API not enabled, IAM not yet propagated) are
//     AccessDenied, which turns permanent after some tries;
//   - other 5xx are Transient, other 4xx Permanent.
//
// GCP's own message is kept.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	code, reasons, msg := 0, "", err.Error()
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		code = ge.Code
		for _, e := range ge.Errors {
			reasons += " " + e.Reason
		}
		if ge.Message != "" && !strings.Contains(msg, ge.Message) {
			msg += ": " + ge.Message
		}
	}
	var ae *apierror.APIError
	if errors.As(err, &ae) && code == 0 {
		code = ae.HTTPCode()
	}
	info, _ := errorInfo(err)
	reasons += " " + info
	lower := strings.ToLower(reasons + " " + msg)
	has := func(subs ...string) bool {
		for _, sub := range subs {
			if strings.Contains(lower, sub) {
				return true
			}
		}
		return false
	}
	var c backend.Class
	switch {
	case has("zone_resource_pool_exhausted", "does not have enough resources available"):
		c = backend.ClassStockout
	case code == http.StatusNotFound:
		c = backend.ClassNotFound
	case has("quotaexceeded", "quota_exceeded", "_quota", "quota '"):
		c = backend.ClassQuota
	case code == http.StatusTooManyRequests, has("ratelimitexceeded", "rate_limit_exceeded"):
		c = backend.ClassThrottled
	case has("resourcenotready", "is not ready"):
		c = backend.ClassTransient
	case code == http.StatusPreconditionFailed:
		c = backend.ClassPermanent
	case code == http.StatusUnauthorized, code == http.StatusForbidden:
		c = backend.ClassAccessDenied
	case code >= 500, code == 0:
		c = backend.ClassTransient
	default:
		c = backend.ClassPermanent
	}
	return backend.Wrap(c, err)
}

// insertError classifies an error of an insert: not found there means a
// resource the request refers to is missing, which retrying cannot fix.
func insertError(err error, what string) error {
	c := Classify(err)
	if backend.ClassOf(c) == backend.ClassNotFound {
		return backend.Wrap(backend.ClassPermanent, errors.Wrapf(err, "%s: a resource it refers to does not exist", what))
	}
	if backend.ClassOf(c) == backend.ClassStockout {
		return errors.Wrapf(c, "%s: the zone has no capacity for it now; it is retried later, or move the proxy to another zone", what)
	}
	if p := deniedPermission(err); p == permUseExternalIP {
		return errors.Wrapf(c, "%s: the provider's service account may not give a VM an external address in this subnetwork; "+
			"grant %s on it (in a Shared VPC, in the host project: roles/compute.networkUser holds it), "+
			"or set spec.forProvider.gcp.publishedAddress: Internal for proxies reached from inside the VPC", what, permUseExternalIP)
	}
	return errors.Wrap(c, what)
}

// errorInfo is the reason and metadata of the google.rpc.ErrorInfo in an
// error's details. The REST client answers a *googleapi.Error whose body
// also holds the legacy errors[] list, which apierror's strict parse of
// the body refuses, so the details are read here, as the JSON decoded
// them; an error of another kind goes through apierror.
func errorInfo(err error) (string, map[string]string) {
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		for _, d := range ge.Details {
			m, ok := d.(map[string]any)
			if !ok || m["@type"] != "type.googleapis.com/google.rpc.ErrorInfo" {
				continue
			}
			reason, _ := m["reason"].(string)
			md := map[string]string{}
			if raw, ok := m["metadata"].(map[string]any); ok {
				for k, v := range raw {
					if s, ok := v.(string); ok {
						md[k] = s
					}
				}
			}
			return reason, md
		}
		return "", nil
	}
	if ae, ok := apierror.FromError(err); ok {
		return ae.Reason(), ae.Metadata()
	}
	return "", nil
}

// permUseExternalIP is the permission a VM with an external address needs
// on its subnetwork, which a Shared VPC's host project grants separately.
const permUseExternalIP = "compute.subnetworks.useExternalIp"

// deniedPermission is the permission an IAM refusal names: from its
// google.rpc.ErrorInfo, or from the message's "Required 'P' permission"
// where the body carries none.
func deniedPermission(err error) string {
	if _, md := errorInfo(err); md["permission"] != "" {
		return md["permission"]
	}
	if m := requiredPermission.FindStringSubmatch(err.Error()); m != nil {
		return m[1]
	}
	return ""
}

var requiredPermission = regexp.MustCompile(`Required '([^']+)' permission`)

func isConflict(err error) bool {
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		return ge.Code == http.StatusConflict
	}
	var ae *apierror.APIError
	return errors.As(err, &ae) && ae.HTTPCode() == http.StatusConflict
}

// ProviderID names a VM the way GCP does.
func (b *Backend) ProviderID(r backend.Ref) string {
	return fmt.Sprintf("projects/%s/zones/%s/instances/%s", b.cfg.Project, r.Zone, r.Name)
}

// ownAddressesScript writes the VM's own addresses, which only the VM
// knows when it boots, to the file Squid's egress_self_started ACL reads:
// its interface addresses, and every external IPv4 and IPv6 address the
// metadata server lists, so that a crawler cannot reach the VM's own
// services through its public address. The broadcast address keeps the
// file from being empty when the metadata server does not answer.
const ownAddressesFunc = `own_addresses() {
	md=http://169.254.169.254/computeMetadata/v1/instance/network-interfaces
	get() { curl -fsS -m 5 -H 'Metadata-Flavor: Google' "$md/$1" 2>/dev/null || true; }
	echo 255.255.255.255
	hostname -I 2>/dev/null | tr ' ' '\n'
	for nic in $(get ''); do
		for ac in $(get "${nic}access-configs/"); do get "${nic}access-configs/${ac}external-ip"; echo; done
		for ac in $(get "${nic}ipv6-access-configs/"); do get "${nic}ipv6-access-configs/${ac}external-ipv6"; echo; done
	done
}`

// StartupScript is the VM's startup script for s: the user's cloud-init
// when the Proxy brings one, otherwise cloudvm's script, which learns the
// VM's external addresses from GCP's metadata server.
func StartupScript(s backend.Spec) (string, error) { return cloudvm.Script(s, ownAddressesFunc) }

// scriptImageRe matches the images the generated startup script supports:
// Debian's and Ubuntu's public images (apt, systemd, Debian's squid
// package layout), by family or by name.
var scriptImageRe = regexp.MustCompile(`^projects/(debian-cloud|ubuntu-os-cloud|ubuntu-os-pro-cloud)/global/images/(family/)?(debian-(11|12|13)|ubuntu-(pro-)?(minimal-)?(2004|2204|2404|2504|2510|2604))(-[a-z0-9-]+)?$`)

// normalImage strips the API's URL prefix, which GCP accepts on images.
func normalImage(s string) string { return strings.TrimPrefix(s, computeURL) }

func zonal(zone, kind, v string) string {
	if strings.Contains(v, "/") {
		return v
	}
	return fmt.Sprintf("zones/%s/%s/%s", zone, kind, v)
}

// firewall lets the proxy port in from the allowed source ranges only,
// targeting this one VM through a network tag named after it. Without
// ranges (credentials only) the port is open to any address, and Squid
// demands credentials. It refuses, by arithmetic on the ranges, a rule that
// would admit public clients to a proxy without credentials, and gives a
// proxy whose Squid configuration the provider did not write (the user's
// cloud-init) no default opening at all.
func (b *Backend) firewall(s backend.Spec, shared bool) (*computepb.Firewall, error) {
	ranges, err := cloudvm.SourceRanges(s, gcpCloud, s.GCP.PublishedAddress == v1alpha1.GCPPublishedInternal)
	if err != nil {
		return nil, err
	}
	return b.buildRule(s, ranges, shared), nil
}

// gcpCloud is how the shared core's errors name a VM's fields and firewall rule.
var gcpCloud = cloudvm.Cloud{Placement: "gcp", UserDataField: "cloudInit", OpeningKind: "a GCP firewall rule", Internal: "publishedAddress: Internal"}

// RuleFor names the fleet rule an instance of s shares (a Proxy of no
// fleet has its own, named after its VM: ""), without the checks Create
// makes, for Delete to let go of it.
func (b *Backend) RuleFor(s backend.Spec) string {
	if s.GCP == nil || s.Owner.Fleet == "" {
		return ""
	}
	masked := cloudvm.MaskedRanges(s)
	if masked == nil {
		return ""
	}
	return b.buildRule(s, masked, true).GetName()
}

// buildRule is the rule letting s's port in from ranges: the VM's own, or
// its fleet's when shared.
func (b *Backend) buildRule(s backend.Spec, ranges []string, shared bool) *computepb.Firewall {
	fw := &computepb.Firewall{
		Name:         ptr.To(s.Name),
		Description:  ptr.To(b.ruleDescription(s.Owner)),
		Network:      ptr.To(b.network(s.GCP)),
		Direction:    ptr.To(computepb.Firewall_INGRESS.String()),
		Allowed:      []*computepb.Allowed{{IPProtocol: ptr.To("tcp"), Ports: []string{strconv.Itoa(int(s.Port))}}},
		SourceRanges: ranges,
		TargetTags:   []string{s.Name},
	}
	if shared {
		cluster := s.Owner.GCPLabels()["egress-cluster"]
		name := sharedRuleName(cluster, s.Owner.Namespace, s.Owner.Fleet, fw)
		fw.Name, fw.TargetTags = ptr.To(name), []string{name}
		fw.Description = ptr.To(b.sharedRuleDescription(cluster, s.Owner.Namespace, s.Owner.Fleet))
	}
	return fw
}

// A fleet's VMs share firewall rules: one per (network, port, source
// ranges) of the fleet, named from them, targeting a network tag of the
// same name, which each VM made with it carries (and names in its
// egress-rule label). A project's firewall-rule quota (often 100 to 200,
// shared with everything else in it) would otherwise cap a fleet. The rule
// goes when its last VM does; orphan collection takes one no VM uses.

// sharedRuleName derives a fleet's rule name from what the rule is: the
// cluster (its label value), the fleet, and the rule's network, port and
// source ranges, so that a rule read back names itself again, and a
// description copied onto another rule claims nothing.
func sharedRuleName(cluster, namespace, fleet string, fw *computepb.Firewall) string {
	var ports []string
	for _, a := range fw.GetAllowed() {
		ports = append(ports, a.GetIPProtocol()+":"+strings.Join(a.GetPorts(), ","))
	}
	return cloudvm.SharedName("egress-fw-", cluster, namespace, fleet, strings.TrimPrefix(fw.GetNetwork(), computeURL), strings.Join(ports, ";"), fw.GetSourceRanges())
}

func (b *Backend) sharedRuleDescription(cluster, namespace, fleet string) string {
	return fmt.Sprintf("egress proxy fleet %s/%s (cluster %s, vm project %s, %s)", namespace, fleet, cluster, b.cfg.Project, ruleMarker)
}

var reSharedRule = regexp.MustCompile(`^egress proxy fleet ([^/\s]+)/([^\s]+) \(cluster ([^,()\s]*), vm project ([^,()\s]+), ` + ruleMarker + `\)$`)

// sharedRuleOwner reads a fleet rule's fleet back from its description,
// and the project of its VMs, if the rule's name is the one its content
// and that fleet derive.
func sharedRuleOwner(fw *computepb.Firewall) (ownership.Owner, string, bool) {
	m := reSharedRule.FindStringSubmatch(fw.GetDescription())
	if m == nil || fw.GetName() != sharedRuleName(m[3], m[1], m[2], fw) {
		return ownership.Owner{}, "", false
	}
	return ownership.Owner{Namespace: m[1], Name: "fleet " + m[2], Fleet: m[2], ClusterID: m[3]}, m[4], true
}

// NetworkProject is the project a network reference names, or empty when
// it names none (the VM's own project).
func NetworkProject(network string) string {
	n := strings.TrimPrefix(network, computeURL)
	if !strings.HasPrefix(n, "projects/") {
		return ""
	}
	return firewallProject(n)
}

// network is the VM's network in the form firewall rules name it:
// projects/P/global/networks/N, P being the ProviderConfig's project unless
// a Shared VPC host project is named.
func (b *Backend) network(g *v1alpha1.GCPPlacement) string {
	n := strings.TrimPrefix(g.Network, computeURL)
	switch {
	case n == "":
		n = v1alpha1.DefaultGCPNetwork
	case !strings.Contains(n, "/"):
		n = "global/networks/" + n
	}
	if !strings.HasPrefix(n, "projects/") {
		n = fmt.Sprintf("projects/%s/%s", b.cfg.Project, n)
	}
	return n
}

// firewallProject is the project a rule on network lives in: the network's.
func firewallProject(network string) string {
	return strings.SplitN(strings.TrimPrefix(network, "projects/"), "/", 2)[0]
}

const computeURL = "https://www.googleapis.com/compute/v1/"

// metadataKey is where the VM's start-up configuration goes: cloud-init
// reads #cloud-config from user-data, and the guest agent runs scripts
// from startup-script.
func metadataKey(s backend.Spec) string {
	if strings.HasPrefix(strings.TrimLeft(s.UserData, " \t\r\n"), "#cloud-config") {
		return "user-data"
	}
	return "startup-script"
}

// Firewall rules carry no labels: their description names the owner, so
// that the orphan collector finds a rule whose VM never came or is gone.
const ruleMarker = "managed by provider-egressproxy"

var reRuleOwner = regexp.MustCompile(`^egress proxy ([^/\s]+)/([^\s]+) \(uid ([^,()\s]+), cluster ([^,()\s]*), vm project ([^,()\s]+), ` + ruleMarker + `\)$`)

func (b *Backend) ruleDescription(o ownership.Owner) string {
	l := o.GCPLabels()
	return fmt.Sprintf("egress proxy %s/%s (uid %s, cluster %s, vm project %s, %s)", o.Namespace, o.Name, o.UID, l["egress-cluster"], b.cfg.Project, ruleMarker)
}

// ruleOwner reads a rule's owner back from its description, and the
// project of its VM. A rule counts as a proxy's only under the name derived
// from that proxy's UID, so a description copied onto another rule, or
// edited to name another UID, claims nothing.
func ruleOwner(fw *computepb.Firewall) (ownership.Owner, string, bool) {
	m := reRuleOwner.FindStringSubmatch(fw.GetDescription())
	if m == nil || fw.GetName() != ownership.InstanceName(types.UID(m[3])) {
		return ownership.Owner{}, "", false
	}
	return ownership.Owner{Namespace: m[1], Name: m[2], UID: types.UID(m[3]), ClusterID: m[4]}, m[5], true
}

// Create makes the firewall rule, then inserts the VM, and waits a bounded
// time for each operation: Compute Engine reports quota errors and
// stockouts in the operation, after accepting the request. An insert still
// running when the wait ends is returned in Instance.Operation, for
// CheckOperation to look at later.
func (b *Backend) Create(ctx context.Context, s backend.Spec) (*backend.Instance, error) {
	if s.GCP == nil {
		return nil, backend.Errorf(backend.ClassPermanent, "the gcp backend needs spec.forProvider.gcp")
	}
	script, err := StartupScript(s)
	if err != nil {
		return nil, err
	}
	shared := s.Owner.Fleet != ""
	fw, err := b.firewall(s, shared)
	if err != nil {
		return nil, err
	}
	vm := b.vm(s, script, fw)
	if err := b.checkPlacement(s, vm, fw); err != nil {
		return nil, err
	}
	// A VM of this name already: this Proxy's from an earlier attempt, or
	// one being deleted, which keeps its name for a while. Either way its
	// firewall rule is left alone here.
	switch existing, err := b.instances.Get(ctx, &computepb.GetInstanceRequest{Project: b.cfg.Project, Zone: s.Zone, Instance: s.Name}); {
	case err == nil:
		return b.adoptVM(existing, s)
	case backend.ClassOf(Classify(err)) != backend.ClassNotFound:
		return nil, errors.Wrapf(Classify(err), "cannot get VM %s", s.Name)
	}
	// Both inserts share one wait of the operation timeout, so that a
	// create holds its reconcile worker no longer than that: the rule's
	// insert is waited for briefly (an error found at once is reported; a
	// rule still being made is Repair's to look at), the VM's for the rest.
	waitUntil := time.Now().Add(b.operationTimeout())
	if _, err := b.ensureFirewall(ctx, fw, min(ruleWait, b.operationTimeout())); err != nil {
		// A fleet's rule another VM's create is making (a scale-up
		// creates many at once) is not this create's to wait for; if it
		// was being deleted instead, Repair makes it again.
		if inFlux := (errRuleInFlux{}); !shared || !errors.As(err, &inFlux) {
			return nil, err
		}
	}
	op, err := b.instances.Insert(ctx, &computepb.InsertInstanceRequest{Project: b.cfg.Project, Zone: s.Zone, InstanceResource: vm})
	switch {
	case isConflict(err):
		return b.adopt(ctx, s)
	case err != nil:
		err = insertError(err, "cannot insert VM "+s.Name)
		if backend.ClassOf(err) == backend.ClassPermanent && !shared {
			// Not retried until the spec changes: the rule would only
			// wait for a VM that will not come. A fleet's rule is left
			// to its other VMs, or to orphan collection.
			b.dropFirewall(ctx, fw)
		}
		return nil, err
	}
	done, err := b.wait(ctx, op, max(time.Until(waitUntil), time.Second))
	if err != nil {
		err = insertError(err, fmt.Sprintf("inserting VM %s in zone %s failed", s.Name, s.Zone))
		if backend.ClassOf(err) == backend.ClassPermanent && !shared {
			// Not retried until the spec changes: the rule would only
			// wait for a VM that will not come.
			b.dropFirewall(ctx, fw)
		}
		return nil, err
	}
	i := &backend.Instance{
		Ref: s.Ref, ProviderID: b.ProviderID(s.Ref), Port: s.Port, Phase: v1alpha1.InstancePhaseProvisioning,
		CreatedAt: time.Now(), SpecHash: s.Hash, CredentialsSum: s.CredentialsSum, Owner: s.Owner,
	}
	if !done {
		i.Operation = op.Name()
	}
	return i, nil
}

// checkPlacement refuses, before anything is made, a VM the generated
// script cannot run on, and a subnetwork of another project than its
// network's.
func (b *Backend) checkPlacement(s backend.Spec, vm *computepb.Instance, fw *computepb.Firewall) error {
	if image := normalImage(s.GCP.Image); s.UserData == "" && image != "" && !scriptImageRe.MatchString(image) {
		// Checked at create only: a running VM of an image made before
		// this check is left to serve.
		return gcpCloud.UnsupportedImage(strconv.Quote(s.GCP.Image), "not a public image of projects/debian-cloud or projects/ubuntu-os-cloud")
	}
	if sn := vm.GetNetworkInterfaces()[0].GetSubnetwork(); sn != "" {
		snProject := b.cfg.Project
		if strings.HasPrefix(sn, "projects/") {
			snProject = firewallProject(sn)
		}
		if snProject != firewallProject(fw.GetNetwork()) {
			return backend.Errorf(backend.ClassPermanent, "spec.forProvider.gcp.subnetwork %s is in project %s, but network %s is not: a subnetwork belongs to its network's project; with a Shared VPC subnetwork set network to the host project's network",
				sn, snProject, fw.GetNetwork())
		}
	}
	return nil
}

// vm is the instance resource of s.
func (b *Backend) vm(s backend.Spec, script string, fw *computepb.Firewall) *computepb.Instance {
	labels := s.Owner.GCPLabels()
	labels[labelSpecHash] = s.Hash
	if s.CredentialsSum != "" {
		labels[labelCredentials] = s.CredentialsSum
	}
	labels[labelPort] = strconv.Itoa(int(s.Port))
	if s.GCP.PublishedAddress == v1alpha1.GCPPublishedInternal {
		labels[labelPublished] = "internal"
	}
	image := s.GCP.Image
	if image == "" {
		image = v1alpha1.DefaultGCPImage
	}
	machine := s.GCP.MachineType
	if machine == "" {
		machine = v1alpha1.DefaultGCPMachineType
	}
	disk := s.GCP.BootDiskType
	if disk == "" {
		disk = "pd-balanced"
	}
	tags := []string{s.Name}
	if fw.GetName() != s.Name {
		// The fleet's rule targets its own tag.
		labels[labelRule] = fw.GetName()
		tags = []string{fw.GetName()}
	}
	for _, t := range s.GCP.NetworkTags {
		tags = append(tags, string(t))
	}
	nic := &computepb.NetworkInterface{
		Network: ptr.To(b.network(s.GCP)),
		AccessConfigs: []*computepb.AccessConfig{{
			Name: ptr.To("External NAT"), Type: ptr.To(computepb.AccessConfig_ONE_TO_ONE_NAT.String()),
		}},
	}
	if sn := strings.TrimPrefix(s.GCP.Subnetwork, computeURL); sn != "" {
		nic.Subnetwork = ptr.To(sn)
	}
	vm := &computepb.Instance{
		Name:        ptr.To(s.Name),
		Description: ptr.To(fmt.Sprintf("egress proxy %s/%s", s.Owner.Namespace, s.Owner.Name)),
		MachineType: ptr.To(zonal(s.Zone, "machineTypes", machine)),
		Labels:      labels,
		Tags:        &computepb.Tags{Items: tags},
		Disks: []*computepb.AttachedDisk{{
			Boot: ptr.To(true), AutoDelete: ptr.To(true),
			InitializeParams: &computepb.AttachedDiskInitializeParams{SourceImage: ptr.To(image), DiskType: ptr.To(zonal(s.Zone, "diskTypes", disk))},
		}},
		NetworkInterfaces: []*computepb.NetworkInterface{nic},
		Metadata: &computepb.Metadata{Items: []*computepb.Items{
			{Key: ptr.To(metadataKey(s)), Value: ptr.To(script)},
			// The project's SSH keys open no door into a proxy: the
			// default network's rule admits SSH from anywhere.
			{Key: ptr.To("block-project-ssh-keys"), Value: ptr.To("TRUE")},
		}},
	}
	if s.GCP.ShieldedVM == nil || *s.GCP.ShieldedVM {
		vm.ShieldedInstanceConfig = &computepb.ShieldedInstanceConfig{
			EnableSecureBoot: ptr.To(true), EnableVtpm: ptr.To(true), EnableIntegrityMonitoring: ptr.To(true),
		}
	}
	return vm
}

// adopt handles an insert answered 409: the name is taken. The VM is this
// Proxy's own from an earlier attempt only when it carries the Proxy's
// ownership labels and spec hash and is not on its way out; a VM being
// deleted keeps its name for a while, and that is worth waiting for.
func (b *Backend) adopt(ctx context.Context, s backend.Spec) (*backend.Instance, error) {
	vm, err := b.instances.Get(ctx, &computepb.GetInstanceRequest{Project: b.cfg.Project, Zone: s.Zone, Instance: s.Name})
	if err != nil {
		if backend.ClassOf(Classify(err)) == backend.ClassNotFound {
			return nil, backend.Errorf(backend.ClassTransient, "VM name %s was taken, and its VM is gone now: retrying", s.Name)
		}
		return nil, errors.Wrapf(Classify(err), "cannot get VM %s", s.Name)
	}
	return b.adoptVM(vm, s)
}

// adoptVM decides whether vm, found under s's name, is s's own.
func (b *Backend) adoptVM(vm *computepb.Instance, s backend.Spec) (*backend.Instance, error) {
	i := b.instance(vm, s.Zone)
	want, _ := ownership.FromLabels(s.Owner.GCPLabels())
	switch {
	case i.Owner.UID != s.Owner.UID || i.Owner.ClusterID != want.ClusterID:
		return nil, backend.Errorf(backend.ClassTransient, "VM name %s is held by a VM this Proxy does not own (status %s): retrying until it is gone", s.Name, vm.GetStatus())
	case i.Phase == v1alpha1.InstancePhaseTerminated:
		return nil, backend.Errorf(backend.ClassTransient, "VM %s is still being deleted (status %s); its name is free once it is gone: retrying", s.Name, vm.GetStatus())
	case i.SpecHash != s.Hash:
		return nil, backend.Errorf(backend.ClassTransient, "VM %s of an earlier spec (hash %s) still holds the name: retrying until it is gone", s.Name, i.SpecHash)
	case i.CredentialsSum != s.CredentialsSum:
		return nil, backend.Errorf(backend.ClassTransient, "VM %s of earlier credentials still holds the name: retrying until it is gone", s.Name)
	}
	return i, nil
}

// wait waits for op with Compute Engine's own operations.wait, which holds
// the request until the operation is done (or answers early, with it still
// running: then it asks again), until limit passes or ctx ends, leaving a
// little of ctx for the caller to record the outcome. It reports whether op
// finished, and the error it finished with. A failure to wait only ends
// the wait: the operation goes on regardless, and a later look finds it.
func (b *Backend) wait(ctx context.Context, op *compute.Operation, limit time.Duration) (bool, error) {
	if op.Done() {
		return true, opError(op)
	}
	deadline := time.Now().Add(limit)
	if d, ok := ctx.Deadline(); ok && d.Add(-5*time.Second).Before(deadline) {
		deadline = d.Add(-5 * time.Second)
	}
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	project, zone := opScope(op.Proto(), b.cfg.Project)
	for {
		var got *computepb.Operation
		var err error
		if zone != "" {
			got, err = b.ops.Wait(wctx, &computepb.WaitZoneOperationRequest{Project: project, Zone: zone, Operation: op.Name()})
		} else {
			got, err = b.globalOps.Wait(wctx, &computepb.WaitGlobalOperationRequest{Project: project, Operation: op.Name()})
		}
		switch {
		case err != nil && backend.ClassOf(Classify(err)) == backend.ClassAccessDenied && wctx.Err() == nil:
			// A standing refusal to read the operation (no
			// compute.zoneOperations.get or globalOperations.get, as in
			// a Shared VPC host project) is not "not done yet": it would
			// never be done.
			return false, errors.Wrapf(Classify(err), "cannot read operation %s (the service account needs compute.zoneOperations.get and compute.globalOperations.get in project %s)", op.Name(), project)
		case err != nil:
			return false, nil
		case got.GetStatus() == computepb.Operation_DONE:
			return true, protoError(got)
		}
		// Answered early, still running: ask again, not in a tight loop.
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-wctx.Done():
			t.Stop()
			return false, nil
		case <-t.C:
		}
	}
}

// opScope reads the project and zone (empty for a global operation) of an
// operation from its links, as GCP writes them.
func opScope(p *computepb.Operation, project string) (string, string) {
	link := p.GetSelfLink()
	if i := strings.Index(link, "/projects/"); i >= 0 {
		if name, _, ok := strings.Cut(link[i+len("/projects/"):], "/"); ok {
			project = name
		}
	}
	zone := p.GetZone()
	if i := strings.LastIndex(zone, "/"); i >= 0 {
		zone = zone[i+1:]
	}
	return project, zone
}

func (b *Backend) operationTimeout() time.Duration {
	if b.cfg.OperationTimeout > 0 {
		return b.cfg.OperationTimeout
	}
	return DefaultOperationTimeout
}

// repairWait is how long Repair waits for a rule's operation: long enough
// to see an error GCP reports at once, short enough to keep Observe quick.
const repairWait = 3 * time.Second

// ruleWait is how long Create waits for its rule's insert, of its
// operation timeout.
const ruleWait = 2 * time.Second

// dropFirewall deletes fw without waiting, as a best effort: Observe of a
// deleted Proxy deletes it again.
func (b *Backend) dropFirewall(ctx context.Context, fw *computepb.Firewall) {
	_, _ = b.firewalls.Delete(ctx, &computepb.DeleteFirewallRequest{Project: firewallProject(fw.GetNetwork()), Firewall: fw.GetName()})
}

// opError is the error a finished operation reports, as the client
// library would return it from Poll.
func opError(op *compute.Operation) error { return protoError(op.Proto()) }

func protoError(p *computepb.Operation) error {
	if p.GetError() == nil && (p.HttpErrorStatusCode == nil || p.GetHttpErrorStatusCode() < 300) {
		return nil
	}
	var codes []string
	for _, e := range p.GetError().GetErrors() {
		codes = append(codes, e.GetCode()+": "+e.GetMessage())
	}
	return &googleapi.Error{Code: int(p.GetHttpErrorStatusCode()), Message: p.GetHttpErrorMessage() + ": " + strings.Join(codes, "; ")}
}

// CheckOperation reports how an insert Create left running ended: nil
// while it runs, when it succeeded or when GCP no longer knows it, else
// its error, classified.
func (b *Backend) CheckOperation(ctx context.Context, r backend.Ref, name string) error {
	op, err := b.ops.Get(ctx, &computepb.GetZoneOperationRequest{Project: b.cfg.Project, Zone: r.Zone, Operation: name})
	switch {
	case err != nil && backend.ClassOf(Classify(err)) == backend.ClassNotFound:
		return nil
	case err != nil:
		return errors.Wrapf(Classify(err), "cannot get operation %s", name)
	case op.GetStatus() != computepb.Operation_DONE:
		return nil
	}
	if err := protoError(op); err != nil {
		return insertError(err, fmt.Sprintf("inserting VM %s in zone %s failed (operation %s)", r.Name, r.Zone, name))
	}
	return nil
}

// ensureFirewall makes rule fw exist as given: it inserts it, or updates a
// rule of its name that differs (left from an earlier spec, or edited by
// hand). It reports whether the rule is in place now, waiting up to wait
// for the operation; a later call sees how a longer one went.
func (b *Backend) ensureFirewall(ctx context.Context, fw *computepb.Firewall, wait time.Duration) (bool, error) {
	project := firewallProject(fw.GetNetwork())
	op, err := b.firewalls.Insert(ctx, &computepb.InsertFirewallRequest{Project: project, FirewallResource: fw})
	if isConflict(err) {
		cur, gerr := b.firewalls.Get(ctx, &computepb.GetFirewallRequest{Project: project, Firewall: fw.GetName()})
		switch {
		case gerr != nil && backend.ClassOf(Classify(gerr)) == backend.ClassNotFound:
			return false, backend.Wrap(backend.ClassTransient, errRuleInFlux{name: fw.GetName()})
		case gerr != nil:
			return false, errors.Wrapf(Classify(gerr), "cannot get firewall rule %s", fw.GetName())
		case sameRule(cur, fw):
			return true, nil
		}
		op, err = b.firewalls.Update(ctx, &computepb.UpdateFirewallRequest{Project: project, Firewall: fw.GetName(), FirewallResource: fw})
		if err != nil {
			return false, errors.Wrapf(Classify(err), "cannot update firewall rule %s to this proxy's settings", fw.GetName())
		}
	} else if err != nil {
		return false, insertError(err, "cannot create firewall rule "+fw.GetName())
	}
	done, err := b.wait(ctx, op, wait)
	if err != nil {
		return false, insertError(err, fmt.Sprintf("firewall rule %s failed", fw.GetName()))
	}
	return done, nil
}

// errRuleInFlux says a rule's name is taken by a rule that cannot be read:
// one being created (by another VM's create, for a fleet's rule) or deleted.
type errRuleInFlux struct{ name string }

func (e errRuleInFlux) Error() string {
	return "firewall rule " + e.name + " is being created or deleted: retrying"
}

// sameRule reports whether a rule lets in what want lets in, to what it
// targets.
func sameRule(got, want *computepb.Firewall) bool {
	norm := func(f *computepb.Firewall) string {
		ranges := slices.Clone(f.GetSourceRanges())
		slices.Sort(ranges)
		var allowed []string
		for _, a := range f.GetAllowed() {
			allowed = append(allowed, a.GetIPProtocol()+":"+strings.Join(a.GetPorts(), ","))
		}
		slices.Sort(allowed)
		tags := slices.Clone(f.GetTargetTags())
		slices.Sort(tags)
		return strings.Join([]string{
			strings.TrimPrefix(f.GetNetwork(), computeURL), f.GetDirection(), strings.Join(ranges, ","), strings.Join(allowed, ";"),
			strings.Join(tags, ","), strings.Join(f.GetSourceTags(), ","), strings.Join(f.GetSourceServiceAccounts(), ","),
			strings.Join(f.GetTargetServiceAccounts(), ","), strconv.FormatBool(f.GetDisabled()), fmt.Sprint(len(f.GetDenied())),
			// The description names the owner, for orphan collection: an
			// old or edited one is put right too.
			f.GetDescription(),
		}, "|")
	}
	return norm(got) == norm(want)
}

// Repair puts the VM's firewall rule right from the spec: it re-creates a
// rule that is gone (deleted by hand, or by an old rule's delete that
// finished after a new insert), and resets one that was changed. It
// reports whether the rule is in place; until it is the proxy is not used.
// It waits only briefly for the rule's operation: Observe must stay quick.
func (b *Backend) Repair(ctx context.Context, s backend.Spec) (bool, error) {
	if s.GCP == nil {
		return true, nil
	}
	// A VM made before fleets shared rules keeps its own.
	fw, err := b.firewall(s, s.Rule != "")
	if err != nil {
		return false, err
	}
	imported := s.Rule != "" && fw.GetName() != s.Rule
	if imported {
		// A VM imported from another fleet shares its maker's fleet rule,
		// which is put right under its own name and description.
		fw.Name, fw.TargetTags = ptr.To(s.Rule), []string{s.Rule}
	}
	cur, err := b.firewalls.Get(ctx, &computepb.GetFirewallRequest{Project: firewallProject(fw.GetNetwork()), Firewall: fw.GetName()})
	if imported && err == nil {
		fw.Description = cur.Description
	}
	switch {
	case err == nil && sameRule(cur, fw):
		return true, nil
	case err != nil && backend.ClassOf(Classify(err)) != backend.ClassNotFound:
		return false, errors.Wrapf(Classify(err), "cannot get firewall rule %s", fw.GetName())
	}
	return b.ensureFirewall(ctx, fw, repairWait)
}

// Phase maps a VM status to an instance phase. A RUNNING VM without an
// external IP is still provisioning: an empty address is never published.
// A VM stopping, being deleted or repossessed is on its way out.
func Phase(status, natIP string) v1alpha1.InstancePhase {
	switch status {
	case "RUNNING":
		if natIP == "" {
			return v1alpha1.InstancePhaseProvisioning
		}
		return v1alpha1.InstancePhaseRunning
	case "STOPPING", "PENDING_STOP", "STOPPED", "SUSPENDING", "SUSPENDED", "TERMINATED", "DEPROVISIONING":
		return v1alpha1.InstancePhaseTerminated
	default: // PROVISIONING, STAGING, REPAIRING
		return v1alpha1.InstancePhaseProvisioning
	}
}

func natIP(vm *computepb.Instance) string {
	for _, ni := range vm.GetNetworkInterfaces() {
		for _, ac := range ni.GetAccessConfigs() {
			if ip := ac.GetNatIP(); ip != "" {
				return ip
			}
		}
	}
	return ""
}

func (b *Backend) instance(vm *computepb.Instance, zone string) *backend.Instance {
	owner, _ := ownership.FromLabels(vm.GetLabels())
	created, _ := time.Parse(time.RFC3339, vm.GetCreationTimestamp())
	port, _ := strconv.Atoi(vm.GetLabels()[labelPort])
	ref := backend.Ref{Name: vm.GetName(), Zone: zone, Rule: vm.GetLabels()[labelRule]}
	for _, ni := range vm.GetNetworkInterfaces() {
		if p := NetworkProject(ni.GetNetwork()); p != b.cfg.Project {
			ref.NetworkProject = p
		}
	}
	i := &backend.Instance{
		Ref: ref, ProviderID: b.ProviderID(ref), Port: int32(port), CreatedAt: created,
		SpecHash: vm.GetLabels()[labelSpecHash], CredentialsSum: vm.GetLabels()[labelCredentials], Owner: owner,
		Phase: Phase(vm.GetStatus(), natIP(vm)),
	}
	if i.Phase == v1alpha1.InstancePhaseRunning {
		i.Host = natIP(vm)
		if vm.GetLabels()[labelPublished] == "internal" {
			// Crawlers in the VPC connect to its internal address;
			// traffic still leaves through the external one.
			i.Host = ""
			if nis := vm.GetNetworkInterfaces(); len(nis) > 0 {
				i.Host = nis[0].GetNetworkIP()
			}
			if i.Host == "" {
				i.Phase = v1alpha1.InstancePhaseProvisioning
			}
		}
	}
	if i.Phase == v1alpha1.InstancePhaseTerminated {
		i.Reason = "VM status " + vm.GetStatus()
		if m := vm.GetStatusMessage(); m != "" {
			i.Reason += ": " + m
		}
	}
	return i
}

// Get observes a VM. Its firewall rule is Repair's business.
func (b *Backend) Get(ctx context.Context, r backend.Ref) (*backend.Instance, error) {
	vm, err := b.instances.Get(ctx, &computepb.GetInstanceRequest{Project: b.cfg.Project, Zone: r.Zone, Instance: r.Name})
	if err != nil {
		return nil, errors.Wrapf(Classify(err), "cannot get VM %s", r.Name)
	}
	return b.instance(vm, r.Zone), nil
}

// Delete removes the firewall rule, waiting a bounded time for that, then
// the VM; either being gone already is success, and so is a VM already
// being deleted. It does not wait for the VM: that keeps its name,
// STOPPING, until it is gone, and Get shows it. The rule goes first so that a
// failure leaves the VM, which the reconciler sees and deletes again,
// rather than a rule nobody looks for.
func (b *Backend) Delete(ctx context.Context, r backend.Ref) error {
	for _, project := range b.firewallProjects(r) {
		op, err := b.firewalls.Delete(ctx, &computepb.DeleteFirewallRequest{Project: project, Firewall: r.Name})
		if err != nil {
			if c := Classify(err); backend.ClassOf(c) != backend.ClassNotFound {
				return errors.Wrapf(c, "cannot delete firewall rule %s", r.Name)
			}
			continue
		}
		// Wait for it, so that a rule being deleted is not mistaken by the
		// next Create for one in place.
		if _, err := b.wait(ctx, op, b.operationTimeout()); err != nil {
			return errors.Wrapf(Classify(err), "deleting firewall rule %s failed", r.Name)
		}
	}
	if r.Zone == "" {
		// A rule left without its VM (orphan collection): nothing else.
		return nil
	}
	// Which fleet rule the VM shares, as it says (an imported or replaced
	// VM's may not be the one its Proxy's spec derives, r.Rule), to let go
	// of after it; a VM gone already leaves r.Rule to go by.
	network := ""
	if vm, err := b.instances.Get(ctx, &computepb.GetInstanceRequest{Project: b.cfg.Project, Zone: r.Zone, Instance: r.Name}); err == nil {
		r.Rule = vm.GetLabels()[labelRule]
		if nis := vm.GetNetworkInterfaces(); len(nis) > 0 {
			network = nis[0].GetNetwork()
		}
	}
	_, err := b.instances.Delete(ctx, &computepb.DeleteInstanceRequest{Project: b.cfg.Project, Zone: r.Zone, Instance: r.Name})
	c := Classify(err)
	switch {
	case err == nil, backend.ClassOf(c) == backend.ClassNotFound:
	case backend.ClassOf(c) == backend.ClassTransient:
		// Not ready: an operation runs on the VM. If it is its deletion,
		// the VM is as good as gone.
		if i, gerr := b.Get(ctx, r); gerr != nil || i.Phase != v1alpha1.InstancePhaseTerminated {
			return errors.Wrapf(c, "cannot delete VM %s", r.Name)
		}
	default:
		return errors.Wrapf(c, "cannot delete VM %s", r.Name)
	}
	if r.Rule != "" {
		b.releaseRule(ctx, r, network)
	}
	return nil
}

// releaseRule deletes a fleet's rule once no VM but the one going (r)
// carries it, without waiting. A VM created meanwhile that finds it gone
// gets it back from Repair; a rule two last VMs each saw the other use is
// left to orphan collection. Failures are left to it too.
func (b *Backend) releaseRule(ctx context.Context, r backend.Ref, network string) {
	it := b.instances.AggregatedList(ctx, &computepb.AggregatedListInstancesRequest{
		Project: b.cfg.Project, Filter: ptr.To(`(labels.` + labelRule + ` = "` + r.Rule + `")`),
	})
	for {
		pair, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			return
		}
		if resp, ok := it.Response.(*computepb.InstanceAggregatedList); ok && len(resp.GetUnreachables()) > 0 || pair.Value.GetWarning().GetCode() == "UNREACHABLE" {
			// A zone in an outage may hold VMs that carry it.
			return
		}
		for _, vm := range pair.Value.GetInstances() {
			// VMs being deleted do not hold it: of a fleet's last VMs,
			// deleted together, the last to look lets go.
			if vm.GetName() != r.Name && Phase(vm.GetStatus(), "x") != v1alpha1.InstancePhaseTerminated {
				return
			}
		}
	}
	project := b.cfg.Project
	if p := NetworkProject(network); p != "" {
		project = p
	} else if r.NetworkProject != "" {
		project = r.NetworkProject
	}
	_, _ = b.firewalls.Delete(ctx, &computepb.DeleteFirewallRequest{Project: project, Firewall: r.Rule})
}

// firewallProjects are the projects a VM's rule may live in: the
// ProviderConfig's, and the Shared VPC host project its Ref names.
func (b *Backend) firewallProjects(r backend.Ref) []string {
	out := []string{b.cfg.Project}
	if r.NetworkProject != "" && r.NetworkProject != b.cfg.Project {
		out = append(out, r.NetworkProject)
	}
	return out
}

// ListOwned lists this cluster's proxy VMs in every zone of the project.
// A zone in an outage is unreachable, and its VMs are missing from the
// list: GCP says so in a scope warned UNREACHABLE (or, to a caller that
// opted in to partial success, which this client library cannot, in
// unreachables). Both are read.
func (b *Backend) ListOwned(ctx context.Context) ([]backend.Instance, error) {
	it := b.instances.AggregatedList(ctx, &computepb.AggregatedListInstancesRequest{
		Project: b.cfg.Project, Filter: ptr.To(ownership.GCPFilter(b.cfg.ClusterID)),
	})
	var out []backend.Instance
	unreachable := map[string]bool{}
	for {
		pair, err := it.Next()
		if resp, ok := it.Response.(*computepb.InstanceAggregatedList); ok {
			for _, z := range resp.GetUnreachables() {
				unreachable[z] = true
			}
		}
		if errors.Is(err, iterator.Done) && len(unreachable) > 0 {
			// The VMs of a zone in an outage are not listed: a rule
			// only they carry would look unused, and be taken.
			zones := slices.Sorted(maps.Keys(unreachable))
			return out, &backend.PartialList{Skipped: "firewall rules of project " + b.cfg.Project,
				Err: errors.Errorf("the VMs of %s could not be listed (unreachable), so no rule can be judged unused", strings.Join(zones, ", "))}
		}
		if errors.Is(err, iterator.Done) {
			rules, err := b.orphanRules(ctx, out)
			return cloudvm.WithOpenings(out, rules, err)
		}
		if err != nil {
			return nil, errors.Wrap(Classify(err), "cannot list VMs")
		}
		if pair.Value.GetWarning().GetCode() == "UNREACHABLE" {
			unreachable[pair.Key] = true
		}
		zone := strings.TrimPrefix(pair.Key, "zones/")
		for _, vm := range pair.Value.GetInstances() {
			out = append(out, *b.instance(vm, zone))
		}
	}
}

// orphanRules lists this cluster's firewall rules in the project that no
// listed VM has: a rule whose VM never came (a create cut short) or whose
// VM was deleted by hand. Rules in a Shared VPC host project are not
// listed: the provider may not list there.
func (b *Backend) orphanRules(ctx context.Context, vms []backend.Instance) ([]backend.Instance, error) {
	have := map[string]bool{}
	for _, i := range vms {
		have[i.Name] = true
		if i.Rule != "" {
			have[i.Rule] = true
		}
	}
	it := b.firewalls.List(ctx, &computepb.ListFirewallsRequest{Project: b.cfg.Project, Filter: ptr.To(`description eq '.*` + ruleMarker + `.*'`)})
	var out []backend.Instance
	for {
		fw, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return out, cloudvm.OpeningsUnlisted(Classify(err), "firewall rules of project "+b.cfg.Project+" (grant compute.firewalls.list to collect them)", "firewall rules")
		}
		// A rule of a VM in another project (a Shared VPC host's rule
		// listed by a configuration of the host project) is that
		// project's configuration's business: its VM is not in this list.
		owner, vmProject, ok := ruleOwner(fw)
		if !ok {
			// A fleet's rule no listed VM carries: its last VM went
			// without taking it along, or never came.
			owner, vmProject, ok = sharedRuleOwner(fw)
		}
		if !ok || have[fw.GetName()] || !owner.OfCluster(b.cfg.ClusterID) || vmProject != b.cfg.Project {
			continue
		}
		created, _ := time.Parse(time.RFC3339, fw.GetCreationTimestamp())
		out = append(out, backend.Instance{
			Ref:        backend.Ref{Name: fw.GetName()},
			ProviderID: fmt.Sprintf("projects/%s/global/firewalls/%s", b.cfg.Project, fw.GetName()),
			Phase:      v1alpha1.InstancePhaseTerminated, CreatedAt: created, Owner: owner,
		})
	}
}

// Adopt relabels the VM for the Proxy that imports it, if it still belongs
// to from. The label fingerprint makes it a compare-and-swap: of two
// imports racing, the second is refused. Its firewall rule keeps naming the
// VM's maker, after whose UID the rule (and the VM) are named, so the
// orphan collector still knows it once the VM is gone.
func (b *Backend) Adopt(ctx context.Context, r backend.Ref, from types.UID, to ownership.Owner) error {
	vm, err := b.instances.Get(ctx, &computepb.GetInstanceRequest{Project: b.cfg.Project, Zone: r.Zone, Instance: r.Name})
	if err != nil {
		return errors.Wrapf(Classify(err), "cannot get VM %s", r.Name)
	}
	cur, _ := ownership.FromLabels(vm.GetLabels())
	if h := cur.Holder(); h != from && h != to.UID {
		return backend.HeldElsewhere("VM "+r.Name, h, from)
	}
	labels := cur.AdoptedBy(to).Relabel(vm.GetLabels(), true)
	op, err := b.instances.SetLabels(ctx, &computepb.SetLabelsInstanceRequest{
		Project: b.cfg.Project, Zone: r.Zone, Instance: r.Name,
		InstancesSetLabelsRequestResource: &computepb.InstancesSetLabelsRequest{Labels: labels, LabelFingerprint: vm.LabelFingerprint},
	})
	if err != nil {
		return errors.Wrapf(labelError(err), "cannot label VM %s for its new Proxy", r.Name)
	}
	// Wait, so that the import is recorded only once the VM says so.
	done, err := b.wait(ctx, op, b.operationTimeout())
	switch {
	case err != nil:
		return errors.Wrapf(Classify(err), "labelling VM %s for its new Proxy failed", r.Name)
	case !done:
		return backend.Errorf(backend.ClassTransient, "labelling VM %s for its new Proxy is still running: retrying", r.Name)
	}
	return nil
}

// SetRetain labels the VM to outlive its Proxy or not. It does not wait for
// the operation: the next Observe sees the label.
func (b *Backend) SetRetain(ctx context.Context, r backend.Ref, retain bool) error {
	vm, err := b.instances.Get(ctx, &computepb.GetInstanceRequest{Project: b.cfg.Project, Zone: r.Zone, Instance: r.Name})
	if err != nil {
		return errors.Wrapf(Classify(err), "cannot get VM %s", r.Name)
	}
	labels := map[string]string{}
	for k, v := range vm.GetLabels() {
		labels[k] = v
	}
	delete(labels, labelRetain)
	if retain {
		labels[labelRetain] = "true"
	}
	_, err = b.instances.SetLabels(ctx, &computepb.SetLabelsInstanceRequest{
		Project: b.cfg.Project, Zone: r.Zone, Instance: r.Name,
		InstancesSetLabelsRequestResource: &computepb.InstancesSetLabelsRequest{Labels: labels, LabelFingerprint: vm.LabelFingerprint},
	})
	return errors.Wrapf(labelError(err), "cannot label VM %s", r.Name)
}

// labelError classifies an error of setLabels: a 412 there is the label
// fingerprint having moved since the VM was read (another writer, a race
// of two imports), which the next try reads afresh; Classify takes any
// other 412 for an organisation policy, which no retry fixes.
func labelError(err error) error {
	c := Classify(err)
	if err != nil && backend.ClassOf(c) == backend.ClassPermanent && strings.Contains(strings.ToLower(err.Error()), "fingerprint") {
		var ge *googleapi.Error
		var ae *apierror.APIError
		if (errors.As(err, &ge) && ge.Code == http.StatusPreconditionFailed) || (errors.As(err, &ae) && ae.HTTPCode() == http.StatusPreconditionFailed) {
			return backend.Wrap(backend.ClassTransient, errors.Wrap(err, "the VM's labels changed since they were read: retrying"))
		}
	}
	return c
}
