package gcp_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/cloudvm"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/cloudvm/cloudvmtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp/gcpfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

func newBackend(t *testing.T, fake *gcpfake.Server, cluster string) *gcp.Backend {
	t.Helper()
	b, err := gcp.New(context.Background(), gcp.Config{Project: "crawl-proj", ClusterID: cluster, ClientOptions: fake.ClientOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func spec(uid string) backend.Spec {
	o := ownership.Owner{ClusterID: "c1", Namespace: "team", Name: "p-" + uid, UID: types.UID(uid)}
	return backend.Spec{
		Ref: backend.Ref{Name: ownership.InstanceName(o.UID), Zone: "europe-west1-b"}, Owner: o, Port: 3128,
		Credentials:         &backend.Credentials{Username: "crawler", Password: "pw"},
		AllowedSourceRanges: []string{"203.0.113.0/24"},
		GCP:                 &v1alpha1.GCPPlacement{Zone: "europe-west1-b", GCPInstance: v1alpha1.GCPInstance{MachineType: "e2-micro", NetworkTags: []v1alpha1.NetworkTag{"crawl"}}},
		Hash:                "abc123",
	}
}

func TestLifecycle(t *testing.T) {
	fake := gcpfake.Start(t)
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := spec("0b7c6a2e-1111-4222-8333-944455556666")
	s.CredentialsSum = "0123456789abcdef"

	inst, err := b.Create(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Phase != v1alpha1.InstancePhaseProvisioning || inst.ProviderID != "projects/crawl-proj/zones/europe-west1-b/instances/"+s.Name {
		t.Errorf("a fresh VM is provisioning under its GCP name: %+v", inst)
	}

	vm := fake.Instance("europe-west1-b", s.Name)
	if vm == nil {
		t.Fatal("the fake received no insert")
	}
	ac := vm.GetNetworkInterfaces()[0].GetAccessConfigs()[0]
	if ac.GetType() != "ONE_TO_ONE_NAT" || vm.GetMachineType() != "zones/europe-west1-b/machineTypes/e2-micro" ||
		vm.GetDisks()[0].GetInitializeParams().GetSourceImage() != "projects/debian-cloud/global/images/family/debian-12" {
		t.Errorf("VM: want an ephemeral external IP, the machine type and image; got %v", vm)
	}
	if vm.GetDisks()[0].GetInitializeParams().GetDiskType() != "zones/europe-west1-b/diskTypes/pd-balanced" {
		t.Errorf("the boot disk is pd-balanced, which every machine family takes: %v", vm.GetDisks()[0])
	}
	if sh := vm.GetShieldedInstanceConfig(); !sh.GetEnableSecureBoot() || !sh.GetEnableVtpm() || !sh.GetEnableIntegrityMonitoring() {
		t.Errorf("Shielded VM is on by default: %v", sh)
	}
	if k := vm.GetMetadata().GetItems()[0].GetKey(); k != "startup-script" {
		t.Errorf("the generated script goes to startup-script, got %s", k)
	}
	// The default network's SSH rule admits anyone: the project's keys
	// must not open the proxy to whoever holds one.
	if it := vm.GetMetadata().GetItems(); len(it) != 2 || it[1].GetKey() != "block-project-ssh-keys" || it[1].GetValue() != "TRUE" {
		t.Errorf("project-wide SSH keys are blocked: %v", it)
	}
	if diff := cmp.Diff([]string{s.Name, "crawl"}, vm.GetTags().GetItems()); diff != "" {
		t.Errorf("network tags: -want, +got:\n%s", diff)
	}
	wantLabels := s.Owner.GCPLabels()
	wantLabels["egress-spec-hash"], wantLabels["egress-port"] = "abc123", "3128"
	// Which credentials the startup script gave it: a VM cannot change
	// them, so a change shows as a difference from this.
	wantLabels["egress-credentials"] = s.CredentialsSum
	if diff := cmp.Diff(wantLabels, vm.GetLabels()); diff != "" {
		t.Errorf("labels: -want, +got:\n%s", diff)
	}
	script := vm.GetMetadata().GetItems()[0].GetValue()
	for _, want := range []string{"install -y -qq squid", "DPkg::Lock::Timeout", "http_port 3128", "acl egress_clients src 203.0.113.0/24", "crawler:$6$rounds=50000$", "systemctl restart egress-proxy"} {
		if !strings.Contains(script, want) {
			t.Errorf("startup script lacks %q", want)
		}
	}
	if strings.Contains(script, "crawler:pw") || strings.Contains(script, "$apr1$") {
		t.Error("the startup script must carry a strong hash, never the password nor APR1 (metadata readers see it)")
	}
	fw := fake.Firewall(s.Name)
	if fw == nil || fw.GetAllowed()[0].GetPorts()[0] != "3128" || fw.GetSourceRanges()[0] != "203.0.113.0/24" || fw.GetTargetTags()[0] != s.Name {
		t.Errorf("firewall rule: want tcp:3128 from 203.0.113.0/24 to this VM only, got %v", fw)
	}

	// A retried create (a crash between insert and persist) finds the same VM.
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	// One with other credentials finds the VM of the earlier ones still
	// holding the name: it waits, rather than taking it for its own.
	other := s
	other.CredentialsSum = "fedcba9876543210"
	if _, err := b.Create(ctx, other); backend.ClassOf(err) != backend.ClassTransient {
		t.Errorf("a create with other credentials must wait for the earlier VM to go: %v", err)
	}
	if n := fake.Instances(); n != 1 {
		t.Errorf("a retried create must not make a second VM: %d VMs", n)
	}

	fake.SetStatus("europe-west1-b", s.Name, "RUNNING", "198.51.100.7")
	got, err := b.Get(ctx, s.Ref)
	if err != nil {
		t.Fatal(err)
	}
	if got.Phase != v1alpha1.InstancePhaseRunning || got.Host != "198.51.100.7" || got.Port != 3128 || got.SpecHash != "abc123" || got.Owner.UID != s.Owner.UID || got.CredentialsSum != s.CredentialsSum {
		t.Errorf("running VM: %+v", got)
	}

	owned, err := b.ListOwned(ctx)
	if err != nil || len(owned) != 1 || owned[0].Name != s.Name || owned[0].Zone != "europe-west1-b" {
		t.Errorf("ListOwned: %+v, %v", owned, err)
	}
	if other, _ := newBackend(t, fake, "another-cluster").ListOwned(ctx); len(other) != 0 {
		t.Errorf("another cluster's filter must not list this VM: %+v", other)
	}

	if err := b.Delete(ctx, s.Ref); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Get(ctx, s.Ref); err != nil || got.Phase != v1alpha1.InstancePhaseTerminated {
		t.Errorf("a VM being deleted is STOPPING, on its way out: %+v, %v", got, err)
	}
	if err := b.Delete(ctx, s.Ref); err != nil {
		t.Errorf("deleting a VM already being deleted succeeds: %v", err)
	}
	testbed.Eventually(t, 5*time.Second, "the VM and its rule are gone", func() (bool, string) {
		return fake.Instances() == 0 && fake.Firewall(s.Name) == nil, fmt.Sprintf("%d VMs", fake.Instances())
	})
	if err := b.Delete(ctx, s.Ref); err != nil {
		t.Errorf("Delete is idempotent: %v", err)
	}
	if _, err := b.Get(ctx, s.Ref); !backend.IsNotFound(err) {
		t.Errorf("Get after Delete: want NotFound, got %v", err)
	}
}

// TestFirewallRefusesOpenProxies checks the firewall builder's arithmetic:
// a rule admitting public clients to a proxy without credentials, or a
// default opening for a proxy whose Squid the provider did not configure,
// is refused before anything is created.
// fixPrivateOnly is what a refusal of private ranges at the external IP
// tells a GCP user to do.
const fixPrivateOnly = "set spec.forProvider.gcp.publishedAddress: Internal for crawlers in the VPC, or list the crawlers' external ranges (with authSecretRef)"

func TestFirewallRefusesOpenProxies(t *testing.T) {
	cases := map[string]struct {
		reason string
		change func(s *backend.Spec)
		want   string   // the error, or
		ranges []string // the rule's source ranges
	}{
		"HalvesWithoutCredentials": {
			reason: "0.0.0.0/1 and 128.0.0.0/1 without credentials open the proxy to the internet.",
			change: func(s *backend.Spec) {
				s.Credentials, s.AllowedSourceRanges = nil, []string{"0.0.0.0/1", "128.0.0.0/1"}
			},
			want: squid.ErrInvalidConfig + ": " + fmt.Sprintf(squid.ErrFmtPublicWithoutCredentials, "0.0.0.0/1"),
		},
		"CloudInitHalvesWithoutCredentials": {
			reason: "The firewall builder refuses by itself when no generated config stands before it.",
			change: func(s *backend.Spec) {
				s.UserData, s.Credentials, s.AllowedSourceRanges = "#cloud-config\n", nil, []string{"0.0.0.0/1", "128.0.0.0/1"}
			},
			want: fmt.Sprintf(cloudvm.ErrFmtOpenProxy, "0.0.0.0/1"),
		},
		"PrivateWithoutCredentials": {
			reason: "Private client ranges need no credentials, with the internal address published.",
			change: func(s *backend.Spec) {
				s.Credentials, s.AllowedSourceRanges, s.GCP.PublishedAddress = nil, []string{"10.0.0.0/8"}, v1alpha1.GCPPublishedInternal
			},
			ranges: []string{"10.0.0.0/8"},
		},
		"PrivateAtTheExternalIP": {
			reason: "Clients in the VPC never reach the external IP from a private address: a proxy open to private ranges only, published there, could serve nobody.",
			change: func(s *backend.Spec) {
				s.Credentials, s.AllowedSourceRanges = nil, []string{"10.0.0.0/8", "100.64.0.0/10"}
			},
			want: fmt.Sprintf(cloudvm.ErrFmtPrivateOnly, []string{"10.0.0.0/8", "100.64.0.0/10"}, fixPrivateOnly),
		},
		"PrivateAtTheExternalIPWithCredentials": {
			reason: "Credentials change nothing about where the clients come from.",
			change: func(s *backend.Spec) { s.AllowedSourceRanges = []string{"192.168.0.0/16"} },
			want:   fmt.Sprintf(cloudvm.ErrFmtPrivateOnly, []string{"192.168.0.0/16"}, fixPrivateOnly),
		},
		"PrivateAndProbeAtTheExternalIP": {
			reason: "The probe's range admits the probe only: the crawlers' own ranges decide.",
			change: func(s *backend.Spec) {
				s.AllowedSourceRanges, s.ProbeSourceRanges = []string{"10.0.0.0/8", "198.51.100.10/32"}, []string{"198.51.100.10/32"}
			},
			want: fmt.Sprintf(cloudvm.ErrFmtPrivateOnly, []string{"10.0.0.0/8"}, fixPrivateOnly),
		},
		"PrivateAndPublicAtTheExternalIP": {
			reason: "A public range among the crawlers' reaches the external IP.",
			change: func(s *backend.Spec) { s.AllowedSourceRanges = []string{"10.0.0.0/8", "203.0.113.0/24"} },
			ranges: []string{"10.0.0.0/8", "203.0.113.0/24"},
		},
		"CredentialsOnly": {
			reason: "With credentials and no ranges the port opens to all; Squid demands the credentials.",
			change: func(s *backend.Spec) { s.AllowedSourceRanges = nil },
			ranges: []string{"0.0.0.0/0"},
		},
		"CloudInitWithoutRanges": {
			reason: "A proxy configured by the user's cloud-init gets no default opening.",
			change: func(s *backend.Spec) { s.UserData, s.AllowedSourceRanges = "#cloud-config\n", nil },
			want:   fmt.Sprintf(cloudvm.ErrFmtUserDataWithoutRanges, "gcp", "cloudInit", "a GCP firewall rule"),
		},
		"HostBits": {
			reason: "GCP refuses a range with host bits set; the rule gets the network.",
			change: func(s *backend.Spec) { s.AllowedSourceRanges = []string{"203.0.113.7/24"} },
			ranges: []string{"203.0.113.0/24"},
		},
		"CloudInitWithRanges": {
			reason: "A proxy configured by the user's cloud-init opens to its ranges only.",
			change: func(s *backend.Spec) { s.UserData = "#cloud-config\n" },
			ranges: []string{"203.0.113.0/24"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			fake := gcpfake.Start(t)
			b := newBackend(t, fake, "c1")
			s := spec("0b7c6a2e-1111-4222-8333-94445555" + fmt.Sprintf("%04d", len(name)))
			tc.change(&s)
			_, err := b.Create(context.Background(), s)
			fw := fake.Firewall(s.Name)
			if tc.want != "" {
				if err == nil || err.Error() != tc.want || backend.ClassOf(err) != backend.ClassPermanent {
					t.Fatalf("%s\nwant the permanent error %q, got %v", tc.reason, tc.want, err)
				}
				if fw != nil || fake.Instance("europe-west1-b", s.Name) != nil {
					t.Errorf("%s\na refused proxy must leave no firewall rule and no VM", tc.reason)
				}
				return
			}
			if err != nil {
				t.Fatalf("%s\n%v", tc.reason, err)
			}
			if fw == nil {
				t.Fatal("no firewall rule")
			}
			if diff := cmp.Diff(tc.ranges, fw.GetSourceRanges()); diff != "" {
				t.Errorf("%s\nsource ranges: -want +got:\n%s", tc.reason, diff)
			}
		})
	}
}

// TestRepairRestoresFirewall: a VM's rule that is gone (deleted by hand,
// or by an old rule's delete finishing after a new insert) is re-created
// from the spec, and one changed by hand is reset; until then the proxy is
// not in place.
func TestRepairRestoresFirewall(t *testing.T) {
	fake := gcpfake.Start(t)
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := spec("uid-fw")
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Repair(ctx, s); !ok || err != nil {
		t.Fatalf("a rule as the spec says needs no repair: %v, %v", ok, err)
	}
	calls := fake.Calls("firewalls.insert") + fake.Calls("firewalls.update")
	if ok, _ := b.Repair(ctx, s); !ok || fake.Calls("firewalls.insert")+fake.Calls("firewalls.update") != calls {
		t.Error("Repair of a rule in place writes nothing")
	}

	clock := frozen(fake)
	fake.SetOperationDuration(time.Hour)
	fake.DeleteFirewall("crawl-proj", s.Name)
	if ok, err := b.Repair(ctx, s); ok || err != nil {
		t.Fatalf("a rule being re-inserted is not in place yet, and Repair does not wait for it: %v, %v", ok, err)
	}
	clock.add(2 * time.Hour)
	fake.SetOperationDuration(0)
	testbed.Eventually(t, 5*time.Second, "the missing rule re-created from the spec", func() (bool, string) {
		ok, err := b.Repair(ctx, s)
		fw := fake.Firewall(s.Name)
		return ok && fw != nil && fw.GetSourceRanges()[0] == "203.0.113.0/24" && fw.GetTargetTags()[0] == s.Name, fmt.Sprint(ok, err, fw)
	})

	fake.DeleteFirewall("crawl-proj", s.Name)
	fake.FailOperation("firewalls.insert", gcpfake.Failure{Code: http.StatusForbidden, Reason: "QUOTA_EXCEEDED", Message: "Quota 'FIREWALLS' exceeded.  Limit: 200.0 globally."})
	if ok, err := b.Repair(ctx, s); ok || backend.ClassOf(err) != backend.ClassQuota || !strings.Contains(err.Error(), "FIREWALLS") {
		t.Errorf("a re-insert that fails in its operation is reported by Repair: %v, %v", ok, err)
	}
	if ok, err := b.Repair(ctx, s); !ok || err != nil {
		t.Fatalf("and the next Repair restores the rule: %v, %v", ok, err)
	}

	fake.ChangeFirewall("crawl-proj", s.Name, func(f *computepb.Firewall) { f.SourceRanges = []string{"0.0.0.0/0"} })
	if _, err := b.Repair(ctx, s); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 5*time.Second, "the widened rule is reset", func() (bool, string) {
		fw := fake.Firewall(s.Name)
		return fw != nil && fw.GetSourceRanges()[0] == "203.0.113.0/24", fmt.Sprint(fw.GetSourceRanges())
	})
}

func TestPhase(t *testing.T) {
	cases := map[string]struct {
		reason string
		status string
		natIP  string
		want   v1alpha1.InstancePhase
	}{
		"Provisioning":  {reason: "Booting.", status: "PROVISIONING", want: v1alpha1.InstancePhaseProvisioning},
		"Staging":       {reason: "Still booting.", status: "STAGING", want: v1alpha1.InstancePhaseProvisioning},
		"RunningWithIP": {reason: "Running with its external IP.", status: "RUNNING", natIP: "198.51.100.1", want: v1alpha1.InstancePhaseRunning},
		"RunningNoIP":   {reason: "No empty address is ever published.", status: "RUNNING", want: v1alpha1.InstancePhaseProvisioning},
		"Stopping":      {reason: "Stopping is terminal for a proxy.", status: "STOPPING", want: v1alpha1.InstancePhaseTerminated},
		"PendingStop":   {reason: "About to stop.", status: "PENDING_STOP", want: v1alpha1.InstancePhaseTerminated},
		"Deprovision":   {reason: "Being repossessed.", status: "DEPROVISIONING", want: v1alpha1.InstancePhaseTerminated},
		"Stopped":       {reason: "Recreated.", status: "STOPPED", want: v1alpha1.InstancePhaseTerminated},
		"Suspended":     {reason: "Recreated.", status: "SUSPENDED", want: v1alpha1.InstancePhaseTerminated},
		"Terminated":    {reason: "Recreated.", status: "TERMINATED", natIP: "198.51.100.1", want: v1alpha1.InstancePhaseTerminated},
		"Repairing":     {reason: "GCP repairs it in place.", status: "REPAIRING", want: v1alpha1.InstancePhaseProvisioning},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, gcp.Phase(tc.status, tc.natIP)); diff != "" {
				t.Errorf("%s\n-want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}

// TestErrorClasses makes the fake answer with GCP's own error bodies, at
// once or in the operation of an accepted insert, and checks how the
// backend classifies what the real client library returns: the
// classification table of docs/provider.md (GCP backend), row by row.
func TestErrorClasses(t *testing.T) {
	const zone = "europe-west1-b"
	createIn := func(change func(*backend.Spec)) func(*gcp.Backend, backend.Spec) error {
		return func(b *gcp.Backend, s backend.Spec) error {
			change(&s)
			_, err := b.Create(context.Background(), s)
			return err
		}
	}
	cases := map[string]struct {
		reason  string
		method  string
		failure gcpfake.Failure
		inOp    bool // the failure arrives in the operation
		call    func(*gcp.Backend, backend.Spec) error
		want    backend.Class
		msg     []string
	}{
		"Quota": {
			reason: "quotaExceeded on insert is a quota error.",
			method: "instances.insert", failure: gcpfake.Quota("CPUS", "europe-west1"),
			want: backend.ClassQuota, msg: []string{"Quota 'CPUS' exceeded"},
		},
		"QuotaInOperation": {
			reason: "An insert accepted and then failed for quota is reported from its operation.",
			method: "instances.insert", failure: gcpfake.QuotaInOperation("IN_USE_ADDRESSES", "europe-west1"), inOp: true,
			want: backend.ClassQuota, msg: []string{"IN_USE_ADDRESSES"},
		},
		"OtherQuota": {
			reason: "Any *_QUOTA code is quota.",
			method: "instances.insert", failure: gcpfake.Failure{Code: http.StatusForbidden, Reason: "REGION_QUOTA", Message: "Quota 'SSD_TOTAL_GB' exceeded.", Times: -1}, inOp: true,
			want: backend.ClassQuota, msg: []string{"SSD_TOTAL_GB"},
		},
		"Stockout": {
			reason: "A stockout arrives in the operation, answered 503; it is transient, and the error names the zone.",
			method: "instances.insert", failure: gcpfake.Stockout("crawl-proj", zone), inOp: true,
			want: backend.ClassStockout, msg: []string{"ZONE_RESOURCE_POOL_EXHAUSTED", "zone " + zone, "no capacity"},
		},
		"StockoutWithDetails": {
			reason: "The newer stockout code is a stockout too.",
			method: "instances.insert", failure: gcpfake.StockoutWithDetails("crawl-proj", zone), inOp: true,
			want: backend.ClassStockout, msg: []string{"ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "zones/" + zone},
		},
		"OrgPolicyExternalIP": {
			reason: "412 from compute.vmExternalIpAccess is permanent, with GCP's message.",
			method: "instances.insert", failure: gcpfake.OrgPolicyExternalIP("crawl-proj", zone, "x"),
			want: backend.ClassPermanent, msg: []string{"constraints/compute.vmExternalIpAccess"},
		},
		"OrgPolicyShieldedVM": {
			reason: "412 from compute.requireShieldedVm is permanent.",
			method: "instances.insert", failure: gcpfake.OrgPolicyShieldedVM("crawl-proj"),
			want: backend.ClassPermanent, msg: []string{"constraints/compute.requireShieldedVm"},
		},
		"MissingNetwork": {
			reason: "A 404 on insert names a missing resource: permanent, naming it.",
			call:   createIn(func(s *backend.Spec) { s.GCP.Network = "global/networks/nope" }),
			want:   backend.ClassPermanent, msg: []string{"projects/crawl-proj/global/networks/nope", "does not exist"},
		},
		"MissingImage": {
			reason: "A missing image is permanent, naming it.",
			call: createIn(func(s *backend.Spec) {
				s.GCP.Image = "projects/debian-cloud/global/images/debian-12-bookworm-v19990101"
			}),
			want: backend.ClassPermanent, msg: []string{"debian-12-bookworm-v19990101"},
		},
		"ImageTheScriptCannotRun": {
			reason: "Container-Optimized OS has no apt: the generated script would fail at boot, so the create is refused, naming the field and the way out.",
			call:   createIn(func(s *backend.Spec) { s.GCP.Image = "projects/cos-cloud/global/images/family/cos-stable" }),
			want:   backend.ClassPermanent, msg: []string{"spec.forProvider.gcp.image", "cos-stable", "spec.forProvider.gcp.cloudInit"},
		},
		"ResourceNotReady": {
			reason: "400 resourceNotReady (an operation still running) is transient.",
			method: "firewalls.insert", failure: gcpfake.NotReady("projects/crawl-proj/global/firewalls/x"),
			want: backend.ClassTransient, msg: []string{"is not ready"},
		},
		"AccessNotConfigured": {
			reason: "403 accessNotConfigured (the API being enabled) is AccessDenied: retried, then permanent.",
			method: "firewalls.insert", failure: gcpfake.AccessNotConfigured("123456"),
			want: backend.ClassAccessDenied, msg: []string{"Compute Engine API has not been used"},
		},
		"IAMNotPropagated": {
			reason: "A 403 for a permission (perhaps a grant still propagating) is AccessDenied too.",
			method: "firewalls.insert", failure: gcpfake.IAMDenied("compute.firewalls.create", "projects/crawl-proj/global/firewalls/x"),
			want: backend.ClassAccessDenied, msg: []string{"compute.firewalls.create"},
		},
		"RateLimited": {
			reason: "429 rateLimitExceeded is throttling: transient with back-off.",
			method: "instances.insert", failure: gcpfake.RateLimited(),
			want: backend.ClassThrottled,
		},
		"UserRateLimit403": {
			reason: "rateLimitExceeded answered 403 is throttling too, not access.",
			method: "instances.insert", failure: gcpfake.Failure{Code: http.StatusForbidden, Reason: "rateLimitExceeded", Message: "Rate Limit Exceeded", Times: -1},
			want: backend.ClassThrottled,
		},
		"RateLimitInErrorInfo": {
			reason: "A 403 whose legacy reason says only forbidden, and whose google.rpc.ErrorInfo says RATE_LIMIT_EXCEEDED, is throttling: the details are read.",
			method: "instances.insert", failure: gcpfake.Failure{Code: http.StatusForbidden, Reason: "forbidden", Info: "RATE_LIMIT_EXCEEDED", Message: "Request throttled", Times: -1},
			want: backend.ClassThrottled,
		},
		"ServerError": {
			reason: "5xx is transient.",
			method: "instances.insert", failure: gcpfake.Failure{Code: http.StatusServiceUnavailable, Reason: "backendError", Message: "Backend Error", Times: -1},
			want: backend.ClassTransient,
		},
		"InvalidMachineType": {
			reason: "An invalid machine type is permanent, with GCP's message.",
			call:   createIn(func(s *backend.Spec) { s.GCP.MachineType = "bogus" }),
			want:   backend.ClassPermanent, msg: []string{"Machine type with name 'bogus' does not exist"},
		},
		"NotFound": {
			reason: "A missing VM is not found.",
			call: func(b *gcp.Backend, s backend.Spec) error {
				_, err := b.Get(context.Background(), s.Ref)
				return err
			},
			want: backend.ClassNotFound,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			fake := gcpfake.Start(t)
			switch {
			case tc.inOp:
				fake.FailOperation(tc.method, tc.failure)
			case tc.failure.Code != 0:
				fake.Fail(tc.method, tc.failure)
			}
			b := newBackend(t, fake, "c1")
			call := tc.call
			if call == nil {
				call = createIn(func(*backend.Spec) {})
			}
			err := call(b, spec("uid-"+name))
			if got := backend.ClassOf(err); got != tc.want {
				t.Errorf("%s\nclass: want %s, got %s (%v)", tc.reason, tc.want, got, err)
			}
			for _, m := range tc.msg {
				if err == nil || !strings.Contains(err.Error(), m) {
					t.Errorf("%s\nthe error must say %q: %v", tc.reason, m, err)
				}
			}
			if tc.inOp && fake.Instances() != 0 {
				t.Errorf("%s\nthe failed insert leaves no VM", tc.reason)
			}
			if tc.want == backend.ClassPermanent {
				testbed.Eventually(t, 5*time.Second, "no rule left for a VM that will not come", func() (bool, string) {
					return fake.Firewall(spec("uid-"+name).Name) == nil, "the rule is there"
				})
			}
		})
	}
}

// TestAdoptOnce: an import relabels the VM for its adopter, keeping its
// maker's UID, after which the VM's name and rule still derive; a second
// import that read the VM as its maker's is refused, whichever wins.
func TestAdoptOnce(t *testing.T) {
	fake := gcpfake.Start(t)
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := spec("4a3b2c1d-1111-4222-8333-944455556666")
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	to := ownership.Owner{ClusterID: "c1", Namespace: "team", Name: "importer", UID: "importer-uid"}
	if err := b.Adopt(ctx, s.Ref, s.Owner.UID, to); err != nil {
		t.Fatal(err)
	}
	if err := b.Adopt(ctx, s.Ref, s.Owner.UID, ownership.Owner{ClusterID: "c1", Namespace: "team", Name: "late", UID: "late-uid"}); !errors.Is(err, backend.ErrHeldElsewhere) {
		t.Errorf("a second import of the maker's VM must be refused as held elsewhere, got %v", err)
	}
	i, err := b.Get(ctx, s.Ref)
	if err != nil {
		t.Fatal(err)
	}
	if i.Owner.Holder() != to.UID || i.Owner.UID != s.Owner.UID || i.Owner.Name != "importer" || i.Owner.Fleet != "" || i.SpecHash != s.Hash {
		t.Errorf("the VM belongs to its adopter, its maker's UID and spec hash kept: %+v", i)
	}
}

// TestLabelRaceRetried: setLabels answering 412 because the labels moved
// since the VM was read (GCP's fingerprint message) is a race that the next
// try wins, not a permanent error; another 412 (an organisation policy)
// stays permanent.
func TestLabelRaceRetried(t *testing.T) {
	fake := gcpfake.Start(t)
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := spec("5a3b2c1d-1111-4222-8333-944455556666")
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	race := gcpfake.Failure{Code: http.StatusPreconditionFailed, Reason: "conditionNotMet", Message: "Labels fingerprint either invalid or resource labels have changed"}
	to := ownership.Owner{ClusterID: "c1", Namespace: "team", Name: "importer", UID: "importer-uid"}
	fake.Fail("instances.setLabels", race)
	if err := b.Adopt(ctx, s.Ref, s.Owner.UID, to); backend.ClassOf(err) != backend.ClassTransient {
		t.Errorf("an import losing the fingerprint race is retried: %v (%s)", err, backend.ClassOf(err))
	}
	fake.Fail("instances.setLabels", race)
	if err := b.SetRetain(ctx, s.Ref, true); backend.ClassOf(err) != backend.ClassTransient {
		t.Errorf("a retain label losing the fingerprint race is retried: %v", err)
	}
	fake.Fail("instances.setLabels", gcpfake.Failure{Code: http.StatusPreconditionFailed, Reason: "conditionNotMet", Message: "Constraint constraints/gcp.resourceLocations violated"})
	if err := b.SetRetain(ctx, s.Ref, true); backend.ClassOf(err) != backend.ClassPermanent {
		t.Errorf("an organisation policy's 412 stays permanent: %v", err)
	}
	if err := b.Adopt(ctx, s.Ref, s.Owner.UID, to); err != nil {
		t.Errorf("the retry wins: %v", err)
	}
}

// TestScriptImages: the generated startup script goes on Debian's and
// Ubuntu's public images only; another image takes the team's own
// start-up configuration, and nothing is made for a refused one.
func TestScriptImages(t *testing.T) {
	images := map[string]bool{
		"": true,
		"projects/debian-cloud/global/images/family/debian-12":                                                   true,
		"https://www.googleapis.com/compute/v1/projects/debian-cloud/global/images/debian-12-bookworm-v20241112": true,
		"projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts":                                          true,
		"projects/ubuntu-os-pro-cloud/global/images/family/ubuntu-pro-minimal-2404-lts-amd64":                    true,
		"projects/cos-cloud/global/images/family/cos-stable":                                                     false,
		"projects/attacker/global/images/family/debian-12":                                                       false,
		// Releases no family test covers.
		"projects/debian-cloud/global/images/family/debian-10":            false,
		"projects/debian-cloud/global/images/family/debian-11":            false,
		"projects/ubuntu-os-cloud/global/images/family/ubuntu-1804-lts":   false,
		"projects/ubuntu-os-cloud/global/images/family/ubuntu-2004-lts":   false,
		"projects/ubuntu-os-cloud/global/images/family/ubuntu-2310":       false,
		"projects/ubuntu-os-cloud/global/images/family/ubuntu-2510-amd64": false,
	}
	// Every family the script is tested on is accepted.
	for _, f := range cloudvm.Families {
		project := "debian-cloud"
		if f.Distro == cloudvm.Ubuntu {
			project = "ubuntu-os-cloud"
		}
		images["projects/"+project+"/global/images/family/"+f.Name] = true
	}
	for image, ok := range images {
		fake := gcpfake.Start(t)
		b := newBackend(t, fake, "c1")
		s := spec("6a3b2c1d-1111-4222-8333-944455556666")
		s.GCP.Image = image
		_, err := b.Create(context.Background(), s)
		want := fmt.Sprintf(cloudvm.ErrFmtUnsupportedImage, "gcp", strconv.Quote(image), fmt.Sprintf(gcp.IsFmtNotImage, cloudvm.SupportedReleases()), "gcp", "cloudInit")
		if refused := err != nil && err.Error() == want; refused == ok {
			t.Errorf("image %q: refused %v, want %v (%v; a refusal says %q)", image, refused, !ok, err, want)
		}
		if !ok && (fake.Instances() != 0 || len(fake.FirewallNames()) != 0) {
			t.Errorf("image %q: a refused create makes nothing", image)
		}
		s.UserData = "#cloud-config\n"
		if image == "projects/cos-cloud/global/images/family/cos-stable" {
			if _, err := b.Create(context.Background(), s); err != nil {
				t.Errorf("with its own start-up configuration any image goes: %v", err)
			}
		}
	}
}

// TestPublishedInternal: a VM publishing its internal address is reached
// there by crawlers in the VPC; it is running only once it has both that
// address and its external one, through which its traffic leaves.
func TestPublishedInternal(t *testing.T) {
	fake := gcpfake.Start(t)
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := spec("7a3b2c1d-1111-4222-8333-944455556666")
	s.Credentials, s.AllowedSourceRanges, s.GCP.PublishedAddress = nil, []string{"10.0.0.0/8"}, v1alpha1.GCPPublishedInternal
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	internal := fake.Instance(s.Zone, s.Name).GetNetworkInterfaces()[0].GetNetworkIP()
	if internal == "" {
		t.Fatal("the fake gives the VM an internal address")
	}
	fake.SetStatus(s.Zone, s.Name, "RUNNING", "")
	if i, err := b.Get(ctx, s.Ref); err != nil || i.Phase != v1alpha1.InstancePhaseProvisioning || i.Host != "" {
		t.Errorf("without its external IP, through which traffic leaves, the VM is not running yet: %+v, %v", i, err)
	}
	fake.SetStatus(s.Zone, s.Name, "RUNNING", "198.51.100.7")
	if i, err := b.Get(ctx, s.Ref); err != nil || i.Phase != v1alpha1.InstancePhaseRunning || i.Host != internal {
		t.Errorf("the internal address %s is published: %+v, %v", internal, i, err)
	}
	ext := spec("8a3b2c1d-1111-4222-8333-944455556666")
	if _, err := b.Create(ctx, ext); err != nil {
		t.Fatal(err)
	}
	fake.SetStatus(ext.Zone, ext.Name, "RUNNING", "198.51.100.8")
	if i, _ := b.Get(ctx, ext.Ref); i.Host != "198.51.100.8" {
		t.Errorf("by default the external IP is published: %+v", i)
	}
}

// TestVMsBootOnTheirOwn: with the fake booting VMs as GCP does (BootAfter),
// a created VM provisions, then runs with an external address of its own,
// which the backend publishes as the proxy's host, without a test moving
// it by hand.
func TestVMsBootOnTheirOwn(t *testing.T) {
	fake := gcpfake.Start(t)
	fake.BootAfter = 100 * time.Millisecond
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	hosts := map[string]bool{}
	for _, uid := range []string{"0b7c6a2e-5555-4222-8333-944455556666", "0b7c6a2e-6666-4222-8333-944455556666"} {
		s := spec(uid)
		inst, err := b.Create(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if inst.Phase != v1alpha1.InstancePhaseProvisioning {
			t.Errorf("a new VM provisions first: %s", inst.Phase)
		}
		testbed.Eventually(t, 5*time.Second, "the VM runs with an external address", func() (bool, string) {
			got, err := b.Get(ctx, s.Ref)
			if err != nil {
				return false, err.Error()
			}
			if got.Phase == v1alpha1.InstancePhaseRunning && got.Host != "" {
				hosts[got.Host] = true
				return true, ""
			}
			return false, fmt.Sprint(got.Phase, got.Host)
		})
	}
	if len(hosts) != 2 {
		t.Errorf("each VM has an external address of its own: %v", hosts)
	}
}

// TestContract: the Compute Engine backend keeps the contract of every
// cloud VM backend, its VMs booting on their own.
func TestContract(t *testing.T) {
	cloudvmtest.Contract(t, cloudvmtest.Cloud{
		New: func(t *testing.T) backend.Backend {
			fake := gcpfake.Start(t)
			fake.BootAfter = 100 * time.Millisecond
			return newBackend(t, fake, "c1")
		},
		Spec: spec,
		FailCreate: func(t *testing.T, class backend.Class) backend.Backend {
			fake := gcpfake.Start(t)
			switch class {
			case backend.ClassStockout:
				fake.FailOperation("instances.insert", gcpfake.Stockout("crawl-proj", "europe-west1-b"))
			case backend.ClassQuota:
				fake.FailOperation("instances.insert", gcpfake.QuotaInOperation("IN_USE_ADDRESSES", "europe-west1"))
			case backend.ClassThrottled:
				fake.Fail("instances.insert", gcpfake.RateLimited())
			case backend.ClassAccessDenied:
				fake.Fail("instances.insert", gcpfake.IAMDenied("compute.instances.create", "projects/crawl-proj/zones/europe-west1-b/instances/x"))
			case backend.ClassPermanent:
				fake.Fail("instances.insert", gcpfake.OrgPolicyShieldedVM("crawl-proj"))
			case backend.ClassTransient:
				fake.Fail("instances.insert", gcpfake.Failure{Code: http.StatusServiceUnavailable, Reason: "backendError", Message: "Backend Error", Times: -1})
			}
			return newBackend(t, fake, "c1")
		},
	})
}
