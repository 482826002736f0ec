package aws_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/aws"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/aws/ec2fake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestTokenChainPastTheListing: a Proxy whose instance was terminated and
// is no longer listed gets a new one, whatever the token EC2 still keeps
// bound to the old: with the same spec the chain of tokens is followed
// (RunInstances answers the terminated instance first), with another the
// token is another.
func TestTokenChainPastTheListing(t *testing.T) {
	fake := ec2fake.Start(t)
	fake.PendingFor, fake.TerminatingFor, fake.TerminatedListed = 0, 0, 0
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := spec("0b7c6a2e-4444-4222-8333-944455556666")
	ids := map[string]bool{}
	for round := range 3 {
		if round == 2 {
			s.Hash = "changed"
		}
		before := fake.Calls("RunInstances")
		inst, err := b.Create(ctx, s)
		if err != nil || ids[inst.ProviderID] {
			t.Fatalf("round %d: %+v %v; want a new instance", round, inst, err)
		}
		ids[inst.ProviderID] = true
		t.Logf("round %d: %d RunInstances", round, fake.Calls("RunInstances")-before)
		if round == 1 && fake.Calls("RunInstances")-before != 2 {
			t.Errorf("round 1 followed the chain: %d RunInstances, want 2 (the terminated instance answered first)", fake.Calls("RunInstances")-before)
		}
		id := inst.ProviderID[strings.LastIndexByte(inst.ProviderID, '/')+1:]
		fake.Interrupt(id, "Server.SpotInstanceTermination: Spot instance termination")
		testbed.Eventually(t, 5*time.Second, "the instance no longer listed", func() (bool, string) {
			n := len(fake.Instances())
			return n == 0, fmt.Sprint(n)
		})
	}
}

// TestListOwned: every page of this cluster's instances that are not
// terminated, none of another cluster's.
func TestListOwned(t *testing.T) {
	fake := ec2fake.Start(t)
	fake.PendingFor, fake.TerminatingFor = 0, 0
	fake.MaxPage = 5
	b := newBackend(t, fake, "c1")
	other := newBackend(t, fake, "c2")
	ctx := context.Background()
	for i := range 12 {
		if _, err := b.Create(ctx, fleetSpec(i)); err != nil {
			t.Fatal(err)
		}
	}
	s := spec("7c2d3e4f-0000-4222-8333-944455556666")
	s.Owner.ClusterID = "c2"
	if _, err := other.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, fleetSpec(0).Ref); err != nil {
		t.Fatal(err)
	}
	owned, err := b.ListOwned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, i := range owned {
		if i.Zone != "" {
			n++
			if !i.Owner.OfCluster("c1") || i.Name == fleetSpec(0).Name && i.Phase != v1alpha1.InstancePhaseTerminated {
				t.Errorf("listed: %+v", i)
			}
		}
	}
	if n < 11 || n > 12 || fake.Calls("DescribeInstances") < 3 {
		t.Errorf("%d of cluster c1's instances listed in %d pages; want the 11 not terminated (the 12th shutting down may be)", n, fake.Calls("DescribeInstances"))
	}
}

// TestDeletedBeforeListed: a Proxy deleted while EC2 does not list its
// new instance yet terminates it by the ID its create recorded.
func TestDeletedBeforeListed(t *testing.T) {
	fake := ec2fake.Start(t)
	fake.HideNewFor = time.Minute
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := spec("0b7c6a2e-7777-4222-8333-944455556666")
	inst, err := b.Create(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, inst.Ref); err != nil {
		t.Fatal(err)
	}
	if st := only(t, fake).State; st != "shutting-down" && st != "terminated" {
		t.Errorf("the instance EC2 did not list yet: %s; want it terminated", st)
	}
}

