package discovery_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	coordv1 "k8s.io/api/coordination/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	dmetrics "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
)

// BenchmarkListProxies lists a 1000-proxy fleet through the discovery
// handler, wired as cmd/discovery wires it (a watch cache of Proxies and
// Leases bumping the snapshot version), against a bare net/http handler
// writing the same bytes, in the same process. The ratio is bare ns/op over
// discovery ns/op: 1 means as fast as serving a static body.
func BenchmarkListProxies(b *testing.B) {
	ctx := context.Background()
	bed := sharedBed.Env(b)
	ns := bed.Namespace(b)
	fleet(b, ns, "big", 1000, 2, nil)
	c, ca := bed.Replica(b, ns, &coordv1.Lease{}, &v1alpha1.Proxy{})
	var version atomic.Uint64
	for _, o := range []client.Object{&coordv1.Lease{}, &v1alpha1.Proxy{}} {
		inf, err := ca.GetInformer(ctx, o)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: func(any) { version.Add(1) }, DeleteFunc: func(any) { version.Add(1) }, UpdateFunc: func(any, any) { version.Add(1) },
		}); err != nil {
			b.Fatal(err)
		}
	}
	st := staticTokens(b, "t "+ns+"\n")
	srv := func(v func() uint64) http.Handler {
		return (discovery.NewServer(discovery.ServerConfig{
			Catalog: discovery.NewCatalog(discovery.CatalogConfig{Cache: ca, Direct: c}), Leases: lease.NewStore(lease.StoreConfig{Client: c, Cache: ca}),
			Auth: discovery.NewKubernetes(discovery.KubernetesConfig{Client: c, Static: st}), Metrics: dmetrics.NewDiscovery(), Log: logging.NewNopLogger(),
			Version: v,
		})).Handler()
	}
	h := srv(version.Load)
	// Without snapshots every listing is rendered from the cache: the cost
	// of the first request after a change.
	uncached := srv(nil)
	req := func() *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/v1/fleets/"+ns+"/big/proxies", nil)
		r.Header.Set("Authorization", "Bearer t")
		return r
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req())
	if rec.Code != http.StatusOK || rec.Body.Len() < 100000 {
		b.Fatalf("listing the fleet: %d, %d bytes", rec.Code, rec.Body.Len())
	}
	body := rec.Body.Bytes()
	bare := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})

	measure := func(h http.Handler) time.Duration {
		const n = 2000
		start := time.Now()
		for range n {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req())
			if rec.Code != http.StatusOK {
				b.Fatalf("status %d", rec.Code)
			}
		}
		return time.Since(start) / n
	}
	b.ResetTimer()
	var disc, raw, render time.Duration
	for b.Loop() {
		disc, raw, render = measure(h), measure(bare), measure(uncached)
	}
	b.ReportMetric(float64(disc.Microseconds()), "discovery-us/list")
	b.ReportMetric(float64(raw.Microseconds()), "bare-us/list")
	b.ReportMetric(float64(raw)/float64(disc), "ratio")
	b.ReportMetric(float64(len(body)), "bytes")
	b.ReportMetric(float64(render.Microseconds()), "render-us/list")
}
