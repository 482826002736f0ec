package function_test

import (
	"bytes"
	"flag"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

var update = flag.Bool("update", false, "rewrite the render golden files")

// fixedTime is the clock of the rendered examples; their fixtures are
// written relative to it.
const fixedTime = "2026-11-29T12:00:00Z"

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// startFunction builds and runs function-proxyfleet as a local process, the
// way `crossplane render` expects a Development-runtime function, and returns
// a functions.yaml pointing at it.
func startFunction(t *testing.T, root string) string {
	t.Helper()
	return startFunctionOf(t, root, root)
}

// startFunctionOf is startFunction with the function built from the
// source tree src (another release's).
func startFunctionOf(t *testing.T, root, src string) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "function")
	build := exec.Command("go", "build", "-o", bin, "./cmd/function")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("cannot build the function of %s: %v\n%s", src, err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	cmd := exec.Command(bin, "--insecure", "--address", addr, "--metrics-address", "127.0.0.1:0", "--fixed-time", fixedTime)
	cmd.Stderr = os.Stderr
	testbed.StartListening(t, cmd, addr)
	pkg, err := os.ReadFile(filepath.Join(root, "examples", "functions.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	fns := filepath.Join(dir, "functions.yaml")
	if err := os.WriteFile(fns, bytes.ReplaceAll(pkg, []byte("localhost:9443"), []byte(addr)), 0o644); err != nil {
		t.Fatal(err)
	}
	return fns
}

// TestRender runs the real `crossplane render` over the examples with the
// function as a local process, compares the output with golden files, and
// validates it with `crossplane beta validate` against the CRDs and XRDs.
func TestRender(t *testing.T) {
	root := repoRoot(t)
	xp := filepath.Join(root, "bin", "crossplane")
	if _, err := os.Stat(xp); err != nil {
		t.Fatal("bin/crossplane is missing: run `make tools` (it builds the Crossplane CLI from the Go module proxy)")
	}
	fns := startFunction(t, root)
	namespaced := filepath.Join(root, "apis", "fleet", "composition.yaml")
	legacy := filepath.Join(root, "apis", "fleet", "legacy", "composition.yaml")
	pool := filepath.Join(root, "apis", "fleet", "pool", "composition.yaml")

	cases := map[string]struct {
		reason      string
		xr          string
		composition string
		flags       []string
		want        []string // substrings the output must hold, beyond the golden file
	}{
		"local": {
			reason: "A fresh local fleet: three Proxies spread over two zones.",
			xr:     "examples/local/proxyfleet.yaml", composition: namespaced,
			want: []string{"name: crawlers-0", "name: crawlers-2", "crawl.example.com/zone: local-b"},
		},
		"kubernetes": {
			reason: "Pods are pinned to their zone with a node selector.",
			xr:     "examples/kubernetes/proxyfleet.yaml", composition: namespaced,
			want: []string{"topology.kubernetes.io/zone: europe-west1-c"},
		},
		"gcp": {
			reason: "Each VM gets its zone.",
			xr:     "examples/gcp/proxyfleet.yaml", composition: namespaced,
			want: []string{"zone: europe-west1-d"},
		},
		"aws": {
			reason: "Each EC2 instance gets its availability zone and the fleet's instance type.",
			xr:     "examples/aws/proxyfleet.yaml", composition: namespaced,
			want: []string{"zone: us-east-1c", "instanceType: t3.micro", "name: ec2-fleet-5"},
		},
		"pooled": {
			reason: "A pooled fleet of 5 in pools of 2 composes three ProxyPools, filled in order (2, 2, 1); no Proxy of its own.",
			xr:     "examples/pooled/proxyfleet.yaml", composition: namespaced,
			want: []string{"kind: ProxyPool", "name: pooled-pool-1", "name: pooled-pool-3", "fleet: pooled", "index: 3",
				"zones: - local-a - local-b", "scaleDown: Immediate", "proxies healthy in 3 pools"},
		},
		"pool": {
			reason: "A pool composes its Proxies with ordinals from its index x 10 000 000, labelled with its fleet and itself, and reports counts and its budget.",
			xr:     "examples/render/pool/xr.yaml", composition: pool,
			want: []string{"name: pooled-20000000", "name: pooled-20000001", "crawl.example.com/fleet: pooled", "crawl.example.com/pool: pooled-pool-2",
				"desiredReplicas: 2", "budget: maxRepairs: 0 maxSurge: 0 maxUnavailable: 0"},
		},
		"legacy": {
			reason: "A claimed XProxyFleet composes into the claim's namespace.",
			xr:     "examples/render/legacy/xr.yaml", composition: legacy,
			want: []string{"name: legacy-crawlers-1", "namespace: crawl-team"},
		},
		"rotation": {
			reason: "An old proxy with a Ready replacement stays while a crawler holds its lease.",
			xr:     "examples/render/rotation/xr.yaml", composition: namespaced,
			flags: []string{"--observed-resources=" + filepath.Join(root, "examples/render/rotation/observed-resources.yaml"),
				"--required-resources=" + filepath.Join(root, "examples/render/rotation/required-resources.yaml")},
			want: []string{"name: crawlers-0", "crawlers-0 waits for its leases to drain", "crawlers-1 waits for surge capacity"},
		},
		"rollout": {
			reason: "After a template change the old Proxies keep their spec, and a surge Proxy of the new template replaces the first.",
			xr:     "examples/render/rollout/xr.yaml", composition: namespaced,
			flags: []string{"--observed-resources=" + filepath.Join(root, "examples/render/rollout/observed-resources.yaml")},
			want: []string{"name: crawlers-3", `crawl.example.com/replaces: "0"`, "port: 3130", "port: 3128", "template-revision: 0ld0ld0ld0",
				"rolling out template revision", "3 of 3 proxies to replace", "crawlers-1 waits for surge capacity",
				// Ready while the surge proxy boots, and progressing.
				"reason: Available status: \"True\" type: Ready", "reason: Progressing status: \"False\" type: RolloutStalled", "remaining: 3"},
		},
		"autoscaling": {
			reason: "An autoscaled fleet grows to serve the leases held, waiting and refused, counting only fresh demand.",
			xr:     "examples/render/autoscaling/xr.yaml", composition: namespaced,
			flags: []string{"--observed-resources=" + filepath.Join(root, "examples/render/autoscaling/observed-resources.yaml"),
				"--required-resources=" + filepath.Join(root, "examples/render/autoscaling/required-resources.yaml")},
			want: []string{"name: crawlers-3", "desiredReplicas: 4", "held: 5", "waiting: 2", "refused: 1", "capacity: 6",
				"aiming at 4 proxies: utilization 1.33 > 0.70; spec.replicas (2) is ignored while spec.autoscaling is set",
				"reason: DemandDriven", "replicas: 4 time: \"2026-11-29T12:00:00Z\""},
		},
		"unhealthy": {
			reason: "A proxy down longer than replaceUnhealthyAfter gets a replacement in its zone.",
			xr:     "examples/render/unhealthy/xr.yaml", composition: namespaced,
			flags: []string{"--observed-resources=" + filepath.Join(root, "examples/render/unhealthy/observed-resources.yaml"), "--include-function-results"},
			want:  []string{"name: crawlers-3", `crawl.example.com/replaces: "1"`, "proxy crawlers-1 unhealthy since 2026-11-29T11:48:00Z", "severity: SEVERITY_WARNING"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"render", filepath.Join(root, tc.xr), tc.composition, fns}, tc.flags...)
			var stdout, stderr bytes.Buffer
			cmd := exec.Command(xp, args...)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("crossplane render: %v\n%s", err, stderr.String())
			}
			got := stdout.Bytes()
			golden := filepath.Join("testdata", "render", name+".yaml")
			if *update {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./internal/function -run TestRender -update to create it)", err)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("%s\n-golden, +rendered:\n%s", tc.reason, diff)
			}
			// YAML folds long messages; compare with whitespace collapsed.
			flat := strings.Join(strings.Fields(string(got)), " ")
			for _, w := range tc.want {
				if !strings.Contains(flat, w) {
					t.Errorf("%s\nthe rendered output lacks %q", tc.reason, w)
				}
			}

			// Only the composed resources are validated: the XR printed by
			// render carries just its status.
			rendered := filepath.Join(t.TempDir(), "rendered.yaml")
			if err := os.WriteFile(rendered, composedOnly(got), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(filepath.Join(root, "hack", "validate.sh"), rendered).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "0 failure cases") {
				t.Errorf("%s\ncrossplane beta validate rejected the rendered Proxies: %v\n%s", tc.reason, err, out)
			}
		})
	}
}

// composedOnly keeps the composed Proxies and ProxyPools of render's
// output (the XR, a pool in the pool's render, carries its status).
func composedOnly(out []byte) []byte {
	var keep []string
	for _, doc := range strings.Split(string(out), "\n---\n") {
		if strings.Contains(doc, "kind: Proxy\n") || strings.Contains(doc, "kind: ProxyPool\n") && !strings.Contains(doc, "status:") {
			keep = append(keep, strings.TrimPrefix(doc, "---\n"))
		}
	}
	return []byte(strings.Join(keep, "\n---\n") + "\n")
}
