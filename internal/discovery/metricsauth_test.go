package discovery_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	dmetrics "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestMetricsNeedAScraper: /metrics, whose fleet-level series name every
// fleet, answers only a token whose subject may get /metrics (a scraper
// bound to the pack's metrics-reader ClusterRole): not a caller without a
// token, not a crawler with a static token, not a ServiceAccount without
// the grant. The fleet series it serves name the fleet.
func TestMetricsNeedAScraper(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	ctx := context.Background()
	fleet(t, ns, "crawlers", 2, 1, nil)
	kc := kubernetes.NewForConfigOrDie(bed.Config)
	for _, sa := range []string{"prometheus", "crawler"} {
		if _, err := kc.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	reader := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "test:" + ns + ":metrics-reader"}, Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "test:" + ns + ":metrics-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: reader.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "prometheus"}}}
	if err := bed.Client.Create(ctx, reader); err != nil {
		t.Fatal(err)
	}
	if err := bed.Client.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bed.Client.Delete(ctx, binding); _ = bed.Client.Delete(ctx, reader) })
	token := func(sa string) string {
		tr, err := kc.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(600))}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	_, s := serverOf(t, "team-token "+ns+"\n")
	reg := prometheus.NewRegistry()
	reg.MustRegister(discovery.FleetCollector{Server: s})
	reg.MustRegister(dmetrics.NewDiscovery().Collectors()...)
	srv := httptest.NewServer(s.Auth.(*discovery.Kubernetes).MetricsAuth(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
	t.Cleanup(srv.Close)
	scrape := func(tok string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+discovery.MetricsPath, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		rsp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = rsp.Body.Close() }()
		b, _ := io.ReadAll(rsp.Body)
		return rsp.StatusCode, string(b)
	}
	for who, tok := range map[string]string{"no token": "", "a crawler's static token": "team-token", "a ServiceAccount without the grant": token("crawler")} {
		if code, body := scrape(tok); code != http.StatusUnauthorized && code != http.StatusForbidden || strings.Contains(body, "crawlers") {
			t.Errorf("%s scraped /metrics: %d\n%s", who, code, body)
		}
	}
	prom := token("prometheus")
	testbed.Eventually(t, 10*time.Second, "the scraper's grant in force", func() (bool, string) {
		code, body := scrape(prom)
		return code == http.StatusOK && strings.Contains(body, `egress_fleet_healthy_proxies{fleet="crawlers",namespace="`+ns+`"} 2`), body
	})
}
