package testbed

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// Kustomize renders cluster/<dir> with bin/kubectl, as `kubectl apply -k`
// would apply it, into its objects.
func Kustomize(t testing.TB, env *Env, dir string) []*unstructured.Unstructured {
	t.Helper()
	kubectl := filepath.Join(env.Root, "bin", "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		t.Fatal("bin/kubectl is missing: run `make tools` (it builds kubectl from the Go module proxy)")
	}
	out, err := exec.Command(kubectl, "kustomize", filepath.Join(env.Root, "cluster", dir)).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize cluster/%s: %v", dir, err)
	}
	var objs []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &u.Object); err != nil || len(u.Object) == 0 {
			continue
		}
		objs = append(objs, u)
	}
	return objs
}

// Impersonating returns a client that acts as the ServiceAccount user
// (system:serviceaccount:NS:NAME), with the groups a ServiceAccount has.
func Impersonating(t testing.TB, env *Env, user string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: ServiceAccountGroups(user)}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// ServiceAccountGroups are the groups of the ServiceAccount user.
func ServiceAccountGroups(user string) []string {
	parts := strings.Split(user, ":")
	ns := ""
	if len(parts) > 2 {
		ns = parts[2]
	}
	return []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
}
