package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
	dmetrics "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

var sharedBed testbed.Lazy

// egressctlProcess is egressctl, when TestMain finds the test binary run
// with EGRESSCTL_TEST_PROCESS=1 by the tests below, with its arguments
// after --.
func egressctlProcess() int {
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	return run(context.Background(), args, os.Stdout, os.Stderr)
}

// TestMain runs the tests, or, for the process tests, egressctl itself.
func TestMain(m *testing.M) {
	if os.Getenv("EGRESSCTL_TEST_PROCESS") == "1" {
		os.Exit(egressctlProcess())
	}
	sharedBed.Main(m)
}

// TestLeaseRunsCommand runs egressctl against a discovery server on the real
// apiserver: the child sees the proxy variables, and the lease is released
// when it exits, with its exit code passed on.
func TestLeaseRunsCommand(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	if err := bed.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "u", "password": "p"}}); err != nil {
		t.Fatal(err)
	}
	p := &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "crawlers-0", Labels: map[string]string{fleetv1alpha1.LabelFleet: "crawlers"}},
		Spec: v1alpha1.ProxySpec{ForProvider: v1alpha1.ProxyParameters{Local: &v1alpha1.LocalPlacement{}, AuthSecretRef: &v1alpha1.AuthSecretReference{Name: "auth"},
			HealthCheck: v1alpha1.HealthCheck{URL: "https://example.com/ip"}, MaxLeases: 1}},
	}
	if err := bed.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p.Status.AtProvider = v1alpha1.ProxyObservation{Host: "127.0.0.1", Port: 31999, Healthy: true}
	p.SetConditions(xpv2.Available())
	if err := bed.Client.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("cli-token "+ns+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := discovery.LoadStaticTokens(tokens)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer((discovery.NewServer(discovery.ServerConfig{
		Catalog: discovery.NewCatalog(discovery.CatalogConfig{Cache: bed.Client, Direct: bed.Client}), Leases: lease.NewStore(lease.StoreConfig{Client: bed.Client}),
		Auth: discovery.NewKubernetes(discovery.KubernetesConfig{Client: bed.Client, Static: st}), Metrics: dmetrics.NewDiscovery(), Log: logging.NewNopLogger(),
	})).Handler())
	t.Cleanup(srv.Close)

	var out, errOut bytes.Buffer
	code := run(ctx, []string{"lease", "--fleet", ns + "/crawlers", "--server", srv.URL, "--token", "cli-token", "--ttl", "1m", "--",
		"sh", "-c", `echo "proxy=$HTTPS_PROXY lease=$EGRESS_LEASE_ID"; exit 3`}, &out, &errOut)
	if code != 3 {
		t.Errorf("egressctl passes on the command's exit code: want 3, got %d (%s)", code, errOut.String())
	}
	if !strings.Contains(out.String(), "proxy=http://u:p@127.0.0.1:31999 lease="+ns+"/crawlers-0-slot-0/") {
		t.Errorf("the child sees the leased proxy: %q", out.String())
	}
	l := &coordv1.LeaseList{}
	if err := bed.Client.List(ctx, l, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 0 {
		t.Errorf("the lease is released when the command exits; %d Lease objects remain", len(l.Items))
	}

	out.Reset()
	if code := run(ctx, []string{"proxies", "--fleet", ns + "/crawlers", "--server", srv.URL, "--token", "cli-token"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "127.0.0.1:31999") {
		t.Errorf("proxies lists the fleet: %d %q", code, out.String())
	}
	if code := run(ctx, []string{"proxies", "--fleet", ns + "/crawlers", "--server", srv.URL, "--token", "wrong"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "401") {
		t.Errorf("a bad token fails clearly: %d %q", code, errOut.String())
	}
}
