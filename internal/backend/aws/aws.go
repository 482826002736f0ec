// Package aws runs each proxy on an EC2 instance with its own public IPv4
// address, through the real aws-sdk-go-v2 EC2 client; tests point it at
// ec2fake, an in-process fake of the EC2 Query API. What it shares with
// the GCP backend (the start-up script, the opening's source ranges, the
// fleet opening's name) is cloudvm's; this package is EC2's client of it.
//
// An instance is one per Proxy, found by its instance tag (the name
// ownership.InstanceName derives from the Proxy's UID). RunInstances is
// made idempotent by its ClientToken: the name, and the ID of the last
// instance of that name that was terminated ("0" when none), so that a
// create cut short by a kill and tried again returns the instance it
// made, while a Proxy whose instance was terminated (a spot interruption,
// a user) gets a new one rather than the terminated one back. A fleet's
// instances share one security group per (VPC, port, source ranges),
// tagged with its fleet and collected by the orphan collector once no
// instance uses it.
//
// Files: aws.go (the backend: create, observe, delete, list), group.go
// (the fleet's security group), errors.go (EC2's error codes as backend
// classes), explain.go (an UnauthorizedOperation's encoded message
// decoded through STS), listing.go (one shared, briefly cached listing of
// the cluster's instances that Gets answer from), credentials.go (an
// access key from a shared credentials file).
package aws

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/cloudvm"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// Tags the backend puts on an instance besides the ownership labels
// (which EC2 tags hold as they are).
const (
	// TagInstance names the instance (ownership.InstanceName): how it is
	// found, whatever its EC2 ID.
	TagInstance    = "egress.crawl.example.com/instance"
	tagSpecHash    = "egress.crawl.example.com/spec-hash"
	tagCredentials = "egress.crawl.example.com/credentials"
	tagPort        = "egress.crawl.example.com/port"
	// TagGroup names the security group the instance's port is opened by.
	TagGroup = "egress.crawl.example.com/security-group"
	// tagGroupOf marks a group the backend made: "fleet" or "instance".
	tagGroupOf = "egress.crawl.example.com/security-group-of"
	// tagCreated is when a group was made (EC2 does not say).
	tagCreated = "egress.crawl.example.com/created"
)

// ec2Keys are the tags an instance records itself by, its name among
// them: EC2 names it i-....
var ec2Keys = cloudvm.Keys{Name: TagInstance, SpecHash: tagSpecHash, Credentials: tagCredentials, Port: tagPort, Opening: TagGroup}

// Owner accounts of the images the generated start-up script supports.
const (
	DebianOwner    = "136693071363"
	CanonicalOwner = "099720109477"
)

// Config configures an aws backend.
type Config struct {
	// Region the instances run in.
	Region string
	// ClusterID names this control plane on everything it makes.
	ClusterID string
	// Credentials sign the requests; nil: the SDK's default chain (the
	// pod's identity through IRSA or EKS Pod Identity, the environment).
	Credentials aws.CredentialsProvider
	// Endpoint replaces EC2's regional endpoint (tests: the fake).
	Endpoint string
	// HTTPClient, when set, carries the requests.
	HTTPClient *http.Client
	// MaxAttempts bounds the SDK's retries of throttled and transient
	// answers (RequestLimitExceeded among them); zero: the SDK's 3.
	MaxAttempts int
	// MaxBackoff bounds the wait between them; zero: the SDK's 20 s.
	MaxBackoff time.Duration
	// Namespace, for a namespaced ProviderConfig's backend, keeps its
	// shared listing to the instances of that namespace's Proxies, the
	// only ones they may observe or import.
	Namespace string
	// ListingMaxAge is how old the shared listing of the cluster's
	// instances may be when Get answers from it; zero:
	// DefaultListingMaxAge.
	ListingMaxAge time.Duration
	// Now is the backend's clock; nil: time.Now.
	Now func() time.Time
}

// What the AWS backend can do beside the basics: import an instance kept
// from an earlier Proxy, and keep one past its Proxy's deletion; and say
// how long EC2's listing may lag a launch.
var (
	_ backend.Backend  = &Backend{}
	_ backend.Adopter  = &Backend{}
	_ backend.Retainer = &Backend{}
	_ backend.Lagging  = &Backend{}
)

// ListingLag is how long EC2's DescribeInstances may miss a launched
// instance: seconds in practice, thirty to be safe.
func (b *Backend) ListingLag() time.Duration { return 30 * time.Second }

// Backend manages proxy instances on EC2.
type Backend struct {
	cfg     Config
	ec2     *ec2.Client
	sts     *sts.Client
	listing *listing

	decodeMu           sync.Mutex
	decodeRefusedUntil time.Time // no STS decode asked for until then
}

