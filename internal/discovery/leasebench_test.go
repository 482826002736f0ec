package discovery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	coordv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	dmetrics "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// BenchmarkLeaseAPI compares, in 5 rounds in one process and at the same
// concurrency (64 crawlers), lease acquire+release through discovery's
// handler, with every bound on (identity-bound leases, a quota per
// identity, admission control with a minimum healthy share and a wait),
// with raw create+delete of Lease objects: the handler's rate as a
// fraction of the raw rate, and its acquire p99 against the raw create
// p99, each the median of the rounds.
func BenchmarkLeaseAPI(b *testing.B) {
	const (
		crawlers  = 64
		perRound  = 30
		rounds    = 5
		maxLeases = 2
	)
	ctx := context.Background()
	bed := sharedBed.Env(b)
	ns := bed.Namespace(b)
	fleet(b, ns, "crawlers", crawlers, maxLeases, nil)
	fleetXR(b, ns, "crawlers", crawlers, map[string]any{
		"maxLeasesPerProxy": int64(maxLeases),
		"admission":         map[string]any{"minHealthyFraction": 0.5, "maxWait": "5s"},
		"quotas":            map[string]any{"maxLeasesPerIdentity": int64(2)},
	})
	var tokens strings.Builder
	for w := range crawlers {
		fmt.Fprintf(&tokens, "token-%d %s crawler-%d\n", w, ns, w)
	}
	st := staticTokens(b, tokens.String())
	c, ca := bed.Replica(b, ns, &coordv1.Lease{}, &v1alpha1.Proxy{})
	version, err := discovery.WatchVersion(ctx, ca)
	if err != nil {
		b.Fatal(err)
	}
	h := (discovery.NewServer(discovery.ServerConfig{
		Catalog: discovery.NewCatalog(discovery.CatalogConfig{Cache: ca, Direct: c}), Leases: lease.NewStore(lease.StoreConfig{Client: c, Cache: ca}),
		Auth: discovery.NewKubernetes(discovery.KubernetesConfig{Client: c, Static: st}), Metrics: dmetrics.NewDiscovery(), Log: logging.NewNopLogger(), Version: version,
	})).Handler()
	serve := func(token, method, path, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}

	run := func(op func(w, i int) (time.Duration, error)) (float64, time.Duration) {
		return testbed.Load(b, crawlers, perRound, op)
	}
	raw := func(round int) func(w, i int) (time.Duration, error) {
		return func(w, i int) (time.Duration, error) {
			return testbed.RawLeaseCycle(ctx, c, ns, fmt.Sprintf("raw-%d-%d-%d", round, w, i))
		}
	}
	api := func(w, _ int) (time.Duration, error) {
		token := fmt.Sprintf("token-%d", w)
		t := time.Now()
		rec := serve(token, http.MethodPost, "/v1/leases", `{"fleet": "`+ns+`/crawlers", "holder": "c", "ttl": "1m"}`)
		d := time.Since(t)
		if rec.Code != http.StatusCreated {
			return 0, fmt.Errorf("acquire: %d %s", rec.Code, rec.Body)
		}
		var l apiv1.Lease
		if err := json.Unmarshal(rec.Body.Bytes(), &l); err != nil {
			return 0, err
		}
		if rec := serve(token, http.MethodDelete, "/v1/leases/"+l.LeaseID, ""); rec.Code != http.StatusNoContent {
			return 0, fmt.Errorf("release: %d %s", rec.Code, rec.Body)
		}
		return d, nil
	}

	var rateRatios, p99Ratios, rawRates, apiRates []float64
	b.ResetTimer()
	for b.Loop() {
		for round := range rounds {
			rawRate, rawP99 := run(raw(round))
			apiRate, apiP99 := run(api)
			rawRates, apiRates = append(rawRates, rawRate), append(apiRates, apiRate)
			rateRatios = append(rateRatios, apiRate/rawRate)
			p99Ratios = append(p99Ratios, float64(apiP99)/float64(rawP99))
			b.Logf("round %d: raw %.0f cycles/s, p99 create %s; API %.0f cycles/s, p99 acquire %s", round+1, rawRate, rawP99.Round(time.Millisecond), apiRate, apiP99.Round(time.Millisecond))
		}
	}
	b.StopTimer()
	l := &coordv1.LeaseList{}
	if err := c.List(ctx, l, client.InNamespace(ns), client.HasLabels{fleetv1alpha1.LabelLeaseKind}); err != nil || len(l.Items) != 0 {
		b.Errorf("every lease released: %d left (%v)", len(l.Items), err)
	}
	b.ReportMetric(testbed.Median(rawRates), "raw-cycles/s")
	b.ReportMetric(testbed.Median(apiRates), "api-cycles/s")
	b.ReportMetric(testbed.Median(rateRatios), "rate-ratio")
	b.ReportMetric(testbed.Median(p99Ratios), "p99-ratio")
}
