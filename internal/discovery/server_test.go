package discovery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	authnv1 "k8s.io/api/authentication/v1"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	dmetrics "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

var sharedBed testbed.Lazy

func TestMain(m *testing.M) { sharedBed.Main(m) }

// fleet creates a fleet's Proxies with the status the provider would write.
func fleet(t testing.TB, ns, name string, n, maxLeases int, healthy func(i int) bool) {
	t.Helper()
	pooledFleet(t, ns, name, n, maxLeases, healthy, nil)
}

// pooledFleet is fleet, each Proxy labelled with the pool pool(i) names
// (none when pool is nil or names none), as a pooled fleet's are.
func pooledFleet(t testing.TB, ns, name string, n, maxLeases int, healthy func(i int) bool, pool func(i int) string) {
	t.Helper()
	bed := sharedBed.Env(t)
	ctx := context.Background()
	if err := bed.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}},
		StringData: map[string]string{"username": "crawler", "password": "s3cret"}}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		p := &v1alpha1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%d", name, i), Labels: map[string]string{
				fleetv1alpha1.LabelFleet: name, fleetv1alpha1.LabelZone: []string{"zone-a", "zone-b"}[i%2],
			}},
			Spec: v1alpha1.ProxySpec{ForProvider: v1alpha1.ProxyParameters{
				Local: &v1alpha1.LocalPlacement{}, AuthSecretRef: &v1alpha1.AuthSecretReference{Name: name + "-auth"},
				HealthCheck: v1alpha1.HealthCheck{URL: "https://example.com/ip"}, MaxLeases: int32(maxLeases),
			}},
		}
		if pool != nil && pool(i) != "" {
			p.Labels[fleetv1alpha1.LabelPool] = pool(i)
		}
		if err := bed.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		ok := healthy == nil || healthy(i)
		p.Status.AtProvider = v1alpha1.ProxyObservation{Host: "127.0.0.1", Port: int32(31000 + i), Healthy: ok, EgressIP: fmt.Sprintf("198.51.100.%d", i), LatencyMilliseconds: 12}
		c := xpv2.Available()
		if !ok {
			c = xpv2.Unavailable()
		}
		p.SetConditions(c)
		if err := bed.Client.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
}