// New returns an aws backend.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	if cfg.Region == "" {
		return nil, backend.Errorf(backend.ClassPermanent, "an AWS backend needs a region: set spec.aws.region")
	}
	opts := []func(*awsconfig.LoadOptions) error{awsconfig.WithRegion(cfg.Region)}
	if cfg.Credentials != nil {
		opts = append(opts, awsconfig.WithCredentialsProvider(cfg.Credentials))
	}
	if cfg.HTTPClient != nil {
		opts = append(opts, awsconfig.WithHTTPClient(cfg.HTTPClient))
	}
	opts = append(opts, awsconfig.WithRetryer(func() aws.Retryer {
		return retry.NewStandard(func(o *retry.StandardOptions) {
			if cfg.MaxAttempts > 0 {
				o.MaxAttempts = cfg.MaxAttempts
			}
			if cfg.MaxBackoff > 0 {
				o.MaxBackoff = cfg.MaxBackoff
			}
		})
	}))
	ac, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, backend.Wrap(backend.ClassPermanent, errors.Wrap(err, "cannot load the AWS configuration"))
	}
	client := ec2.NewFromConfig(ac, func(o *ec2.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
	})
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	b := &Backend{cfg: cfg, ec2: client, sts: sts.NewFromConfig(ac, func(o *sts.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
	})}
	b.listing = newListing(cfg.ListingMaxAge, cfg.Now, b.listAll)
	return b, nil
}

// ownAddressesFunc prints the instance's addresses for Squid's
// egress_self ACL: its interfaces', and the public IPv4 and IPv6
// addresses the instance metadata service (IMDSv2: a session token first,
// as the instance requires) lists for each interface. The broadcast
// address keeps the file from being empty when the service does not
// answer.
const ownAddressesFunc = `own_addresses() {
	md=http://169.254.169.254/latest
	tok=$(curl -fsS -m 5 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' "$md/api/token" 2>/dev/null || true)
	get() { curl -fsS -m 5 -H "X-aws-ec2-metadata-token: $tok" "$md/meta-data/$1" 2>/dev/null || true; }
	echo 255.255.255.255
	hostname -I 2>/dev/null | tr ' ' '\n'
	for mac in $(get network/interfaces/macs/); do
		get "network/interfaces/macs/${mac}public-ipv4s"; echo
		get "network/interfaces/macs/${mac}ipv6s"; echo
	done
}`

// UserData is the instance's start-up configuration for s: the user's
// own, or cloudvm's script with EC2's own_addresses.
func UserData(s backend.Spec) (string, error) { return cloudvm.Script(s, ownAddressesFunc) }

// ec2Cloud is how errors about an instance's security group name its
// fields.
var ec2Cloud = cloudvm.Cloud{Placement: "aws", UserDataField: "userData", OpeningKind: "an EC2 security group"}

// maxUserData is EC2's bound on user data, before base64.
const maxUserData = 16 << 10

// ProviderID names an instance the way Kubernetes' AWS cloud provider
// does.
func ProviderID(zone, id string) string { return "aws:///" + zone + "/" + id }

// What Create refuses, for the tests to compare errors with (and an
// import another writer overtook: the instance, the Proxy uid its tags
// name now); the isFmt* say what an image is in a refusal of it
// (cloudvm.ErrFmtUnsupportedImage), given the releases supported.
const (
	errFmtZoneOfOtherRegion = "spec.forProvider.aws.zone %q is not a zone of the ProviderConfig's region %s: use one of %sa, %sb, ..."
	errFmtUserDataTooLarge  = "the instance's start-up configuration is %d bytes, over EC2's %d: shorten spec.forProvider.aws.userData"
	errFmtUnknownParameter  = "spec.forProvider.aws.image %q: only Debian's (/aws/service/debian/release/...) and Canonical's (/aws/service/canonical/ubuntu/...) parameters are resolved; give another image by its AMI ID"
	errFmtImageOwner        = "owned by account %s, not Debian's (%s) or Canonical's (%s)"
	errReadSubnet           = "cannot read the instance's subnet (spec.forProvider.aws.subnet)"
	errFmtSubnetZone        = "spec.forProvider.aws.subnet %s is in zone %s, not %s (spec.forProvider.aws.zone)"
	errFmtRetagged          = "instance %s was retagged by another meanwhile (its tags name Proxy uid %s): retrying"
	isFmtNotParameter       = "not a parameter of %s"
	isFmtNotImage           = "not an image of %s"
)

