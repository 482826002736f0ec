package aws

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/cloudvm"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// A fleet's instances share a security group per (VPC, port, source
// ranges), named from them (cloudvm.SharedName), so that a fleet of
// thousands needs a handful of groups, not one each (a region allows 2 500
// by default, shared with everything else in it); a Proxy of no fleet has
// its own, named after its instance. The group's rules never change: other
// ranges or another port make another group. It goes when the last
// instance using it does, or with the orphan collector once no instance
// uses it.

// groupName names the group an instance of s in vpc joins, by what it is:
// a Proxy of no fleet's is its own (keyed by its instance's name), but
// named from its port and ranges as a fleet's is, so that a group is
// never changed: another port or other ranges make another group (an
// instance going keeps its old one, which must not stay open wider than
// the new spec says), and the old goes with its last instance.
func (b *Backend) groupName(s backend.Spec, vpc string, ranges []string) string {
	owner := s.Owner.Fleet
	if owner == "" {
		owner = "instance " + s.Name
	}
	return cloudvm.SharedName("egress-sg-", ownership.LabelValue(b.cfg.ClusterID), s.Owner.Namespace, owner, vpc, "tcp:"+strconv.Itoa(int(s.Port)), ranges)
}

// groupTags are the tags of the group of s: the cluster's ownership, the
// fleet (or, for a Proxy of no fleet, the Proxy), what made it, and when.
func (b *Backend) groupTags(s backend.Spec, now time.Time) []types.Tag {
	labels := ownership.Owner{ClusterID: b.cfg.ClusterID, Namespace: s.Owner.Namespace, Fleet: s.Owner.Fleet}.Labels()
	of := "fleet"
	if s.Owner.Fleet == "" {
		// The Proxy's owner tags, but never retain: a kept instance keeps
		// its group in use, and a group no instance uses is collected.
		o := s.Owner
		o.Retain, o.Adopter = false, ""
		labels, of = o.Labels(), "instance"
	}
	tags := []types.Tag{{Key: aws.String(tagGroupOf), Value: aws.String(of)}, {Key: aws.String(tagCreated), Value: aws.String(now.UTC().Format(time.RFC3339))}}
	for _, k := range sortedKeys(labels) {
		tags = append(tags, types.Tag{Key: aws.String(k), Value: aws.String(labels[k])})
	}
	return tags
}

// ensureGroup makes the group of s in vpc, or finds it, and puts in any
// of its rules that are missing (a create cut short between the group and
// its rules): its ID and name.
func (b *Backend) ensureGroup(ctx context.Context, s backend.Spec, vpc string, ranges []string) (string, string, error) {
	name := b.groupName(s, vpc, ranges)
	g, err := b.findGroup(ctx, name, vpc)
	if err != nil {
		return "", "", err
	}
	id := ""
	if g != nil {
		id = aws.ToString(g.GroupId)
	} else {
		out, err := b.ec2.CreateSecurityGroup(ctx, &ec2.CreateSecurityGroupInput{
			GroupName: aws.String(name), VpcId: aws.String(vpc),
			Description:       aws.String(groupDescription(s, b.cfg.ClusterID)),
			TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeSecurityGroup, Tags: b.groupTags(s, time.Now())}},
		})
		switch {
		case err == nil:
			id = aws.ToString(out.GroupId)
		case code(err) == "InvalidGroup.Duplicate":
			// Another replica's create, or one cut short, made it first.
			if g, err = b.findGroup(ctx, name, vpc); err != nil || g == nil {
				return "", "", backend.Errorf(backend.ClassTransient, "security group %s exists but is not listed yet", name)
			}
			id = aws.ToString(g.GroupId)
		default:
			return "", "", errors.Wrapf(Classify(err), "cannot create security group %s", name)
		}
	}
	have := map[string]bool{}
	if g != nil {
		for _, p := range g.IpPermissions {
			if aws.ToString(p.IpProtocol) == "tcp" && aws.ToInt32(p.FromPort) == s.Port && aws.ToInt32(p.ToPort) == s.Port {
				for _, r := range p.IpRanges {
					have[aws.ToString(r.CidrIp)] = true
				}
			}
		}
	}
	var missing []types.IpRange
	for _, r := range ranges {
		if !have[r] {
			missing = append(missing, types.IpRange{CidrIp: aws.String(r), Description: aws.String("egress proxy clients")})
		}
	}
	if len(missing) > 0 {
		_, err := b.ec2.AuthorizeSecurityGroupIngress(ctx, &ec2.AuthorizeSecurityGroupIngressInput{GroupId: aws.String(id), IpPermissions: []types.IpPermission{{
			IpProtocol: aws.String("tcp"), FromPort: aws.Int32(s.Port), ToPort: aws.Int32(s.Port), IpRanges: missing,
		}}})
		if err != nil && code(err) != "InvalidPermission.Duplicate" {
			return "", "", errors.Wrapf(Classify(err), "cannot open port %d in security group %s", s.Port, name)
		}
	}
	return id, name, nil
}

