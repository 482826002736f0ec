package fuzz_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	dmetrics "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// sharedBed starts an apiserver only in a process that runs FuzzServer.
var sharedBed testbed.Lazy

// TestMain starts one test bed for a fuzzing coordinator's workers.
func TestMain(m *testing.M) { sharedBed.FuzzMain(m) }

// fuzzServer is a discovery server on the real apiserver with one fleet of
// two proxies and two static tokens.
func fuzzServer(f *testing.F) (http.Handler, string) {
	bed := sharedBed.Env(f)
	ns := bed.Namespace(f)
	ctx := context.Background()
	if err := bed.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}},
		StringData: map[string]string{"username": "crawler", "password": "s3cret"}}); err != nil {
		f.Fatal(err)
	}
	for i := range 2 {
		p := &v1alpha1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("crawlers-%d", i), Labels: map[string]string{fleetv1alpha1.LabelFleet: "crawlers"}},
			Spec: v1alpha1.ProxySpec{ForProvider: v1alpha1.ProxyParameters{Local: &v1alpha1.LocalPlacement{}, AuthSecretRef: &v1alpha1.AuthSecretReference{Name: "auth"},
				HealthCheck: v1alpha1.HealthCheck{URL: "https://example.com/ip"}, MaxLeases: 2}},
		}
		if err := bed.Client.Create(ctx, p); err != nil {
			f.Fatal(err)
		}
		p.Status.AtProvider = v1alpha1.ProxyObservation{Host: "127.0.0.1", Port: int32(31000 + i), Healthy: true}
		p.SetConditions(xpv2.Available())
		if err := bed.Client.Status().Update(ctx, p); err != nil {
			f.Fatal(err)
		}
	}
	tokens := filepath.Join(f.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("good "+ns+" team\nother elsewhere\n"), 0o600); err != nil {
		f.Fatal(err)
	}
	st, err := discovery.LoadStaticTokens(tokens)
	if err != nil {
		f.Fatal(err)
	}
	s := discovery.NewServer(discovery.ServerConfig{
		Catalog: discovery.NewCatalog(discovery.CatalogConfig{Cache: bed.Client, Direct: bed.Client, Fleets: bed.Client}),
		Leases:  lease.NewStore(lease.StoreConfig{Client: bed.Client}),
		Auth:    discovery.NewKubernetes(discovery.KubernetesConfig{Client: bed.Client, Static: st}),
		Metrics: dmetrics.NewDiscovery(), Log: logging.NewNopLogger(),
		MaxBansPerFleet: 20,
	})
	return s.Handler(), ns
}

// FuzzServer sends arbitrary requests (method, path, body, token) to the
// whole API on a real apiserver. Properties: no panic; no 5xx, since no
// input is the server's fault; every error is a JSON body with the status
// as its code and a reason, and a 400 names a field; a granted lease has
// a TTL the fleet allows, and its ID parses back to itself.
func FuzzServer(f *testing.F) {
	for _, seed := range []struct {
		method, path, body, token string
	}{
		{"POST", "/v1/leases", `{"fleet": "NS/crawlers", "holder": "h", "ttl": "10m"}`, "good"},
		{"POST", "/v1/leases", `{"fleet": "NS/crawlers", "holder": "h", "maxWait": "0", "zone": "a", "domain": "x.example", "stickyKey": "k"}`, "good"},
		{"POST", "/v1/leases/NS/crawlers-0-slot-0/uid/renew", `{"ttl": "5m"}`, "good"},
		{"POST", "/v1/leases/NS/crawlers-0-slot-0/uid/report", `{"domain": "x.example", "outcome": "banned", "cooldown": "1h"}`, "good"},
		{"DELETE", "/v1/leases/NS/crawlers-1-slot-1/uid", "", "good"},
		{"GET", "/v1/fleets/NS/crawlers/proxies?zone=a&exclude=crawlers-0&notBannedFor=x.example", "", "good"},
		{"GET", "/v1/fleets/NS/crawlers", "", "other"},
		{"GET", "/v1/fleets/NS/crawlers/proxies.txt", "", "bad"},
		{"GET", "/", "", "good"},
	} {
		f.Add(seed.method, seed.path, []byte(seed.body), seed.token)
	}
	h, ns := fuzzServer(f)
	f.Fuzz(func(t *testing.T, method, path string, body []byte, token string) {
		path = strings.ReplaceAll(path, "NS", ns)
		body = bytes.ReplaceAll(body, []byte("NS"), []byte(ns))
		// A request that takes this long is a hang: it fails the
		// property (503) with its input, rather than stall the fuzzer.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := http.NewRequestWithContext(ctx, method, "http://discovery"+path, bytes.NewReader(body))
		if err != nil || r.URL.Host != "discovery" {
			return // not a request a client could send
		}
		r.RequestURI = r.URL.RequestURI()
		r.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code >= 500 {
			t.Fatalf("%s %s %q: %d %s", method, path, body, rec.Code, rec.Body)
		}
		if rec.Code >= 400 {
			var e apiv1.Error
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Code != rec.Code || e.Error.Reason == "" || e.Error.Message == "" ||
				(rec.Code == http.StatusBadRequest) != (e.Error.Field != "") {
				t.Fatalf("%s %s %q: %d with a body that is not a proper error: %s", method, path, body, rec.Code, rec.Body)
			}
			return
		}
		if method == http.MethodPost && path == "/v1/leases" && rec.Code == http.StatusCreated {
			var l apiv1.Lease
			if err := json.Unmarshal(rec.Body.Bytes(), &l); err != nil || l.TTLSeconds < 1 || l.TTLSeconds > 3600 {
				t.Fatalf("granted %s: not a lease within the fleet's TTLs", rec.Body)
			}
			a, b, c, err := lease.ParseID(l.LeaseID)
			if err != nil || a+"/"+b+"/"+c != l.LeaseID {
				t.Fatalf("granted lease ID %q does not parse back", l.LeaseID)
			}
			// Give it back, so the fleet does not fill up.
			rel := httptest.NewRequest(http.MethodDelete, "/v1/leases/"+l.LeaseID, nil)
			rel.Header.Set("Authorization", "Bearer "+token)
			h.ServeHTTP(httptest.NewRecorder(), rel)
		}
	})
}