// Create starts an instance for s, after the fleet's security group; an
// instance of s's name that runs already is returned instead.
func (b *Backend) Create(ctx context.Context, s backend.Spec) (_ *backend.Instance, err error) {
	defer func() { err = b.explain(ctx, err) }()
	if s.AWS == nil {
		return nil, backend.Errorf(backend.ClassPermanent, "spec.forProvider.aws is required for a ProviderConfig of backend AWS")
	}
	if !strings.HasPrefix(s.AWS.Zone, b.cfg.Region) || len(s.AWS.Zone) != len(b.cfg.Region)+1 {
		return nil, backend.Errorf(backend.ClassPermanent, errFmtZoneOfOtherRegion, s.AWS.Zone, b.cfg.Region, b.cfg.Region, b.cfg.Region)
	}
	ranges, err := cloudvm.SourceRanges(s, ec2Cloud, false)
	if err != nil {
		return nil, err
	}
	all, err := b.named(ctx, s.Name)
	if err != nil {
		return nil, err
	}
	if live := newestLive(all); live != nil {
		return b.instance(live), nil
	}
	if err := launchFailed(all, time.Now()); err != nil {
		return nil, err
	}
	subnet, vpc, err := b.subnet(ctx, s.AWS)
	if err != nil {
		return nil, err
	}
	root, err := b.rootDevice(ctx, s)
	if err != nil {
		return nil, err
	}
	script, err := UserData(s)
	if err != nil {
		return nil, err
	}
	if len(script) > maxUserData {
		return nil, backend.Errorf(backend.ClassPermanent, errFmtUserDataTooLarge, len(script), maxUserData)
	}
	group, groupName, err := b.ensureGroup(ctx, s, vpc, ranges)
	if err != nil {
		return nil, err
	}
	groups := append([]string{group}, s.AWS.SecurityGroups...)
	prefix := s.Name + "-" + madeFrom(s, subnet, root, script, groups) + "-"
	return b.run(ctx, s, prefix, lastGone(all), subnet, root, script, groups, groupName)
}

// madeFrom is a digest of what an instance of s is made from (the spec's
// hash, the credentials, where it runs and what it boots), so that a
// token is never sent again with other parameters: EC2 would refuse it
// (IdempotentParameterMismatch) for a day or more after its instance was
// terminated.
func madeFrom(s backend.Spec, subnet, root, script string, groups []string) string {
	sum := sha256.Sum256([]byte(strings.Join(append([]string{s.Hash, s.CredentialsSum, subnet, root, image(s.AWS), s.AWS.InstanceType, script}, groups...), "\x00")))
	return hex.EncodeToString(sum[:])[:12]
}

// maxTokenHops bounds how many terminated instances one Create walks past
// (see run).
const maxTokenHops = 16

// run runs the instance with token prefix+last. EC2 binds a token to its instance
// for a day or more after the instance is terminated, and a terminated
// instance is listed for an hour or so: when the listing no longer shows
// the last terminated instance, the token derived from it names an older
// one, and RunInstances answers with that instance, terminated. The next
// token is then derived from the instance answered, along the chain the
// earlier creates made, to the one not used yet. A token used with other
// parameters (the spec changed after a create cut short) is followed
// through the instance EC2 lists for it.
func (b *Backend) run(ctx context.Context, s backend.Spec, prefix, last, subnet, root, script string, groups []string, groupName string) (*backend.Instance, error) {
	for hop := 0; ; hop++ {
		tok := prefix + last
		b.listing.touch(s.Name)
		out, err := b.ec2.RunInstances(ctx, b.runInput(s, tok, subnet, root, script, groups, groupName))
		b.listing.touch(s.Name) // again: the SDK may have retried a while
		var i *types.Instance
		switch {
		case code(err) == "IdempotentParameterMismatch":
			made, lerr := b.describe(ctx, []types.Filter{{Name: aws.String("client-token"), Values: []string{tok}}})
			if lerr != nil || len(made) == 0 {
				return nil, backend.Errorf(backend.ClassTransient, "an earlier create of %s used token %s with other parameters; its instance is taken up once EC2 lists it: %v", s.Name, tok, err)
			}
			i = &made[0]
		case code(err) == "InvalidGroup.NotFound":
			// One of spec.forProvider.aws.securityGroups is gone (the
			// fleet's own was just made or found).
			return nil, backend.Wrap(backend.ClassPermanent, errors.Wrapf(err, "cannot run instance %s: a security group of spec.forProvider.aws.securityGroups %v does not exist", s.Name, s.AWS.SecurityGroups))
		case err != nil:
			return nil, errors.Wrapf(Classify(err), "cannot run instance %s", s.Name)
		case len(out.Instances) != 1:
			return nil, backend.Errorf(backend.ClassTransient, "RunInstances of %s answered %d instances", s.Name, len(out.Instances))
		default:
			i = &out.Instances[0]
		}
		if !gone(i) {
			return b.instance(i), nil
		}
		if hop == maxTokenHops {
			return nil, backend.Errorf(backend.ClassTransient, "token %s of %s is the %dth in a row bound to a terminated instance (%s)", tok, s.Name, hop+1, aws.ToString(i.InstanceId))
		}
		last = aws.ToString(i.InstanceId)
	}
}

// launchWindow is how long after its launch a terminated instance's reason
// holds the next create back: its class's back-off applies meanwhile.
const launchWindow = 10 * time.Minute

