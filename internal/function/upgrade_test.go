package function_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// upgradeFleet is a fleet as a user of the previous release wrote it (its
// schema, no pools), four local proxies in two zones, crawlers holding up
// to two leases on each.
const upgradeFleet = `apiVersion: crawl.example.com/v1alpha1
kind: ProxyFleet
metadata:
  name: crawlers
  namespace: crawl-team
  uid: 6b1e9d3e-0000-4000-8000-000000000033
spec:
  replicas: %d
  providerConfigRef:
    kind: ClusterProviderConfig
    name: local
  zones: [local-a, local-b]
  placement:
    local:
      bindAddress: 127.0.0.1
  proxy:
    authSecretRef:
      name: crawlers-proxy-auth
    allowedSourceRanges: [127.0.0.0/8]
  healthCheck:
    url: https://127.0.0.1:18443/ip
    interval: 10s
    timeout: 3s
    failureThreshold: 2
  rotation:
    maxAge: 24h
    maxSurge: 1
    maxUnavailable: 1
    replaceUnhealthyAfter: 2m
  leases:
    maxLeasesPerProxy: 2
    defaultTTL: 10m
    maxTTL: 1h
`

// TestUpgradeFromPreviousRelease: a fleet the previous release composed
// (its function built from git, rendered with its Composition by the real
// `crossplane render`) is taken over by this release's function and
// Composition without a disruption: every Proxy is kept, none is changed
// (a changed spec would touch a running instance, a new template revision
// would roll the whole fleet onto new egress IPs), none is added, the
// fleet stays Ready; and while egress-discovery has not yet written the
// LeaseSummaries this release reads instead of Leases (it upgrades after
// the Configuration, or not at all), an autoscaler that wants fewer
// proxies removes none, since their leases are unknown. The stored XR and
// every Proxy also validate against this release's XRD and CRDs.
//
// (The fleet's own scale-down, spec.replicas lowered, removes proxies at
// once in either release, as a Deployment's does; it is the autoscaler
// that spares proxies a crawler may hold.)
func TestUpgradeFromPreviousRelease(t *testing.T) {
	root := repoRoot(t)
	xp := filepath.Join(root, "bin", "crossplane")
	if _, err := os.Stat(xp); err != nil {
		t.Fatal("bin/crossplane is missing: run `make tools` (it builds the Crossplane CLI from the Go module proxy)")
	}
	old := t.TempDir()
	archive := exec.Command("sh", "-c", fmt.Sprintf("git -C %q archive --format=tar %s | tar -x -C %q", root, testbed.PreviousRelease, old))
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("cannot read the previous release %s from git (the test needs the repository's history: git fetch --unshallow): %v\n%s", testbed.PreviousRelease, err, out)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	render := func(fns, composition, xr string, flags ...string) []map[string]any {
		t.Helper()
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(xp, append([]string{"render", xr, composition, fns}, flags...)...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("crossplane render with %s: %v\n%s", composition, err, stderr.String())
		}
		var docs []map[string]any
		for _, doc := range strings.Split(stdout.String(), "\n---\n") {
			doc = strings.TrimPrefix(doc, "---\n")
			if strings.TrimSpace(doc) == "" {
				continue
			}
			m := map[string]any{}
			if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
				t.Fatalf("render's output does not parse: %v\n%s", err, doc)
			}
			docs = append(docs, m)
		}
		return docs
	}

	// The previous release composes the fleet.
	xr := write("xr.yaml", fmt.Appendf(nil, upgradeFleet, 4))
	before := render(startFunctionOf(t, root, old), filepath.Join(old, "apis", "fleet", "composition.yaml"), xr)
	var proxies []map[string]any
	var stored map[string]any
	others := map[string]bool{} // kind/name of what else it composed
	for _, d := range before {
		switch d["kind"] {
		case "Proxy":
			proxies = append(proxies, d)
		case fleetv1alpha1.ProxyFleetKind:
			stored = d
		default:
			others[fmt.Sprintf("%v/%v", d["kind"], d["metadata"].(map[string]any)["name"])] = true
		}
	}
	if len(proxies) != 4 || stored == nil {
		t.Fatalf("the previous release composed %d Proxies and no XR %t, want 4 and the XR", len(proxies), stored == nil)
	}
	// As the provider left them: Ready, healthy, an hour old, each with an
	// egress IP of its own.
	var observed []string
	specs := map[string]any{}
	for i, p := range proxies {
		meta := p["metadata"].(map[string]any)
		name := meta["name"].(string)
		meta["creationTimestamp"] = "2026-11-29T11:00:00Z"
		fp := p["spec"].(map[string]any)["forProvider"].(map[string]any)
		specs[name] = p["spec"]
		p["status"] = map[string]any{
			"conditions": []any{
				map[string]any{"type": "Ready", "status": "True", "reason": "Available", "lastTransitionTime": "2026-11-29T11:00:10Z"},
				map[string]any{"type": "Synced", "status": "True", "reason": "ReconcileSuccess", "lastTransitionTime": "2026-11-29T11:00:10Z"},
			},
			"atProvider": map[string]any{"providerID": "local/egress-" + name, "host": "127.0.0.1", "port": fp["port"], "healthy": true,
				"egressIP": fmt.Sprintf("203.0.113.%d", 10+i), "instanceCreatedAt": "2026-11-29T11:00:00Z", "lastProbeTime": "2026-11-29T11:00:10Z",
				"consecutiveSuccesses": 1, "latencyMilliseconds": 5, "phase": "Running"},
		}
		b, err := yaml.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		observed = append(observed, string(b))
	}
	observedFile := write("observed.yaml", []byte(strings.Join(observed, "---\n")))
	// The XR as the API stores it: the user's spec and the status the
	// previous release wrote.
	user := map[string]any{}
	if err := yaml.Unmarshal(fmt.Appendf(nil, upgradeFleet, 4), &user); err != nil {
		t.Fatal(err)
	}
	user["status"] = stored["status"]

	newFns := startFunction(t, root)
	composition := filepath.Join(root, "apis", "fleet", "composition.yaml")
	for _, tc := range []struct {
		name        string
		autoscaling map[string]any
		reason      string
	}{
		{name: "Steady", reason: "the upgrade alone changes no Proxy"},
		{name: "AutoscaledDownWhileLeasesUnknown", reason: "an autoscaler that wants one proxy while no LeaseSummary exists yet removes none: their leases are unknown",
			autoscaling: map[string]any{"minReplicas": 1, "maxReplicas": 4, "scaleDownStabilization": "0s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := user["spec"].(map[string]any)
			delete(spec, "autoscaling")
			if tc.autoscaling != nil {
				spec["autoscaling"] = tc.autoscaling
			}
			b, err := yaml.Marshal(user)
			if err != nil {
				t.Fatal(err)
			}
			after := render(newFns, composition, write("stored-"+tc.name+".yaml", b), "--observed-resources="+observedFile)
			got, gotOthers := map[string]any{}, map[string]bool{}
			var fleet map[string]any
			var composed []string
			for _, d := range after {
				switch d["kind"] {
				case "Proxy":
					name := d["metadata"].(map[string]any)["name"].(string)
					got[name] = d["spec"]
					composed = append(composed, stripStatus(t, d))
				case fleetv1alpha1.ProxyFleetKind:
					fleet = d
				default:
					gotOthers[fmt.Sprintf("%v/%v", d["kind"], d["metadata"].(map[string]any)["name"])] = true
				}
			}
			if diff := cmp.Diff(others, gotOthers); diff != "" {
				t.Errorf("%s: this release composes other resources than the previous release did (-previous +this):\n%s", tc.reason, diff)
			}
			if tc.autoscaling != nil {
				// Idle, it would aim at one proxy: it holds because the
				// leases are unknown, and says so.
				if msg := condition(fleet, "Autoscaling"); !strings.Contains(msg, "no LeaseSummary of the fleet is fresh") {
					t.Errorf("%s: the Autoscaling condition does not say the leases are unknown: %q", tc.reason, msg)
				}
			}
			if diff := cmp.Diff(specs, got); diff != "" {
				t.Errorf("%s: the Proxies this release composes differ from those the previous release composed and the provider runs (-previous +this):\n%s", tc.reason, diff)
			}
			if !ready(fleet) {
				t.Errorf("%s: the fleet is not Ready after the upgrade: %v", tc.reason, fleet["status"])
			}
			// The stored XR and the Proxies validate against this
			// release's XRD and CRDs.
			out, err := exec.Command(filepath.Join(root, "hack", "validate.sh"), write("validate-"+tc.name+".yaml", append(b, []byte("\n---\n"+strings.Join(composed, "\n---\n"))...))).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "0 failure cases") {
				t.Errorf("crossplane beta validate rejected the upgraded fleet or its Proxies: %v\n%s", err, out)
			}
		})
	}
}

// stripStatus is d without its status, as YAML.
func stripStatus(t *testing.T, d map[string]any) string {
	t.Helper()
	c := map[string]any{}
	for k, v := range d {
		if k != "status" {
			c[k] = v
		}
	}
	b, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// ready reports whether a rendered XR's Ready condition is True.
func ready(xr map[string]any) bool {
	return conditionOf(xr, "Ready")["status"] == "True"
}

// condition is the message of a rendered XR's condition of type typ.
func condition(xr map[string]any, typ string) string {
	msg, _ := conditionOf(xr, typ)["message"].(string)
	return msg
}

func conditionOf(xr map[string]any, typ string) map[string]any {
	st, _ := xr["status"].(map[string]any)
	conds, _ := st["conditions"].([]any)
	for _, c := range conds {
		if m, _ := c.(map[string]any); m["type"] == typ {
			return m
		}
	}
	return nil
}
