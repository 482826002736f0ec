package gcp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"k8s.io/utils/ptr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/cloudvm"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp/gcpfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestNetworks: custom-mode VPCs need a subnetwork, a Shared VPC's
// subnetwork lives in the host project, whose network then takes the
// firewall rule, and organisations may have no default network at all.
func TestNetworks(t *testing.T) {
	ctx := context.Background()

	t.Run("NoDefaultNetwork", func(t *testing.T) {
		fake := gcpfake.Start(t)
		fake.RemoveNetwork("crawl-proj", "default")
		_, err := newBackend(t, fake, "c1").Create(ctx, spec("uid-nodefault"))
		if backend.ClassOf(err) != backend.ClassPermanent || !strings.Contains(err.Error(), "projects/crawl-proj/global/networks/default") {
			t.Errorf("a project without the default network is a permanent error naming it: %v", err)
		}
		if fake.Instances() != 0 {
			t.Error("nothing is created")
		}
	})

	t.Run("CustomModeNeedsSubnetwork", func(t *testing.T) {
		fake := gcpfake.Start(t)
		fake.AddNetwork("crawl-proj", "crawl-vpc", false)
		fake.AddSubnetwork("crawl-proj", "europe-west1", "proxies", "projects/crawl-proj/global/networks/crawl-vpc")
		b := newBackend(t, fake, "c1")
		s := spec("uid-custom")
		s.GCP.Network = "global/networks/crawl-vpc"
		_, err := b.Create(ctx, s)
		if backend.ClassOf(err) != backend.ClassPermanent || !strings.Contains(err.Error(), "Subnetwork should be specified") {
			t.Errorf("a custom-mode network without a subnetwork is refused by GCP, permanently: %v", err)
		}
		s.GCP.Subnetwork = "regions/europe-west1/subnetworks/proxies"
		// The refused attempt dropped its rule; while that delete runs the
		// rule's name is in flux and Create says so, transiently, as the
		// reconciler would see it before its next try.
		testbed.Eventually(t, 5*time.Second, "Create after the refusal", func() (bool, string) {
			_, err := b.Create(ctx, s)
			if err != nil && backend.ClassOf(err) != backend.ClassTransient {
				t.Fatalf("only a transient error may come while the dropped rule is deleted: %v", err)
			}
			return err == nil, fmt.Sprint(err)
		})
		vm := fake.Instance(s.Zone, s.Name)
		if ni := vm.GetNetworkInterfaces()[0]; ni.GetSubnetwork() != "regions/europe-west1/subnetworks/proxies" || ni.GetNetwork() != "projects/crawl-proj/global/networks/crawl-vpc" {
			t.Errorf("the VM attaches to the subnetwork of its network: %v", ni)
		}
		// The refused first attempt dropped its rule; that delete may
		// finish after this Create found the rule, and Repair restores it.
		testbed.Eventually(t, 5*time.Second, "the rule on the VM's network", func() (bool, string) {
			ok, err := b.Repair(ctx, s)
			fw := fake.FirewallIn("crawl-proj", s.Name)
			return ok && fw.GetNetwork() == "projects/crawl-proj/global/networks/crawl-vpc", fmt.Sprint(ok, err, fw)
		})
	})

	t.Run("SharedVPC", func(t *testing.T) {
		fake := gcpfake.Start(t)
		fake.AddNetwork("net-host", "shared", false)
		fake.AddSubnetwork("net-host", "europe-west1", "crawl", "projects/net-host/global/networks/shared")
		b := newBackend(t, fake, "c1")
		s := spec("uid-shared")
		s.GCP.Subnetwork = "projects/net-host/regions/europe-west1/subnetworks/crawl"
		s.GCP.Network = "global/networks/default"
		_, err := b.Create(ctx, s)
		if want := fmt.Sprintf(gcp.ErrFmtSubnetworkProject, s.GCP.Subnetwork, "net-host", "projects/crawl-proj/global/networks/default"); backend.ClassOf(err) != backend.ClassPermanent || err == nil || err.Error() != want {
			t.Errorf("a host subnetwork with the service project's network is refused before anything is made: %v", err)
		}
		s.GCP.Network = "projects/net-host/global/networks/shared"
		if _, err := b.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		owned, err := b.ListOwned(ctx)
		if err != nil || len(owned) != 1 || owned[0].NetworkProject != "net-host" {
			t.Fatalf("a listed VM names its network's host project, for the orphan collector's Delete: %+v, %v", owned, err)
		}
		s.Ref = owned[0].Ref
		if fake.FirewallIn("net-host", s.Name) == nil || fake.FirewallIn("crawl-proj", s.Name) != nil {
			t.Error("the rule of a Shared VPC VM is made in the host project, on its network")
		}
		if err := b.Delete(ctx, s.Ref); err != nil {
			t.Fatal(err)
		}
		if fake.FirewallIn("net-host", s.Name) != nil {
			t.Error("Delete removes the host project's rule: nothing leaks")
		}
	})

	t.Run("SharedVPCWithoutExternalIPGrant", func(t *testing.T) {
		fake := gcpfake.Start(t)
		fake.AddNetwork("net-host", "shared", false)
		const subnet = "projects/net-host/regions/europe-west1/subnetworks/crawl"
		fake.AddSubnetwork("net-host", "europe-west1", "crawl", "projects/net-host/global/networks/shared")
		fake.Deny("compute.subnetworks.useExternalIp", subnet)
		b := newBackend(t, fake, "c1")
		s := spec("uid-no-grant")
		s.GCP.Subnetwork = subnet
		s.GCP.Network = "projects/net-host/global/networks/shared"
		_, err := b.Create(ctx, s)
		// The provider's own words whole (the VM's name as the error
		// gives it), then GCP's refusal.
		vm, _, _ := strings.Cut(fmt.Sprint(err), ":")
		own := fmt.Sprintf(gcp.ErrFmtNoExternalIPGrant, vm, gcp.PermUseExternalIP) + ": googleapi: Error 403: Required 'compute.subnetworks.useExternalIp' permission for '" + subnet + "'"
		if backend.ClassOf(err) != backend.ClassAccessDenied || err == nil || err.Error() != own || !strings.HasPrefix(vm, "cannot insert VM egress-") {
			t.Errorf("a host subnetwork that does not grant useExternalIp is refused, naming the grant: %v", err)
		}
		// Publishing the internal address changes nothing: the VM still
		// leaves through an external address of its own.
		internal := s
		internal.GCP = ptr.To(*s.GCP)
		internal.GCP.PublishedAddress = v1alpha1.GCPPublishedInternal
		internal.AllowedSourceRanges = []string{"10.0.0.0/8"}
		if _, err := b.Create(ctx, internal); backend.ClassOf(err) != backend.ClassAccessDenied {
			t.Errorf("a VM publishing its internal address needs the grant too: %v", err)
		}
		if fake.Instance(s.Zone, s.Name) != nil {
			t.Error("the refused insert made a VM")
		}
		fake.Grant("compute.subnetworks.useExternalIp", subnet)
		if _, err := b.Create(ctx, s); err != nil {
			t.Fatalf("once granted, the create goes through: %v", err)
		}
	})

	t.Run("HostNetworkWithOwnSubnetwork", func(t *testing.T) {
		fake := gcpfake.Start(t)
		fake.AddNetwork("net-host", "shared", false)
		s := spec("uid-mixed")
		s.GCP.Network = "projects/net-host/global/networks/shared"
		s.GCP.Subnetwork = "regions/europe-west1/subnetworks/crawl"
		_, err := newBackend(t, fake, "c1").Create(ctx, s)
		if want := fmt.Sprintf(gcp.ErrFmtSubnetworkProject, s.GCP.Subnetwork, "crawl-proj", s.GCP.Network); backend.ClassOf(err) != backend.ClassPermanent || err == nil || err.Error() != want {
			t.Errorf("a service-project subnetwork with a host network is refused: %v", err)
		}
		if fake.FirewallIn("net-host", s.Name) != nil {
			t.Error("before any rule is made")
		}
	})

	t.Run("SubnetworkOfAnotherRegion", func(t *testing.T) {
		fake := gcpfake.Start(t)
		fake.AddSubnetwork("crawl-proj", "us-central1", "far", "projects/crawl-proj/global/networks/default")
		s := spec("uid-region")
		s.GCP.Subnetwork = "regions/us-central1/subnetworks/far"
		_, err := newBackend(t, fake, "c1").Create(ctx, s)
		if backend.ClassOf(err) != backend.ClassPermanent || !strings.Contains(err.Error(), "does not match the instance region") {
			t.Errorf("a subnetwork of another region is refused: %v", err)
		}
	})

	t.Run("IPv6Ranges", func(t *testing.T) {
		fake := gcpfake.Start(t)
		s := spec("uid-v6")
		s.AllowedSourceRanges = []string{"203.0.113.0/24", "2001:db8::/32"}
		_, err := newBackend(t, fake, "c1").Create(ctx, s)
		if backend.ClassOf(err) != backend.ClassPermanent || err == nil || err.Error() != fmt.Sprintf(cloudvm.ErrFmtIPv4Only, "2001:db8::/32", "a GCP firewall rule") {
			t.Errorf("IPv6 source ranges are refused before GCP sees them: %v", err)
		}
	})
}