// launchFailed is the error of the newest of all, when EC2 ended it at
// launch within launchWindow (capacity, a volume limit, a KMS key it
// cannot use), classified, so that the Proxy shows why and its next
// instance waits its class's back-off instead of being made at once.
// Terminations by a user, a spot interruption or an instance's own
// shutdown are none: the Proxy gets a new instance.
func launchFailed(all []types.Instance, now time.Time) error {
	var newest *types.Instance
	for i := range all {
		if x := &all[i]; newest == nil || aws.ToTime(x.LaunchTime).After(aws.ToTime(newest.LaunchTime)) {
			newest = x
		}
	}
	if newest == nil || !gone(newest) || newest.StateReason == nil || now.Sub(aws.ToTime(newest.LaunchTime)) > launchWindow {
		return nil
	}
	reason := aws.ToString(newest.StateReason.Code)
	var c backend.Class
	switch {
	case strings.HasPrefix(reason, "Server.InsufficientInstanceCapacity"):
		c = backend.ClassStockout
	case strings.HasPrefix(reason, "Client.VolumeLimitExceeded"):
		c = backend.ClassQuota
	case strings.HasPrefix(reason, "Client.InvalidKMSKey"), strings.HasPrefix(reason, "Client.InvalidSnapshot"), strings.HasPrefix(reason, "Client.InternalError"):
		c = backend.ClassPermanent
	case strings.HasPrefix(reason, "Server.InternalError"):
		c = backend.ClassTransient
	default:
		return nil
	}
	return backend.Errorf(c, "instance %s ended at launch: %s (%s)", aws.ToString(newest.InstanceId), reason, aws.ToString(newest.StateReason.Message))
}

// lastGone is the newest terminated instance of all, "0" when none is
// listed: the last part of RunInstances' ClientToken, after the name and
// the digest of what the instance is made from (at most 64 ASCII
// characters in all).
func lastGone(all []types.Instance) string {
	last, at := "0", time.Time{}
	for i := range all {
		if x := &all[i]; gone(x) && (last == "0" || aws.ToTime(x.LaunchTime).After(at)) {
			last, at = aws.ToString(x.InstanceId), aws.ToTime(x.LaunchTime)
		}
	}
	return last
}

func (b *Backend) runInput(s backend.Spec, tok, subnet, root, script string, groups []string, groupName string) *ec2.RunInstancesInput {
	recorded := ec2Keys.Record(s, groupName)
	tags := []types.Tag{{Key: aws.String("Name"), Value: aws.String(s.Name)}}
	for _, k := range sortedKeys(recorded) {
		tags = append(tags, types.Tag{Key: aws.String(k), Value: aws.String(recorded[k])})
	}
	owner := s.Owner.Labels()
	volumeTags := []types.Tag{{Key: aws.String(TagInstance), Value: aws.String(s.Name)}}
	for _, k := range sortedKeys(owner) {
		volumeTags = append(volumeTags, types.Tag{Key: aws.String(k), Value: aws.String(owner[k])})
	}
	typ := s.AWS.InstanceType
	if typ == "" {
		typ = v1alpha1.DefaultAWSInstanceType
	}
	return &ec2.RunInstancesInput{
		ClientToken: aws.String(tok), ImageId: aws.String(image(s.AWS)), InstanceType: types.InstanceType(typ),
		MinCount: aws.Int32(1), MaxCount: aws.Int32(1),
		NetworkInterfaces: []types.InstanceNetworkInterfaceSpecification{{
			DeviceIndex: aws.Int32(0), SubnetId: aws.String(subnet), AssociatePublicIpAddress: aws.Bool(true),
			DeleteOnTermination: aws.Bool(true), Groups: groups,
		}},
		// IMDSv2 only, one hop: a process the proxy's clients reach
		// through it, or a container on it, gets no credentials.
		MetadataOptions: &types.InstanceMetadataOptionsRequest{
			HttpTokens: types.HttpTokensStateRequired, HttpPutResponseHopLimit: aws.Int32(1), HttpEndpoint: types.InstanceMetadataEndpointStateEnabled,
		},
		BlockDeviceMappings: []types.BlockDeviceMapping{{DeviceName: aws.String(root), Ebs: &types.EbsBlockDevice{
			Encrypted: aws.Bool(true), DeleteOnTermination: aws.Bool(true), VolumeType: types.VolumeTypeGp3,
		}}},
		UserData:          aws.String(base64.StdEncoding.EncodeToString([]byte(script))),
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeInstance, Tags: tags}, {ResourceType: types.ResourceTypeVolume, Tags: volumeTags}},
	}
}

func image(p *v1alpha1.AWSPlacement) string {
	if p.Image == "" {
		return v1alpha1.DefaultAWSImage
	}
	return p.Image
}

