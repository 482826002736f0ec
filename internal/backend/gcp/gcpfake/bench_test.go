package gcpfake_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"k8s.io/utils/ptr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp/gcpfake"
)

// names lists what filter selects, maxResults VMs a page, and counts the
// pages (up to the first maxPages, when positive): one list call each, as
// a page's scopes are read before the next page is asked for.
func names(t testing.TB, ic *compute.InstancesClient, filter string, maxResults uint32, maxPages int) ([]string, int) {
	t.Helper()
	it := ic.AggregatedList(context.Background(), &computepb.AggregatedListInstancesRequest{
		Project: "crawl-proj", Filter: ptr.To(filter), MaxResults: ptr.To(maxResults),
	})
	var out []string
	for pages := 0; ; {
		pair, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		for _, vm := range pair.Value.GetInstances() {
			out = append(out, vm.GetName())
		}
		if it.PageInfo().Remaining() == 0 {
			pages++
			if it.PageInfo().Token == "" || pages == maxPages {
				return out, pages
			}
		}
	}
}

// TestFakePagesAFilter: a filtered list comes in pages of maxResults of
// the VMs selected, in order, each VM once, however the selected and the
// others interleave.
func TestFakePagesAFilter(t *testing.T) {
	fake := gcpfake.Start(t)
	ic, _ := clients(t, fake)
	for i := range 9 {
		vm := goodVM(fmt.Sprintf("vm-%d", i))
		vm.Labels["egress-cluster"] = []string{"one", "two"}[i%2]
		if _, err := ic.Insert(context.Background(), &computepb.InsertInstanceRequest{Project: "crawl-proj", Zone: zone, InstanceResource: vm}); err != nil {
			t.Fatal(err)
		}
	}
	// A token past the selected VMs is refused, as GCP refuses a token it
	// did not give, however many VMs the filter passes over.
	for _, tok := range []string{"page-6", "page-99", "other"} {
		_, err := ic.AggregatedList(context.Background(), &computepb.AggregatedListInstancesRequest{
			Project: "crawl-proj", Filter: ptr.To(`labels.egress-cluster = "one"`), MaxResults: ptr.To(uint32(2)), PageToken: ptr.To(tok),
		}).Next()
		if c, msg := code(err); c != 400 || !strings.Contains(msg, "pageToken") {
			t.Errorf("page token %q: %v; want a 400 naming pageToken", tok, err)
		}
	}
	for _, tc := range []struct {
		max   uint32
		pages int
	}{{1, 5}, {2, 3}, {4, 2}, {5, 1}, {500, 1}} {
		before := fake.Calls("instances.aggregatedList")
		got, pages := names(t, ic, `labels.egress-cluster = "one"`, tc.max, 0)
		calls := fake.Calls("instances.aggregatedList") - before
		if strings.Join(got, ",") != "vm-0,vm-2,vm-4,vm-6,vm-8" || pages != tc.pages || calls != pages {
			t.Errorf("pages of %d: %v in %d pages, %d calls; want the 5 of cluster one in %d, a call each", tc.max, got, pages, calls, tc.pages)
		}
		if got, pages := names(t, ic, `labels.egress-cluster = "one"`, tc.max, 1); len(got) != min(5, int(tc.max)) || pages != 1 {
			t.Errorf("the first page of %d: %v in %d pages", tc.max, got, pages)
		}
	}
}

// BenchmarkFakeBySize: what one Get and one filtered list of a page of ten
// (the shape of the GCP backend's rule release) cost the fake by how many
// VMs it holds, each made through the API (so with its operations done).
// make scale runs it at 10 000 VMs; its cost per call must not grow with
// them past the filter's own scan.
func BenchmarkFakeBySize(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			fake := gcpfake.Start(b)
			fake.SetOperationDuration(0)
			ic, err := compute.NewInstancesRESTClient(context.Background(), fake.ClientOptions()...)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = ic.Close() })
			ctx := context.Background()
			for i := range n {
				vm := goodVM(fmt.Sprintf("vm-%05d", i))
				vm.Labels["egress-fleet"] = fmt.Sprint(i % 10)
				if _, err := ic.Insert(ctx, &computepb.InsertInstanceRequest{Project: "crawl-proj", Zone: zone, InstanceResource: vm}); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, err := ic.Get(ctx, &computepb.GetInstanceRequest{Project: "crawl-proj", Zone: zone, Instance: fmt.Sprintf("vm-%05d", i%n)}); err != nil {
					b.Fatal(err)
				}
				if got, _ := names(b, ic, fmt.Sprintf(`labels.egress-fleet = "%d"`, i%10), 10, 1); len(got) != 10 {
					b.Fatalf("a page of %d; want 10", len(got))
				}
			}
		})
	}
}
