package proxy

import (
	"context"
	"strconv"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/gc"
)

// resolveConfig reads the ProviderConfig or ClusterProviderConfig a Proxy
// references.
func resolveConfig(ctx context.Context, kube client.Client, p *v1alpha1.Proxy) (*config, error) {
	ref := p.GetProviderConfigReference()
	if ref == nil {
		return nil, errors.New("spec.providerConfigRef is not set")
	}
	switch ref.Kind {
	case v1alpha1.ClusterProviderConfigKind:
		pc := &v1alpha1.ClusterProviderConfig{}
		if err := kube.Get(ctx, types.NamespacedName{Name: ref.Name}, pc); err != nil {
			return nil, configError(err, ref.Kind, ref.Name)
		}
		return &config{Kind: ref.Kind, Name: pc.Name, UID: pc.UID, Version: strconv.FormatInt(pc.Generation, 10), Spec: pc.Spec}, nil
	case v1alpha1.ProviderConfigKind:
		pc := &v1alpha1.ProviderConfig{}
		if err := kube.Get(ctx, types.NamespacedName{Namespace: p.GetNamespace(), Name: ref.Name}, pc); err != nil {
			return nil, configError(err, ref.Kind, p.GetNamespace()+"/"+ref.Name)
		}
		return &config{Kind: ref.Kind, Name: pc.Name, Namespace: pc.Namespace, UID: pc.UID, Version: strconv.FormatInt(pc.Generation, 10), Spec: pc.Spec}, nil
	default:
		return nil, errors.Errorf("spec.providerConfigRef.kind %q is neither %s nor %s", ref.Kind, v1alpha1.ProviderConfigKind, v1alpha1.ClusterProviderConfigKind)
	}
}

func configError(err error, kind, name string) error {
	if kerrors.IsNotFound(err) {
		return errors.Errorf("%s %s not found: create it, or fix spec.providerConfigRef", kind, name)
	}
	return errors.Wrapf(err, "cannot get %s %s", kind, name)
}

// usageTracker records which Proxies use which configuration, with the usage
// kind that matches the configuration's kind.
type usageTracker struct {
	namespaced *resource.ProviderConfigUsageTracker
	cluster    *resource.ProviderConfigUsageTracker
}

func newUsageTracker(c client.Client) *usageTracker {
	return &usageTracker{
		namespaced: resource.NewProviderConfigUsageTracker(c, &v1alpha1.ProviderConfigUsage{}),
		cluster:    resource.NewProviderConfigUsageTracker(c, &v1alpha1.ClusterProviderConfigUsage{}),
	}
}

// Track records p's usage of its configuration.
func (u *usageTracker) Track(ctx context.Context, p *v1alpha1.Proxy) error {
	if ref := p.GetProviderConfigReference(); ref != nil && ref.Kind == v1alpha1.ClusterProviderConfigKind {
		return u.cluster.Track(ctx, p)
	}
	return u.namespaced.Track(ctx, p)
}

// CollectorSources gives the orphan collector the backend of every
// configuration in the cluster and the UID of every Proxy.
type CollectorSources struct {
	Kube     client.Reader
	Backends BackendSource
}

var _ gc.Sources = CollectorSources{}

// Targets resolves every ProviderConfig and ClusterProviderConfig to its
// backend.
func (s CollectorSources) Targets(ctx context.Context) ([]gc.Target, error) {
	var configs []struct {
		c   *config
		obj client.Object
	}
	pcs := &v1alpha1.ProviderConfigList{}
	if err := s.Kube.List(ctx, pcs); err != nil {
		return nil, errors.Wrap(err, "cannot list ProviderConfigs")
	}
	for i := range pcs.Items {
		pc := &pcs.Items[i]
		configs = append(configs, struct {
			c   *config
			obj client.Object
		}{&config{Kind: v1alpha1.ProviderConfigKind, Name: pc.Name, Namespace: pc.Namespace, UID: pc.UID, Version: strconv.FormatInt(pc.Generation, 10), Spec: pc.Spec}, pc})
	}
	cpcs := &v1alpha1.ClusterProviderConfigList{}
	if err := s.Kube.List(ctx, cpcs); err != nil {
		return nil, errors.Wrap(err, "cannot list ClusterProviderConfigs")
	}
	for i := range cpcs.Items {
		pc := &cpcs.Items[i]
		configs = append(configs, struct {
			c   *config
			obj client.Object
		}{&config{Kind: v1alpha1.ClusterProviderConfigKind, Name: pc.Name, UID: pc.UID, Version: strconv.FormatInt(pc.Generation, 10), Spec: pc.Spec}, pc})
	}
	out := make([]gc.Target, 0, len(configs))
	live := map[types.UID]bool{}
	for _, c := range configs {
		live[c.c.UID] = true
	}
	// Clients of configurations that are gone are let go.
	if p, ok := s.Backends.(interface{ prune(map[types.UID]bool) }); ok {
		p.prune(live)
	}
	for _, c := range configs {
		b, err := s.Backends.For(ctx, c.c)
		if err != nil {
			err = errors.Wrapf(err, "cannot use %s %s", c.c.Kind, c.c.Name)
		}
		out = append(out, gc.Target{Kind: string(c.c.Spec.Backend), Backend: b, Object: c.obj, Err: err})
	}
	return out, nil
}

// Owners lists the UID of every Proxy.
func (s CollectorSources) Owners(ctx context.Context) (map[types.UID]bool, error) {
	l := &v1alpha1.ProxyList{}
	if err := s.Kube.List(ctx, l); err != nil {
		return nil, errors.Wrap(err, "cannot list Proxies")
	}
	out := make(map[types.UID]bool, len(l.Items))
	for _, p := range l.Items {
		out[p.UID] = true
	}
	return out, nil
}
