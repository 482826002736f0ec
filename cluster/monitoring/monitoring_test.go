// Package monitoring_test checks the monitoring pack: its alerts against
// promtool's rule unit tests, and every metric its rules and dashboard
// query against the metrics the binaries register.
package monitoring_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
)

// rules reads the PrometheusRule's spec: a Prometheus rule file.
func rules(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile("prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pr := map[string]any{}
	if err := yaml.Unmarshal(raw, &pr); err != nil {
		t.Fatal(err)
	}
	spec, ok := pr["spec"].(map[string]any)
	if !ok {
		t.Fatal("prometheusrule.yaml has no spec")
	}
	return spec
}

// promtool runs promtool's rule unit tests against spec, and says whether
// they passed, with promtool's output.
func promtool(t *testing.T, spec map[string]any) (bool, string) {
	t.Helper()
	bin, err := filepath.Abs(filepath.Join("..", "..", "bin", "promtool"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatal("bin/promtool is missing: run `make tools` (it unpacks Debian's promtool, or builds it from the pinned Prometheus module)")
	}
	dir := t.TempDir()
	b, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join("tests", "rules_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string][]byte{"rules.yaml": b, "rules_test.yaml": tests} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command(bin, "check", "rules", filepath.Join(dir, "rules.yaml")).CombinedOutput(); err != nil {
		return false, "promtool check rules: " + string(out)
	}
	cmd := exec.Command(bin, "test", "rules", "rules_test.yaml")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return err == nil, string(out)
}

// TestAlertingRules: the PrometheusRule's alerts pass promtool's unit
// tests, and each alert is tested: without any one of them the tests fail.
func TestAlertingRules(t *testing.T) {
	spec := rules(t)
	if ok, out := promtool(t, spec); !ok {
		t.Fatalf("promtool test rules failed:\n%s", out)
	}
	group := spec["groups"].([]any)[0].(map[string]any)
	all := group["rules"].([]any)
	for i, r := range all {
		name := r.(map[string]any)["alert"]
		without := append(append([]any{}, all[:i]...), all[i+1:]...)
		mutated := map[string]any{"groups": []any{map[string]any{"name": group["name"], "rules": without}}}
		if ok, _ := promtool(t, mutated); ok {
			t.Errorf("the rule tests still pass without alert %v: it is not tested", name)
		}
	}
}

// exported lists the metric names the binaries register: the provider's,
// egress-discovery's (its API, gateway, cache and fleet metrics), each
// histogram with its _bucket, _sum and _count series.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	var cs []prometheus.Collector
	cs = append(cs, metrics.NewProvider().Collectors()...)
	cs = append(cs, metrics.NewDiscovery().Collectors()...)
	cs = append(cs, metrics.NewGateway().Collectors()...)
	cs = append(cs, discovery.CatalogGauges(nil)...)
	cs = append(cs, discovery.FleetCollector{})
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	out := map[string]bool{}
	for _, c := range cs {
		ch := make(chan *prometheus.Desc, 64)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			m := fq.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("cannot read a metric name from %s", d)
			}
			for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
				out[m[1]+suffix] = true
			}
		}
	}
	return out
}

// metricName finds the product's metric names in a PromQL expression.
var metricName = regexp.MustCompile(`\begress_[a-z0-9_]+\b`)

// unknownMetrics lists the metric names exprs query that are not exported.
func unknownMetrics(exprs []string, exported map[string]bool) []string {
	seen := map[string]bool{}
	for _, e := range exprs {
		for _, n := range metricName.FindAllString(e, -1) {
			if !exported[n] {
				seen[n] = true
			}
		}
	}
	var out []string
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// dashboardExprs reads every query of the Grafana dashboard, its
// variables' included.
func dashboardExprs(t *testing.T, raw []byte) []string {
	t.Helper()
	var d struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			out = append(out, q.Expr)
		}
	}
	for _, v := range d.Templating.List {
		out = append(out, fmt.Sprint(v.Query))
	}
	return out
}

// TestQueriesNameExportedMetrics: every metric the dashboard and the
// alerts query is one the binaries register, so that no panel stays empty
// and no alert can never fire for a misspelt name; a misspelt name is
// caught.
func TestQueriesNameExportedMetrics(t *testing.T) {
	names := exported(t)
	raw, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	exprs := dashboardExprs(t, raw)
	if len(exprs) < 10 {
		t.Fatalf("the dashboard has %d queries; expected its panels' and variables'", len(exprs))
	}
	group := rules(t)["groups"].([]any)[0].(map[string]any)
	for _, r := range group["rules"].([]any) {
		exprs = append(exprs, fmt.Sprint(r.(map[string]any)["expr"]))
	}
	if unknown := unknownMetrics(exprs, names); len(unknown) > 0 {
		t.Errorf("queried but exported by no binary: %v", unknown)
	}
	for _, want := range []string{"egress_fleet_bans", "egress_proxy_probe_duration_seconds_bucket", "egress_discovery_lease_denials_total"} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("the dashboard shows %s", want)
		}
	}
	broken := strings.ReplaceAll(string(raw), "egress_fleet_bans", "egress_fleet_banz")
	if unknown := unknownMetrics(dashboardExprs(t, []byte(broken)), names); len(unknown) != 1 || unknown[0] != "egress_fleet_banz" {
		t.Errorf("a misspelt metric is caught: got %v", unknown)
	}
}

// TestPackRenders: kubectl kustomize renders the pack with every part, and
// the discovery ServiceMonitor keeps the fleet series' own namespace label
// (honorLabels), which the scrape would otherwise overwrite with
// egress-system, merging fleets of the same name.
func TestPackRenders(t *testing.T) {
	kubectl, err := filepath.Abs(filepath.Join("..", "..", "bin", "kubectl"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(kubectl); err != nil {
		t.Fatal("bin/kubectl is missing: run `make tools`")
	}
	out, err := exec.Command(kubectl, "kustomize", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize cluster/monitoring: %v\n%s", err, out)
	}
	for _, want := range []string{"kind: ServiceMonitor", "kind: PodMonitor", "kind: PrometheusRule", "grafana_dashboard: \"1\"", "honorLabels: true", "nonResourceURLs:"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the rendered pack lacks %q", want)
		}
	}
}

// TestRuleTestsUseRealLabels: the rule tests' series carry the backend
// label values the provider exports (a ProviderConfig's spec.backend, or
// "external" for External Proxies), so that a test passes only for
// series that can exist; a made-up value is caught.
func TestRuleTestsUseRealLabels(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("tests", "rules_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	real := map[string]bool{"external": true}
	for _, b := range []v1alpha1.BackendType{v1alpha1.BackendLocal, v1alpha1.BackendKubernetes, v1alpha1.BackendGCP, v1alpha1.BackendAWS} {
		real[string(b)] = true
	}
	unreal := func(text string) []string {
		var out []string
		for _, m := range regexp.MustCompile(`backend(?:="|: "?)([A-Za-z]+)`).FindAllStringSubmatch(text, -1) {
			if !real[m[1]] {
				out = append(out, m[1])
			}
		}
		return out
	}
	if bad := unreal(string(raw)); len(bad) > 0 {
		t.Errorf("the rule tests use backend values the provider never exports: %v", bad)
	}
	if bad := unreal("egress_proxy_probes_total{backend=\"gcp\"}\n- exp_labels: {backend: \"local\"}"); len(bad) != 2 {
		t.Errorf("a made-up backend value is caught: %v", bad)
	}
	if !strings.Contains(string(raw), `backend="AWS"`) {
		t.Error("the rule tests cover the AWS backend")
	}
}
