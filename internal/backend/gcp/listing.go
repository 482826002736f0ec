package gcp

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"google.golang.org/api/iterator"
	"k8s.io/utils/ptr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/cloudvm"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

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
			return out, &backend.PartialList{Skipped: b.projectRules(),
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
	it := b.firewalls.List(ctx, &computepb.ListFirewallsRequest{Project: b.cfg.Project, Filter: ptr.To(`description eq '.*` + ruleMarker + `.*'`)})
	var rules []cloudvm.Opening
	for {
		fw, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return cloudvm.Unused(rules, cloudvm.Used(vms)), nil
		}
		if err != nil {
			return cloudvm.Unused(rules, cloudvm.Used(vms)), cloudvm.OpeningsUnlisted(Classify(err), b.projectRules()+" (grant compute.firewalls.list to collect them)", "firewall rules")
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
		if !ok || !owner.OfCluster(b.cfg.ClusterID) || vmProject != b.cfg.Project {
			continue
		}
		created, _ := time.Parse(time.RFC3339, fw.GetCreationTimestamp())
		rules = append(rules, cloudvm.Opening{
			Name: fw.GetName(), ProviderID: fmt.Sprintf("projects/%s/global/firewalls/%s", b.cfg.Project, fw.GetName()),
			Owner: owner, Created: created,
		})
	}
}

// projectRules names what a partial list skipped: the project's rules.
func (b *Backend) projectRules() string { return "firewall rules of project " + b.cfg.Project }
