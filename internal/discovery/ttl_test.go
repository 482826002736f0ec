package discovery_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
)

// reader answers every Get with err, or with obj's spec when err is nil.
type reader struct {
	err  error
	spec map[string]any
}

func (r reader) Get(_ context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	if r.err != nil {
		return r.err
	}
	if u, ok := obj.(*unstructured.Unstructured); ok {
		u.Object["spec"] = r.spec
	}
	return nil
}

func (r reader) List(context.Context, client.ObjectList, ...client.ListOption) error { return r.err }

// TestTTLsFailClosed: a fleet's lease TTLs that cannot be read are an
// error, never the defaults (an hour), which could be longer than the
// fleet allows; a fleet without a ProxyFleet or claim, or a cluster
// without their kinds, gets the defaults; and a failed read is not
// remembered.
func TestTTLsFailClosed(t *testing.T) {
	gr := schema.GroupResource{Group: fleetv1alpha1.Group, Resource: "proxyfleets"}
	capped := map[string]any{"leases": map[string]any{"defaultTTL": "1m", "maxTTL": "5m"}}
	for name, tc := range map[string]struct {
		r        reader
		def, max time.Duration
		fails    bool
	}{
		"Read":             {r: reader{spec: capped}, def: time.Minute, max: 5 * time.Minute},
		"APIServerDown":    {r: reader{err: kerrors.NewServiceUnavailable("etcd is down")}, fails: true},
		"Timeout":          {r: reader{err: kerrors.NewTimeoutError("slow", 1)}, fails: true},
		"Unparsable":       {r: reader{spec: map[string]any{"leases": map[string]any{"maxTTL": "forever"}}}, fails: true},
		"NoFleet":          {r: reader{err: kerrors.NewNotFound(gr, "f")}, def: fleetv1alpha1.DefaultLeaseTTL, max: fleetv1alpha1.DefaultMaxLeaseTTL},
		"KindNotInstalled": {r: reader{err: &meta.NoKindMatchError{GroupKind: gr.WithVersion("v1alpha1").GroupVersion().WithKind("ProxyFleet").GroupKind()}}, def: fleetv1alpha1.DefaultLeaseTTL, max: fleetv1alpha1.DefaultMaxLeaseTTL},
	} {
		t.Run(name, func(t *testing.T) {
			c := discovery.NewCatalog(discovery.CatalogConfig{Direct: tc.r})
			def, maxTTL, err := c.TTLs(context.Background(), "ns", "f")
			if tc.fails {
				if err == nil || tc.r.err != nil && !errors.Is(err, tc.r.err) || tc.r.err == nil && !strings.Contains(err.Error(), "forever") {
					t.Fatalf("want the read's error, got %v (defaultTTL %s maxTTL %s)", err, def, maxTTL)
				}
				// Not remembered: the next read, once the fleet can be
				// read, has its TTLs.
				c.Direct = reader{spec: capped}
				if def, maxTTL, err := c.TTLs(context.Background(), "ns", "f"); err != nil || maxTTL != 5*time.Minute || def != time.Minute {
					t.Errorf("after the failure: %s %s %v", def, maxTTL, err)
				}
				return
			}
			if err != nil || def != tc.def || maxTTL != tc.max {
				t.Errorf("got %s %s %v, want %s %s", def, maxTTL, err, tc.def, tc.max)
			}
		})
	}
}

// TestProxyExists: the sweeper lets a lease go with its Proxy only when the
// cache knows the Proxy gone; any other error keeps it.
func TestProxyExists(t *testing.T) {
	gr := schema.GroupResource{Group: "egress.crawl.example.com", Resource: "proxies"}
	for name, tc := range map[string]struct {
		err  error
		want bool
	}{
		"Found":     {nil, true},
		"Gone":      {kerrors.NewNotFound(gr, "p"), false},
		"CacheDown": {errors.New("the cache is not synced"), true},
		"Timeout":   {kerrors.NewTimeoutError("slow", 1), true},
	} {
		if got := discovery.ProxyExists(context.Background(), reader{err: tc.err})("ns", "p"); got != tc.want {
			t.Errorf("%s: exists %v, want %v", name, got, tc.want)
		}
	}
}

// TestTTLsStandInBriefly: TTLs read a while ago stand in, for up to five
// minutes, when they cannot be read again; after that the fleet fails
// closed.
func TestTTLsStandInBriefly(t *testing.T) {
	now := time.Unix(1000, 0)
	capped := map[string]any{"leases": map[string]any{"defaultTTL": "1m", "maxTTL": "5m"}}
	c := discovery.NewCatalog(discovery.CatalogConfig{Direct: reader{spec: capped}, Now: func() time.Time { return now }})
	if _, _, err := c.TTLs(context.Background(), "ns", "f"); err != nil {
		t.Fatal(err)
	}
	c.Direct = reader{err: kerrors.NewServiceUnavailable("etcd is down")}
	now = now.Add(4 * time.Minute)
	if _, maxTTL, err := c.TTLs(context.Background(), "ns", "f"); err != nil || maxTTL != 5*time.Minute {
		t.Errorf("4 minutes after a good read: want the TTLs read then, got %s %v", maxTTL, err)
	}
	now = now.Add(2 * time.Minute)
	if _, maxTTL, err := c.TTLs(context.Background(), "ns", "f"); !kerrors.IsServiceUnavailable(err) {
		t.Errorf("6 minutes after a good read: want the apiserver's error, got %s %v", maxTTL, err)
	}
}