// rootDevice is the image's root device, whose volume the instance gets
// encrypted: Debian's and Canonical's parameters name theirs; an AMI says
// its own. An image the generated script does not support (not Debian's
// or Canonical's, or of a release cloudvm.Families does not hold) needs
// the user's own start-up configuration.
func (b *Backend) rootDevice(ctx context.Context, s backend.Spec) (string, error) {
	img := image(s.AWS)
	if param, ok := strings.CutPrefix(img, "resolve:ssm:"); ok {
		root, release := ssmImage(param)
		switch {
		case root == "":
			return "", backend.Errorf(backend.ClassPermanent, errFmtUnknownParameter, img)
		case s.UserData == "" && release == "":
			return "", ec2Cloud.UnsupportedImage(strconv.Quote(img), fmt.Sprintf(isFmtNotParameter, cloudvm.SupportedReleases()))
		}
		return root, nil
	}
	out, err := b.ec2.DescribeImages(ctx, &ec2.DescribeImagesInput{ImageIds: []string{img}})
	if err != nil {
		return "", errors.Wrapf(Classify(err), "cannot read image %s (spec.forProvider.aws.image)", img)
	}
	if len(out.Images) != 1 {
		return "", backend.Errorf(backend.ClassPermanent, "spec.forProvider.aws.image %s does not exist in region %s", img, b.cfg.Region)
	}
	im := out.Images[0]
	owner, name := aws.ToString(im.OwnerId), aws.ToString(im.Name)
	switch {
	case s.UserData != "":
	case owner != DebianOwner && owner != CanonicalOwner:
		return "", ec2Cloud.UnsupportedImage(img+" ("+name+")", fmt.Sprintf(errFmtImageOwner, owner, DebianOwner, CanonicalOwner))
	case !amiSupported(owner, name):
		return "", ec2Cloud.UnsupportedImage(img+" ("+name+")", fmt.Sprintf(isFmtNotImage, cloudvm.SupportedReleases()))
	}
	return aws.ToString(im.RootDeviceName), nil
}

// ssmImage reads a public parameter naming an AMI: the root device of its
// maker's images (empty for a parameter of no known maker), and the
// release, when it is one of cloudvm.Families. Debian's are
// /aws/service/debian/release/<12|bookworm>/..., Canonical's
// /aws/service/canonical/ubuntu/<server|server-minimal|pro-server>/<24.04|noble>/....
func ssmImage(param string) (root, release string) {
	if rest, ok := strings.CutPrefix(param, "/aws/service/debian/"); ok {
		if v, ok := strings.CutPrefix(rest, "release/"); ok {
			v, _, _ = strings.Cut(v, "/")
			if f, ok := cloudvm.FamilyOf(cloudvm.Debian, v); ok {
				release = f.Name
			}
		}
		return "/dev/xvda", release
	}
	if rest, ok := strings.CutPrefix(param, "/aws/service/canonical/ubuntu/"); ok {
		// <product>/<release>/...
		if parts := strings.Split(rest, "/"); len(parts) >= 2 {
			if f, ok := cloudvm.FamilyOf(cloudvm.Ubuntu, parts[1]); ok {
				release = f.Name
			}
		}
		return "/dev/sda1", release
	}
	return "", ""
}

// amiNames read the release from an AMI's name: Debian's
// debian-12-amd64-..., Canonical's .../ubuntu-noble-24.04-amd64-server-....
var (
	debianAMIName = regexp.MustCompile(`^debian-([0-9]+)-`)
	ubuntuAMIName = regexp.MustCompile(`(?:^|/)ubuntu-([a-z]+)-([0-9]{2}\.[0-9]{2})-`)
)

// amiSupported says whether an AMI of Debian's or Canonical's account is
// of a release of cloudvm.Families, by its name.
func amiSupported(owner, name string) bool {
	if owner == DebianOwner {
		m := debianAMIName.FindStringSubmatch(name)
		_, ok := cloudvm.FamilyOf(cloudvm.Debian, safeAt(m, 1))
		return ok
	}
	m := ubuntuAMIName.FindStringSubmatch(name)
	f, ok := cloudvm.FamilyOf(cloudvm.Ubuntu, safeAt(m, 2))
	return ok && f.Codename == safeAt(m, 1)
}

func safeAt(m []string, i int) string {
	if i < len(m) {
		return m[i]
	}
	return ""
}

// subnet is the instance's subnet and its VPC: the placement's, which must
// be in its zone, or the zone's default one.
func (b *Backend) subnet(ctx context.Context, p *v1alpha1.AWSPlacement) (string, string, error) {
	in := &ec2.DescribeSubnetsInput{Filters: []types.Filter{{Name: aws.String("availability-zone"), Values: []string{p.Zone}}, {Name: aws.String("default-for-az"), Values: []string{"true"}}}}
	if p.Subnet != "" {
		in = &ec2.DescribeSubnetsInput{SubnetIds: []string{p.Subnet}}
	}
	out, err := b.ec2.DescribeSubnets(ctx, in)
	if err != nil {
		return "", "", errors.Wrap(Classify(err), errReadSubnet)
	}
	switch {
	case len(out.Subnets) == 0 && p.Subnet == "":
		return "", "", backend.Errorf(backend.ClassPermanent, "zone %s has no default subnet (its default VPC was deleted): set spec.forProvider.aws.subnet", p.Zone)
	case len(out.Subnets) == 0:
		return "", "", backend.Errorf(backend.ClassPermanent, "spec.forProvider.aws.subnet %s does not exist", p.Subnet)
	case aws.ToString(out.Subnets[0].AvailabilityZone) != p.Zone:
		return "", "", backend.Errorf(backend.ClassPermanent, errFmtSubnetZone, p.Subnet, aws.ToString(out.Subnets[0].AvailabilityZone), p.Zone)
	}
	return aws.ToString(out.Subnets[0].SubnetId), aws.ToString(out.Subnets[0].VpcId), nil
}

