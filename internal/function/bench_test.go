package function

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"testing"
	"time"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/resource"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
)

// fleetRequest is a request for an n-replica fleet with n observed, Ready,
// healthy proxies over three zones, and no leases.
func fleetRequest(n int) *fnv1.RunFunctionRequest {
	spec := fmt.Sprintf(`{"replicas": %d, "zones": ["a", "b", "c"], "placement": {"local": {}},
		"proxy": {"authSecretRef": {"name": "auth"}}, "healthCheck": {"url": "https://example.com/ip"},
		"rotation": {"maxAge": "24h"}}`, n)
	observed := make(map[string]*fnv1.Resource, n)
	zones := []string{"a", "b", "c"}
	for i := range n {
		observed[resourceName(i)] = observedProxy(i, zones[i%3], true, t0.Add(-time.Hour), "")
	}
	return &fnv1.RunFunctionRequest{
		Observed:          &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}, Resources: observed},
		RequiredResources: noLeases(),
	}
}

func benchmarkRun(b *testing.B, n int) {
	f := New(Config{Log: logging.NewNopLogger(), Now: func() time.Time { return t0 }})
	req := fleetRequest(n)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		rsp, err := f.RunFunction(context.Background(), req)
		if err != nil || len(rsp.GetDesired().GetResources()) != n {
			b.Fatalf("want %d desired proxies, got %d (%v)", n, len(rsp.GetDesired().GetResources()), err)
		}
	}
}

// BenchmarkRunFunction measures one RunFunction of a steady fleet: every
// proxy observed Ready, nothing to change.
func BenchmarkRunFunction(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) { benchmarkRun(b, n) })
	}
}

// BenchmarkRunFunctionFromWire decodes the request from protobuf wire bytes
// on every call, as the gRPC server does before calling RunFunction, so each
// call reads freshly decoded memory as in production rather than one request
// kept warm (or, at 10 000 replicas, cold) across calls.
func BenchmarkRunFunctionFromWire(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			f := New(Config{Log: logging.NewNopLogger(), Now: func() time.Time { return t0 }})
			wire, err := proto.Marshal(fleetRequest(n))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				req := &fnv1.RunFunctionRequest{}
				if err := proto.Unmarshal(wire, req); err != nil {
					b.Fatal(err)
				}
				if _, err := f.RunFunction(context.Background(), req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRunFunctionScaling reports how the time per call grows from 1000
// to 10 000 replicas, both measured in this process: the ratio is what is
// compared against the goal (≤ 12), the absolute times are for this
// machine. Each call gets a request freshly decoded from wire bytes, as from
// the gRPC server; "ratio" times RunFunction alone, "wire-ratio" decoding
// included.
func BenchmarkRunFunctionScaling(b *testing.B) {
	f := New(Config{Log: logging.NewNopLogger(), Now: func() time.Time { return t0 }})
	fn, wire := map[int]time.Duration{}, map[int]time.Duration{}
	for _, n := range []int{1000, 10000} {
		raw, err := proto.Marshal(fleetRequest(n))
		if err != nil {
			b.Fatal(err)
		}
		// The fastest of several rounds: the machine is shared and noisy,
		// and the minimum is the best estimate of the code's own cost.
		runtime.GC()
		fn[n], wire[n] = time.Hour, time.Hour
		for range 8 {
			start := time.Now()
			req := &fnv1.RunFunctionRequest{}
			if err := proto.Unmarshal(raw, req); err != nil {
				b.Fatal(err)
			}
			decoded := time.Now()
			if _, err := f.RunFunction(context.Background(), req); err != nil {
				b.Fatal(err)
			}
			fn[n] = min(fn[n], time.Since(decoded))
			wire[n] = min(wire[n], time.Since(start))
		}
	}
	for b.Loop() {
	}
	b.ReportMetric(float64(fn[1000].Microseconds())/1000, "ms/1k")
	b.ReportMetric(float64(fn[10000].Microseconds())/1000, "ms/10k")
	b.ReportMetric(float64(fn[10000])/float64(fn[1000]), "ratio")
	b.ReportMetric(float64(wire[1000].Microseconds())/1000, "wire-ms/1k")
	b.ReportMetric(float64(wire[10000])/float64(wire[1000]), "wire-ratio")
}

// pooledRequest is the request of a steady pooled fleet of n replicas in
// pools of perPool: every pool observed as it reports itself when all its
// proxies are Ready and nothing is due.
func pooledRequest(tb testing.TB, n, perPool int) *fnv1.RunFunctionRequest {
	tb.Helper()
	spec := fmt.Sprintf(`{"replicas": %d, "zones": ["a", "b", "c"], "placement": {"local": {}},
		"proxy": {"authSecretRef": {"name": "auth"}}, "healthCheck": {"url": "https://example.com/ip"},
		"rotation": {"maxAge": "24h"}, "pools": {"proxiesPerPool": %d}}`, n, perPool)
	f, err := parseFleet("crawlers", "team", mustMap(tb, spec))
	if err != nil {
		tb.Fatal(err)
	}
	observed := map[string]*fnv1.Resource{}
	for _, p := range sizePools(n, perPool, f.Zones, nil) {
		r, err := f.pool(p, nil)
		if err != nil {
			tb.Fatal(err)
		}
		o := r.GetResource()
		status, err := structpb.NewStruct(map[string]any{
			"replicas": p.replicas, "desiredReplicas": p.replicas, "readyReplicas": p.replicas, "healthyReplicas": p.replicas,
			"updatedReplicas": p.replicas, "observedRevision": f.Revision,
			"budget":     map[string]any{},
			"conditions": []any{map[string]any{"type": "Ready", "status": "True"}},
		})
		if err != nil {
			tb.Fatal(err)
		}
		o.Fields["status"] = structpb.NewStructValue(status)
		observed[poolResourceName(p.index)] = &fnv1.Resource{Resource: o}
	}
	return &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr(spec)}, Resources: observed}}
}