// TestStartupConfigKey: cloud-init reads #cloud-config from user-data; the
// guest agent runs scripts from startup-script.
func TestStartupConfigKey(t *testing.T) {
	cases := map[string]struct {
		userData, key string
	}{
		"Generated":   {key: "startup-script"},
		"CloudConfig": {userData: "#cloud-config\npackages: [squid]\n", key: "user-data"},
		"Indented":    {userData: "\n#cloud-config\nruncmd: []\n", key: "user-data"},
		"Script":      {userData: "#!/bin/bash\napt-get install -y squid\n", key: "startup-script"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			fake := gcpfake.Start(t)
			s := spec("uid-key-" + strings.ToLower(name))
			s.UserData = tc.userData
			if _, err := newBackend(t, fake, "c1").Create(context.Background(), s); err != nil {
				t.Fatal(err)
			}
			items := fake.Instance(s.Zone, s.Name).GetMetadata().GetItems()
			if len(items) != 2 || items[0].GetKey() != tc.key {
				t.Errorf("want the start-up configuration under %s, got %v", tc.key, items)
			}
		})
	}
}

// TestOrphanRulesListed: a firewall rule whose VM never came (a stockout
// after the rule was made, then the Proxy deleted while the provider was
// down) is listed with its owner, for the orphan collector, and Delete
// removes it; a rule with its VM is not listed twice.
func TestOrphanRulesListed(t *testing.T) {
	ctx := context.Background()
	fake := gcpfake.Start(t)
	b := newBackend(t, fake, "c1")
	kept := spec("uid-with-vm")
	if _, err := b.Create(ctx, kept); err != nil {
		t.Fatal(err)
	}
	s := spec("uid-no-vm")
	fake.FailOperation("instances.insert", gcpfake.Stockout("crawl-proj", s.Zone))
	if _, err := b.Create(ctx, s); backend.ClassOf(err) != backend.ClassStockout {
		t.Fatalf("want a stockout: %v", err)
	}
	owned, err := b.ListOwned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Without compute.firewalls.list the VMs are still listed, and the
	// rules said to be skipped; any other failure to list the rules fails
	// the list (a refused filter, a 5xx, a 429 must not switch rule
	// collection off in silence).
	fake.Fail("firewalls.list", gcpfake.IAMDenied("compute.firewalls.list", "projects/crawl-proj"))
	partial, err := b.ListOwned(ctx)
	var skipped *backend.PartialList
	if !errors.As(err, &skipped) || !strings.Contains(err.Error(), "compute.firewalls.list") || len(partial) != 1 || partial[0].Name != kept.Name {
		t.Errorf("a 403 on listing rules lists the VMs and names the skip: %+v, %v", partial, err)
	}
	for _, f := range []gcpfake.Failure{gcpfake.RateLimited(), {Code: 500, Reason: "backendError", Message: "Internal Error", Times: -1}, {Code: 400, Reason: "invalid", Message: "Invalid value for field 'filter'", Times: -1}} {
		fake.Fail("firewalls.list", f)
		if got, err := b.ListOwned(ctx); err == nil || errors.As(err, &skipped) || got != nil {
			t.Errorf("a %d on listing rules fails the list: %+v, %v", f.Code, got, err)
		}
	}
	fake.Fail("firewalls.list", gcpfake.Failure{})

	var rule *backend.Instance
	for i := range owned {
		if owned[i].Name == s.Name {
			rule = &owned[i]
		}
	}
	if len(owned) != 2 || rule == nil || rule.Owner.UID != s.Owner.UID || !rule.Owner.OfCluster("c1") || rule.Zone != "" {
		t.Fatalf("the VM and the rule left without one, with its owner: %+v", owned)
	}
	if err := b.Delete(ctx, rule.Ref); err != nil {
		t.Fatal(err)
	}
	if fake.Firewall(s.Name) != nil || fake.Firewall(kept.Name) == nil {
		t.Error("Delete removes the orphaned rule, and only it")
	}

	// A rule that copies a proxy's description under another name claims
	// nothing: the collector never lists it.
	fc, err := compute.NewFirewallsRESTClient(ctx, fake.ClientOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fc.Close() }()
	copied := fake.Firewall(kept.Name)
	copied.Name = ptr.To("someone-elses-rule")
	if _, err := fc.Insert(ctx, &computepb.InsertFirewallRequest{Project: "crawl-proj", FirewallResource: copied}); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, kept.Ref); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 5*time.Second, "only the proxy's own rule is gone", func() (bool, string) {
		return fake.Instances() == 0, fmt.Sprint(fake.Instances())
	})
	owned, err = b.ListOwned(ctx)
	if err != nil || len(owned) != 0 {
		t.Errorf("a copied description claims nothing: %+v, %v", owned, err)
	}
}
