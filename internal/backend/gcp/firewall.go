package gcp

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"google.golang.org/api/iterator"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/cloudvm"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

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

// firewallProject is the project a rule on network lives in: the network's.
func firewallProject(network string) string {
	return strings.SplitN(strings.TrimPrefix(network, "projects/"), "/", 2)[0]
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

// releaseRule deletes a fleet's rule once no VM but the one going (r)
// carries it, without waiting. A VM created meanwhile that finds it gone
// gets it back from Repair; a rule two last VMs each saw the other use is
// left to orphan collection. Failures are left to it too.
//
// One VM that holds the rule is all it needs to see, so it asks only for
// the fleet's VMs other than r that Phase would not call Terminated, in
// small pages: a page of the fleet's every VM (up to 500, a megabyte) on
// each delete made deleting a fleet of N cost N² (170 ms a delete at
// 1 000 against the fake, TestReleaseRuleAsksForOne). The client still
// checks each VM, should the API list one it was asked to leave out.
func (b *Backend) releaseRule(ctx context.Context, r backend.Ref, network string) {
	filter := `(labels.` + labelRule + ` = "` + r.Rule + `") AND (name != "` + r.Name + `")`
	for _, s := range stoppedStatuses {
		filter += ` AND (status != "` + s + `")`
	}
	it := b.instances.AggregatedList(ctx, &computepb.AggregatedListInstancesRequest{
		Project: b.cfg.Project, MaxResults: ptr.To[uint32](10), Filter: ptr.To(filter),
	})
	for {
		pair, err := it.Next()
		// A zone in an outage may hold VMs that carry it: the rule stays,
		// for the orphan collector once the zone answers.
		if resp, ok := it.Response.(*computepb.InstanceAggregatedList); ok && len(resp.GetUnreachables()) > 0 {
			return
		}
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil || pair.Value.GetWarning().GetCode() == "UNREACHABLE" {
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
