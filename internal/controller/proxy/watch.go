package proxy

import (
	"context"
	"reflect"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
)

// Indexes of Proxies by what they are made from, so that a change to a
// Secret or a ProviderConfig reaches the Proxies that use it within
// seconds, not at their next poll: a rotated password, a fixed
// credentials Secret or a widened policy lifts a failed create's hold, and
// an auth Secret's new password reaches its proxies.
const (
	indexSecrets = "egress.crawl.example.com/secrets"
	indexConfig  = "egress.crawl.example.com/config"
)

// proxySecrets indexes a Proxy by its auth and cloud-init Secrets.
func proxySecrets(o client.Object) []string {
	p, ok := o.(*v1alpha1.Proxy)
	if !ok {
		return nil
	}
	var out []string
	for _, k := range usedSecrets(p, nil) {
		out = append(out, k.String())
	}
	return out
}

// proxyConfig indexes a Proxy by its ProviderConfig, as KIND/NAMESPACE/NAME.
func proxyConfig(o client.Object) []string {
	p, ok := o.(*v1alpha1.Proxy)
	if !ok || p.GetProviderConfigReference() == nil {
		return nil
	}
	return []string{configKey(p.GetProviderConfigReference().Kind, p.GetNamespace(), p.GetProviderConfigReference().Name)}
}

func configKey(kind, proxyNamespace, name string) string {
	if kind == v1alpha1.ClusterProviderConfigKind {
		return kind + "//" + name
	}
	return kind + "/" + proxyNamespace + "/" + name
}

func setupIndexes(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.Proxy{}, indexSecrets, proxySecrets); err != nil {
		return err
	}
	return mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.Proxy{}, indexConfig, proxyConfig)
}

// secretContentChanged passes a Secret's creation and deletion, and an
// update of its data or of the label that lets proxies use it: not the
// metadata writes (annotations, managed fields) that tools make all day,
// each of which would otherwise reach every Proxy using the Secret.
func secretContentChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e ctrlevent.UpdateEvent) bool {
			o, okOld := e.ObjectOld.(*corev1.Secret)
			n, okNew := e.ObjectNew.(*corev1.Secret)
			if !okOld || !okNew {
				return false
			}
			return !reflect.DeepEqual(o.Data, n.Data) || !reflect.DeepEqual(o.StringData, n.StringData) ||
				o.GetLabels()[v1alpha1.LabelProxySecret] != n.GetLabels()[v1alpha1.LabelProxySecret]
		},
		GenericFunc: func(ctrlevent.GenericEvent) bool { return false },
	}
}

// watcher maps changes of what Proxies are made from to the Proxies.
type watcher struct{ kube client.Client }

func (w watcher) proxies(ctx context.Context, index, key string) []reconcile.Request {
	l := &v1alpha1.ProxyList{}
	if err := w.kube.List(ctx, l, client.MatchingFields{index: key}); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(l.Items))
	for i := range l.Items {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: l.Items[i].Namespace, Name: l.Items[i].Name}})
	}
	return out
}

// forSecret: the Proxies whose auth or cloud-init Secret it is, and those
// of every ProviderConfig whose credentials it holds.
func (w watcher) forSecret(ctx context.Context, o client.Object) []reconcile.Request {
	s, ok := o.(*corev1.Secret)
	if !ok {
		return nil
	}
	key := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
	out := w.proxies(ctx, indexSecrets, key.String())
	pcs := &v1alpha1.ProviderConfigList{}
	if err := w.kube.List(ctx, pcs, client.InNamespace(s.Namespace)); err == nil {
		for i := range pcs.Items {
			pc := &config{Kind: v1alpha1.ProviderConfigKind, Namespace: pcs.Items[i].Namespace, Spec: pcs.Items[i].Spec}
			if holds(pc, key) {
				out = append(out, w.proxies(ctx, indexConfig, configKey(v1alpha1.ProviderConfigKind, pc.Namespace, pcs.Items[i].Name))...)
			}
		}
	}
	cpcs := &v1alpha1.ClusterProviderConfigList{}
	if err := w.kube.List(ctx, cpcs); err == nil {
		for i := range cpcs.Items {
			if holds(&config{Kind: v1alpha1.ClusterProviderConfigKind, Spec: cpcs.Items[i].Spec}, key) {
				out = append(out, w.proxies(ctx, indexConfig, configKey(v1alpha1.ClusterProviderConfigKind, "", cpcs.Items[i].Name))...)
			}
		}
	}
	return out
}

// holds reports whether pc's credentials are in the Secret key.
func holds(pc *config, key types.NamespacedName) bool {
	for _, k := range usedSecrets(&v1alpha1.Proxy{}, pc) {
		if k == key {
			return true
		}
	}
	return false
}

// forConfig: the Proxies that use a ProviderConfig.
func (w watcher) forConfig(ctx context.Context, o client.Object) []reconcile.Request {
	switch o.(type) {
	case *v1alpha1.ClusterProviderConfig:
		return w.proxies(ctx, indexConfig, configKey(v1alpha1.ClusterProviderConfigKind, "", o.GetName()))
	case *v1alpha1.ProviderConfig:
		// A ProviderConfig serves the Proxies of its own namespace.
		return w.proxies(ctx, indexConfig, configKey(v1alpha1.ProviderConfigKind, o.GetNamespace(), o.GetName()))
	}
	return nil
}
