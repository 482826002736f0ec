package gcp_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp/gcpfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
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
	o := ownership.Owner{ClusterID: "c1", Namespace: "team", Name: "p-" + uid, UID: types.UID(uid), Fleet: "crawlers"}
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
	if diff := cmp.Diff([]string{s.Name, "crawl"}, vm.GetTags().GetItems()); diff != "" {
		t.Errorf("network tags: -want, +got:\n%s", diff)
	}
	wantLabels := s.Owner.GCPLabels()
	wantLabels["egress-spec-hash"], wantLabels["egress-port"] = "abc123", "3128"
	if diff := cmp.Diff(wantLabels, vm.GetLabels()); diff != "" {
		t.Errorf("labels: -want, +got:\n%s", diff)
	}
	script := vm.GetMetadata().GetItems()[0].GetValue()
	for _, want := range []string{"install -y -qq squid", "DPkg::Lock::Timeout", "http_port 3128", "acl egress_clients src 203.0.113.0/24", "crawler:$apr1$", "systemctl enable --now egress-proxy"} {
		if !strings.Contains(script, want) {
			t.Errorf("startup script lacks %q", want)
		}
	}
	if strings.Contains(script, "crawler:pw") {
		t.Error("the startup script must carry a hash, never the password")
	}
	fw := fake.Firewall(s.Name)
	if fw == nil || fw.GetAllowed()[0].GetPorts()[0] != "3128" || fw.GetSourceRanges()[0] != "203.0.113.0/24" || fw.GetTargetTags()[0] != s.Name {
		t.Errorf("firewall rule: want tcp:3128 from 203.0.113.0/24 to this VM only, got %v", fw)
	}

	// A retried create (a crash between insert and persist) finds the same VM.
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if n := fake.Instances(); n != 1 {
		t.Errorf("a retried create must not make a second VM: %d VMs", n)
	}

	fake.SetStatus("europe-west1-b", s.Name, "RUNNING", "198.51.100.7")
	got, err := b.Get(ctx, s.Ref)
	if err != nil {
		t.Fatal(err)
	}
	if got.Phase != v1alpha1.InstancePhaseRunning || got.Host != "198.51.100.7" || got.Port != 3128 || got.SpecHash != "abc123" || got.Owner.UID != s.Owner.UID {
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
	if fake.Instances() != 0 || fake.Firewall(s.Name) != nil {
		t.Error("Delete removes the VM and its firewall rule")
	}
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
func TestFirewallRefusesOpenProxies(t *testing.T) {
	cases := map[string]struct {
		reason string
		change func(s *backend.Spec)
		want   string   // an error containing this, or
		ranges []string // the rule's source ranges
	}{
		"HalvesWithoutCredentials": {
			reason: "0.0.0.0/1 and 128.0.0.0/1 without credentials open the proxy to the internet.",
			change: func(s *backend.Spec) {
				s.Credentials, s.AllowedSourceRanges = nil, []string{"0.0.0.0/1", "128.0.0.0/1"}
			},
			want: `"0.0.0.0/1" is not private, loopback or CGNAT space`,
		},
		"CloudInitHalvesWithoutCredentials": {
			reason: "The firewall builder refuses by itself when no generated config stands before it.",
			change: func(s *backend.Spec) {
				s.UserData, s.Credentials, s.AllowedSourceRanges = "#cloud-config\n", nil, []string{"0.0.0.0/1", "128.0.0.0/1"}
			},
			want: `spec.forProvider.allowedSourceRanges "0.0.0.0/1" is not private`,
		},
		"PrivateWithoutCredentials": {
			reason: "Private client ranges need no credentials.",
			change: func(s *backend.Spec) { s.Credentials, s.AllowedSourceRanges = nil, []string{"10.0.0.0/8"} },
			ranges: []string{"10.0.0.0/8"},
		},
		"CredentialsOnly": {
			reason: "With credentials and no ranges the port opens to all; Squid demands the credentials.",
			change: func(s *backend.Spec) { s.AllowedSourceRanges = nil },
			ranges: []string{"0.0.0.0/0"},
		},
		"CloudInitWithoutRanges": {
			reason: "A proxy configured by the user's cloud-init gets no default opening.",
			change: func(s *backend.Spec) { s.UserData, s.AllowedSourceRanges = "#cloud-config\n", nil },
			want:   "spec.forProvider.allowedSourceRanges is required with spec.forProvider.gcp.cloudInit",
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
				if err == nil || !strings.Contains(err.Error(), tc.want) || backend.ClassOf(err) != backend.ClassPermanent {
					t.Fatalf("%s\nwant a permanent error containing %q, got %v", tc.reason, tc.want, err)
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

func TestFirewallGuardsReadiness(t *testing.T) {
	fake := gcpfake.Start(t)
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := spec("uid-fw")
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	fake.SetStatus("europe-west1-b", s.Name, "RUNNING", "198.51.100.8")
	fake.Fail("firewalls.get", gcpfake.Failure{Code: http.StatusNotFound, Reason: "notFound", Message: "The resource was not found", Times: -1})
	got, err := b.Get(ctx, s.Ref)
	if err != nil {
		t.Fatal(err)
	}
	if got.Phase != v1alpha1.InstancePhaseProvisioning || got.Host != "" {
		t.Errorf("a VM without its firewall rule is not Running: %+v", got)
	}
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

// TestErrorClasses makes the fake answer with GCP's own error bodies and
// checks how the backend classifies what the real client library returns.
func TestErrorClasses(t *testing.T) {
	cases := map[string]struct {
		reason  string
		method  string
		failure gcpfake.Failure
		call    func(*gcp.Backend, backend.Spec) error
		want    backend.Class
		msg     string
	}{
		"Quota": {
			reason:  "QUOTA_EXCEEDED on insert is a quota error.",
			method:  "instances.insert",
			failure: gcpfake.Failure{Code: http.StatusForbidden, Reason: "quotaExceeded", Message: "Quota 'CPUS' exceeded.  Limit: 8.0 in region europe-west1.", Times: -1},
			want:    backend.ClassQuota, msg: "Quota 'CPUS' exceeded",
		},
		"RateLimited": {
			reason:  "429 is a quota error too.",
			method:  "instances.insert",
			failure: gcpfake.Failure{Code: http.StatusTooManyRequests, Reason: "rateLimitExceeded", Message: "Rate Limit Exceeded", Times: -1},
			want:    backend.ClassQuota,
		},
		"QuotaAfterAccept": {
			reason:  "An insert accepted and then failed for quota is reported from its operation.",
			method:  "operations.get",
			failure: gcpfake.Failure{Code: http.StatusForbidden, Reason: "QUOTA_EXCEEDED", Message: "Quota 'IN_USE_ADDRESSES' exceeded.", Times: -1},
			want:    backend.ClassQuota, msg: "IN_USE_ADDRESSES",
		},
		"ServerError": {
			reason:  "5xx is transient.",
			method:  "instances.insert",
			failure: gcpfake.Failure{Code: http.StatusServiceUnavailable, Reason: "backendError", Message: "Backend Error", Times: -1},
			want:    backend.ClassTransient,
		},
		"InvalidMachineType": {
			reason: "An invalid machine type is permanent, with GCP's message.",
			method: "instances.insert",
			call: func(b *gcp.Backend, s backend.Spec) error {
				s.GCP.MachineType = "bogus"
				_, err := b.Create(context.Background(), s)
				return err
			},
			want: backend.ClassPermanent, msg: "Machine type with name 'bogus' does not exist",
		},
		"Forbidden": {
			reason:  "A 403 that is not about quota (IAM) is permanent.",
			method:  "firewalls.insert",
			failure: gcpfake.Failure{Code: http.StatusForbidden, Reason: "forbidden", Message: "Required 'compute.firewalls.create' permission", Times: -1},
			want:    backend.ClassPermanent, msg: "compute.firewalls.create",
		},
		"NotFound": {
			reason: "A missing VM is not found.",
			method: "instances.get",
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
			if tc.failure.Code != 0 {
				fake.Fail(tc.method, tc.failure)
			}
			b := newBackend(t, fake, "c1")
			call := tc.call
			if call == nil {
				call = func(b *gcp.Backend, s backend.Spec) error {
					_, err := b.Create(context.Background(), s)
					return err
				}
			}
			err := call(b, spec("uid-"+name))
			if got := backend.ClassOf(err); got != tc.want {
				t.Errorf("%s\nclass: want %s, got %s (%v)", tc.reason, tc.want, got, err)
			}
			if tc.msg != "" && (err == nil || !strings.Contains(err.Error(), tc.msg)) {
				t.Errorf("%s\nthe error must keep GCP's message %q: %v", tc.reason, tc.msg, err)
			}
		})
	}
}