// TestOneListingPerPoll: the Gets of a poll share one listing of the
// cluster's instances (one DescribeInstances for 50 Proxies, not 50); a
// listing older than its age is made again; a name the backend changed
// since the listing began (terminated here) and a name the listing lacks
// (an instance launched after it) are asked of EC2 alone; an instance
// recorded by its ID under another name is found in the listing; and a
// listing that fails leaves each Get to ask on its own.
//
// The SDK retries (as newBackend's do: the Go client now and then closes
// a connection while the SDK reads its answer), so a listing is counted
// as one to attempts calls, and what proves that no Get asked EC2 alone
// is that no call looked up one name.
func TestOneListingPerPoll(t *testing.T) {
	const attempts = 4
	fake := ec2fake.Start(t)
	fake.PendingFor = 0
	var mu sync.Mutex
	clock := time.Now()
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); clock = clock.Add(d) }
	b, err := aws.New(context.Background(), aws.Config{
		Region: ec2fake.Region, ClusterID: "c1", Endpoint: fake.URL,
		Credentials: credentials.NewStaticCredentialsProvider(ec2fake.AccessKey, ec2fake.SecretKey, ""),
		MaxAttempts: attempts, MaxBackoff: 10 * time.Millisecond, ListingMaxAge: time.Minute, Now: now,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	specs := make([]backend.Spec, 50)
	made := map[string]string{}
	for i := range specs {
		specs[i] = fleetSpec(i)
		inst, err := b.Create(ctx, specs[i])
		if err != nil {
			t.Fatal(err)
		}
		made[specs[i].Name] = inst.ProviderID
	}
	advance(10 * time.Second) // the creates have settled
	getAll := func() {
		t.Helper()
		var wg sync.WaitGroup
		for _, s := range specs {
			wg.Go(func() {
				got, err := b.Get(ctx, s.Ref)
				if err != nil || got.ProviderID != made[s.Name] || got.Phase != v1alpha1.InstancePhaseRunning {
					t.Errorf("%s: %+v %v", s.Name, got, err)
				}
			})
		}
		wg.Wait()
	}
	before := len(fake.Params("DescribeInstances"))
	getAll()
	getAll()
	if listings, names := describedSince(fake, before); listings < 1 || listings > attempts || names != 0 {
		t.Errorf("two polls of 50 Proxies within the listing's age: %d listings, %d lookups of one name; want one listing (up to %d attempts), no lookup", listings, names, attempts)
	}
	advance(2 * time.Minute)
	before = len(fake.Params("DescribeInstances"))
	getAll()
	if listings, names := describedSince(fake, before); listings < 1 || listings > attempts || names != 0 {
		t.Errorf("a poll after the listing's age: %d listings, %d lookups of one name; want a new listing (up to %d attempts), no lookup", listings, names, attempts)
	}

	// Terminated by the backend: asked of EC2, not read from the listing
	// that still shows it running.
	if err := b.Delete(ctx, specs[0].Ref); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Get(ctx, specs[0].Ref); err != nil || got.Phase != v1alpha1.InstancePhaseTerminated {
		t.Errorf("just terminated: %+v %v", got, err)
	}
	// Launched after the listing: not in it, asked of EC2.
	late := fleetSpec(99)
	inst, err := b.Create(ctx, late)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b.Get(ctx, late.Ref); err != nil || got.ProviderID != inst.ProviderID {
		t.Errorf("launched after the listing: %+v %v", got, err)
	}
	// Recorded by ID under another name (an import): found in the listing.
	vm := ""
	for _, i := range fake.Instances() {
		if i.Tags[aws.TagInstance] == specs[1].Name {
			vm = i.ID
		}
	}
	before = fake.Calls("DescribeInstances")
	if got, err := b.Get(ctx, backend.Ref{Name: "egress-someoneelse00", Zone: "us-east-1a", ID: vm}); err != nil || got.Name != specs[1].Name {
		t.Errorf("by its recorded ID: %+v %v", got, err)
	}
	if n := fake.Calls("DescribeInstances") - before; n != 0 {
		t.Errorf("an instance the listing holds, by ID: %d DescribeInstances, want 0", n)
	}

	// The listing fails, every attempt: each Get asks on its own, and
	// answers.
	advance(2 * time.Minute)
	fake.Fail("DescribeInstances", ec2fake.Failure{Code: "Unavailable", Times: attempts})
	before = len(fake.Params("DescribeInstances"))
	if got, err := b.Get(ctx, specs[2].Ref); err != nil || got.ProviderID != made[specs[2].Name] {
		t.Errorf("with the listing failed: %+v %v", got, err)
	}
	if listings, names := describedSince(fake, before); listings != attempts || names != 1 {
		t.Errorf("with the listing failed: %d listings, %d lookups of one name; want %d failed listings and one lookup", listings, names, attempts)
	}
}

// describedSince counts the DescribeInstances the fake answered after
// the first skip: listings of the cluster's instances, and lookups of
// one name (by its tag) or of instance IDs.
func describedSince(fake *ec2fake.Server, skip int) (listings, names int) {
	for _, p := range fake.Params("DescribeInstances")[skip:] {
		one := false
		for k, v := range p {
			if v == "tag:"+aws.TagInstance || strings.HasPrefix(k, "InstanceId.") {
				one = true
			}
		}
		if one {
			names++
		} else {
			listings++
		}
	}
	return listings, names
}

// TestListingNeverSaysGone: a listing that shows a name's instance
// terminated is not taken for "none": another provider (the leader
// before, a replica) may have launched its replacement since, which Get
// then finds by asking EC2 of the name.
func TestListingNeverSaysGone(t *testing.T) {
	fake := ec2fake.Start(t)
	fake.PendingFor, fake.TerminatingFor = 0, 0
	var mu sync.Mutex
	clock := time.Now()
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); clock = clock.Add(d) }
	cfg := aws.Config{
		Region: ec2fake.Region, ClusterID: "c1", Endpoint: fake.URL,
		Credentials: credentials.NewStaticCredentialsProvider(ec2fake.AccessKey, ec2fake.SecretKey, ""),
		MaxAttempts: 4, MaxBackoff: 10 * time.Millisecond, ListingMaxAge: time.Minute, Now: now,
	}
	b, err := aws.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	other := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := spec("0b7c6a2e-cccc-4222-8333-944455556666")
	first, err := b.Create(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if !fake.Interrupt(only(t, fake).ID, "Server.SpotInstanceTermination: Spot instance termination") {
		t.Fatal("nothing to interrupt")
	}
	advance(2 * time.Minute) // a listing that shows it terminated
	if _, err := b.Get(ctx, s.Ref); !backend.IsNotFound(err) {
		t.Fatalf("terminated: %v", err)
	}
	second, err := other.Create(ctx, s)
	if err != nil || second.ProviderID == first.ProviderID {
		t.Fatalf("the replacement: %+v %v", second, err)
	}
	if got, err := b.Get(ctx, s.Ref); err != nil || got.ProviderID != second.ProviderID {
		t.Errorf("the listing showed only the terminated one; Get found %+v %v, want %s", got, err, second.ProviderID)
	}
}

