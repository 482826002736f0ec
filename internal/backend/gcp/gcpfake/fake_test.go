package gcpfake_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"k8s.io/utils/ptr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp/gcpfake"
)

const zone = "europe-west1-b"

func clients(t *testing.T, fake *gcpfake.Server) (*compute.InstancesClient, *compute.FirewallsClient) {
	t.Helper()
	ic, err := compute.NewInstancesRESTClient(context.Background(), fake.ClientOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	fc, err := compute.NewFirewallsRESTClient(context.Background(), fake.ClientOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = ic.Close(), fc.Close() })
	return ic, fc
}

func goodVM(name string) *computepb.Instance {
	return &computepb.Instance{
		Name:        ptr.To(name),
		MachineType: ptr.To("zones/" + zone + "/machineTypes/e2-micro"),
		Labels:      map[string]string{"managed-by": "provider-egressproxy"},
		Tags:        &computepb.Tags{Items: []string{name}},
		Disks: []*computepb.AttachedDisk{{Boot: ptr.To(true), InitializeParams: &computepb.AttachedDiskInitializeParams{
			SourceImage: ptr.To("projects/debian-cloud/global/images/family/debian-12"),
		}}},
		NetworkInterfaces: []*computepb.NetworkInterface{{Network: ptr.To("global/networks/default")}},
		Metadata:          &computepb.Metadata{Items: []*computepb.Items{{Key: ptr.To("startup-script"), Value: ptr.To("#!/bin/sh\n")}}},
	}
}

func code(err error) (int, string) {
	var ge *googleapi.Error
	if !errors.As(err, &ge) {
		return 0, ""
	}
	return ge.Code, ge.Message
}

// TestFakeRefusesWhatGCPRefuses: each request below is one Compute Engine
// refuses; the fake must refuse it too, or tests pass that production fails.
func TestFakeRefusesWhatGCPRefuses(t *testing.T) {
	big := strings.Repeat("x", 256*1024+1)
	cases := map[string]struct {
		change func(*computepb.Instance)
		code   int
		msg    string
	}{
		"Valid": {change: func(*computepb.Instance) {}},
		"FullURLs": {change: func(vm *computepb.Instance) {
			vm.MachineType = ptr.To("https://www.googleapis.com/compute/v1/projects/crawl-proj/zones/" + zone + "/machineTypes/e2-small")
		}},
		"UpperCaseName":   {change: func(vm *computepb.Instance) { vm.Name = ptr.To("Proxy") }, code: 400, msg: "resource.name"},
		"LongName":        {change: func(vm *computepb.Instance) { vm.Name = ptr.To("a" + strings.Repeat("b", 63)) }, code: 400, msg: "resource.name"},
		"LabelKey":        {change: func(vm *computepb.Instance) { vm.Labels["Team"] = "x" }, code: 400, msg: "Label key 'Team'"},
		"LabelValue":      {change: func(vm *computepb.Instance) { vm.Labels["team"] = "a/b" }, code: 400, msg: "Label value 'a/b'"},
		"Tag":             {change: func(vm *computepb.Instance) { vm.Tags.Items = append(vm.Tags.Items, "Crawl_1") }, code: 400, msg: "resource.tags.items[1]"},
		"MachineTypeZone": {change: func(vm *computepb.Instance) { vm.MachineType = ptr.To("zones/us-central1-a/machineTypes/e2-micro") }, code: 400, msg: "does not match"},
		"MachineTypeForm": {change: func(vm *computepb.Instance) { vm.MachineType = ptr.To("e2-micro") }, code: 400, msg: "resource.machineType"},
		"UnknownImage": {change: func(vm *computepb.Instance) {
			vm.Disks[0].InitializeParams.SourceImage = ptr.To("projects/debian-cloud/global/images/family/debian-7")
		}, code: 404, msg: "family/debian-7"},
		"MetadataValue":  {change: func(vm *computepb.Instance) { vm.Metadata.Items[0].Value = ptr.To(big) }, code: 400, msg: "262144"},
		"MetadataKey":    {change: func(vm *computepb.Instance) { vm.Metadata.Items[0].Key = ptr.To("startup script") }, code: 400, msg: "metadata"},
		"MissingNetwork": {change: func(vm *computepb.Instance) { vm.NetworkInterfaces[0].Network = ptr.To("global/networks/nope") }, code: 404, msg: "networks/nope"},
		"PdStandardOnC3": {change: func(vm *computepb.Instance) { vm.MachineType = ptr.To("zones/" + zone + "/machineTypes/c3-standard-4") }, code: 400, msg: "pd-standard"},
		"HyperdiskOnE2": {change: func(vm *computepb.Instance) {
			vm.Disks[0].InitializeParams.DiskType = ptr.To("zones/" + zone + "/diskTypes/hyperdisk-balanced")
		}, code: 400, msg: "hyperdisk-balanced"},
		"NoBootDisk": {change: func(vm *computepb.Instance) { vm.Disks[0].Boot = ptr.To(false) }, code: 400, msg: "boot disk"},
		"MissingSubnet": {change: func(vm *computepb.Instance) {
			vm.NetworkInterfaces[0].Subnetwork = ptr.To("regions/europe-west1/subnetworks/x")
		}, code: 404, msg: "subnetworks/x"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			fake := gcpfake.Start(t)
			ic, _ := clients(t, fake)
			vm := goodVM("proxy-1")
			tc.change(vm)
			_, err := ic.Insert(context.Background(), &computepb.InsertInstanceRequest{Project: "crawl-proj", Zone: zone, InstanceResource: vm})
			got, msg := code(err)
			if got != tc.code || !strings.Contains(msg, tc.msg) {
				t.Errorf("want %d %q, got %d: %v", tc.code, tc.msg, got, err)
			}
			if tc.code != 0 && fake.Instances() != 0 {
				t.Error("a refused insert makes nothing")
			}
		})
	}
}

