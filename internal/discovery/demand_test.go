package discovery_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	coordv1 "k8s.io/api/coordination/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// autoscale sets a fleet XR's spec.autoscaling and returns the XR.
func autoscale(t *testing.T, ns, name string, spec map[string]any) *unstructured.Unstructured {
	t.Helper()
	c := sharedBed.Env(t).Client
	xr := &unstructured.Unstructured{}
	xr.SetGroupVersionKind(fleetv1alpha1.SchemeGroupVersion.WithKind(fleetv1alpha1.ProxyFleetKind))
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, xr); err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedMap(xr.Object, spec, "spec", "autoscaling")
	if err := c.Update(context.Background(), xr); err != nil {
		t.Fatal(err)
	}
	return xr
}

// clock is a settable clock for the server and its publisher.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *clock) add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.t = c.t.Add(d) }

// TestDemandPublished: a replica publishes its share of an autoscaled
// fleet's demand to a demand Lease the function reads: nothing while
// nothing is asked for; the leases held, the acquisitions refused within
// the last minute and those waiting now; no more than once every 10 s;
// again every 30 s while not zero, so it stays fresh; and it deletes the
// Lease when the fleet is no longer autoscaled, and any replica's Lease of
// a fleet that is gone.
func TestDemandPublished(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	ctx := context.Background()
	fleet(t, ns, "crawlers", 1, 1, nil)
	fleetXR(t, ns, "crawlers", 1, map[string]any{"admission": map[string]any{"maxWait": "5s"}})
	xr := autoscale(t, ns, "crawlers", map[string]any{"maxReplicas": int64(5)})

	clk := &clock{t: time.Now()}
	srv, s := serverOf(t, "team-token "+ns+" crawler\n", func(x *discovery.ServerConfig) { x.Now = clk.now })
	pub := discovery.NewDemandPublisher(discovery.DemandPublisherConfig{Server: s, Client: bed.Client, Fleets: bed.Client, Replica: "replica-1", Log: logging.NewNopLogger()})
	name := leasewire.DemandName("crawlers", "replica-1")
	published := func() (leasewire.Demand, bool) {
		t.Helper()
		if err := pub.Publish(ctx); err != nil {
			t.Fatal(err)
		}
		l := &coordv1.Lease{}
		err := bed.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, l)
		if kerrors.IsNotFound(err) {
			return leasewire.Demand{}, false
		}
		if err != nil {
			t.Fatal(err)
		}
		d, fresh := leasewire.ReadDemand(l, "crawlers", clk.now())
		if !fresh {
			t.Fatalf("the demand Lease just published does not count: %+v", l)
		}
		return d, true
	}
	if _, ok := published(); ok {
		t.Fatal("with nothing asked for, no demand Lease is written")
	}

	c := &apiv1.Client{BaseURL: srv.URL, Token: "team-token"}
	held, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "a", MaxWait: "0s"})
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := published(); !ok || d != (leasewire.Demand{Held: 1}) {
		t.Fatalf("one lease held: published %+v (%v), want held 1", d, ok)
	}
	if _, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "b", MaxWait: "0s"}); apiErr(err) == nil || apiErr(err).Detail.Reason != apiv1.ReasonNoFreeSlot {
		t.Fatalf("a second acquisition of a one-slot fleet: want NoFreeSlot, got %v", err)
	}
	if d, _ := published(); d.Refused != 0 {
		t.Errorf("published again within 10 s of the last: %+v", d)
	}
	clk.add(leasewire.DemandInterval)
	if d, _ := published(); d != (leasewire.Demand{Held: 1, Refused: 1}) {
		t.Errorf("10 s on, the refusal is published: %+v", d)
	}

	// An acquisition waiting for the slot counts as waiting while it waits.
	done := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "c", MaxWait: "5s"})
		done <- err
	}()
	testbed.Eventually(t, 5*time.Second, "the waiting acquisition published", func() (bool, string) {
		clk.add(leasewire.DemandInterval)
		d, _ := published()
		return d.Waiting == 1, fmt.Sprintf("%+v", d)
	})
	if err := c.Release(ctx, held.LeaseID); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the waiting acquisition is granted the released slot: %v", err)
	}

	// A minute on, the refusal no longer counts; while a lease is held the
	// Lease is rewritten every 30 s, so it stays fresh.
	clk.add(time.Minute)
	if d, _ := published(); d != (leasewire.Demand{Held: 1}) {
		t.Errorf("a minute after the refusal: %+v, want held 1 only", d)
	}
	before := &coordv1.Lease{}
	if err := bed.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, before); err != nil {
		t.Fatal(err)
	}
	clk.add(leasewire.DemandRefresh)
	published()
	after := &coordv1.Lease{}
	if err := bed.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, after); err != nil {
		t.Fatal(err)
	}
	if !after.Spec.RenewTime.After(before.Spec.RenewTime.Time) {
		t.Errorf("an unchanged demand above zero is rewritten every %s: renewTime %s then %s", leasewire.DemandRefresh, before.Spec.RenewTime, after.Spec.RenewTime)
	}

	// Another replica's Lease of a fleet that is gone is swept; one of a
	// fleet that exists is not.
	orphan := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: leasewire.DemandName("gone", "replica-9")}}
	leasewire.SetDemand(orphan, "gone", "replica-9", leasewire.Demand{Waiting: 3}, clk.now())
	other := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: leasewire.DemandName("crawlers", "replica-9")}}
	leasewire.SetDemand(other, "crawlers", "replica-9", leasewire.Demand{Waiting: 3}, clk.now())
	for _, l := range []*coordv1.Lease{orphan, other} {
		if err := bed.Client.Create(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	clk.add(leasewire.DemandRefresh)
	published()
	if err := bed.Client.Get(ctx, client.ObjectKeyFromObject(orphan), &coordv1.Lease{}); !kerrors.IsNotFound(err) {
		t.Errorf("the demand Lease of a fleet that is gone is swept: %v", err)
	}
	if err := bed.Client.Get(ctx, client.ObjectKeyFromObject(other), &coordv1.Lease{}); err != nil {
		t.Errorf("another replica's demand Lease of a live fleet stays: %v", err)
	}

	// No longer autoscaled: the replica deletes its Lease.
	if err := bed.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "crawlers"}, xr); err != nil {
		t.Fatal(err)
	}
	unstructured.RemoveNestedField(xr.Object, "spec", "autoscaling")
	if err := bed.Client.Update(ctx, xr); err != nil {
		t.Fatal(err)
	}
	if _, ok := published(); ok {
		t.Error("a fleet no longer autoscaled keeps this replica's demand Lease")
	}
}

