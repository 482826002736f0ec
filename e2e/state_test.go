//go:build e2e

package e2e

import (
	"context"
	"path/filepath"
	"sort"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

type fleetStatus struct {
	ready   bool
	healthy int
	message string
	// throttled holds Crossplane's message when it throttles the fleet's
	// reconciles because the fleet or its Proxies change too often.
	throttled string
	// duplicates is the DuplicateEgressIP condition's status.
	duplicates string
}

func fleetObject(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("crawl.example.com/v1alpha1")
	u.SetKind("ProxyFleet")
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

// observe reads a fleet's status and its Proxies.
func observe(fleet string) (fleetStatus, []v1alpha1.Proxy, error) {
	st, err := fleetState(fleet)
	if err != nil {
		return st, nil, err
	}
	ps, err := proxies(fleet)
	return st, ps, err
}

func fleetState(name string) (fleetStatus, error) {
	u := fleetObject(name)
	if err := stack.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, u); err != nil {
		return fleetStatus{}, err
	}
	st := fleetStatus{}
	h, _, _ := unstructured.NestedInt64(u.Object, "status", "healthyReplicas")
	st.healthy = int(h)
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		switch m["type"] {
		case "Ready":
			st.ready = m["status"] == "True"
		case "FleetHealthy":
			st.message, _ = m["message"].(string)
		case "DuplicateEgressIP":
			st.duplicates, _ = m["status"].(string)
		case "Responsive":
			if m["status"] == "False" {
				st.throttled, _ = m["message"].(string)
			}
		}
	}
	return st, nil
}

func proxies(fleet string) ([]v1alpha1.Proxy, error) {
	l := &v1alpha1.ProxyList{}
	err := stack.Client.List(context.Background(), l, client.InNamespace(ns), client.MatchingLabels{fleetv1alpha1.LabelFleet: fleet})
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	return l.Items, err
}

// namesAndReady returns the Proxies' names and how many are Ready.
func namesAndReady(ps []v1alpha1.Proxy) ([]string, int) {
	names := make([]string, 0, len(ps))
	ready := 0
	for _, p := range ps {
		names = append(names, p.Name)
		if isReady(&p) {
			ready++
		}
	}
	return names, ready
}

func isReady(p *v1alpha1.Proxy) bool {
	return p.GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue
}

// instanceDir is the local backend's folder for a Proxy's Squid.
func instanceDir(p *v1alpha1.Proxy) string {
	return filepath.Join(stack.SquidDir, ownership.InstanceName(p.UID))
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