func TestFakeFirewallRules(t *testing.T) {
	ctx := context.Background()
	fake := gcpfake.Start(t)
	_, fc := clients(t, fake)
	rule := func(ranges ...string) *computepb.Firewall {
		return &computepb.Firewall{Name: ptr.To("proxy-1"), Network: ptr.To("global/networks/default"), Direction: ptr.To("INGRESS"),
			Allowed: []*computepb.Allowed{{IPProtocol: ptr.To("tcp"), Ports: []string{"3128"}}}, SourceRanges: ranges, TargetTags: []string{"proxy-1"}}
	}
	_, err := fc.Insert(ctx, &computepb.InsertFirewallRequest{Project: "crawl-proj", FirewallResource: rule("203.0.113.0/24", "2001:db8::/32")})
	if c, msg := code(err); c != http.StatusBadRequest || !strings.Contains(msg, "IPv4 and IPv6") {
		t.Errorf("mixed IPv4 and IPv6 ranges are refused: %v", err)
	}
	_, err = fc.Insert(ctx, &computepb.InsertFirewallRequest{Project: "crawl-proj", FirewallResource: &computepb.Firewall{Name: ptr.To("r"), Network: ptr.To("projects/other-proj/global/networks/default")}})
	if c, _ := code(err); c != http.StatusBadRequest {
		t.Errorf("a rule on another project's network is refused: %v", err)
	}

	fake.SetOperationDuration(time.Hour)
	op, err := fc.Insert(ctx, &computepb.InsertFirewallRequest{Project: "crawl-proj", FirewallResource: rule("203.0.113.0/24")})
	if err != nil {
		t.Fatal(err)
	}
	if op.Done() {
		t.Error("operations run for the configured time")
	}
	if _, err := fc.Get(ctx, &computepb.GetFirewallRequest{Project: "crawl-proj", Firewall: "proxy-1"}); !is(err, 404) {
		t.Errorf("a rule exists once its insert is done: %v", err)
	}
	if _, err := fc.Insert(ctx, &computepb.InsertFirewallRequest{Project: "crawl-proj", FirewallResource: rule("203.0.113.0/24")}); !is(err, 409) {
		t.Errorf("a rule being inserted holds its name: %v", err)
	}
	if _, err := fc.Delete(ctx, &computepb.DeleteFirewallRequest{Project: "crawl-proj", Firewall: "proxy-1"}); !is(err, 400) {
		t.Errorf("a rule with an operation running is not ready: %v", err)
	}
}

