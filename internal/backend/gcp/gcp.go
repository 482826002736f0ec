// Package gcp runs each proxy on a Compute Engine VM with its own ephemeral
// external IP: the only backend whose proxies have truly distinct egress
// IPs. It uses the real cloud.google.com/go/compute REST clients; tests
// point them at an in-process fake of the Compute API.
//
// gcp.go holds the Backend, its VMs (Create, Get, Delete, Adopt,
// SetRetain) and its start-up script; firewall.go the firewall rules (a
// fleet's shared rule, its repair and release); operations.go the
// hand-off and wait of long operations; listing.go ListOwned and the
// orphaned rules; errors.go the error classes and GCP's error details.
package gcp

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
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
	// labelPublished is "internal" on a VM whose internal address is
	// published (gcp.publishedAddress Internal).
	labelPublished = "egress-published"
	// labelRule names the firewall rule a VM shares with the others of its
	// fleet; a VM without it has a rule of its own, named after it.
	labelRule = "egress-rule"
)

// gcpKeys are the labels a VM records itself by; its name is GCP's name.
var gcpKeys = cloudvm.Keys{SpecHash: labelSpecHash, Credentials: labelCredentials, Port: labelPort, Opening: labelRule, GCPForm: true}

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

// New returns a gcp backend, cfg's zero settings taking their defaults.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	if cfg.OperationTimeout <= 0 {
		cfg.OperationTimeout = DefaultOperationTimeout
	}
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
// Debian's and Ubuntu's public images of cloudvm.Families (apt, systemd,
// the release's squid package), by family or by name, Ubuntu's also in
// its Pro and minimal variants.
var scriptImageRe = regexp.MustCompile(`^projects/(debian-cloud|ubuntu-os-cloud|ubuntu-os-pro-cloud)/global/images/(family/)?(` + scriptFamilies() + `)(-[a-z0-9-]+)?$`)

// scriptFamilies is the alternation of cloudvm.Families as GCP's image
// families name them.
func scriptFamilies() string {
	names := make([]string, 0, len(cloudvm.Families))
	for _, f := range cloudvm.Families {
		name := regexp.QuoteMeta(f.Name)
		if f.Distro == cloudvm.Ubuntu {
			name = "ubuntu-(pro-)?(minimal-)?" + regexp.QuoteMeta(strings.TrimPrefix(f.Name, "ubuntu-"))
		}
		names = append(names, name)
	}
	return strings.Join(names, "|")
}

// normalImage strips the API's URL prefix, which GCP accepts on images.
func normalImage(s string) string { return strings.TrimPrefix(s, computeURL) }

func zonal(zone, kind, v string) string {
	if strings.Contains(v, "/") {
		return v
	}
	return fmt.Sprintf("zones/%s/%s/%s", zone, kind, v)
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
	waitUntil := time.Now().Add(b.cfg.OperationTimeout)
	if _, err := b.ensureFirewall(ctx, fw, min(ruleWait, b.cfg.OperationTimeout)); err != nil {
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
		return gcpCloud.UnsupportedImage(strconv.Quote(s.GCP.Image), fmt.Sprintf(isFmtNotImage, cloudvm.SupportedReleases()))
	}
	if sn := vm.GetNetworkInterfaces()[0].GetSubnetwork(); sn != "" {
		snProject := b.cfg.Project
		if strings.HasPrefix(sn, "projects/") {
			snProject = firewallProject(sn)
		}
		if snProject != firewallProject(fw.GetNetwork()) {
			return backend.Errorf(backend.ClassPermanent, errFmtSubnetworkProject,
				sn, snProject, fw.GetNetwork())
		}
	}
	return nil
}

// isFmtNotImage says what an image the script cannot run on is, in
// cloudvm.ErrFmtUnsupportedImage: the releases it supports.
const isFmtNotImage = "not an image of %s from projects/debian-cloud, ubuntu-os-cloud or ubuntu-os-pro-cloud"

// errFmtSubnetworkProject refuses a subnetwork of another project than
// its network's: the subnetwork, its project, the network.
const errFmtSubnetworkProject = "spec.forProvider.gcp.subnetwork %s is in project %s, but network %s is not: a subnetwork belongs to its network's project; with a Shared VPC subnetwork set network to the host project's network"

