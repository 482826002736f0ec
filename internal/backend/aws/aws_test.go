package aws_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/aws"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/aws/ec2fake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/cloudvm"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/cloudvm/cloudvmtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

func newBackend(t *testing.T, fake *ec2fake.Server, cluster string) *aws.Backend {
	t.Helper()
	b, err := aws.New(context.Background(), aws.Config{
		Region: ec2fake.Region, ClusterID: cluster, Endpoint: fake.URL,
		Credentials: credentials.NewStaticCredentialsProvider(ec2fake.AccessKey, ec2fake.SecretKey, ""),
		// Four attempts, not two: under the whole suite's load Go's HTTP
		// client can close a connection while the SDK reads an answer
		// (its writer finishing the request after the SDK closed the
		// request body; aws-sdk-go-v2 #2737), which the SDK retries; two
		// such in a row failed TestListOwned once.
		MaxAttempts: 4, MaxBackoff: 10 * time.Millisecond,
		// Every Get lists afresh: these tests change the fake behind the
		// backend's back and look at once (TestOneListingPerPoll keeps a
		// listing).
		ListingMaxAge: time.Nanosecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func spec(uid string) backend.Spec {
	o := ownership.Owner{ClusterID: "c1", Namespace: "team", Name: "p-" + uid, UID: types.UID(uid)}
	return backend.Spec{
		Ref: backend.Ref{Name: ownership.InstanceName(o.UID), Zone: "us-east-1a"}, Owner: o, Port: 3128,
		Credentials:         &backend.Credentials{Username: "crawler", Password: "pw"},
		AllowedSourceRanges: []string{"203.0.113.0/24"},
		AWS:                 &v1alpha1.AWSPlacement{Zone: "us-east-1a", AWSInstance: v1alpha1.AWSInstance{InstanceType: "t3.micro"}},
		Hash:                "abc123", CredentialsSum: "0123456789abcdef",
	}
}

func fleetSpec(i int) backend.Spec {
	s := spec(fmt.Sprintf("1c2d3e4f-%04d-4222-8333-944455556666", i))
	s.Owner.Fleet = "crawlers"
	return s
}

// only is the fake's one instance, or fails the test.
func only(t *testing.T, fake *ec2fake.Server) ec2fake.Instance {
	t.Helper()
	all := fake.Instances()
	if len(all) != 1 {
		t.Fatalf("%d instances, want 1: %+v", len(all), all)
	}
	return all[0]
}

// TestLifecycle: an instance is made as a proxy's must be (IMDSv2 only
// with one hop, an encrypted root volume, a public address, the owner's
// tags, the generated script reading its addresses through IMDSv2), runs
// with its public address, is found again rather than made twice, and is
// terminated: shutting down it is on its way out, terminated it is gone.
func TestLifecycle(t *testing.T) {
	fake := ec2fake.Start(t)
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := spec("0b7c6a2e-1111-4222-8333-944455556666")
	inst, err := b.Create(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	vm := only(t, fake)
	if inst.Phase != v1alpha1.InstancePhaseProvisioning || inst.ProviderID != "aws:///us-east-1a/"+vm.ID || inst.Name != s.Name {
		t.Errorf("a fresh instance is provisioning under its EC2 ID: %+v", inst)
	}
	for k, want := range map[string]string{
		"MetadataOptions.HttpTokens": "required", "MetadataOptions.HttpPutResponseHopLimit": "1",
		"BlockDeviceMapping.1.DeviceName": "/dev/xvda", "BlockDeviceMapping.1.Ebs.Encrypted": "true",
		"NetworkInterface.1.AssociatePublicIpAddress": "true", "ImageId": v1alpha1.DefaultAWSImage,
		"NetworkInterface.1.SubnetId": "subnet-0default0000000",
	} {
		if got := vm.Params[k]; got != want {
			t.Errorf("RunInstances %s = %q, want %q", k, got, want)
		}
	}
	if vm.Params["IamInstanceProfile.Name"] != "" || vm.Params["IamInstanceProfile.Arn"] != "" {
		t.Error("an instance profile without the policy naming one")
	}
	if o, ok := ownership.FromLabels(vm.Tags); !ok || o.UID != s.Owner.UID || !o.OfCluster("c1") || vm.Tags[aws.TagInstance] != s.Name {
		t.Errorf("the instance's tags name its owner: %v", vm.Tags)
	}
	script, _ := base64.StdEncoding.DecodeString(vm.UserData)
	if !strings.Contains(string(script), "X-aws-ec2-metadata-token") || !strings.Contains(string(script), "http_port 3128") || strings.Contains(string(script), "pw") {
		t.Errorf("the user data installs Squid, learns its addresses through IMDSv2, and holds no clear password:\n%s", script)
	}
	testbed.Eventually(t, 5*time.Second, "the instance runs with its public address", func() (bool, string) {
		got, err := b.Get(ctx, s.Ref)
		return err == nil && got.Phase == v1alpha1.InstancePhaseRunning && got.Host != "" && got.Port == 3128 && got.SpecHash == "abc123" && got.CredentialsSum == s.CredentialsSum,
			fmt.Sprintf("%+v %v", got, err)
	})
	again, err := b.Create(ctx, s)
	if err != nil || again.ProviderID != inst.ProviderID || fake.Calls("RunInstances") != 1 {
		t.Errorf("a second create finds the instance: %+v %v (%d RunInstances)", again, err, fake.Calls("RunInstances"))
	}
	if err := b.Delete(ctx, s.Ref); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Get(ctx, s.Ref); err != nil || got.Phase != v1alpha1.InstancePhaseTerminated {
		t.Errorf("shutting down, the instance is on its way out: %+v %v", got, err)
	}
	testbed.Eventually(t, 5*time.Second, "the terminated instance is gone", func() (bool, string) {
		_, err := b.Get(ctx, s.Ref)
		return backend.IsNotFound(err), fmt.Sprint(err)
	})
	if err := b.Delete(ctx, s.Ref); err != nil {
		t.Errorf("deleting what is gone: %v", err)
	}
	if g := fake.Groups(); len(g) != 0 {
		t.Errorf("the Proxy's own security group outlived its instance: %+v", g)
	}
}

// TestProxyGroupNeverWidened: a Proxy of no fleet whose ranges narrow
// gets a group of the new ranges; the old group, still attached to the
// old instance shutting down, is not left open wider on the new one.
func TestProxyGroupNeverWidened(t *testing.T) {
	fake := ec2fake.Start(t)
	fake.PendingFor, fake.TerminatingFor = 0, time.Second
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := spec("0b7c6a2e-6666-4222-8333-944455556666")
	s.AllowedSourceRanges = nil // credentials only: open to every address
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, s.Ref); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 5*time.Second, "the first instance gone", func() (bool, string) {
		_, err := b.Get(ctx, s.Ref)
		return backend.IsNotFound(err), fmt.Sprint(err)
	})
	s.Credentials, s.AllowedSourceRanges, s.UserData = nil, []string{"10.0.0.0/8"}, "#!/bin/sh\n# the team's own proxy\n"
	s.AWS.Image = ec2fake.DebianAMI
	inst, err := b.Create(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	for _, vm := range fake.Instances() {
		if "aws:///us-east-1a/"+vm.ID != inst.ProviderID {
			continue
		}
		for _, g := range fake.Groups() {
			if g.ID == vm.Groups[0] && strings.Join(g.Ingress, ",") != "tcp:3128-3128:10.0.0.0/8" {
				t.Errorf("the new instance's group admits %v; want only 10.0.0.0/8", g.Ingress)
			}
		}
	}
}

// TestCreateRetriedAfterAKill: a create whose answer was lost (the
// provider killed after RunInstances) and tried again while EC2 does not
// list the instance yet gets the same instance back, by its ClientToken,
// not a second one.
func TestCreateRetriedAfterAKill(t *testing.T) {
	fake := ec2fake.Start(t)
	fake.HideNewFor = time.Minute
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := spec("0b7c6a2e-2222-4222-8333-944455556666")
	first, err := b.Create(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	second, err := b.Create(ctx, s)
	if err != nil || second.ProviderID != first.ProviderID {
		t.Errorf("the retried create: %+v %v; want %s again", second, err, first.ProviderID)
	}
	if n := len(fake.Instances()); n != 1 || fake.Calls("RunInstances") != 2 {
		t.Errorf("%d instances after %d RunInstances; want one", n, fake.Calls("RunInstances"))
	}
	// The spec changed before the retry, while EC2 does not list the
	// first yet: its token is another (a token is never sent with other
	// parameters, which EC2 would refuse for a day), so a second instance
	// is made; once both are listed, the newest serves and the older is
	// terminated.
	s.Hash = "def456"
	third, err := b.Create(ctx, s)
	if err != nil || third.ProviderID == first.ProviderID {
		t.Fatalf("a retry with another spec: %+v %v", third, err)
	}
	fake.HideNewFor = 0
	got, err := b.Get(ctx, s.Ref)
	if err != nil || got.ProviderID != third.ProviderID || got.SpecHash != "def456" {
		t.Errorf("the newest serves: %+v %v", got, err)
	}
	testbed.Eventually(t, 5*time.Second, "the older instance terminated", func() (bool, string) {
		var states []string
		for _, i := range fake.Instances() {
			if i.State == "pending" || i.State == "running" {
				states = append(states, i.ID)
			}
		}
		return len(states) == 1, fmt.Sprint(states)
	})
}

// TestLaunchFailureHeld: an instance EC2 ends at launch (no capacity in the
// zone) is reported on the next create, classified, rather than replaced
// at once in a loop.
func TestLaunchFailureHeld(t *testing.T) {
	fake := ec2fake.Start(t)
	fake.PendingFor, fake.TerminatingFor = 0, 0
	fake.OnRun = func(i *ec2fake.Instance) {
		i.FailLaunch = "Server.InsufficientInstanceCapacity: Insufficient capacity."
	}
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := spec("0b7c6a2e-5555-4222-8333-944455556666")
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 5*time.Second, "the instance ended at launch is gone", func() (bool, string) {
		_, err := b.Get(ctx, s.Ref)
		return backend.IsNotFound(err), fmt.Sprint(err)
	})
	_, err := b.Create(ctx, s)
	if backend.ClassOf(err) != backend.ClassStockout || !strings.Contains(err.Error(), "InsufficientInstanceCapacity") || fake.Calls("RunInstances") != 1 {
		t.Errorf("the next create: %v (%s), %d RunInstances; want the stockout, held", err, backend.ClassOf(err), fake.Calls("RunInstances"))
	}
}

// TestTerminatedInstanceReplaced: an instance ended by a spot interruption
// is gone for its Proxy, whose next create makes a new one (a new token),
// also once EC2 no longer lists the old one, whose token then names an
// instance terminated long ago: the chain of tokens is followed to a new
// one.
func TestTerminatedInstanceReplaced(t *testing.T) {
	fake := ec2fake.Start(t)
	fake.PendingFor, fake.TerminatingFor = 0, 0
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := spec("0b7c6a2e-3333-4222-8333-944455556666")
	ids := map[string]bool{}
	for round := range 3 {
		inst, err := b.Create(ctx, s)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if ids[inst.ProviderID] {
			t.Fatalf("round %d: the terminated instance %s came back", round, inst.ProviderID)
		}
		ids[inst.ProviderID] = true
		id := inst.ProviderID[strings.LastIndexByte(inst.ProviderID, '/')+1:]
		if !fake.Interrupt(id, "Server.SpotInstanceTermination: Spot instance termination") {
			t.Fatal("no such instance")
		}
		if _, err := b.Get(ctx, s.Ref); !backend.IsNotFound(err) {
			t.Fatalf("round %d: an interrupted instance is gone for its Proxy: %v", round, err)
		}
		if round == 1 {
			// EC2 stops listing terminated instances after a while.
			fake.TerminatedListed = 0
		}
	}
}

// TestFleetSharesOneGroup: the instances of a fleet, in two zones of one
// VPC, share one security group opening their port to the fleet's ranges
// (and the provider's probe ranges); a Proxy of no fleet has its own; an
// the fleet's group, still attached to its last instance shutting down
// when that is deleted, outlives its instances only until the orphan
// collector takes it.
func TestFleetSharesOneGroup(t *testing.T) {
	fake := ec2fake.Start(t)
	fake.PendingFor, fake.TerminatingFor = 0, time.Second
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	var specs []backend.Spec
	for i := range 6 {
		s := fleetSpec(i)
		s.AllowedSourceRanges, s.ProbeSourceRanges = []string{"203.0.113.0/24", "198.51.100.7/32"}, []string{"198.51.100.7/32"}
		if i%2 == 1 {
			s.Zone, s.AWS.Zone = "us-east-1b", "us-east-1b"
		}
		if _, err := b.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		specs = append(specs, s)
	}
	alone := spec("2c2d3e4f-0000-4222-8333-944455556666")
	if _, err := b.Create(ctx, alone); err != nil {
		t.Fatal(err)
	}
	groups := fake.Groups()
	if len(groups) != 2 {
		t.Fatalf("%d security groups for a fleet of 6 and a Proxy of no fleet, want 2: %+v", len(groups), groups)
	}
	var fleetGroup ec2fake.Group
	for _, g := range groups {
		if g.Tags["egress.crawl.example.com/security-group-of"] == "fleet" {
			fleetGroup = g
		}
	}
	if strings.Join(fleetGroup.Ingress, ",") != "tcp:3128-3128:203.0.113.0/24,tcp:3128-3128:198.51.100.7/32" || fleetGroup.Tags[ownership.LabelOwnerFleet] != "crawlers" {
		t.Errorf("the fleet's group opens the port to its ranges and the probe's: %+v", fleetGroup)
	}
	for _, vm := range fake.Instances() {
		if len(vm.Groups) != 1 {
			t.Errorf("instance %s joins %v", vm.ID, vm.Groups)
		}
	}
	for _, s := range specs {
		if err := b.Delete(ctx, s.Ref); err != nil {
			t.Fatal(err)
		}
	}
	testbed.Eventually(t, 5*time.Second, "the fleet's group is an orphan once its instances are gone", func() (bool, string) {
		owned, err := b.ListOwned(ctx)
		var orphan []string
		for _, i := range owned {
			if i.Zone == "" {
				orphan = append(orphan, i.Name)
			}
		}
		return err == nil && len(orphan) == 1 && orphan[0] == fleetGroup.Name, fmt.Sprintf("%v %v", orphan, err)
	})
	if err := b.Delete(ctx, backend.Ref{Name: fleetGroup.Name}); err != nil {
		t.Fatal(err)
	}
	if g := fake.Groups(); len(g) != 1 || g[0].Tags["egress.crawl.example.com/security-group-of"] != "instance" {
		t.Errorf("after the collector, only the lone Proxy's group is left: %+v", g)
	}
}

// TestRefusals: what EC2 would refuse, or what would leave a proxy open
// or never running, is a permanent error naming the field, and makes
// nothing.
func TestRefusals(t *testing.T) {
	unsupported := func(image, is string) string {
		return fmt.Sprintf(cloudvm.ErrFmtUnsupportedImage, "aws", image, is, "aws", "userData")
	}
	fake := ec2fake.Start(t)
	fake.AddSubnet("subnet-0aaaaaaaaaaaaaaa1", "vpc-0aaaaaaaaaaaaaaa1", "us-east-1c")
	b := newBackend(t, fake, "c1")
	for name, c := range map[string]struct {
		mod  func(*backend.Spec)
		want string
	}{
		"zone of another region":             {func(s *backend.Spec) { s.AWS.Zone = "eu-west-1a" }, fmt.Sprintf(aws.ErrFmtZoneOfOtherRegion, "eu-west-1a", "us-east-1", "us-east-1", "us-east-1")},
		"image the script does not support":  {func(s *backend.Spec) { s.AWS.Image = ec2fake.OtherAMI }, unsupported(ec2fake.OtherAMI+" (someones-image)", fmt.Sprintf(aws.ErrFmtImageOwner, "123456789012", aws.DebianOwner, aws.CanonicalOwner))},
		"an SSM parameter of no known maker": {func(s *backend.Spec) { s.AWS.Image = "resolve:ssm:/my/ami" }, fmt.Sprintf(aws.ErrFmtUnknownParameter, "resolve:ssm:/my/ami")},
		"Debian's AMI of an old release":     {func(s *backend.Spec) { s.AWS.Image = ec2fake.Debian10AMI }, unsupported(ec2fake.Debian10AMI+" (debian-10-amd64-20240703-1797)", fmt.Sprintf(aws.IsFmtNotImage, cloudvm.SupportedReleases()))},
		"Canonical's AMI of an old release":  {func(s *backend.Spec) { s.AWS.Image = ec2fake.Ubuntu1804AMI }, unsupported(ec2fake.Ubuntu1804AMI+" (ubuntu/images/hvm-ssd/ubuntu-bionic-18.04-amd64-server-20230607)", fmt.Sprintf(aws.IsFmtNotImage, cloudvm.SupportedReleases()))},
		"Debian's parameter of an old release": {func(s *backend.Spec) {
			s.AWS.Image = "resolve:ssm:/aws/service/debian/release/10/latest/amd64"
		}, unsupported(`"resolve:ssm:/aws/service/debian/release/10/latest/amd64"`, fmt.Sprintf(aws.IsFmtNotParameter, cloudvm.SupportedReleases()))},
		"Canonical's parameter of an old release": {func(s *backend.Spec) {
			s.AWS.Image = "resolve:ssm:/aws/service/canonical/ubuntu/server/18.04/stable/current/amd64/hvm/ebs-gp2/ami-id"
		}, unsupported(`"resolve:ssm:/aws/service/canonical/ubuntu/server/18.04/stable/current/amd64/hvm/ebs-gp2/ami-id"`, fmt.Sprintf(aws.IsFmtNotParameter, cloudvm.SupportedReleases()))},
		"Debian's daily parameter": {func(s *backend.Spec) {
			s.AWS.Image = "resolve:ssm:/aws/service/debian/daily/12/latest/amd64"
		}, unsupported(`"resolve:ssm:/aws/service/debian/daily/12/latest/amd64"`, fmt.Sprintf(aws.IsFmtNotParameter, cloudvm.SupportedReleases()))},
		"subnet in another zone": {func(s *backend.Spec) { s.AWS.Subnet = "subnet-0aaaaaaaaaaaaaaa1" }, fmt.Sprintf(aws.ErrFmtSubnetZone, "subnet-0aaaaaaaaaaaaaaa1", "us-east-1c", "us-east-1a")},
		"no such subnet": {func(s *backend.Spec) { s.AWS.Subnet = "subnet-0bbbbbbbbbbbbbbb1" }, aws.ErrReadSubnet + ": operation error EC2: DescribeSubnets, https response error StatusCode: 400, RequestID: fake-request, " +
			"api error InvalidSubnetID.NotFound: The subnet ID 'subnet-0bbbbbbbbbbbbbbb1' does not exist"},
		"open proxy":          {func(s *backend.Spec) { s.Credentials = nil }, fmt.Sprintf(cloudvm.ErrFmtOpenProxy, "203.0.113.0/24")},
		"user data too large": {func(s *backend.Spec) { s.UserData = strings.Repeat("#", 17<<10) }, fmt.Sprintf(aws.ErrFmtUserDataTooLarge, 17<<10, aws.MaxUserData)},
	} {
		s := spec("5c2d3e4f-0000-4222-8333-944455556666")
		c.mod(&s)
		_, err := b.Create(context.Background(), s)
		if backend.ClassOf(err) != backend.ClassPermanent || err == nil || err.Error() != c.want {
			t.Errorf("%s: %v (%s); want the permanent error %q", name, err, backend.ClassOf(err), c.want)
		}
	}
	if n := len(fake.Instances()); n != 0 || fake.Calls("RunInstances") != 0 {
		t.Errorf("refusals made %d instances", n)
	}
	// Ubuntu's AMI is supported, with its own root device.
	s := spec("5c2d3e4f-0001-4222-8333-944455556666")
	s.AWS.Image = ec2fake.UbuntuAMI
	if _, err := b.Create(context.Background(), s); err != nil || only(t, fake).Params["BlockDeviceMapping.1.DeviceName"] != "/dev/sda1" {
		t.Errorf("Ubuntu's AMI with its root device encrypted: %v", err)
	}
}

// TestFamilyParameters: every release the generated script is tested on
// (cloudvm.Families) is accepted through its maker's public parameter, by
// number and by codename, with the maker's root device.
func TestFamilyParameters(t *testing.T) {
	fake := ec2fake.Start(t)
	b := newBackend(t, fake, "c1")
	n := 0
	for _, f := range cloudvm.Families {
		params, root := []string{
			"/aws/service/debian/release/" + f.Version + "/latest/amd64",
			"/aws/service/debian/release/" + f.Codename + "/latest/arm64",
		}, "/dev/xvda"
		if f.Distro == cloudvm.Ubuntu {
			params, root = []string{
				"/aws/service/canonical/ubuntu/server/" + f.Version + "/stable/current/amd64/hvm/ebs-gp3/ami-id",
				"/aws/service/canonical/ubuntu/server-minimal/" + f.Codename + "/stable/current/amd64/hvm/ebs-gp2/ami-id",
			}, "/dev/sda1"
		}
		for _, p := range params {
			s := spec(fmt.Sprintf("5c2d3e4f-%04d-4222-8333-944455556666", n))
			n++
			s.AWS.Image = "resolve:ssm:" + p
			i, err := b.Create(context.Background(), s)
			if err != nil {
				t.Errorf("%s: %v", p, err)
				continue
			}
			for _, x := range fake.Instances() {
				if got := x.Params["BlockDeviceMapping.1.DeviceName"]; x.ID == i.ID && got != root {
					t.Errorf("%s: root device %q, want %q", p, got, root)
				}
			}
		}
	}
}

// TestErrorsClassified: EC2's error codes, as RunInstances answers them,
// sort into the backend's classes, EC2's message kept; a throttled call
// is retried by the SDK and passes.
func TestErrorsClassified(t *testing.T) {
	fake := ec2fake.Start(t)
	b := newBackend(t, fake, "c1")
	for code, want := range map[string]backend.Class{
		"InsufficientInstanceCapacity": backend.ClassStockout,
		"InstanceLimitExceeded":        backend.ClassQuota,
		"VcpuLimitExceeded":            backend.ClassQuota,
		"AddressLimitExceeded":         backend.ClassQuota,
		"UnauthorizedOperation":        backend.ClassAccessDenied,
		"InvalidParameterValue":        backend.ClassPermanent,
		"RequestLimitExceeded":         backend.ClassThrottled,
		"InternalError":                backend.ClassTransient,
	} {
		fake.Fail("RunInstances", ec2fake.Failure{Code: code, Message: "the " + code + " message", Times: -1})
		_, err := b.Create(context.Background(), spec("6c2d3e4f-0000-4222-8333-944455556666"))
		if backend.ClassOf(err) != want || !strings.Contains(err.Error(), "the "+code+" message") {
			t.Errorf("%s: %v (%s); want %s with EC2's message", code, err, backend.ClassOf(err), want)
		}
	}
	fake.Fail("RunInstances", ec2fake.Failure{Code: "RequestLimitExceeded", Times: 1})
	before := fake.Calls("RunInstances")
	if _, err := b.Create(context.Background(), spec("6c2d3e4f-0001-4222-8333-944455556666")); err != nil || fake.Calls("RunInstances") != before+2 {
		t.Errorf("one throttled RunInstances is retried: %v, %d calls", err, fake.Calls("RunInstances")-before)
	}
}

// TestSharedCredentials: an access key is read from a shared credentials
// file's [default] profile; anything that would make the provider run a
// program, assume a role or read another file is refused, naming it.
func TestSharedCredentials(t *testing.T) {
	good := "# a comment\n[other]\naws_access_key_id = AKIDOTHER\n[default]\naws_access_key_id = AKIDX\naws_secret_access_key = s3cret\naws_session_token = tok\n"
	p, err := aws.SharedCredentials([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Retrieve(context.Background())
	if err != nil || c.AccessKeyID != "AKIDX" || c.SecretAccessKey != "s3cret" || c.SessionToken != "tok" {
		t.Errorf("the [default] profile's key: %+v %v", c, err)
	}
	for name, file := range map[string]string{
		"credential_process": "[default]\ncredential_process = /bin/sh -c 'curl evil'\n",
		"role_arn":           "[default]\naws_access_key_id = A\naws_secret_access_key = B\nrole_arn = arn:aws:iam::1:role/x\n",
		"no default":         "[prod]\naws_access_key_id = A\naws_secret_access_key = B\n",
		"no secret":          "[default]\naws_access_key_id = A\n",
		"garbage":            "[default]\nnot a key value\n",
	} {
		if _, err := aws.SharedCredentials([]byte(file)); err == nil {
			t.Errorf("%s: accepted", name)
		} else if name == "credential_process" && !strings.Contains(err.Error(), "credential_process") {
			t.Errorf("%s: %v; want it named", name, err)
		}
	}
}

// TestFleetOf200: a fleet of 200 instances over three zones scales up
// with no create holding its caller longer than EC2 takes to answer
// (RunInstances does not wait for the instance: it is pending) and one
// security group for all of them.
func TestFleetOf200(t *testing.T) {
	fake := ec2fake.Start(t)
	fake.PendingFor = time.Minute // nothing boots while the fleet is made
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	var slowest time.Duration
	for i := range 200 {
		s := fleetSpec(3000 + i)
		s.Zone = "us-east-1" + string(rune('a'+i%3))
		s.AWS.Zone = s.Zone
		start := time.Now()
		inst, err := b.Create(ctx, s)
		if err != nil {
			t.Fatalf("instance %d: %v", i, err)
		}
		slowest = max(slowest, time.Since(start))
		if inst.Phase != v1alpha1.InstancePhaseProvisioning {
			t.Fatalf("instance %d: %+v", i, inst)
		}
	}
	if n, g := len(fake.Instances()), fake.Groups(); n != 200 || len(g) != 1 {
		t.Errorf("%d instances in %d security groups; want 200 in one", n, len(g))
	}
	if slowest > 10*time.Second {
		t.Errorf("the slowest create held its caller %s; want under 10 s", slowest)
	}
	t.Logf("200 creates, the slowest %s; %d DescribeInstances, %d RunInstances", slowest, fake.Calls("DescribeInstances"), fake.Calls("RunInstances"))
}

// TestUnauthorizedExplained: EC2's encoded reason for an
// UnauthorizedOperation is decoded through STS into the error (action,
// resource, principal, explicit deny), the opaque blob left out, the class
// kept; without sts:DecodeAuthorizationMessage the error says to grant it.
func TestUnauthorizedExplained(t *testing.T) {
	fake := ec2fake.Start(t)
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	refusal := fake.Unauthorized(`{"allowed":false,"explicitDeny":true,"matchedStatements":{"items":[]},"context":{"principal":{"id":"AROA:i","arn":"arn:aws:sts::123456789012:assumed-role/provider/i"},"action":"ec2:RunInstances","resource":"arn:aws:ec2:us-east-1:123456789012:instance/*","conditions":{"items":[]}}}`)
	blob := refusal.Message[strings.Index(refusal.Message, "message: ")+len("message: "):]
	fake.Fail("RunInstances", refusal)
	_, err := b.Create(ctx, spec("0b7c6a2e-aaaa-4222-8333-944455556666"))
	if backend.ClassOf(err) != backend.ClassAccessDenied || !strings.Contains(err.Error(), "arn:aws:sts::123456789012:assumed-role/provider/i may not ec2:RunInstances on arn:aws:ec2:us-east-1:123456789012:instance/*: a policy denies it explicitly") || strings.Contains(err.Error(), blob) {
		t.Errorf("decoded: %v (%s)", err, backend.ClassOf(err))
	}
	if n := fake.Calls("sts:DecodeAuthorizationMessage"); n != 1 {
		t.Errorf("%d decodes, want 1", n)
	}
	fake.DenyDecode = true
	fake.Fail("RunInstances", fake.Unauthorized(`{"allowed":false,"context":{"action":"ec2:RunInstances"}}`))
	_, err = b.Create(ctx, spec("0b7c6a2e-bbbb-4222-8333-944455556666"))
	if backend.ClassOf(err) != backend.ClassAccessDenied || !strings.Contains(err.Error(), "grant the provider's identity sts:DecodeAuthorizationMessage") {
		t.Errorf("not decodable: %v", err)
	}
	// Refused once, STS is not asked again for a while.
	decodes := fake.Calls("sts:DecodeAuthorizationMessage")
	fake.Fail("RunInstances", fake.Unauthorized(`{"allowed":false,"context":{"action":"ec2:RunInstances"}}`))
	if _, err = b.Create(ctx, spec("0b7c6a2e-bbbb-4222-8333-944455556666")); backend.ClassOf(err) != backend.ClassAccessDenied {
		t.Errorf("refused again: %v", err)
	}
	if n := fake.Calls("sts:DecodeAuthorizationMessage"); n != decodes {
		t.Errorf("STS asked %d more times after it refused", n-decodes)
	}
	if len(fake.Instances()) != 0 {
		t.Errorf("refused, yet an instance: %+v", fake.Instances())
	}
}

// TestStoppedInstanceReportedTerminated: an instance somebody stops (or
// that is stopping) serves no crawler: Get reports it terminated, which
// makes the controller replace it (TestAWSInstanceReplaced), and the
// states a running instance passes through on its way up provision.
func TestStoppedInstanceReportedTerminated(t *testing.T) {
	for state, want := range map[ec2types.InstanceStateName]v1alpha1.InstancePhase{
		ec2types.InstanceStateNamePending: v1alpha1.InstancePhaseProvisioning, ec2types.InstanceStateNameRunning: v1alpha1.InstancePhaseRunning,
		ec2types.InstanceStateNameStopping: v1alpha1.InstancePhaseTerminated, ec2types.InstanceStateNameStopped: v1alpha1.InstancePhaseTerminated,
		ec2types.InstanceStateNameShuttingDown: v1alpha1.InstancePhaseTerminated, ec2types.InstanceStateNameTerminated: v1alpha1.InstancePhaseTerminated,
	} {
		if got := aws.Phase(state, "54.1.2.3"); got != want {
			t.Errorf("%s: phase %s, want %s", state, got, want)
		}
	}
	if got := aws.Phase(ec2types.InstanceStateNameRunning, ""); got != v1alpha1.InstancePhaseProvisioning {
		t.Errorf("running without a public address yet: phase %s, want Provisioning", got)
	}

	fake := ec2fake.Start(t)
	fake.PendingFor = 0
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := spec("0b7c6a2e-3333-4222-8333-944455556666")
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	id := only(t, fake).ID
	for _, state := range []string{"stopping", "stopped"} {
		fake.SetState(id, state)
		got, err := b.Get(ctx, s.Ref)
		if err != nil || got.Phase != v1alpha1.InstancePhaseTerminated {
			t.Errorf("a %s instance: %+v %v; want it reported terminated", state, got, err)
		}
	}
}

// TestTokenSentWithOtherParameters: a create that sends a token EC2 bound
// to other parameters (here the owner's tags changed, which the token does
// not digest) gets IdempotentParameterMismatch; while EC2 does not list the
// instance the token made, the create is retried later, as transient, and
// no second instance is made.
func TestTokenSentWithOtherParameters(t *testing.T) {
	fake := ec2fake.Start(t)
	fake.HideNewFor = time.Minute
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := spec("0b7c6a2e-4444-4222-8333-944455556666")
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	s.Owner.Name = "renamed"
	_, err := b.Create(ctx, s)
	if backend.ClassOf(err) != backend.ClassTransient || !strings.Contains(err.Error(), "used token") || !strings.Contains(err.Error(), "IdempotentParameterMismatch") {
		t.Errorf("a token bound to other parameters: %v (%s); want a transient error naming the mismatch", err, backend.ClassOf(err))
	}
	if n := len(fake.Instances()); n != 1 {
		t.Errorf("%d instances; the mismatch makes none", n)
	}
}

// TestContract: the EC2 backend keeps the contract of every cloud VM
// backend.
func TestContract(t *testing.T) {
	cloudvmtest.Contract(t, cloudvmtest.Cloud{
		New:  func(t *testing.T) backend.Backend { return newBackend(t, ec2fake.Start(t), "c1") },
		Spec: spec,
		FailCreate: func(t *testing.T, class backend.Class) backend.Backend {
			fake := ec2fake.Start(t)
			code := map[backend.Class]string{
				backend.ClassStockout: "InsufficientInstanceCapacity", backend.ClassQuota: "VcpuLimitExceeded",
				backend.ClassThrottled: "RequestLimitExceeded", backend.ClassAccessDenied: "UnauthorizedOperation",
				backend.ClassPermanent: "InvalidParameterValue", backend.ClassTransient: "InternalError",
			}[class]
			fake.Fail("RunInstances", ec2fake.Failure{Code: code, Message: "the " + code + " message", Times: -1})
			return newBackend(t, fake, "c1")
		},
	})
}