// TestOrphanGroupsListed: without ec2:DescribeSecurityGroups the
// instances are still listed and the skip is named; any other failure to
// list the groups (a throttle, a 5xx, a refused filter) fails the list,
// so that the orphan collector never takes a gap for an empty list.
func TestOrphanGroupsListed(t *testing.T) {
	ctx := context.Background()
	cases := map[string]struct {
		failure ec2fake.Failure
		partial bool
	}{
		"Unauthorized": {failure: ec2fake.Failure{Code: "UnauthorizedOperation", Status: 403, Message: "You are not authorized to perform this operation.", Times: -1}, partial: true},
		"Throttled":    {failure: ec2fake.Failure{Code: "RequestLimitExceeded", Times: -1}},
		"Unavailable":  {failure: ec2fake.Failure{Code: "InternalError", Status: 500, Times: -1}},
		"BadFilter":    {failure: ec2fake.Failure{Code: "InvalidParameterValue", Message: "The filter 'tag:x' is invalid", Times: -1}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			fake := ec2fake.Start(t)
			fake.PendingFor = 0
			b := newBackend(t, fake, "c1")
			s := spec("5c2d3e4f-0000-4222-8333-944455556666")
			if _, err := b.Create(ctx, s); err != nil {
				t.Fatal(err)
			}
			fake.Fail("DescribeSecurityGroups", tc.failure)
			got, err := b.ListOwned(ctx)
			var skipped *backend.PartialList
			switch {
			case tc.partial && (!errors.As(err, &skipped) || !strings.Contains(err.Error(), "ec2:DescribeSecurityGroups") || len(got) != 1 || got[0].Name != s.Name):
				t.Errorf("a refusal to list groups lists the instances and names the skip: %+v, %v", got, err)
			case !tc.partial && (err == nil || errors.As(err, &skipped) || got != nil):
				t.Errorf("a %s on listing groups fails the list: %+v, %v", tc.failure.Code, got, err)
			}
		})
	}
}