// groupDescription says whose a group is, within EC2's 255 characters
// (a Proxy's name may be 253 long): the tags say it exactly.
func groupDescription(s backend.Spec, cluster string) string {
	d := fmt.Sprintf("egress proxies %s/%s (cluster %s, managed by %s)", s.Owner.Namespace, fleetOrProxy(s), cluster, ownership.ManagedBy)
	if len(d) > 255 {
		d = d[:252] + "..."
	}
	return d
}

func fleetOrProxy(s backend.Spec) string {
	if s.Owner.Fleet != "" {
		return s.Owner.Fleet
	}
	return s.Owner.Name
}

// findGroup is this cluster's group of name (in vpc, when set), nil when
// there is none.
func (b *Backend) findGroup(ctx context.Context, name, vpc string) (*types.SecurityGroup, error) {
	filters := []types.Filter{{Name: aws.String("group-name"), Values: []string{name}},
		{Name: aws.String("tag:" + ownership.LabelCluster), Values: []string{ownership.LabelValue(b.cfg.ClusterID)}}}
	if vpc != "" {
		filters = append(filters, types.Filter{Name: aws.String("vpc-id"), Values: []string{vpc}})
	}
	out, err := b.ec2.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{Filters: filters})
	if err != nil {
		return nil, errors.Wrapf(Classify(err), "cannot read security group %s", name)
	}
	if len(out.SecurityGroups) == 0 {
		return nil, nil
	}
	return &out.SecurityGroups[0], nil
}

// releaseGroup deletes the group of name once no instance of this
// cluster that is not terminated carries it; one still attached to an
// instance shutting down is left to the orphan collector.
func (b *Backend) releaseGroup(ctx context.Context, name string) {
	// One page of the fewest EC2 allows tells whether any instance uses
	// it: deleting a fleet of N costs N small reads, not N listings of N.
	out, err := b.ec2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{MaxResults: aws.Int32(5), Filters: []types.Filter{
		{Name: aws.String("tag:" + TagGroup), Values: []string{name}},
		{Name: aws.String("instance-state-name"), Values: []string{"pending", "running", "stopping", "stopped"}}}})
	if err != nil || len(out.Reservations) > 0 {
		return
	}
	_ = b.deleteGroup(ctx, name)
}

// deleteGroup deletes this cluster's group of name; a missing one is
// deleted already.
func (b *Backend) deleteGroup(ctx context.Context, name string) error {
	g, err := b.findGroup(ctx, name, "")
	if err != nil || g == nil {
		return err
	}
	if _, err := b.ec2.DeleteSecurityGroup(ctx, &ec2.DeleteSecurityGroupInput{GroupId: g.GroupId}); err != nil {
		if c := Classify(err); backend.ClassOf(c) != backend.ClassNotFound {
			return errors.Wrapf(c, "cannot delete security group %s", name)
		}
	}
	return nil
}

// orphanGroups are this cluster's groups whose name used does not list,
// as instances without a zone, with their owner's fleet and their
// creation time, for the orphan collector.
func (b *Backend) orphanGroups(ctx context.Context, used map[string]bool) ([]backend.Instance, error) {
	var groups []cloudvm.Opening
	p := ec2.NewDescribeSecurityGroupsPaginator(b.ec2, &ec2.DescribeSecurityGroupsInput{Filters: tagFilters(ownership.Selector(b.cfg.ClusterID)), MaxResults: aws.Int32(1000)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, Classify(err)
		}
		for i := range page.SecurityGroups {
			g := &page.SecurityGroups[i]
			tags := tagMap(g.Tags)
			if tags[tagGroupOf] == "" {
				continue
			}
			// A group no live instance uses serves nothing: collected even
			// if an older provider tagged it to be retained (Unused).
			owner, ok := ownership.FromLabels(tags)
			if !ok {
				owner = ownership.Owner{ClusterID: tags[ownership.LabelCluster], Namespace: tags[ownership.LabelNamespace], Fleet: tags[ownership.LabelOwnerFleet], Name: "fleet " + tags[ownership.LabelOwnerFleet]}
			}
			created, _ := time.Parse(time.RFC3339, tags[tagCreated])
			groups = append(groups, cloudvm.Opening{
				Name: aws.ToString(g.GroupName), ProviderID: "aws:///" + b.cfg.Region + "/" + aws.ToString(g.GroupId),
				Owner: owner, Created: created,
			})
		}
	}
	return cloudvm.Unused(groups, used), nil
}