// staticTokens loads a token file of content.
func staticTokens(t testing.TB, content string) *discovery.StaticTokens {
	t.Helper()
	f := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := discovery.LoadStaticTokens(f)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func server(t *testing.T, static string, mods ...func(*discovery.ServerConfig)) *httptest.Server {
	t.Helper()
	srv, _ := serverOf(t, static, mods...)
	return srv
}

// withStore builds the server's lease store again, with mod applied to
// its configuration; withCatalog and withAuth do so for its catalog and
// its Kubernetes authenticator.
func withStore(s *discovery.ServerConfig, mod func(*lease.StoreConfig)) {
	cfg := s.Leases.StoreConfig
	mod(&cfg)
	s.Leases = lease.NewStore(cfg)
}

func withCatalog(s *discovery.ServerConfig, mod func(*discovery.CatalogConfig)) {
	cfg := s.Catalog.Config
	mod(&cfg)
	s.Catalog = discovery.NewCatalog(cfg)
}

func withAuth(s *discovery.ServerConfig, mod func(*discovery.KubernetesConfig)) {
	cfg := s.Auth.(*discovery.Kubernetes).KubernetesConfig
	mod(&cfg)
	s.Auth = discovery.NewKubernetes(cfg)
}

// serverOf is server, and the Server it serves.
func serverOf(t *testing.T, static string, mods ...func(*discovery.ServerConfig)) (*httptest.Server, *discovery.Server) {
	t.Helper()
	bed := sharedBed.Env(t)
	var tokens *discovery.StaticTokens
	if static != "" {
		f := filepath.Join(t.TempDir(), "tokens")
		if err := os.WriteFile(f, []byte(static), 0o600); err != nil {
			t.Fatal(err)
		}
		var err error
		if tokens, err = discovery.LoadStaticTokens(f); err != nil {
			t.Fatal(err)
		}
	}
	cfg := discovery.ServerConfig{
		Catalog: discovery.NewCatalog(discovery.CatalogConfig{Cache: bed.Client, Direct: bed.Client, Fleets: bed.Client}),
		Leases:  lease.NewStore(lease.StoreConfig{Client: bed.Client, OwnerOf: discovery.ProxyOwner(bed.Client), FleetOwnerOf: discovery.ProxyController(bed.Client, bed.Client)}),
		Auth:    discovery.NewKubernetes(discovery.KubernetesConfig{Client: bed.Client, Static: tokens}),
		Metrics: dmetrics.NewDiscovery(), Log: logging.NewNopLogger(),
	}
	for _, m := range mods {
		m(&cfg)
	}
	s := discovery.NewServer(cfg)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv, s
}

func call(t *testing.T, srv *httptest.Server, token, method, path, body string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close() //nolint:errcheck // Read to the end already.
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

func TestAPI(t *testing.T) {
	bed := sharedBed.Env(t)
	ns, other := bed.Namespace(t), bed.Namespace(t)
	fleet(t, ns, "crawlers", 3, 1, func(i int) bool { return i != 2 })
	fleet(t, other, "theirs", 1, 1, nil)
	// ProxyFleet XRs: one whose leases are capped at 30m, one with no
	// proxies yet.
	for _, xr := range []struct{ name, maxTTL string }{{"crawlers", "30m"}, {"empty", "1h"}} {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyFleet",
			"metadata": map[string]any{"name": xr.name, "namespace": ns},
			"spec": map[string]any{
				"zones": []any{"zone-a"}, "placement": map[string]any{"local": map[string]any{}},
				"proxy":       map[string]any{"authSecretRef": map[string]any{"name": "crawlers-auth"}},
				"healthCheck": map[string]any{"url": "https://example.com/ip"},
				"leases":      map[string]any{"defaultTTL": "10m", "maxTTL": xr.maxTTL},
			},
		}}
		if err := bed.Client.Create(context.Background(), u); err != nil {
			t.Fatal(err)
		}
	}
	srv := server(t, "team-token "+ns+"\n")
	c := &apiv1.Client{BaseURL: srv.URL, Token: "team-token"}
	ctx := context.Background()

	fl, err := c.Fleets(ctx)
	if err != nil || len(fl.Items) != 2 || fl.Items[0].Name != "crawlers" || fl.Items[0].Healthy != 2 || fl.Items[0].Proxies != 3 ||
		fl.Items[1].Name != "empty" || fl.Items[1].Proxies != 0 {
		t.Fatalf("a team token sees its own fleets only, the one without proxies too: %+v %v", fl, err)
	}
	pl, err := c.Proxies(ctx, ns+"/crawlers", "zone-a")
	if err != nil || len(pl.Items) != 1 || pl.Items[0].Name != "crawlers-0" || pl.Items[0].EgressIP != "198.51.100.0" {
		t.Fatalf("zone-a's healthy proxies: %+v %v", pl, err)
	}
	code, _, body := call(t, srv, "team-token", "GET", "/v1/fleets/"+ns+"/crawlers/proxies.txt", "")
	if code != 200 || string(body) != "http://crawler:s3cret@127.0.0.1:31000\nhttp://crawler:s3cret@127.0.0.1:31001\n" {
		t.Errorf("proxies.txt: %d %q", code, body)
	}

	l1, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "scrapy-1", TTL: "2m", StickyKey: "s1"})
	if err != nil || !strings.HasPrefix(l1.ProxyURL, "http://crawler:s3cret@127.0.0.1:3100") {
		t.Fatalf("acquire: %+v %v", l1, err)
	}
	l2, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "scrapy-2"})
	if err != nil || l2.Proxy == l1.Proxy {
		t.Fatalf("the second crawler gets the other healthy proxy (maxLeases 1): %+v %v", l2, err)
	}
	_, err = c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "scrapy-3"})
	var ae *apiv1.APIError
	if !asAPIError(err, &ae) || ae.Status != http.StatusConflict || ae.RetryAfter == "" {
		t.Fatalf("a full fleet answers 409 with Retry-After: %v", err)
	}
	if _, err := c.Renew(ctx, l1.LeaseID, "5m"); err != nil {
		t.Errorf("renew: %v", err)
	}
	if err := c.Report(ctx, l1.LeaseID, apiv1.ReportRequest{Domain: "shop.example", Outcome: "banned", Cooldown: "10m"}); err != nil {
		t.Fatalf("report: %v", err)
	}
	// Leases and bans are owned by their Proxy, so they go with it even
	// where nobody sweeps: a deleted fleet takes discovery's grant along.
	owned := &coordv1.LeaseList{}
	if err := bed.Client.List(ctx, owned, client.InNamespace(ns), client.HasLabels{fleetv1alpha1.LabelLeaseKind}); err != nil || len(owned.Items) < 3 {
		t.Fatalf("leases: %d %v", len(owned.Items), err)
	}
	for _, l := range owned.Items {
		if l.Labels[fleetv1alpha1.LabelLeaseKind] == fleetv1alpha1.LeaseKindIPBans {
			// An address's ban history outlives the proxy: its fleet
			// owns it (lease.TestIPBanHistory).
			continue
		}
		p := &v1alpha1.Proxy{}
		if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: l.Annotations[fleetv1alpha1.AnnotationProxy]}, p); err != nil {
			t.Fatal(err)
		}
		if o := l.OwnerReferences; len(o) != 1 || o[0].UID != p.UID || o[0].Kind != v1alpha1.ProxyKind || o[0].Name != p.Name {
			t.Errorf("lease %s must be owned by its Proxy %s (%s): %+v", l.Name, p.Name, p.UID, o)
		}
	}
	if err := c.Release(ctx, l1.LeaseID); err != nil {
		t.Fatalf("release: %v", err)
	}
	// The banned proxy is skipped for that domain, but not for others.
	if _, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "scrapy-4", Domain: "shop.example"}); !asAPIError(err, &ae) || ae.Status != http.StatusConflict {
		t.Errorf("the only free proxy is banned for shop.example: want 409, got %v", err)
	}
	l3, err := c.Acquire(ctx, apiv1.AcquireRequest{Fleet: ns + "/crawlers", Holder: "scrapy-4", Domain: "news.example", StickyKey: "s1"})
	if err != nil || l3.Proxy != l1.Proxy {
		t.Errorf("for another domain the sticky key gets its proxy back: %+v %v", l3, err)
	}
	if pl, _ := c.Proxies(ctx, ns+"/crawlers", ""); len(pl.Items) != 2 {
		t.Errorf("listing shows both healthy proxies: %+v", pl)
	}

	cases := map[string]struct {
		reason       string
		token        string
		method, path string
		body         string
		wantCode     int
		wantField    string
	}{
		"NoToken":        {reason: "Unauthenticated calls get 401.", method: "GET", path: "/v1/fleets", wantCode: 401},
		"GarbageToken":   {reason: "A token nobody knows gets 401.", token: "garbage", method: "GET", path: "/v1/fleets", wantCode: 401},
		"OtherNamespace": {reason: "Another team's fleet is forbidden.", token: "team-token", method: "GET", path: "/v1/fleets/" + other + "/theirs/proxies", wantCode: 403},
		"UnknownFleet":   {reason: "An unknown fleet is 404.", token: "team-token", method: "GET", path: "/v1/fleets/" + ns + "/nope/proxies", wantCode: 404},
		"UnknownLease":   {reason: "An unknown lease is 404.", token: "team-token", method: "DELETE", path: "/v1/leases/" + ns + "/crawlers-0-slot-0/nottoken", wantCode: 404},
		"BadFleet":       {reason: "The fleet must be ns/name.", token: "team-token", method: "POST", path: "/v1/leases", body: `{"fleet": "crawlers", "holder": "x"}`, wantCode: 400, wantField: "fleet"},
		"NoHolder":       {reason: "A holder is required.", token: "team-token", method: "POST", path: "/v1/leases", body: `{"fleet": "` + ns + `/crawlers"}`, wantCode: 400, wantField: "holder"},
		"TTLTooLong":     {reason: "TTL is at most the fleet's leases.maxTTL (30m here).", token: "team-token", method: "POST", path: "/v1/leases", body: `{"fleet": "` + ns + `/crawlers", "holder": "x", "ttl": "45m"}`, wantCode: 400, wantField: "ttl"},
		"WrongType":      {reason: "Types are checked.", token: "team-token", method: "POST", path: "/v1/leases", body: `{"fleet": 7}`, wantCode: 400, wantField: "fleet"},
		"UnknownField":   {reason: "Typos are not ignored.", token: "team-token", method: "POST", path: "/v1/leases", body: `{"fleet": "` + ns + `/crawlers", "holdr": "x"}`, wantCode: 400, wantField: "holdr"},
		"NotJSON":        {reason: "Bodies are JSON.", token: "team-token", method: "POST", path: "/v1/leases", body: `fleet=x`, wantCode: 400, wantField: "body"},
		"TooLarge":       {reason: "Bodies are size-limited.", token: "team-token", method: "POST", path: "/v1/leases", body: `{"holder": "` + strings.Repeat("x", 20000) + `"}`, wantCode: 413},
		"BadOutcome":     {reason: "Outcomes are banned or ok.", token: "team-token", method: "POST", path: "/v1/leases/" + l2.LeaseID + "/report", body: `{"domain": "a.example", "outcome": "meh"}`, wantCode: 400, wantField: "outcome"},
		"NoRoute":        {reason: "Unknown paths are JSON 404s.", token: "team-token", method: "GET", path: "/v2/nothing", wantCode: 404},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			code, _, body := call(t, srv, tc.token, tc.method, tc.path, tc.body)
			var e apiv1.Error
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("%s\nerrors are JSON: %q", tc.reason, body)
			}
			if code != tc.wantCode || e.Error.Code != tc.wantCode || e.Error.Field != tc.wantField {
				t.Errorf("%s\nwant %d field %q, got %d %+v", tc.reason, tc.wantCode, tc.wantField, code, e.Error)
			}
		})
	}

	t.Run("OpenAPIAndStatusPage", func(t *testing.T) {
		code, _, body := call(t, srv, "", "GET", "/openapi.json", "")
		var doc map[string]any
		if code != 200 || json.Unmarshal(body, &doc) != nil || doc["openapi"] != "3.0.3" {
			t.Errorf("/openapi.json: %d", code)
		}
		code, _, body = call(t, srv, "team-token", "GET", "/", "")
		for _, want := range []string{ns + "/crawlers", "2/3 healthy", "198.51.100.1", "12 ms", "1/1", "unhealthy"} {
			if code != 200 || !strings.Contains(string(body), want) {
				t.Errorf("status page lacks %q (%d)", want, code)
			}
		}
	})
}