// vm is the instance resource of s.
func (b *Backend) vm(s backend.Spec, script string, fw *computepb.Firewall) *computepb.Instance {
	shared := ""
	if fw.GetName() != s.Name {
		// The fleet's rule; a VM's own is named after it.
		shared = fw.GetName()
	}
	labels := gcpKeys.Record(s, shared)
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
	if shared != "" {
		// The fleet's rule targets its own tag.
		tags = []string{shared}
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

// What adoptVM answers for a VM under a Proxy's name that is not its own,
// each with the VM's name first.
const (
	errFmtNameHeldByOther  = "VM name %s is held by a VM this Proxy does not own (status %s): retrying until it is gone"
	errFmtStillDeleting    = "VM %s is still being deleted (status %s); its name is free once it is gone: retrying"
	errFmtEarlierSpec      = "VM %s of an earlier spec (hash %s) still holds the name: retrying until it is gone"
	errFmtEarlierPasswords = "VM %s of earlier credentials still holds the name: retrying until it is gone"
)

// adoptVM decides whether vm, found under s's name, is s's own.
func (b *Backend) adoptVM(vm *computepb.Instance, s backend.Spec) (*backend.Instance, error) {
	i := b.instance(vm, s.Zone)
	want, _ := ownership.FromLabels(s.Owner.GCPLabels())
	switch {
	case i.Owner.UID != s.Owner.UID || i.Owner.ClusterID != want.ClusterID:
		return nil, backend.Errorf(backend.ClassTransient, errFmtNameHeldByOther, s.Name, vm.GetStatus())
	case i.Phase == v1alpha1.InstancePhaseTerminated:
		return nil, backend.Errorf(backend.ClassTransient, errFmtStillDeleting, s.Name, vm.GetStatus())
	case i.SpecHash != s.Hash:
		return nil, backend.Errorf(backend.ClassTransient, errFmtEarlierSpec, s.Name, i.SpecHash)
	case i.CredentialsSum != s.CredentialsSum:
		return nil, backend.Errorf(backend.ClassTransient, errFmtEarlierPasswords, s.Name)
	}
	return i, nil
}

// Phase maps a VM status to an instance phase. A RUNNING VM without an
// external IP is still provisioning: an empty address is never published.
// A VM stopping, being deleted or repossessed is on its way out.
func Phase(status, natIP string) v1alpha1.InstancePhase {
	switch {
	case status == "RUNNING" && natIP != "":
		return v1alpha1.InstancePhaseRunning
	case slices.Contains(stoppedStatuses, status):
		return v1alpha1.InstancePhaseTerminated
	default: // PROVISIONING, STAGING, REPAIRING, RUNNING without an address
		return v1alpha1.InstancePhaseProvisioning
	}
}

// stoppedStatuses are the VM statuses Phase calls Terminated: a VM
// stopping, stopped, suspended or going away.
var stoppedStatuses = []string{"STOPPING", "PENDING_STOP", "STOPPED", "SUSPENDING", "SUSPENDED", "TERMINATED", "DEPROVISIONING"}

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
	created, _ := time.Parse(time.RFC3339, vm.GetCreationTimestamp())
	i := &backend.Instance{Ref: backend.Ref{Name: vm.GetName(), Zone: zone}, CreatedAt: created, Phase: Phase(vm.GetStatus(), natIP(vm))}
	gcpKeys.Observe(vm.GetLabels(), i)
	for _, ni := range vm.GetNetworkInterfaces() {
		if p := NetworkProject(ni.GetNetwork()); p != b.cfg.Project {
			i.NetworkProject = p
		}
	}
	i.ProviderID = b.ProviderID(i.Ref)
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
		if _, err := b.wait(ctx, op, b.cfg.OperationTimeout); err != nil {
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
	labels, err := cloudvm.Adopted("VM "+r.Name, vm.GetLabels(), from, to, true)
	if err != nil {
		return err
	}
	op, err := b.instances.SetLabels(ctx, &computepb.SetLabelsInstanceRequest{
		Project: b.cfg.Project, Zone: r.Zone, Instance: r.Name,
		InstancesSetLabelsRequestResource: &computepb.InstancesSetLabelsRequest{Labels: labels, LabelFingerprint: vm.LabelFingerprint},
	})
	if err != nil {
		return errors.Wrapf(labelError(err), "cannot label VM %s for its new Proxy", r.Name)
	}
	// Wait, so that the import is recorded only once the VM says so.
	done, err := b.wait(ctx, op, b.cfg.OperationTimeout)
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
	labels := cloudvm.Retained(vm.GetLabels(), retain, true)
	_, err = b.instances.SetLabels(ctx, &computepb.SetLabelsInstanceRequest{
		Project: b.cfg.Project, Zone: r.Zone, Instance: r.Name,
		InstancesSetLabelsRequestResource: &computepb.InstancesSetLabelsRequest{Labels: labels, LabelFingerprint: vm.LabelFingerprint},
	})
	return errors.Wrapf(labelError(err), "cannot label VM %s", r.Name)
}