// poolRequest is the request of one steady, full pool of n proxies.
func poolRequest(tb testing.TB, n int) *fnv1.RunFunctionRequest {
	tb.Helper()
	base := fleetv1alpha1.PoolOrdinalSpan
	observed := make(map[string]*fnv1.Resource, n)
	for i := range n {
		observed[resourceName(base+i)] = observedProxy(base+i, []string{"a", "b", "c"}[i%3], true, t0.Add(-time.Hour), "")
	}
	tmpl := mustMap(tb, fmt.Sprintf(`{"replicas": %d, "zones": ["a", "b", "c"], "placement": {"local": {}},
		"proxy": {"authSecretRef": {"name": "auth"}}, "healthCheck": {"url": "https://example.com/ip"}, "rotation": {"maxAge": "24h"}}`, n))
	b, err := json.Marshal(map[string]any{"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
		"metadata": map[string]any{"name": "crawlers-pool-1", "namespace": "team"},
		"spec":     map[string]any{"fleet": "crawlers", "index": 1, "template": tmpl}})
	if err != nil {
		tb.Fatal(err)
	}
	return &fnv1.RunFunctionRequest{
		Observed:          &fnv1.State{Composite: &fnv1.Resource{Resource: resource.MustStructJSON(string(b))}, Resources: observed},
		RequiredResources: poolSummaries(inPool("crawlers-pool-1", leaseSummary("crawlers", "r1", t0, nil, nil, leasewire.Demand{}))),
	}
}

// BenchmarkPooledFleet times one RunFunction of a steady pooled fleet of
// 100, 1 000 and 10 000 proxies in pools of 105 (1, 10 and 96 pools), and
// of one full pool of 105 and of 120, each the fastest of several rounds in
// this process: the fleet's cost grows with its pools, a pool's with its
// own proxies only, so no composition of a fleet of any size costs more
// than that of 96 pools or of one pool of 120.
func BenchmarkPooledFleet(b *testing.B) {
	f := New(Config{Log: logging.NewNopLogger(), Now: func() time.Time { return t0 }})
	fastest := func(req *fnv1.RunFunctionRequest, want int) time.Duration {
		raw, err := proto.Marshal(req)
		if err != nil {
			b.Fatal(err)
		}
		best := time.Hour
		runtime.GC()
		for range 8 {
			in := &fnv1.RunFunctionRequest{}
			if err := proto.Unmarshal(raw, in); err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			rsp, err := f.RunFunction(context.Background(), in)
			if err != nil || len(rsp.GetDesired().GetResources()) < want {
				b.Fatalf("want at least %d desired resources, got %d (%v, %v)", want, len(rsp.GetDesired().GetResources()), err, rsp.GetResults())
			}
			best = min(best, time.Since(start))
		}
		return best
	}
	fleet := map[int]time.Duration{}
	for _, n := range []int{100, 1000, 10000} {
		fleet[n] = fastest(pooledRequest(b, n, 105), (n+104)/105)
	}
	pool105, pool120 := fastest(poolRequest(b, 105), 105), fastest(poolRequest(b, 120), 120)
	for b.Loop() {
	}
	for _, n := range []int{100, 1000, 10000} {
		b.ReportMetric(float64(fleet[n].Microseconds())/1000, fmt.Sprintf("fleet-ms/n=%d", n))
	}
	b.ReportMetric(float64(fleet[10000])/float64(fleet[1000]), "fleet-ratio-10k/1k")
	b.ReportMetric(float64(pool105.Microseconds())/1000, "pool-ms/105")
	b.ReportMetric(float64(pool120.Microseconds())/1000, "pool-ms/120")
}
