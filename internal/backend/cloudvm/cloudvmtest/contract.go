package cloudvmtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// Cloud is what the contract needs of one cloud's backend under test: a
// backend of cluster "c1" against the cloud's fake, and the Spec of a
// Proxy's instance in its first zone (the proxy's UID given).
type Cloud struct {
	New  func(t *testing.T) backend.Backend
	Spec func(uid string) backend.Spec
	// FailCreate is a backend of cluster "c1" whose fake answers every
	// create of an instance with the cloud's own error of class (its
	// error body, at once or in the operation, as the cloud would), for
	// each of FailedCreateClasses.
	FailCreate func(t *testing.T, class backend.Class) backend.Backend
}

// FailedCreateClasses are the classes a failed create must come back as,
// from each cloud's own errors, since the controller does something
// different for each: another zone or later (ZoneExhausted), the create
// gate and its alert (QuotaExceeded, Throttled, AccessDenied), no retry
// until the spec changes (PermanentError), a retry with back-off
// (Transient).
var FailedCreateClasses = []backend.Class{
	backend.ClassStockout, backend.ClassQuota, backend.ClassThrottled,
	backend.ClassAccessDenied, backend.ClassPermanent, backend.ClassTransient,
}

// wait is how long the contract waits for what a cloud shows eventually
// (a listing that lags a create, an instance that boots).
const wait = 20 * time.Second

// Contract checks what every cloud VM backend promises the controller
// and the orphan collector, whatever its API: a third cloud passes it
// before anything else.
//   - Create is idempotent: created again, the instance is the same one.
//   - Get of an instance never made is NotFound; Delete of one succeeds.
//   - ListOwned lists the instance, owned by its Proxy.
//   - An import (Adopter) of an instance another Proxy holds is refused
//     with backend.ErrHeldElsewhere; of one still its maker's, it moves
//     the instance to the importer, as Get then shows.
//   - SetRetain (Retainer) marks the instance to outlive its Proxy, as
//     Get then shows, and lets it go again.
//   - Deleted, the instance goes; an opening its Proxy's ranges made is
//     gone or listed for the orphan collector (terminated, of no zone,
//     never retained).
//   - A create the cloud refuses comes back in the class of the cloud's
//     error, for each of FailedCreateClasses, and leaves no instance.
func Contract(t *testing.T, c Cloud) {
	ctx := context.Background()
	failedCreates(t, c)
	b := c.New(t)
	s := c.Spec("0c0ffee0-1111-4222-8333-944455556666")

	if _, err := b.Get(ctx, c.Spec("0c0ffee0-dead-4222-8333-944455556666").Ref); backend.ClassOf(err) != backend.ClassNotFound {
		t.Errorf("Get of an instance never made: %v, want class NotFound", err)
	}
	if err := b.Delete(ctx, c.Spec("0c0ffee0-dead-4222-8333-944455556666").Ref); err != nil {
		t.Errorf("Delete of an instance never made: %v, want success", err)
	}

	first, err := b.Create(ctx, s)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	again, err := b.Create(ctx, s)
	if err != nil || again.ProviderID != first.ProviderID {
		t.Fatalf("Create again: %+v, %v; want the same instance %s", again, err, first.ProviderID)
	}
	r := s.Ref
	r.ID = first.ID
	testbed.Eventually(t, wait, "the instance listed once, owned by its Proxy", func() (bool, string) {
		all, err := b.ListOwned(ctx)
		if err != nil {
			return false, err.Error()
		}
		n, owner := 0, types.UID("")
		for _, i := range all {
			if i.Name == s.Name && i.Zone != "" {
				n++
				owner = i.Owner.Holder()
			}
		}
		return n == 1 && owner == s.Owner.UID, fmt.Sprintf("%d listed, held by %q", n, owner)
	})

	if a, ok := b.(backend.Adopter); ok {
		checkImport(t, b, a, r, s)
	}
	if rt, ok := b.(backend.Retainer); ok {
		checkRetain(t, b, rt, r)
	}
	checkGone(t, b, r)
}

