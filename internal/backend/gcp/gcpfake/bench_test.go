package gcpfake_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"google.golang.org/api/iterator"
	"k8s.io/utils/ptr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp/gcpfake"
)

// names lists what filter selects, maxResults a page, and counts the pages
// (up to the first maxPages, when positive).
func names(t testing.TB, ic *compute.InstancesClient, filter string, maxResults uint32, maxPages int) ([]string, int) {
	t.Helper()
	it := ic.AggregatedList(context.Background(), &computepb.AggregatedListInstancesRequest{
		Project: "crawl-proj", Filter: ptr.To(filter), MaxResults: ptr.To(maxResults),
	})
	var out []string
	pages, token := 0, "start"
	for {
		pair, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, pages
		}
		if err != nil {
			t.Fatal(err)
		}
		if it.PageInfo().Token != token {
			if maxPages > 0 && pages == maxPages {
				return out, pages
			}
			token = it.PageInfo().Token
			pages++
		}
		for _, vm := range pair.Value.GetInstances() {
			out = append(out, vm.GetName())
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
	for _, tc := range []struct {
		max   uint32
		pages int
	}{{1, 5}, {2, 3}, {4, 2}, {5, 1}, {500, 1}} {
		got, pages := names(t, ic, `labels.egress-cluster = "one"`, tc.max, 0)
		if strings.Join(got, ",") != "vm-0,vm-2,vm-4,vm-6,vm-8" || pages != tc.pages {
			t.Errorf("pages of %d: %v in %d pages; want the 5 of cluster one in %d", tc.max, got, pages, tc.pages)
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
