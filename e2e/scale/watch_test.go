//go:build scale

package scale

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
)

// watchChanges watches the fleet's Proxies and counts, for each update,
// what it changed: status fields, conditions (by type), labels and
// annotations, the spec. It says which transitions the steady fleet's
// writes are.
func (e *env) watchChanges(t *testing.T, fleet string) func() map[string]int {
	t.Helper()
	dc, err := dynamic.NewForConfig(e.stack.Config)
	if err != nil {
		t.Fatal(err)
	}
	gvr := v1alpha1.SchemeGroupVersion.WithResource("proxies")
	ctx, cancel := context.WithCancel(context.Background())
	l, err := dc.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: fleetv1alpha1.LabelFleet + "=" + fleet})
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]map[string]string{}
	for _, p := range l.Items {
		last[p.GetName()] = flatten(p.Object)
	}
	w, err := dc.Resource(gvr).Namespace(ns).Watch(ctx, metav1.ListOptions{LabelSelector: fleetv1alpha1.LabelFleet + "=" + fleet, ResourceVersion: l.GetResourceVersion()})
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			now := flatten(u.Object)
			prev := last[u.GetName()]
			last[u.GetName()] = now
			if ev.Type != watch.Modified || prev == nil {
				counts[string(ev.Type)]++
				continue
			}
			for k, v := range now {
				if prev[k] != v {
					counts[k]++
				}
			}
			for k := range prev {
				if _, ok := now[k]; !ok {
					counts[k]++
				}
			}
		}
	}()
	return func() map[string]int {
		cancel()
		w.Stop()
		<-done
		return counts
	}
}

// flatten names what an update may change: each status field and
// condition, each label and annotation, and the spec as one.
func flatten(o map[string]any) map[string]string {
	out := map[string]string{}
	at, _, _ := unstructured.NestedMap(o, "status", "atProvider")
	for k, v := range at {
		out["status.atProvider."+k] = fmt.Sprint(v)
	}
	conds, _, _ := unstructured.NestedSlice(o, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		out[fmt.Sprintf("condition %v", m["type"])] = fmt.Sprint(m["status"], m["reason"], m["message"])
	}
	for _, f := range []string{"labels", "annotations"} {
		m, _, _ := unstructured.NestedStringMap(o, "metadata", f)
		for k, v := range m {
			out["metadata."+f+"."+k] = v
		}
	}
	spec, _, _ := unstructured.NestedMap(o, "spec")
	out["spec"] = fmt.Sprint(spec)
	return out
}

// watchBreaker samples the fleet's and its pools' Responsive conditions
// every 15 s until stopped, and returns what it saw open.
func (e *env) watchBreaker(fleet string) (chan struct{}, func(chan struct{}) []string) {
	stop := make(chan struct{})
	done := make(chan []string)
	go func() {
		seen := map[string]bool{}
		for {
			for _, kind := range []string{"ProxyFleet", fleetv1alpha1.ProxyPoolKind} {
				l := &unstructured.UnstructuredList{}
				l.SetAPIVersion(fleetv1alpha1.SchemeGroupVersion.String())
				l.SetKind(kind + "List")
				if err := e.stack.Client.List(context.Background(), l, client.InNamespace(ns)); err != nil {
					continue
				}
				for _, x := range l.Items {
					conds, _, _ := unstructured.NestedSlice(x.Object, "status", "conditions")
					for _, c := range conds {
						m, _ := c.(map[string]any)
						if m["type"] == "Responsive" && m["status"] == "False" {
							msg, _ := m["message"].(string)
							seen[kind+" "+x.GetName()+": "+msg] = true
						}
					}
				}
			}
			select {
			case <-stop:
				out := make([]string, 0, len(seen))
				for s := range seen {
					out = append(out, s)
				}
				sort.Strings(out)
				done <- out
				return
			case <-time.After(15 * time.Second):
			}
		}
	}()
	return stop, func(stop chan struct{}) []string {
		close(stop)
		return <-done
	}
}