func is(err error, want int) bool {
	c, _ := code(err)
	return c == want
}

// TestFakeDeletionKeepsName: a VM being deleted stays STOPPING and keeps
// its name until the operation ends.
func TestFakeDeletionKeepsName(t *testing.T) {
	ctx := context.Background()
	fake := gcpfake.Start(t)
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	fake.SetClock(func() time.Time { return now })
	ic, _ := clients(t, fake)
	if _, err := ic.Insert(ctx, &computepb.InsertInstanceRequest{Project: "crawl-proj", Zone: zone, InstanceResource: goodVM("proxy-1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := ic.Delete(ctx, &computepb.DeleteInstanceRequest{Project: "crawl-proj", Zone: zone, Instance: "proxy-1"}); !is(err, 400) {
		t.Errorf("deleting a VM whose insert runs is not ready: %v", err)
	}
	now = now.Add(time.Second)
	op, err := ic.Delete(ctx, &computepb.DeleteInstanceRequest{Project: "crawl-proj", Zone: zone, Instance: "proxy-1"})
	if err != nil || op.Done() {
		t.Fatalf("delete is accepted and runs: %v", err)
	}
	vm, err := ic.Get(ctx, &computepb.GetInstanceRequest{Project: "crawl-proj", Zone: zone, Instance: "proxy-1"})
	if err != nil || vm.GetStatus() != "STOPPING" {
		t.Errorf("a VM being deleted is STOPPING: %v, %v", vm.GetStatus(), err)
	}
	if _, err := ic.Insert(ctx, &computepb.InsertInstanceRequest{Project: "crawl-proj", Zone: zone, InstanceResource: goodVM("proxy-1")}); !is(err, 409) {
		t.Errorf("its name is taken meanwhile: %v", err)
	}
	if _, err := ic.Delete(ctx, &computepb.DeleteInstanceRequest{Project: "crawl-proj", Zone: zone, Instance: "proxy-1"}); !is(err, 400) {
		t.Errorf("deleting it again is not ready: %v", err)
	}
	now = now.Add(time.Second)
	if err := op.Poll(ctx); err != nil || !op.Done() {
		t.Fatalf("the delete ends: %v", err)
	}
	if _, err := ic.Get(ctx, &computepb.GetInstanceRequest{Project: "crawl-proj", Zone: zone, Instance: "proxy-1"}); !is(err, 404) {
		t.Errorf("then the VM is gone: %v", err)
	}
}

// TestFakeFilters: the list filter grammar as the API documents it.
func TestFakeFilters(t *testing.T) {
	ctx := context.Background()
	fake := gcpfake.Start(t)
	ic, _ := clients(t, fake)
	for _, v := range []struct{ name, cluster string }{{"a-1", "one"}, {"b-1", "two"}} {
		vm := goodVM(v.name)
		vm.Labels["egress-cluster"] = v.cluster
		if _, err := ic.Insert(ctx, &computepb.InsertInstanceRequest{Project: "crawl-proj", Zone: zone, InstanceResource: vm}); err != nil {
			t.Fatal(err)
		}
	}
	list := func(filter string) ([]string, error) {
		it := ic.AggregatedList(ctx, &computepb.AggregatedListInstancesRequest{Project: "crawl-proj", Filter: ptr.To(filter)})
		var names []string
		for {
			pair, err := it.Next()
			if errors.Is(err, iterator.Done) {
				return names, nil
			}
			if err != nil {
				return nil, err
			}
			for _, vm := range pair.Value.GetInstances() {
				names = append(names, vm.GetName())
			}
		}
	}
	cases := map[string]struct {
		filter string
		want   string // names, comma-separated, or "error"
	}{
		"One":               {filter: `labels.egress-cluster = "one"`, want: "a-1"},
		"Parenthesized":     {filter: `(labels.managed-by = "provider-egressproxy") AND (labels.egress-cluster = "two")`, want: "b-1"},
		"Juxtaposed":        {filter: `(labels.managed-by = "provider-egressproxy") (labels.egress-cluster = "two")`, want: "b-1"},
		"Or":                {filter: `(labels.egress-cluster = "one") OR (labels.egress-cluster = "two")`, want: "a-1,b-1"},
		"NotEqual":          {filter: `labels.egress-cluster != "one"`, want: "b-1"},
		"Presence":          {filter: `labels.egress-cluster:*`, want: "a-1,b-1"},
		"Regex":             {filter: `name eq 'a-.*'`, want: "a-1"},
		"RegexNe":           {filter: `name ne 'a-.*'`, want: "b-1"},
		"Nested":            {filter: `((name = "a-1") OR (name = "b-1")) AND (labels.egress-cluster = "two")`, want: "b-1"},
		"Unparenthesized":   {filter: `labels.managed-by = "provider-egressproxy" AND labels.egress-cluster = "two"`, want: "error"},
		"Unbalanced":        {filter: `(labels.egress-cluster = "one"`, want: "error"},
		"NoOperator":        {filter: `labels.egress-cluster "one"`, want: "error"},
		"NoValue":           {filter: `(name = )`, want: "error"},
		"Unterminated":      {filter: `name = "a-1`, want: "error"},
		"MixedStyles":       {filter: `(name eq 'a-.*') (labels.egress-cluster = "one")`, want: "error"},
		"NothingMatches":    {filter: `labels.egress-cluster = "three"`, want: ""},
		"Status":            {filter: `(labels.egress-cluster:*) AND (name != "a-1") AND (status != "STOPPING")`, want: "b-1"},
		"OtherField":        {filter: `(canIpForward = "false") AND (labels.egress-cluster = "one")`, want: ""},
		"OtherFieldAbsent":  {filter: `(canIpForward != "true") AND (labels.egress-cluster = "one")`, want: "a-1"},
		"EmptyMatchesEvery": {filter: ``, want: "a-1,b-1"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			names, err := list(tc.filter)
			got := strings.Join(names, ",")
			if err != nil {
				if c, msg := code(err); c != 400 || !strings.Contains(msg, "Invalid list filter expression") {
					t.Fatalf("a refused filter is a 400 naming it: %v", err)
				}
				got = "error"
			}
			if got != tc.want {
				t.Errorf("filter %s: want %q, got %q (%v)", tc.filter, tc.want, got, err)
			}
		})
	}
}

// TestFakeOperationErrors: an insert accepted, then failed in its
// operation, as stockouts and quota arrive; the VM disappears.
func TestFakeOperationErrors(t *testing.T) {
	ctx := context.Background()
	fake := gcpfake.Start(t)
	ic, _ := clients(t, fake)
	fake.FailOperation("instances.insert", gcpfake.Stockout("crawl-proj", zone))
	op, err := ic.Insert(ctx, &computepb.InsertInstanceRequest{Project: "crawl-proj", Zone: zone, InstanceResource: goodVM("proxy-1")})
	if err != nil {
		t.Fatalf("the insert is accepted: %v", err)
	}
	err = op.Wait(ctx)
	if c, msg := code(err); c != http.StatusServiceUnavailable || !strings.Contains(msg, "ZONE_RESOURCE_POOL_EXHAUSTED") {
		t.Errorf("the operation reports the stockout as GCP does: %v", err)
	}
	if fake.Instances() != 0 {
		t.Error("the VM of a failed insert disappears")
	}
}