// named lists every instance tagged with name, terminated ones that EC2
// still lists included.
func (b *Backend) named(ctx context.Context, name string) ([]types.Instance, error) {
	return b.describe(ctx, []types.Filter{{Name: aws.String("tag:" + TagInstance), Values: []string{name}}})
}

// byID lists the instance of id (none when EC2 does not list it).
func (b *Backend) byID(ctx context.Context, id string) ([]types.Instance, error) {
	return b.describe(ctx, []types.Filter{{Name: aws.String("instance-id"), Values: []string{id}}})
}

// nameOf is the instance name the first of all carries.
func nameOf(all []types.Instance) string {
	if len(all) == 0 {
		return ""
	}
	return tagsOf(&all[0])[TagInstance]
}

// tagsOf is an instance's tags as a map.
func tagsOf(i *types.Instance) map[string]string { return tagMap(i.Tags) }

// tagMap is EC2's tags as a map.
func tagMap(in []types.Tag) map[string]string {
	tags := make(map[string]string, len(in))
	for _, t := range in {
		tags[aws.ToString(t.Key)] = aws.ToString(t.Value)
	}
	return tags
}

// describe lists the instances filters select, every page.
func (b *Backend) describe(ctx context.Context, filters []types.Filter) ([]types.Instance, error) {
	var out []types.Instance
	p := ec2.NewDescribeInstancesPaginator(b.ec2, &ec2.DescribeInstancesInput{Filters: filters, MaxResults: aws.Int32(1000)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, errors.Wrap(Classify(err), "cannot list instances")
		}
		for _, r := range page.Reservations {
			out = append(out, r.Instances...)
		}
	}
	return out, nil
}

// gone reports an instance terminated, or on its way there.
func gone(i *types.Instance) bool {
	return i.State != nil && (i.State.Name == types.InstanceStateNameTerminated || i.State.Name == types.InstanceStateNameShuttingDown)
}

// newestLive is the newest of all not terminated (shutting down counts as
// live: it still holds its name until it is gone), nil when none is.
func newestLive(all []types.Instance) *types.Instance {
	var best *types.Instance
	for i := range all {
		x := &all[i]
		if x.State != nil && x.State.Name == types.InstanceStateNameTerminated {
			continue
		}
		if best == nil || aws.ToTime(x.LaunchTime).After(aws.ToTime(best.LaunchTime)) {
			best = x
		}
	}
	return best
}

// Phase maps an EC2 state to an instance phase: pending, and running
// without a public address, provision; stopping, stopped and shutting
// down are on their way out, and replaced.
func Phase(state types.InstanceStateName, publicIP string) v1alpha1.InstancePhase {
	switch state {
	case types.InstanceStateNameRunning:
		if publicIP == "" {
			return v1alpha1.InstancePhaseProvisioning
		}
		return v1alpha1.InstancePhaseRunning
	case types.InstanceStateNamePending:
		return v1alpha1.InstancePhaseProvisioning
	default:
		return v1alpha1.InstancePhaseTerminated
	}
}

func (b *Backend) instance(i *types.Instance) *backend.Instance {
	zone := ""
	if i.Placement != nil {
		zone = aws.ToString(i.Placement.AvailabilityZone)
	}
	var state types.InstanceStateName
	if i.State != nil {
		state = i.State.Name
	}
	out := &backend.Instance{
		Ref:        backend.Ref{Zone: zone, ID: aws.ToString(i.InstanceId)},
		ProviderID: ProviderID(zone, aws.ToString(i.InstanceId)),
		Phase:      Phase(state, aws.ToString(i.PublicIpAddress)), CreatedAt: aws.ToTime(i.LaunchTime),
	}
	ec2Keys.Observe(tagsOf(i), out)
	if out.Phase == v1alpha1.InstancePhaseRunning {
		out.Host = aws.ToString(i.PublicIpAddress)
	}
	if out.Phase == v1alpha1.InstancePhaseTerminated {
		out.Reason = string(state)
		if i.StateReason != nil {
			out.Reason += ": " + aws.ToString(i.StateReason.Message)
		}
		if i.InstanceLifecycle == types.InstanceLifecycleTypeSpot {
			out.Reason += " (spot)"
		}
	}
	return out
}

