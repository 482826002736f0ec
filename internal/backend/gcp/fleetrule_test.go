package gcp_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"k8s.io/utils/ptr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp/gcpfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// fleetSpec is spec for a Proxy of fleet crawlers.
func fleetSpec(i int) backend.Spec {
	s := spec(fmt.Sprintf("1c2d3e4f-%04d-4222-8333-944455556666", i))
	s.Owner.Fleet = "crawlers"
	return s
}

// TestFleetSharesOneRule: the VMs of one fleet are let in by one firewall
// rule, targeting a tag each carries, whatever their number; a Proxy of no
// fleet keeps a rule of its own; the rule goes with the fleet's last VM,
// not before.
func TestFleetSharesOneRule(t *testing.T) {
	fake := gcpfake.Start(t)
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	var specs []backend.Spec
	for i := range 3 {
		s := fleetSpec(i)
		if _, err := b.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		specs = append(specs, s)
	}
	alone := spec("2c2d3e4f-0000-4222-8333-944455556666")
	if _, err := b.Create(ctx, alone); err != nil {
		t.Fatal(err)
	}
	names := fake.FirewallNames()
	if len(names) != 2 || fake.Firewall(alone.Name) == nil {
		t.Fatalf("one rule for the fleet's three VMs and one for the Proxy of no fleet: %v", names)
	}
	shared := fake.Instance(specs[0].Zone, specs[0].Name).GetLabels()["egress-rule"]
	if !slices.Contains(names, "crawl-proj/"+shared) {
		t.Fatalf("the rule the VMs name is the other one: %s, %v", shared, names)
	}
	fw := fake.Firewall(shared)
	if !strings.HasPrefix(shared, "egress-fw-") || fw.GetTargetTags()[0] != shared || fw.GetSourceRanges()[0] != "203.0.113.0/24" || fw.GetAllowed()[0].GetPorts()[0] != "3128" {
		t.Errorf("the fleet's rule lets its port in from its ranges to its tag: %v", fw)
	}
	for _, s := range specs {
		vm := fake.Instance(s.Zone, s.Name)
		if vm.GetLabels()["egress-rule"] != shared || vm.GetTags().GetItems()[0] != shared {
			t.Errorf("VM %s carries the rule's tag and names it: %v %v", s.Name, vm.GetLabels(), vm.GetTags().GetItems())
		}
		i, err := b.Get(ctx, s.Ref)
		if err != nil || i.Rule != shared {
			t.Fatalf("Get says which rule the VM shares: %+v, %v", i, err)
		}
		rs := s
		rs.Ref = i.Ref
		if ok, err := b.Repair(ctx, rs); !ok || err != nil {
			t.Errorf("Repair finds the shared rule in place: %v %v", ok, err)
		}
	}
	// Repair puts a rule deleted by hand back, under the same name.
	fake.DeleteFirewall("crawl-proj", shared)
	i, _ := b.Get(ctx, specs[0].Ref)
	rs := specs[0]
	rs.Ref = i.Ref
	if _, err := b.Repair(ctx, rs); err != nil || fake.Firewall(shared) == nil {
		t.Errorf("a fleet rule deleted by hand is restored: %v", err)
	}

	for n, s := range specs {
		if err := b.Delete(ctx, s.Ref); err != nil {
			t.Fatal(err)
		}
		waitOps(fake)
		left := fake.Firewall(shared) != nil
		if last := n == len(specs)-1; left == last {
			t.Errorf("after deleting %d of %d VMs the fleet's rule is there: %v", n+1, len(specs), left)
		}
	}
	if fake.Firewall(alone.Name) == nil {
		t.Error("the Proxy of no fleet keeps its own rule")
	}
}