// TestStatusPageShowsSizing: the status page shows each fleet's desired
// against actual proxies, and for an autoscaled fleet why, and the demand
// it was sized by, as the function recorded them in the XR's status.
func TestStatusPageShowsSizing(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	ctx := context.Background()
	fleet(t, ns, "elastic", 2, 3, nil)
	fleet(t, ns, "fixed", 1, 1, nil)
	fleetXR(t, ns, "elastic", 1, nil)
	fleetXR(t, ns, "fixed", 1, nil)
	setStatus := func(name string, autoscaling map[string]any, status map[string]any) {
		t.Helper()
		xr := &unstructured.Unstructured{}
		xr.SetGroupVersionKind(fleetv1alpha1.SchemeGroupVersion.WithKind(fleetv1alpha1.ProxyFleetKind))
		if err := bed.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, xr); err != nil {
			t.Fatal(err)
		}
		if autoscaling != nil {
			xr = autoscale(t, ns, name, autoscaling)
		}
		_ = unstructured.SetNestedMap(xr.Object, status, "status")
		if err := bed.Client.Status().Update(ctx, xr); err != nil {
			t.Fatal(err)
		}
	}
	setStatus("elastic", map[string]any{"maxReplicas": int64(6)}, map[string]any{
		"desiredReplicas": int64(4),
		"autoscaling":     map[string]any{"reason": "utilization 1.33 > 0.70", "held": int64(5), "waiting": int64(2), "refused": int64(1), "capacity": int64(6)},
	})
	setStatus("fixed", nil, map[string]any{"desiredReplicas": int64(1)})
	srv := server(t, "team-token "+ns+"\n")
	code, _, body := call(t, srv, "team-token", "GET", "/", "")
	page := string(body)
	for _, want := range []string{
		"desired 4, actual 2, sized by lease demand: utilization 1.33 &gt; 0.70",
		"demand: 5 leases held, 2 waiting, 1 refused in the last minute; capacity 6",
		"desired 1, actual 1, set by spec.replicas",
	} {
		if code != 200 || !strings.Contains(page, want) {
			t.Errorf("the status page shows %q (%d):\n%s", want, code, page)
		}
	}
}

// TestAutoscaledFleetWakesFromZero: an acquisition of an autoscaled fleet
// with no proxy waits, and counts as demand, rather than being told the
// fleet does not exist; it is granted once a proxy is Ready. A fleet that
// is not autoscaled and has no proxy is still not found.
func TestAutoscaledFleetWakesFromZero(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	ctx := context.Background()
	fleetXR(t, ns, "elastic", 1, map[string]any{"admission": map[string]any{"maxWait": "20s"}})
	fleetXR(t, ns, "fixed", 1, nil)
	autoscale(t, ns, "elastic", map[string]any{"minReplicas": int64(0), "maxReplicas": int64(3)})
	srv, s := serverOf(t, "team-token "+ns+" crawler\n")
	c := &apiv1.Client{BaseURL: srv.URL, Token: "team-token"}
	if _, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/fixed", Holder: "a"}); apiErr(err) == nil || apiErr(err).Status != 404 {
		t.Errorf("a fixed-size fleet without proxies: want 404, got %v", err)
	}
	pub := discovery.NewDemandPublisher(discovery.DemandPublisherConfig{Server: s, Client: bed.Client, Fleets: bed.Client, Replica: "replica-1", Log: logging.NewNopLogger()})
	done := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/elastic", Holder: "a", MaxWait: "15s"})
		done <- err
	}()
	testbed.Eventually(t, 10*time.Second, "the waiting acquisition of a fleet at zero published", func() (bool, string) {
		if err := pub.Publish(ctx); err != nil {
			return false, err.Error()
		}
		l := &coordv1.Lease{}
		if err := bed.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: leasewire.DemandName("elastic", "replica-1")}, l); err != nil {
			return false, err.Error()
		}
		d, _ := leasewire.ReadDemand(l, "elastic", time.Now())
		return d.Waiting == 1, fmt.Sprintf("%+v", d)
	})
	fleet(t, ns, "elastic", 1, 1, nil)
	if err := <-done; err != nil {
		t.Errorf("the acquisition that waited for the fleet to wake: %v", err)
	}
}