// Get observes the instance of r's name: the newest not terminated; a
// terminated one is gone (NotFound), so that a Proxy whose instance was
// terminated (a spot interruption, a user) gets a new one.
func (b *Backend) Get(ctx context.Context, r backend.Ref) (_ *backend.Instance, err error) {
	defer func() { err = b.explain(ctx, err) }()
	name := r.Name
	if r.ID != "" {
		// An imported instance keeps the name its maker gave it.
		if n, ok := b.listing.name(ctx, r.ID); ok {
			name = n
		}
	}
	all, err := b.instancesOf(ctx, name)
	if err != nil {
		return nil, err
	}
	if r.ID != "" && !slices.ContainsFunc(all, func(x types.Instance) bool { return aws.ToString(x.InstanceId) == r.ID }) {
		// Recorded by ID under another name: an imported instance keeps
		// the name its maker gave it. Its name's instances, then; whose
		// they are is the controller's to check (by their owner tags).
		byID, err := b.byID(ctx, r.ID)
		if err != nil {
			return nil, err
		}
		switch n := nameOf(byID); {
		case n == name:
			// Listed by its ID, not yet among its name's.
			all = append(slices.Clone(all), byID...)
		case n != "":
			if all, err = b.instancesOf(ctx, n); err != nil {
				return nil, err
			}
		}
		// Not listed (any more): the name's own instances stand.
	}
	live := newestLive(all)
	if live == nil {
		return nil, backend.Errorf(backend.ClassNotFound, "instance %s not found", r.Name)
	}
	b.terminateOlder(ctx, all, live)
	return b.instance(live), nil
}

// instancesOf are name's instances: the shared listing's when it may
// answer for name and shows one that is not terminated (it never answers
// "none": an instance too new for a listing would be taken for gone),
// else EC2's for name alone.
func (b *Backend) instancesOf(ctx context.Context, name string) ([]types.Instance, error) {
	if all, listed := b.listing.instances(ctx, name); listed && newestLive(all) != nil {
		return all, nil
	}
	return b.named(ctx, name)
}

// terminateOlder terminates the live instances of all but keep: a create
// cut short and retried with another spec before EC2 listed the first
// instance (its token differs, as its parameters do) leaves two of one
// name, and only the newest serves its Proxy.
func (b *Backend) terminateOlder(ctx context.Context, all []types.Instance, keep *types.Instance) {
	var older []string
	for i := range all {
		if x := &all[i]; x != keep && !gone(x) && x.State != nil {
			older = append(older, aws.ToString(x.InstanceId))
		}
	}
	if len(older) > 0 {
		b.listing.touch(tagsOf(keep)[TagInstance])
		_, _ = b.ec2.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: older})
		b.listing.touch(tagsOf(keep)[TagInstance])
	}
}

// Delete terminates every instance of r's name (or, for a Ref without a
// zone, the orphan collector's, deletes the security group of that name),
// and lets go of the instance's security group when no other instance
// uses it; one still in use by an instance shutting down is left to the
// orphan collector.
func (b *Backend) Delete(ctx context.Context, r backend.Ref) (err error) {
	defer func() { err = b.explain(ctx, err) }()
	if r.Zone == "" {
		return b.deleteGroup(ctx, r.Name)
	}
	all, err := b.named(ctx, r.Name)
	if err != nil {
		return err
	}
	var ids []string
	group := r.Rule
	for i := range all {
		x := &all[i]
		if x.State == nil || x.State.Name != types.InstanceStateNameTerminated {
			ids = append(ids, aws.ToString(x.InstanceId))
		}
		// The group it joined, as the instance says (a terminated one
		// too: its group may be let go of only now).
		if g := tagsOf(x)[TagGroup]; g != "" {
			group = g
		}
	}
	batches := [][]string{ids}
	if r.ID != "" && !slices.ContainsFunc(all, func(x types.Instance) bool { return aws.ToString(x.InstanceId) == r.ID }) {
		// Recorded, but not listed yet (EC2's listing lags its
		// creates), or imported under another name: terminated by its
		// ID, so that a Proxy deleted at once leaves no instance behind.
		// On its own: an ID EC2 no longer knows fails the whole batch.
		batches = append(batches, []string{r.ID})
	}
	b.listing.touch(r.Name)
	if n := b.listing.known(r.ID); n != "" {
		b.listing.touch(n)
	}
	for i := range all {
		b.listing.touch(tagsOf(&all[i])[TagInstance])
	}
	defer b.listing.touch(r.Name) // again once EC2 answered
	for _, batch := range batches {
		if len(batch) == 0 {
			continue
		}
		if _, err := b.ec2.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: batch}); err != nil {
			if c := Classify(err); backend.ClassOf(c) != backend.ClassNotFound {
				return errors.Wrapf(c, "cannot terminate instance %s", r.Name)
			}
		}
	}
	if group != "" {
		b.releaseGroup(ctx, group)
	}
	return nil
}

// Adopt moves the instance r names (by its recorded ID, else its name) to
// its new Proxy, to, when it is still from's: its owner tags are rewritten
// (the maker's cluster, namespace and UID stay, as its name derives from
// them), and owner tags the new owner does not carry are removed.
func (b *Backend) Adopt(ctx context.Context, r backend.Ref, from k8stypes.UID, to ownership.Owner) (err error) {
	defer func() { err = b.explain(ctx, err) }()
	x, err := b.one(ctx, r)
	if err != nil {
		return err
	}
	tags := tagsOf(x)
	want, err := cloudvm.Adopted("instance "+aws.ToString(x.InstanceId), tags, from, to, false)
	if err != nil {
		return err
	}
	return b.retag(ctx, x, tags, want)
}