func asAPIError(err error, into **apiv1.APIError) bool {
	return errors.As(err, into)
}

// TestServiceAccountTokens authenticates with real ServiceAccount tokens
// (TokenRequest against the test apiserver) and authorises with RBAC.
func TestServiceAccountTokens(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "crawlers", 1, 1, nil)
	ctx := context.Background()
	kc := kubernetes.NewForConfigOrDie(bed.Config)
	for _, sa := range []string{"allowed", "denied"} {
		if _, err := kc.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := bed.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "use-fleets"}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{fleetv1alpha1.Group}, Resources: []string{fleetv1alpha1.ProxyFleetResource}, Verbs: []string{"use"},
	}}}); err != nil {
		t.Fatal(err)
	}
	if err := bed.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "use-fleets"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "use-fleets"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "allowed", Namespace: ns}}}); err != nil {
		t.Fatal(err)
	}
	token := func(sa string, audiences ...string) string {
		tr, err := kc.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(600)), Audiences: audiences}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	srv := server(t, "", func(s *discovery.ServerConfig) {
		withAuth(s, func(k *discovery.KubernetesConfig) { k.Audience = discovery.DefaultAudience })
	})
	for _, tc := range []struct {
		sa       string
		audience []string
		want     int
	}{
		{"allowed", []string{discovery.DefaultAudience}, 200},
		{"denied", []string{discovery.DefaultAudience}, 403},
		// A token for the API server (its default audience) is refused:
		// one sent here could be replayed there.
		{"allowed", nil, 401},
		{"allowed", []string{"another-service"}, 401},
	} {
		code, _, body := call(t, srv, token(tc.sa, tc.audience...), "GET", "/v1/fleets/"+ns+"/crawlers/proxies", "")
		if code != tc.want {
			t.Errorf("ServiceAccount %s, audiences %v: want %d, got %d %s", tc.sa, tc.audience, tc.want, code, body)
		}
	}
	if code, _, _ := call(t, srv, "eyJhbGciOiJSUzI1NiJ9.garbage.sig", "GET", "/v1/fleets", ""); code != 401 {
		t.Errorf("a garbage token: want 401, got %d", code)
	}
}
