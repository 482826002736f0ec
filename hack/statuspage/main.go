// Command statuspage renders egress-discovery's status page in headless
// Chromium and saves a screenshot: it starts the test bed (real apiserver),
// creates a fleet with proxies, a lease and a ban, serves the page and
// points Chromium at it. Needs `make tools` and `apt-get install chromium`.
//
//	go run ./hack/statuspage -o _output/status.png
//
// main.go sets up the test bed, the example fleet and its leases and
// bans, and runs Chromium; front.go signs in on the page's form and
// fronts the server with the sign-in cookie Chromium cannot keep.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	dmetrics "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// namespace holds the example fleet; authSecret is its auth Secret.
const (
	namespace  = "crawl-team"
	authSecret = "auth"
)

func main() {
	out := flag.String("o", "_output/status.png", "Where to write the screenshot.")
	flag.Parse()
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "statuspage:", err)
		os.Exit(1)
	}
}

func run(out string) error {
	bed, err := testbed.Start()
	if err != nil {
		return err
	}
	defer bed.Stop() //nolint:errcheck // Best effort.
	ctx := context.Background()
	c := bed.Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		return err
	}
	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: authSecret, Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "crawler", "password": "example"}}); err != nil {
		return err
	}
	for i := range 4 {
		p := &v1alpha1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("crawlers-%d", i), Labels: map[string]string{
				fleetv1alpha1.LabelFleet: "crawlers", fleetv1alpha1.LabelZone: []string{"europe-west1-b", "europe-west1-c"}[i%2]}},
			Spec: v1alpha1.ProxySpec{ForProvider: v1alpha1.ProxyParameters{Local: &v1alpha1.LocalPlacement{},
				AuthSecretRef: &v1alpha1.AuthSecretReference{Name: authSecret}, HealthCheck: v1alpha1.HealthCheck{URL: "https://ifconfig.me/ip"}, MaxLeases: 2}},
		}
		if err := c.Create(ctx, p); err != nil {
			return err
		}
		healthy := i != 3
		// crawlers-3 leaves through crawlers-2's NAT: the page marks both.
		egress := fmt.Sprintf("34.140.%d.%d", 10+min(i, 2), 20+min(i, 2))
		p.Status.AtProvider = v1alpha1.ProxyObservation{Host: fmt.Sprintf("34.140.%d.%d", 10+i, 20+i), Port: 3128, Healthy: healthy,
			EgressIP: egress, LatencyMilliseconds: int64(40 + 7*i)}
		cond := xpv2.Available()
		if !healthy {
			cond = xpv2.Unavailable()
		}
		p.SetConditions(cond)
		if err := c.Status().Update(ctx, p); err != nil {
			return err
		}
	}
	// The fleet's XR, autoscaled, with the status the function would
	// write: the page shows desired against actual and the demand.
	xr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": fleetv1alpha1.SchemeGroupVersion.String(), "kind": fleetv1alpha1.ProxyFleetKind,
		"metadata": map[string]any{"name": "crawlers", "namespace": namespace},
		"spec": map[string]any{
			"zones": []any{"europe-west1-b", "europe-west1-c"}, "placement": map[string]any{"local": map[string]any{}},
			"proxy": map[string]any{"authSecretRef": map[string]any{"name": authSecret}}, "healthCheck": map[string]any{"url": "https://ifconfig.me/ip"},
			"leases":      map[string]any{"maxLeasesPerProxy": int64(2)},
			"autoscaling": map[string]any{"minReplicas": int64(1), "maxReplicas": int64(8)},
		},
	}}
	if err := c.Create(ctx, xr); err != nil {
		return err
	}
	xr.Object["status"] = map[string]any{"desiredReplicas": int64(5), "autoscaling": map[string]any{
		"reason": "utilization 1.00 > 0.70", "held": int64(3), "waiting": int64(2), "refused": int64(1), "capacity": int64(6)}}
	if err := c.Status().Update(ctx, xr); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "statuspage")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir) //nolint:errcheck // Scratch.
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("demo crawl-team\n"), 0o600); err != nil {
		return err
	}
	st, err := discovery.LoadStaticTokens(tokens)
	if err != nil {
		return err
	}
	srv := httptest.NewServer((discovery.NewServer(discovery.ServerConfig{
		Catalog: discovery.NewCatalog(discovery.CatalogConfig{Cache: c, Direct: c, Fleets: c}), Leases: lease.NewStore(lease.StoreConfig{Client: c}),
		Auth: discovery.NewKubernetes(discovery.KubernetesConfig{Client: c, Static: st}), Metrics: dmetrics.NewDiscovery(), Log: logging.NewNopLogger(),
	})).Handler())
	defer srv.Close()
	api := &apiv1.Client{BaseURL: srv.URL, Token: "demo"}
	for _, h := range []string{"scrapy-1", "colly-7", "crawlee-2"} {
		l, err := api.Acquire(ctx, apiv1.AcquireRequest{Fleet: "crawl-team/crawlers", Holder: h, TTL: "10m"})
		if err != nil {
			return err
		}
		if h == "colly-7" {
			if err := api.Report(ctx, l.LeaseID, apiv1.ReportRequest{Domain: "shop.example", Outcome: "banned"}); err != nil {
				return err
			}
		}
	}

	// Signed in on the page's own form; the front plays the browser's
	// cookie jar for headless Chromium.
	ck, err := signIn(srv.URL, "demo")
	if err != nil {
		return err
	}
	front := httptest.NewServer(cookieFront(srv.URL, ck))
	defer front.Close()
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	abs, _ := filepath.Abs(out)
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--user-data-dir="+filepath.Join(dir, "chromium"),
		"--window-size=1400,700", "--screenshot="+abs, front.URL+"/")
	if b, err := cmd.CombinedOutput(); err != nil {
		return errors.Wrapf(err, "chromium said:\n%s", b)
	}
	fmt.Println("wrote", abs)
	return nil
}