// SetRetain tags the instance to outlive its Proxy, or removes the tag.
func (b *Backend) SetRetain(ctx context.Context, r backend.Ref, retain bool) (err error) {
	defer func() { err = b.explain(ctx, err) }()
	x, err := b.one(ctx, r)
	if err != nil {
		return err
	}
	tags := tagsOf(x)
	return b.retag(ctx, x, tags, cloudvm.Retained(tags, retain, false))
}

// one is the instance r names: its recorded ID's, else the newest live
// one of its name.
func (b *Backend) one(ctx context.Context, r backend.Ref) (*types.Instance, error) {
	var all []types.Instance
	var err error
	if r.ID != "" {
		all, err = b.byID(ctx, r.ID)
	} else {
		all, err = b.named(ctx, r.Name)
	}
	if err != nil {
		return nil, err
	}
	x := newestLive(all)
	if x == nil {
		return nil, backend.Errorf(backend.ClassNotFound, "instance %s not found", r.Name)
	}
	return x, nil
}

// ownerKeys are the tags that say whose an instance is.
var ownerKeys = map[string]bool{
	ownership.LabelManagedBy: true, ownership.LabelCluster: true, ownership.LabelNamespace: true, ownership.LabelName: true,
	ownership.LabelUID: true, ownership.LabelOwnerFleet: true, ownership.LabelRetain: true, ownership.LabelAdopter: true,
}

// retag makes x's tags want, from have: those written first (so that a
// kill between the calls leaves the new owner), then the ones want lacks
// removed, then read back.
func (b *Backend) retag(ctx context.Context, x *types.Instance, have, want map[string]string) error {
	id := aws.ToString(x.InstanceId)
	b.listing.touch(have[TagInstance])
	defer b.listing.touch(have[TagInstance])
	// Every owner tag wanted, changed or not (a retag racing this one
	// from another read cannot leave a mix of both owners), and any other
	// that changed; never AWS's own (aws:), which no caller may write.
	var set, drop []types.Tag
	for _, k := range sortedKeys(want) {
		if v, ok := have[k]; (!ok || v != want[k] || ownerKeys[k]) && !strings.HasPrefix(k, "aws:") {
			set = append(set, types.Tag{Key: aws.String(k), Value: aws.String(want[k])})
		}
	}
	for _, k := range sortedKeys(have) {
		if _, ok := want[k]; !ok && !strings.HasPrefix(k, "aws:") {
			drop = append(drop, types.Tag{Key: aws.String(k)})
		}
	}
	if len(set) > 0 {
		if _, err := b.ec2.CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{id}, Tags: set}); err != nil {
			return errors.Wrapf(Classify(err), "cannot tag instance %s", id)
		}
	}
	if len(drop) > 0 {
		if _, err := b.ec2.DeleteTags(ctx, &ec2.DeleteTagsInput{Resources: []string{id}, Tags: drop}); err != nil {
			return errors.Wrapf(Classify(err), "cannot remove tags of instance %s", id)
		}
	}
	// EC2 tags unconditionally: read them back, and report a retag that
	// another (a second import of the instance) overtook, so that the
	// caller records nothing and tries again.
	now, err := b.byID(ctx, id)
	if err != nil {
		return err
	}
	if len(now) != 1 {
		return backend.Errorf(backend.ClassTransient, "instance %s is not listed after its retag: retrying", id)
	}
	got, _ := ownership.FromLabels(tagsOf(&now[0]))
	if w, _ := ownership.FromLabels(want); got != w {
		return backend.Errorf(backend.ClassTransient, errFmtRetagged, id, got.Holder())
	}
	return nil
}

// ListOwned lists this cluster's instances that are not terminated, and
// the security groups it made that no listed instance uses (as instances
// without a zone, for the orphan collector to delete).
func (b *Backend) ListOwned(ctx context.Context) ([]backend.Instance, error) {
	filters := append([]types.Filter{{Name: aws.String("instance-state-name"), Values: []string{"pending", "running", "stopping", "stopped", "shutting-down"}}},
		tagFilters(ownership.Selector(b.cfg.ClusterID))...)
	all, err := b.describe(ctx, filters)
	if err != nil {
		return nil, err
	}
	var out []backend.Instance
	var attached []string
	for i := range all {
		x := &all[i]
		in := b.instance(x)
		if in.Name == "" {
			continue
		}
		out = append(out, *in)
		for _, g := range x.SecurityGroups {
			attached = append(attached, aws.ToString(g.GroupName))
		}
	}
	groups, err := b.orphanGroups(ctx, cloudvm.Used(out, attached...))
	if err != nil {
		err = cloudvm.OpeningsUnlisted(err, "security groups in region "+b.cfg.Region+" (grant ec2:DescribeSecurityGroups to collect them)", "security groups")
	}
	return cloudvm.WithOpenings(out, groups, err)
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// String names the backend in logs.
func (b *Backend) String() string { return fmt.Sprintf("aws(%s)", b.cfg.Region) }
