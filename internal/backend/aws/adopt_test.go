package aws_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/aws"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/aws/ec2fake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// TestAdoptAndRetain: an instance kept from a Proxy made with Retain is
// imported by a new Proxy, found by its recorded ID under its maker's name,
// carries its new owner's tags and no more the old retain tag, and is
// marked to outlive its Proxy and unmarked again; an instance another
// Proxy took meanwhile is not adopted.
func TestAdoptAndRetain(t *testing.T) {
	fake := ec2fake.Start(t)
	fake.PendingFor = 0
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	old := spec("0b7c6a2e-7777-4222-8333-944455556666")
	old.Owner.Retain = true
	inst, err := b.Create(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := ownership.FromLabels(only(t, fake).Tags); !o.Retain {
		t.Fatalf("made to be retained: %v", only(t, fake).Tags)
	}
	to := ownership.Owner{ClusterID: "c1", Namespace: "team", Name: "importer", UID: "9f7c6a2e-7777-4222-8333-944455556666"}
	// The importer's Ref: its own name, the recorded ID.
	ref := backend.Ref{Name: ownership.InstanceName(to.UID), Zone: "us-east-1a", ID: only(t, fake).ID}
	got, err := b.Get(ctx, ref)
	if err != nil || got.ProviderID != inst.ProviderID || got.Name != old.Name {
		t.Fatalf("found by its recorded ID under its maker's name: %+v %v", got, err)
	}
	if err := b.Adopt(ctx, ref, "someone-else", to); !errors.Is(err, backend.ErrHeldElsewhere) {
		t.Errorf("adopted from a Proxy that does not hold it: %v", err)
	}
	if err := b.Adopt(ctx, ref, old.Owner.UID, to); err != nil {
		t.Fatal(err)
	}
	o, ok := ownership.FromLabels(only(t, fake).Tags)
	if !ok || o.Holder() != to.UID || o.Name != "importer" || o.Retain || o.UID != old.Owner.UID {
		t.Errorf("adopted: the importer holds it, its maker's UID stays, the retain tag is gone: %+v %v", o, only(t, fake).Tags)
	}
	if got, err := b.Get(ctx, ref); err != nil || got.Owner.Holder() != to.UID {
		t.Errorf("observed as the importer's: %+v %v", got, err)
	}
	for _, retain := range []bool{true, false} {
		if err := b.SetRetain(ctx, got.Ref, retain); err != nil {
			t.Fatal(err)
		}
		if o, _ := ownership.FromLabels(only(t, fake).Tags); o.Retain != retain || o.Holder() != to.UID {
			t.Errorf("retain %v: %v", retain, only(t, fake).Tags)
		}
	}
	if _, ok := only(t, fake).Tags[ownership.LabelRetain]; ok {
		t.Errorf("unmarked, the retain tag is gone: %v", only(t, fake).Tags)
	}
}

// TestAdoptOvertaken: two Proxies import one instance at once; EC2 tags
// unconditionally, so the one whose tags another's retag overwrote while
// it wrote its own learns so from the read back, and records nothing.
func TestAdoptOvertaken(t *testing.T) {
	fake := ec2fake.Start(t)
	fake.PendingFor = 0
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	old := spec("0b7c6a2e-8888-4222-8333-944455556666")
	old.Owner.Retain = true
	if _, err := b.Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	id := only(t, fake).ID
	p1 := ownership.Owner{ClusterID: "c1", Namespace: "team", Name: "first", UID: "11111111-8888-4222-8333-944455556666", Retain: true}
	p2 := ownership.Owner{ClusterID: "c1", Namespace: "team", Name: "second", UID: "22222222-8888-4222-8333-944455556666"}
	// While p2 writes its tags, p1's import (read before p2 wrote) lands.
	fake.OnChange = func(action string) {
		if action == "CreateTags" {
			fake.OnChange = nil
			cur, _ := ownership.FromLabels(only(t, fake).Tags)
			fake.Tag(id, cur.AdoptedBy(p1).Labels())
		}
	}
	ref := backend.Ref{Name: ownership.InstanceName(p2.UID), Zone: "us-east-1a", ID: id}
	err := b.Adopt(ctx, ref, old.Owner.UID, p2)
	if backend.ClassOf(err) != backend.ClassTransient || err == nil || err.Error() != fmt.Sprintf(aws.ErrFmtRetagged, id, p1.UID) {
		t.Errorf("an import another overtook: %v", err)
	}
	if o, _ := ownership.FromLabels(only(t, fake).Tags); o.Holder() != p1.UID {
		t.Errorf("the tags name the last writer, p1: %v", only(t, fake).Tags)
	}
	if err := b.Adopt(ctx, ref, old.Owner.UID, p2); !errors.Is(err, backend.ErrHeldElsewhere) {
		t.Errorf("tried again, p2 takes an instance p1 now holds: %v", err)
	}
}

// TestStaleRecordedID: a recorded ID EC2 no longer lists does not hide the
// name's live instance from Get, nor keep Delete from terminating it.
func TestStaleRecordedID(t *testing.T) {
	fake := ec2fake.Start(t)
	fake.PendingFor = 0
	b := newBackend(t, fake, "c1")
	ctx := context.Background()
	s := spec("0b7c6a2e-9999-4222-8333-944455556666")
	inst, err := b.Create(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	ref := s.Ref
	ref.ID = "i-0000000000000000f"
	if got, err := b.Get(ctx, ref); err != nil || got.ProviderID != inst.ProviderID {
		t.Errorf("the name's instance, past a recorded ID EC2 does not list: %+v %v", got, err)
	}
	if err := b.Delete(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if st := only(t, fake).State; st != "shutting-down" && st != "terminated" {
		t.Errorf("deleted with a stale recorded ID, the instance is %s", st)
	}
}