// checkImport: an import naming another maker is refused, one naming the
// instance's maker moves it to the importer.
func checkImport(t *testing.T, b backend.Backend, a backend.Adopter, r backend.Ref, s backend.Spec) {
	ctx := context.Background()
	to := ownership.Owner{ClusterID: "c1", Namespace: s.Owner.Namespace, Name: "importer", UID: "0c0ffee0-2222-4222-8333-944455556666"}
	if err := a.Adopt(ctx, r, "0c0ffee0-3333-4222-8333-944455556666", to); !errors.Is(err, backend.ErrHeldElsewhere) {
		t.Errorf("an import naming another maker: %v, want ErrHeldElsewhere", err)
	}
	if err := a.Adopt(ctx, r, s.Owner.UID, to); err != nil {
		t.Fatalf("an import of its maker's instance: %v", err)
	}
	testbed.Eventually(t, wait, "the import shown by Get", func() (bool, string) {
		i, err := b.Get(ctx, r)
		if err != nil {
			return false, err.Error()
		}
		return i.Owner.Holder() == to.UID, string(i.Owner.Holder())
	})
}

// checkRetain: the retain mark set, then let go, as Get shows.
func checkRetain(t *testing.T, b backend.Backend, rt backend.Retainer, r backend.Ref) {
	ctx := context.Background()
	for _, retain := range []bool{true, false} {
		if err := rt.SetRetain(ctx, r, retain); err != nil {
			t.Fatalf("SetRetain(%v): %v", retain, err)
		}
		testbed.Eventually(t, wait, fmt.Sprintf("Get shows retain %v", retain), func() (bool, string) {
			i, err := b.Get(ctx, r)
			if err != nil {
				return false, err.Error()
			}
			return i.Owner.Retain == retain, fmt.Sprint(i.Owner.Retain)
		})
	}
}

// checkGone: deleted, the instance goes, and an opening left behind is
// the orphan collector's.
func checkGone(t *testing.T, b backend.Backend, r backend.Ref) {
	ctx := context.Background()
	if err := b.Delete(ctx, r); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	testbed.Eventually(t, wait, "the instance and its opening gone", func() (bool, string) {
		if err := b.Delete(ctx, r); err != nil {
			return false, "Delete again: " + err.Error()
		}
		i, err := b.Get(ctx, r)
		if err == nil && i.Phase != v1alpha1.InstancePhaseTerminated {
			return false, "the instance is " + string(i.Phase)
		}
		if err != nil && backend.ClassOf(err) != backend.ClassNotFound {
			return false, err.Error()
		}
		all, err := b.ListOwned(ctx)
		if err != nil {
			return false, err.Error()
		}
		var left []string
		for _, i := range all {
			// An opening left behind is the orphan collector's: listed
			// as a terminated instance of no zone, never retained.
			if i.Zone != "" || i.Phase != v1alpha1.InstancePhaseTerminated || i.Owner.Retain {
				left = append(left, fmt.Sprintf("%s in %q (%s, retain %v)", i.Name, i.Zone, i.Phase, i.Owner.Retain))
			}
		}
		return len(left) == 0, fmt.Sprint("listed: ", left)
	})
}

// failedCreates: each class of FailedCreateClasses comes back from a
// create the cloud refuses that way, and no instance is left of it: the
// next observation finds none, and the orphan collector has none to take.
func failedCreates(t *testing.T, c Cloud) {
	if c.FailCreate == nil {
		t.Fatal("the cloud gives no FailCreate: every cloud shows its errors' classes")
	}
	ctx := context.Background()
	for _, class := range FailedCreateClasses {
		b := c.FailCreate(t, class)
		s := c.Spec("0c0ffee0-4444-4222-8333-944455556666")
		_, err := b.Create(ctx, s)
		if got := backend.ClassOf(err); got != class {
			t.Errorf("a create refused as %s: class %s (%v)", class, got, err)
		}
		if i, err := b.Get(ctx, s.Ref); backend.ClassOf(err) != backend.ClassNotFound && (err != nil || i.Phase != v1alpha1.InstancePhaseTerminated) {
			t.Errorf("a create refused as %s left an instance: %+v %v", class, i, err)
		}
		all, err := b.ListOwned(ctx)
		if err != nil {
			t.Errorf("a create refused as %s: ListOwned: %v", class, err)
		}
		for _, i := range all {
			if i.Zone != "" && i.Phase != v1alpha1.InstancePhaseTerminated {
				t.Errorf("a create refused as %s left an instance listed: %+v", class, i)
			}
		}
	}
}
