package discovery_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	dmetrics "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
)

// TestPoolSeries: a pooled fleet has its proxies and healthy proxies
// counted per pool, so that a pool with none healthy (its zone out, its
// composition failing) shows beside the fleet's totals; a fleet of one
// level has no pool series.
func TestPoolSeries(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	// Pool 1: crawlers-0..2, of which 1 is unhealthy; pool 2: crawlers-3
	// and 4, neither healthy.
	fleet(t, ns, "crawlers", 5, 1, func(i int) bool { return i != 1 && i < 3 })
	for i, pool := range []string{"crawlers-pool-1", "crawlers-pool-1", "crawlers-pool-1", "crawlers-pool-2", "crawlers-pool-2"} {
		p := &v1alpha1.Proxy{}
		if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: fmt.Sprintf("crawlers-%d", i)}, p); err != nil {
			t.Fatal(err)
		}
		p.Labels[fleetv1alpha1.LabelPool] = pool
		if err := bed.Client.Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	plain := bed.Namespace(t)
	fleet(t, plain, "plain", 2, 1, nil)

	s := discovery.NewServer(discovery.ServerConfig{
		Catalog: discovery.NewCatalog(discovery.CatalogConfig{Cache: bed.Client, Direct: bed.Client, Fleets: bed.Client}),
		Leases:  lease.NewStore(lease.StoreConfig{Client: bed.Client}), Metrics: dmetrics.NewDiscovery(), Log: logging.NewNopLogger(),
	})
	c := discovery.FleetCollector{Server: s}
	want := map[string]map[string]float64{
		"egress_pool_proxies":         {"crawlers-pool-1": 3, "crawlers-pool-2": 2},
		"egress_pool_healthy_proxies": {"crawlers-pool-1": 2, "crawlers-pool-2": 0},
	}
	for name, w := range want {
		if diff := cmp.Diff(w, poolGauges(t, c, name, ns)); diff != "" {
			t.Errorf("%s of the pooled fleet (-want +got):\n%s", name, diff)
		}
		if got := poolGauges(t, c, name, plain); len(got) != 0 {
			t.Errorf("%s of a fleet of one level: %v, want none", name, got)
		}
	}
	if got, ok := fleetGauge(t, c, "egress_fleet_healthy_proxies", ns); !ok || got != 2 {
		t.Errorf("egress_fleet_healthy_proxies of the pooled fleet: %v (%v), want the pools' sum 2", got, ok)
	}
}

// poolGauges is the metric name of namespace ns's pools, by pool.
func poolGauges(t *testing.T, c prometheus.Collector, name, ns string) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] == ns {
				out[labels["pool"]] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}
