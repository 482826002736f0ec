package discovery_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestDrainingProxies: a proxy the fleet is replacing (labelled
// draining-since) takes no new leases, and its leases are renewed only up to
// the drain start plus the fleet's maxTTL (1h by default), after which a
// renewal is refused with 409 and the crawler takes a new lease elsewhere.
func TestDrainingProxies(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "rolling", 2, 1, nil)
	srv := server(t, "tok "+ns+"\n")
	c := &apiv1.Client{BaseURL: srv.URL, Token: "tok"}
	ctx := context.Background()

	held, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/rolling", Holder: "crawler-1"})
	if err != nil {
		t.Fatal(err)
	}
	drain := func(since time.Time) {
		t.Helper()
		p := &v1alpha1.Proxy{}
		if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: held.Proxy}, p); err != nil {
			t.Fatal(err)
		}
		p.Labels[fleetv1alpha1.LabelDrainingSince] = strconv.FormatInt(since.Unix(), 10)
		if err := bed.Client.Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	drain(time.Now().Add(-50 * time.Minute))
	if err := c.Release(ctx, held.LeaseID); err != nil {
		t.Fatal(err)
	}
	// Released, the draining proxy has a free slot, which nobody gets.
	testbed.Eventually(t, 10*time.Second, "the draining proxy left out of the list", func() (bool, string) {
		pl, err := c.Proxies(ctx, ns+"/rolling", "")
		return err == nil && len(pl.Items) == 1 && pl.Items[0].Name != held.Proxy, ""
	})
	other, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/rolling", Holder: "crawler-2"})
	if err != nil || other.Proxy == held.Proxy {
		t.Fatalf("a new lease goes to the proxy that is not draining: %+v %v", other, err)
	}
	var ae *apiv1.APIError
	if _, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/rolling", Holder: "crawler-3"}); !asAPIError(err, &ae) || ae.Status != http.StatusConflict {
		t.Fatalf("the only free slot is on the draining proxy: want 409, got %v", err)
	}

	// A lease taken before the drain began: renewed up to drain + maxTTL.
	p := &v1alpha1.Proxy{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: held.Proxy}, p); err != nil {
		t.Fatal(err)
	}
	delete(p.Labels, fleetv1alpha1.LabelDrainingSince)
	if err := bed.Client.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	var before *apiv1.Lease
	testbed.Eventually(t, 10*time.Second, "a lease on the proxy before it drains", func() (bool, string) {
		before, err = c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/rolling", Holder: "crawler-4"})
		return err == nil && before.Proxy == held.Proxy, ""
	})
	start := time.Now().Add(-50 * time.Minute)
	drain(start)
	testbed.Eventually(t, 10*time.Second, "a renewal capped at the drain start plus maxTTL", func() (bool, string) {
		g, err := c.Renew(ctx, before.LeaseID, "30m")
		if err != nil {
			return false, err.Error()
		}
		return !g.ExpiresAt.After(start.Add(time.Hour).Add(time.Second)), g.ExpiresAt.String()
	})
	drain(time.Now().Add(-2 * time.Hour))
	testbed.Eventually(t, 10*time.Second, "a renewal past the drain start plus maxTTL refused", func() (bool, string) {
		_, err := c.Renew(ctx, before.LeaseID, "5m")
		return asAPIError(err, &ae) && ae.Status == http.StatusConflict && strings.Contains(ae.Detail.Message, "is being replaced"), ""
	})
}

// TestOutdatedCredentialsProxies: a proxy that accepts only the auth
// Secret's previous credentials (a GCP VM its fleet is replacing after a
// password change) is neither listed nor given a new lease, since
// discovery would hand out credentials it refuses; a lease taken on it
// before is still renewed, for its crawler holds the credentials it takes.
func TestOutdatedCredentialsProxies(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "vms", 2, 2, nil)
	srv := server(t, "tok "+ns+"\n")
	c := &apiv1.Client{BaseURL: srv.URL, Token: "tok"}
	ctx := context.Background()
	held, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/vms", Holder: "crawler-1"})
	if err != nil {
		t.Fatal(err)
	}
	if g, err := c.Renew(ctx, held.LeaseID, "5m"); err != nil || g.ProxyURL != held.ProxyURL {
		t.Fatalf("a renewal hands out the proxy's URL with the credentials it takes now, %q: %+v %v", held.ProxyURL, g, err)
	}
	p := &v1alpha1.Proxy{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: held.Proxy}, p); err != nil {
		t.Fatal(err)
	}
	p.Status.AtProvider.CredentialsOutdated = true
	if err := bed.Client.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, "the outdated proxy left out of the list", func() (bool, string) {
		pl, err := c.Proxies(ctx, ns+"/vms", "")
		return err == nil && len(pl.Items) == 1 && pl.Items[0].Name != held.Proxy, ""
	})
	for i := range 2 {
		g, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/vms", Holder: "crawler-" + strconv.Itoa(i+2)})
		if err != nil || g.Proxy == held.Proxy {
			t.Fatalf("a new lease goes to the proxy with current credentials: %+v %v", g, err)
		}
	}
	var ae *apiv1.APIError
	if _, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/vms", Holder: "crawler-4"}); !asAPIError(err, &ae) || ae.Status != http.StatusConflict {
		t.Fatalf("the only free slot is on the outdated proxy: want 409, got %v", err)
	}
	if g, err := c.Renew(ctx, held.LeaseID, "5m"); err != nil || g.ProxyURL != "" {
		t.Errorf("the lease on the outdated proxy must still renew, with no new URL (the crawler keeps the credentials it has): %+v %v", g, err)
	}
}

// blindToLeases is a cache that has seen no Lease yet.
type blindToLeases struct{ client.Reader }

func (b blindToLeases) List(ctx context.Context, l client.ObjectList, opts ...client.ListOption) error {
	if _, ok := l.(*coordv1.LeaseList); ok {
		return nil
	}
	return b.Reader.List(ctx, l, opts...)
}