// TestFleetRuleKeptThroughAnOutage: a fleet's rule is not released while
// a zone is unreachable, since its VMs there, which the list cannot show,
// may carry it; it goes once the zone answers and the last VM goes.
func TestFleetRuleKeptThroughAnOutage(t *testing.T) {
	fake := gcpfake.Start(t)
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	near, far := fleetSpec(0), fleetSpec(1)
	far.Zone, far.GCP.Zone = "europe-west1-c", "europe-west1-c"
	for _, s := range []backend.Spec{near, far} {
		if _, err := b.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	shared := fake.Instance(near.Zone, near.Name).GetLabels()["egress-rule"]
	fake.SetUnreachable(far.Zone, true)
	if err := b.Delete(ctx, near.Ref); err != nil {
		t.Fatal(err)
	}
	waitOps(fake)
	if fake.Firewall(shared) == nil {
		t.Fatal("the fleet's rule was released while the zone of another of its VMs was unreachable")
	}
	fake.SetUnreachable(far.Zone, false)
	if err := b.Delete(ctx, far.Ref); err != nil {
		t.Fatal(err)
	}
	waitOps(fake)
	testbed.Eventually(t, 5*time.Second, "the rule goes with the fleet's last VM", func() (bool, string) {
		return fake.Firewall(shared) == nil, "still there"
	})
}

// waitOps lets the fake's operations (a VM delete: STOPPING, then gone)
// finish.
func waitOps(fake *gcpfake.Server) {
	time.Sleep(3 * gcpfake.DefaultOperationDuration)
	_ = fake.Instances()
}

// TestFleetRuleOrphans: a fleet rule no VM carries is listed for orphan
// collection, with its fleet, once its VMs are gone without it; one a VM
// still carries is not; a rule whose description was copied from a fleet
// rule claims nothing.
func TestFleetRuleOrphans(t *testing.T) {
	fake := gcpfake.Start(t)
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := fleetSpec(7)
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	shared := fake.Instance(s.Zone, s.Name).GetLabels()["egress-rule"]
	rules := func() []string {
		owned, err := b.ListOwned(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, i := range owned {
			if i.Zone == "" {
				out = append(out, i.Name+" "+i.Owner.Namespace+"/"+i.Owner.Fleet)
			}
		}
		return out
	}
	if got := rules(); len(got) != 0 {
		t.Errorf("a rule its VM carries is no orphan: %v", got)
	}
	// A copy of its description on a rule of another name.
	fw := fake.Firewall(shared)
	fake.PutFirewall("crawl-proj", &computepb.Firewall{Name: ptr.To("egress-fw-aaaaaaaaaaaaaaaa"), Description: fw.Description, Network: fw.Network,
		Direction: fw.Direction, Allowed: fw.Allowed, SourceRanges: fw.SourceRanges, TargetTags: []string{"egress-fw-aaaaaaaaaaaaaaaa"}})
	// The VM goes without its rule (deleted by hand).
	fake.RemoveInstance(s.Zone, s.Name)
	if got := rules(); len(got) != 1 || got[0] != shared+" team/crawlers" {
		t.Errorf("the rule its last VM left behind is listed with its fleet, the copy is not: %v", got)
	}
	if err := b.Delete(ctx, backend.Ref{Name: shared}); err != nil || fake.Firewall(shared) != nil {
		t.Errorf("and Delete removes it: %v", err)
	}
}

// TestFleetVMOfOwnRule: a fleet's VM made before fleets shared rules (no
// egress-rule label, a rule named after it) keeps its own rule, which
// Repair looks after; no shared rule is made for it, and its delete takes
// its rule along.
func TestFleetVMOfOwnRule(t *testing.T) {
	fake := gcpfake.Start(t)
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := fleetSpec(9)
	old := s
	old.Owner.Fleet = ""
	if _, err := b.Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	i, err := b.Get(ctx, s.Ref)
	if err != nil || i.Rule != "" {
		t.Fatalf("a VM of its own rule names none: %+v %v", i, err)
	}
	fake.DeleteFirewall("crawl-proj", s.Name)
	rs := s
	rs.Ref = i.Ref
	if _, err := b.Repair(ctx, rs); err != nil {
		t.Fatal(err)
	}
	if names := fake.FirewallNames(); len(names) != 1 || names[0] != "crawl-proj/"+s.Name {
		t.Errorf("its own rule is restored, and no shared one made: %v", names)
	}
	if err := b.Delete(ctx, s.Ref); err != nil {
		t.Fatal(err)
	}
	waitOps(fake)
	if names := fake.FirewallNames(); len(names) != 0 {
		t.Errorf("its rule goes with it: %v", names)
	}
}

// TestFleetRuleOfAVMThatNeverCame: a create cut short after the fleet's
// rule was made (or a VM whose insert failed) leaves a rule no VM names;
// the Proxy's delete, which finds no VM, lets go of it by the name its
// spec derives.
func TestFleetRuleOfAVMThatNeverCame(t *testing.T) {
	fake := gcpfake.Start(t)
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := fleetSpec(11)
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	rule := b.RuleFor(s)
	if rule == "" || fake.Firewall(rule) == nil {
		t.Fatalf("RuleFor names the rule Create made: %q, %v", rule, fake.FirewallNames())
	}
	fake.RemoveInstance(s.Zone, s.Name)
	ref := s.Ref
	ref.Rule = rule
	if err := b.Delete(ctx, ref); err != nil {
		t.Fatal(err)
	}
	waitOps(fake)
	if fake.Firewall(rule) != nil {
		t.Errorf("the rule its VM never carried goes with the Proxy: %v", fake.FirewallNames())
	}
	if alone := spec("3c2d3e4f-0000-4222-8333-944455556666"); b.RuleFor(alone) != "" {
		t.Error("a Proxy of no fleet shares no rule")
	}
}

// TestFleetWithinRuleQuota: a fleet of 30 VMs fits a project whose
// firewall-rule quota is 5, as 30 Proxies of no fleet do not: the sixth
// of those is refused with QuotaExceeded.
func TestFleetWithinRuleQuota(t *testing.T) {
	fake := gcpfake.Start(t)
	fake.SetQuota(gcpfake.QuotaFirewalls, 5)
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	for i := range 30 {
		if _, err := b.Create(ctx, fleetSpec(100+i)); err != nil {
			t.Fatalf("VM %d of the fleet: %v", i, err)
		}
	}
	var err error
	for i := range 6 {
		if _, err = b.Create(ctx, spec(fmt.Sprintf("4c2d3e4f-%04d-4222-8333-944455556666", i))); err != nil {
			break
		}
	}
	if backend.ClassOf(err) != backend.ClassQuota || !strings.Contains(err.Error(), "FIREWALLS") {
		t.Errorf("one rule per Proxy runs into the quota: %v", err)
	}
}

// TestInstanceQuotas: the fake counts in-use addresses and CPUs per
// region, as Compute Engine does, and the create past them is QuotaExceeded,
// naming the quota; another region has its own.
func TestInstanceQuotas(t *testing.T) {
	fake := gcpfake.Start(t)
	fake.SetQuota(gcpfake.QuotaAddresses, 3)
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	for i := range 3 {
		if _, err := b.Create(ctx, fleetSpec(200+i)); err != nil {
			t.Fatal(err)
		}
	}
	_, err := b.Create(ctx, fleetSpec(203))
	if backend.ClassOf(err) != backend.ClassQuota || !strings.Contains(err.Error(), "IN_USE_ADDRESSES") {
		t.Errorf("the fourth address in the region is over quota: %v", err)
	}
	other := fleetSpec(204)
	other.Zone, other.GCP.Zone = "us-central1-a", "us-central1-a"
	if _, err := b.Create(ctx, other); err != nil {
		t.Errorf("another region has its own quota: %v", err)
	}
	fake.SetQuota(gcpfake.QuotaAddresses, -1)
	fake.SetQuota(gcpfake.QuotaCPUs, 7)
	if _, err := b.Create(ctx, fleetSpec(205)); backend.ClassOf(err) != backend.ClassQuota || !strings.Contains(err.Error(), "CPUS") {
		t.Errorf("e2-micro counts 2 vCPUs: a fourth VM in the region brings 8, over a quota of 7: %v", err)
	}
	fake.SetQuota(gcpfake.QuotaCPUs, 8)
	if _, err := b.Create(ctx, fleetSpec(206)); err != nil {
		t.Errorf("a fourth VM's 8 vCPUs are within a quota of 8 (the refused insert counts for nothing): %v", err)
	}
}

// TestListingPagedAndUnreachable: ListOwned reads every page of a list
// longer than a page, and a zone in an outage, whose VMs are not listed,
// stops rule collection (a rule only they carry would look unused) while
// the VMs listed are still collected.
func TestListingPagedAndUnreachable(t *testing.T) {
	fake := gcpfake.Start(t)
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	const n = 520
	for i := range n {
		s := fleetSpec(1000 + i)
		if i%2 == 1 {
			s.Zone, s.GCP.Zone = "europe-west1-c", "europe-west1-c"
		}
		fake.PutInstance(s.Zone, &computepb.Instance{Name: ptr.To(s.Name), Status: ptr.To("RUNNING"), Labels: s.Owner.GCPLabels()})
	}
	owned, err := b.ListOwned(ctx)
	if err != nil || len(owned) != n {
		t.Fatalf("every page is read: %d of %d, %v", len(owned), n, err)
	}
	if fake.Calls("instances.aggregatedList") < 2 {
		t.Errorf("%d VMs take more than one page of 500", n)
	}
	// A rule none of the listed VMs carries, old.
	fake.PutFirewall("crawl-proj", &computepb.Firewall{Name: ptr.To(s0Rule(b)), Description: ptr.To("egress proxy fleet team/crawlers (cluster c1, vm project crawl-proj, managed by provider-egressproxy)"),
		Network: ptr.To("projects/crawl-proj/global/networks/default"), Direction: ptr.To("INGRESS"),
		Allowed: []*computepb.Allowed{{IPProtocol: ptr.To("tcp"), Ports: []string{"3128"}}}, SourceRanges: []string{"203.0.113.0/24"}})
	fake.SetUnreachable("europe-west1-c", true)
	owned, err = b.ListOwned(ctx)
	var partial *backend.PartialList
	if !errors.As(err, &partial) || !strings.Contains(err.Error(), "zones/europe-west1-c") || len(owned) != n/2 {
		t.Errorf("an unreachable zone lists the rest and says what was not collected: %d VMs, %v", len(owned), err)
	}
	for _, i := range owned {
		if i.Zone == "" {
			t.Errorf("no rule is judged unused while a zone is unreachable: %s", i.Name)
		}
	}
}

// s0Rule is the name of the fleet rule fleetSpec's VMs share.
func s0Rule(b interface{ RuleFor(backend.Spec) string }) string { return b.RuleFor(fleetSpec(0)) }

// TestReleaseRuleAsksForOne: deleting a VM asks whether another holds its
// fleet's rule, and one is all the answer needs: each delete makes one
// listing, which returns at most a small page, not a page of the fleet's
// every VM (deleting a fleet of N cost N², 170 ms a delete at 1 000). A VM
// still being made holds the rule; VMs being deleted or suspended do not.
func TestReleaseRuleAsksForOne(t *testing.T) {
	fake := gcpfake.Start(t)
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	var specs []backend.Spec
	for i := range 30 {
		s := fleetSpec(i)
		if _, err := b.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		specs = append(specs, s)
	}
	rule := fake.Instance(specs[0].Zone, specs[0].Name).GetLabels()["egress-rule"]
	listed, calls := fake.Listed(), fake.Calls("instances.aggregatedList")
	for _, s := range specs[:10] {
		if err := b.Delete(ctx, s.Ref); err != nil {
			t.Fatal(err)
		}
	}
	if n, c := fake.Listed()-listed, fake.Calls("instances.aggregatedList")-calls; n > 100 || c != 10 {
		t.Errorf("10 deletes of a fleet of 30 made %d listings of %d VMs in all, want one each of at most 10", c, n)
	}
	waitOps(fake)
	if fake.Firewall(rule) == nil {
		t.Fatal("the fleet's rule went with 20 VMs still carrying it")
	}
	// The rest but three go; of those, one is being made again
	// (PROVISIONING) and one suspended.
	for _, s := range specs[10:27] {
		if err := b.Delete(ctx, s.Ref); err != nil {
			t.Fatal(err)
		}
	}
	if !fake.SetStatus(specs[27].Zone, specs[27].Name, "PROVISIONING", "") || !fake.SetStatus(specs[28].Zone, specs[28].Name, "SUSPENDED", "") {
		t.Fatal("no VM to set")
	}
	if err := b.Delete(ctx, specs[29].Ref); err != nil {
		t.Fatal(err)
	}
	waitOps(fake)
	if fake.Firewall(rule) == nil {
		t.Fatal("the fleet's rule went while a VM of it was being made")
	}
	if err := b.Delete(ctx, specs[27].Ref); err != nil {
		t.Fatal(err)
	}
	waitOps(fake)
	if fake.Firewall(rule) != nil {
		t.Error("the fleet's rule stayed with every other VM being deleted or suspended")
	}
}
