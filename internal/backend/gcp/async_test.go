package gcp_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/option"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp/gcpfake"
)

// fakeClock is the fake's time, moved by the test.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func frozen(fake *gcpfake.Server) *fakeClock {
	c := &fakeClock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	fake.SetClock(c.now)
	return c
}

// TestOperationsWaited: Create waits for the insert operations, so that an
// error Compute Engine finds after accepting the insert is reported; an
// insert that outlasts the wait is returned as running, and CheckOperation
// later reports how it ended instead of a blind re-create.
func TestOperationsWaited(t *testing.T) {
	ctx := context.Background()

	t.Run("WaitsForBoth", func(t *testing.T) {
		fake := gcpfake.Start(t)
		fake.SetOperationDuration(300 * time.Millisecond)
		b := newBackend(t, fake, "c1")
		s := spec("uid-wait")
		inst, err := b.Create(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if inst.Operation != "" || fake.Calls("operations.wait") < 2 {
			t.Errorf("Create waits for the firewall and VM inserts: operation %q left, %d waits", inst.Operation, fake.Calls("operations.wait"))
		}
		if fake.Firewall(s.Name) == nil {
			t.Error("the firewall rule exists once Create returns")
		}
	})

	t.Run("OutlastsTheWait", func(t *testing.T) {
		fake := gcpfake.Start(t)
		clock := frozen(fake)
		fake.SetOperationDuration(10 * time.Minute)
		b, err := gcp.New(ctx, gcp.Config{Project: "crawl-proj", ClusterID: "c1", ClientOptions: fake.ClientOptions(), OperationTimeout: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = b.Close() }()
		s := spec("uid-slow")
		fake.FailOperation("instances.insert", gcpfake.Stockout("crawl-proj", s.Zone))
		inst, err := b.Create(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if inst.Operation == "" || inst.Phase != v1alpha1.InstancePhaseProvisioning {
			t.Fatalf("an insert still running when the wait ends is returned as running, with its operation: %+v", inst)
		}
		if err := b.CheckOperation(ctx, s.Ref, inst.Operation); err != nil {
			t.Errorf("a running operation has no error yet: %v", err)
		}
		clock.add(11 * time.Minute)
		if _, err := b.Get(ctx, s.Ref); !backend.IsNotFound(err) {
			t.Fatalf("the VM of a failed insert disappears: %v", err)
		}
		err = b.CheckOperation(ctx, s.Ref, inst.Operation)
		if backend.ClassOf(err) != backend.ClassStockout || !strings.Contains(err.Error(), "ZONE_RESOURCE_POOL_EXHAUSTED") || !strings.Contains(err.Error(), inst.Operation) {
			t.Errorf("the failed insert is reported, classified, naming its operation: %v", err)
		}
		if err := b.CheckOperation(ctx, s.Ref, "operation-gone"); err != nil {
			t.Errorf("an operation GCP no longer knows says nothing: %v", err)
		}
	})

	t.Run("OperationsUnreadable", func(t *testing.T) {
		// A service account that may insert but not read operations (the
		// custom role of a Shared VPC host project without
		// compute.globalOperations.get): a wait that took the standing
		// 403 for "not done yet" would hand back a running operation
		// forever; the refusal is the answer, naming the permission.
		fake := gcpfake.Start(t)
		fake.SetOperationDuration(300 * time.Millisecond)
		b := newBackend(t, fake, "c1")
		fake.Fail("operations.wait", gcpfake.IAMDenied("compute.globalOperations.get", "projects/crawl-proj"))
		_, err := b.Create(ctx, spec("uid-unreadable"))
		if backend.ClassOf(err) != backend.ClassAccessDenied || !strings.Contains(err.Error(), "compute.globalOperations.get") {
			t.Errorf("a standing 403 on reading the operation is AccessDenied, naming the permission: %v", err)
		}
		// A poll that fails otherwise (a 5xx) only ends the wait: the
		// operation runs on, and is looked at later.
		fake.Fail("operations.wait", gcpfake.Failure{Code: 503, Reason: "backendError", Message: "Backend Error", Times: -1})
		inst, err := b.Create(ctx, spec("uid-5xx"))
		if err != nil || inst.Operation == "" {
			t.Errorf("a failing poll leaves the operation running: %+v, %v", inst, err)
		}
	})

	t.Run("Cancellable", func(t *testing.T) {
		fake := gcpfake.Start(t)
		fake.SetOperationDuration(time.Hour)
		b := newBackend(t, fake, "c1")
		cctx, cancel := context.WithTimeout(ctx, 6*time.Second)
		defer cancel()
		start := time.Now()
		inst, err := b.Create(cctx, spec("uid-cancel"))
		if err != nil {
			t.Fatal(err)
		}
		if time.Since(start) > 5*time.Second {
			t.Errorf("the wait leaves the caller's deadline room to record the outcome: took %s of 6s", time.Since(start))
		}
		if inst.Operation == "" {
			t.Error("the VM insert, cut short by the deadline, is returned as running")
		}
	})
}

// TestNameReuse: a VM being deleted keeps its name, STOPPING, and an insert
// of that name answers 409; Create must not take that VM for its own.
func TestNameReuse(t *testing.T) {
	ctx := context.Background()
	fake := gcpfake.Start(t)
	clock := frozen(fake)
	fake.SetOperationDuration(time.Minute)
	b, err := gcp.New(ctx, gcp.Config{Project: "crawl-proj", ClusterID: "c1", ClientOptions: fake.ClientOptions(), OperationTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close() }()
	s := spec("uid-reuse")
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	clock.add(2 * time.Minute)
	if err := b.Delete(ctx, s.Ref); err != nil {
		t.Fatal(err)
	}
	if vm := fake.Instance(s.Zone, s.Name); vm.GetStatus() != "STOPPING" {
		t.Fatalf("a deleted VM stays STOPPING for a while: %v", vm.GetStatus())
	}

	_, err = b.Create(ctx, s)
	if backend.ClassOf(err) != backend.ClassTransient || err.Error() != fmt.Sprintf(gcp.ErrFmtStillDeleting, s.Name, "STOPPING") {
		t.Fatalf("a 409 for a STOPPING VM is transient, not 'mine': %v", err)
	}
	clock.add(2 * time.Minute)
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatalf("once the old VM is gone the name is free: %v", err)
	}
	// The old rule's delete finished after the new Create found a rule of
	// its name in place: the new VM has none until Repair restores it.
	if fake.Firewall(s.Name) != nil {
		t.Fatal("the new rule is still being inserted")
	}
	if ok, _ := b.Repair(ctx, s); ok {
		t.Error("a VM whose rule is not in place is not repaired yet")
	}
	clock.add(2 * time.Minute)
	if ok, err := b.Repair(ctx, s); !ok || err != nil {
		t.Errorf("the rule is in place once its insert is done: %v, %v", ok, err)
	}

	newer := s
	newer.Hash = "def456"
	_, err = b.Create(ctx, newer)
	if backend.ClassOf(err) != backend.ClassTransient || err.Error() != fmt.Sprintf(gcp.ErrFmtEarlierSpec, s.Name, s.Hash) {
		t.Errorf("a 409 for a VM of another spec hash is not this spec's VM: %v", err)
	}
	restored := spec("uid-reuse")
	restored.Owner.ClusterID = "c2"
	_, err = b.Create(ctx, restored)
	if backend.ClassOf(err) != backend.ClassTransient || err.Error() != fmt.Sprintf(gcp.ErrFmtNameHeldByOther, s.Name, fake.Instance(s.Zone, s.Name).GetStatus()) {
		t.Errorf("a VM of the same UID but another cluster (a restored etcd) is not adopted: %v", err)
	}
	other := spec("uid-reuse")
	other.Owner.UID = "someone-else"
	_, err = b.Create(ctx, other)
	if backend.ClassOf(err) != backend.ClassTransient || err.Error() != fmt.Sprintf(gcp.ErrFmtNameHeldByOther, s.Name, fake.Instance(s.Zone, s.Name).GetStatus()) {
		t.Errorf("a 409 for a VM of another owner is not adopted: %v", err)
	}
	inst, err := b.Create(ctx, s)
	if err != nil || inst.SpecHash != s.Hash || inst.Owner.UID != s.Owner.UID {
		t.Errorf("a 409 for this Proxy's VM of this spec is adopted: %+v, %v", inst, err)
	}
}

// TestRuleDeletedUnderANewVM: the old rule's delete is still running when
// the replacement's Create finds a rule of its name, as the spec wants it,
// and inserts the VM; then the delete finishes and the new VM has no rule.
// Repair puts it back.
func TestRuleDeletedUnderANewVM(t *testing.T) {
	ctx := context.Background()
	fake := gcpfake.Start(t)
	clock := frozen(fake)
	b, err := gcp.New(ctx, gcp.Config{Project: "crawl-proj", ClusterID: "c1", ClientOptions: fake.ClientOptions(), OperationTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close() }()
	s := spec("uid-race")
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	clock.add(time.Minute)
	fc, err := compute.NewFirewallsRESTClient(ctx, fake.ClientOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fc.Close() }()
	ic, err := compute.NewInstancesRESTClient(ctx, fake.ClientOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ic.Close() }()
	// The old VM goes quickly, its rule slowly.
	fake.SetOperationDuration(10 * time.Minute)
	if _, err := fc.Delete(ctx, &computepb.DeleteFirewallRequest{Project: "crawl-proj", Firewall: s.Name}); err != nil {
		t.Fatal(err)
	}
	fake.SetOperationDuration(time.Second)
	if _, err := ic.Delete(ctx, &computepb.DeleteInstanceRequest{Project: "crawl-proj", Zone: s.Zone, Instance: s.Name}); err != nil {
		t.Fatal(err)
	}
	clock.add(2 * time.Second)

	if _, err := b.Create(ctx, s); err != nil {
		t.Fatalf("the replacement is created beside the rule being deleted: %v", err)
	}
	if ok, err := b.Repair(ctx, s); !ok || err != nil {
		t.Fatalf("the rule is there for now: %v, %v", ok, err)
	}
	clock.add(11 * time.Minute)
	if fake.Firewall(s.Name) != nil {
		t.Fatal("the old rule's delete has finished")
	}
	if ok, _ := b.Repair(ctx, s); ok {
		t.Error("the new VM without its rule is not in place")
	}
	clock.add(2 * time.Second)
	if ok, err := b.Repair(ctx, s); !ok || err != nil || fake.Firewall(s.Name) == nil {
		t.Errorf("Repair restores the rule: %v, %v", ok, err)
	}
}

// TestCredentials runs the credentials path for real: the fake demands a
// bearer token signed by a service-account key, and the backend gets one
// from the key the ProviderConfig would give it.
func TestCredentials(t *testing.T) {
	ctx := context.Background()
	fake := gcpfake.Start(t)
	key, err := fake.RequireAuth()
	if err != nil {
		t.Fatal(err)
	}
	opts := append([]option.ClientOption{option.WithAuthCredentialsJSON(option.ServiceAccount, key)}, fake.EndpointOptions()...)
	b, err := gcp.New(ctx, gcp.Config{Project: "crawl-proj", ClusterID: "c1", ClientOptions: opts})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close() }()
	if _, err := b.Create(ctx, spec("uid-auth")); err != nil {
		t.Fatalf("a valid service-account key authenticates: %v", err)
	}
	if fake.Authenticated() == 0 {
		t.Error("the fake saw no authenticated request")
	}

	anon := newBackend(t, fake, "c1")
	_, err = anon.Get(ctx, spec("uid-auth").Ref)
	if backend.ClassOf(err) != backend.ClassAccessDenied {
		t.Errorf("a request without credentials is refused, as AccessDenied: %v", err)
	}
}

// TestScaleUpHandsOff: 200 VMs of a fleet created as its scale-up does,
// by 20 reconcile workers (twice the provider's default
// --max-reconcile-rate), each insert running for a minute and each create
// handing off after 2 s (--gcp-operation-timeout): no create holds its
// worker longer than 10 s; each hands its running insert off as its
// Instance.Operation, every VM exists, one firewall rule lets them all
// in, and once the inserts are done CheckOperation finds nothing wrong.
// (200 creates at once, one goroutine each, measured the race detector
// and the CPU on a loaded 2-core CI machine rather than the backend: 11 s.)
func TestScaleUpHandsOff(t *testing.T) {
	const n, workers = 200, 20
	fake := gcpfake.Start(t)
	clock := frozen(fake)
	fake.SetOperationDuration(time.Minute)
	b, err := gcp.New(context.Background(), gcp.Config{Project: "crawl-proj", ClusterID: "c1", ClientOptions: fake.ClientOptions(), OperationTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	ctx := context.Background()
	specs := make([]backend.Spec, n)
	took := make([]time.Duration, n)
	insts := make([]*backend.Instance, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	queue := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range queue {
				cctx, cancel := context.WithTimeout(ctx, time.Minute) // the reconcile's deadline
				t0 := time.Now()
				insts[i], errs[i] = b.Create(cctx, specs[i])
				took[i] = time.Since(t0)
				cancel()
			}
		}()
	}
	for i := range n {
		specs[i] = spec(fmt.Sprintf("0b7c6a2e-%04d-4222-8333-944455556666", i))
		specs[i].Owner.Fleet = "crawlers"
		queue <- i
	}
	close(queue)
	wg.Wait()
	wall := time.Since(start)
	longest := slices.Max(took)
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("create %d: %v", i, errs[i])
		}
		if insts[i].Operation == "" {
			t.Fatalf("create %d returned without its running insert handed off", i)
		}
	}
	if longest > 10*time.Second {
		t.Errorf("a create held its worker %s; at most 10 s", longest)
	}
	if got := fake.Instances(); got != n {
		t.Errorf("%d VMs, want %d", got, n)
	}
	if rules := fake.FirewallNames(); len(rules) != 1 {
		t.Errorf("the fleet's VMs share one firewall rule: %d rules", len(rules))
	}
	t.Logf("%d creates by %d workers, inserts running 1 min: longest create %s, all returned in %s", n, workers, longest.Round(time.Millisecond), wall.Round(time.Millisecond))
	clock.add(2 * time.Minute)
	for i := range n {
		if err := b.CheckOperation(ctx, specs[i].Ref, insts[i].Operation); err != nil {
			t.Fatalf("insert %d ended in error: %v", i, err)
		}
	}
}
