// Package config reconciles ProviderConfigs and ClusterProviderConfigs: it
// counts the Proxies using each and keeps one in use from being deleted.
package config

import (
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/providerconfig"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
)

// Setup adds the controllers of both configuration kinds.
func Setup(mgr ctrl.Manager, o controller.Options) error {
	for _, k := range []struct {
		kinds  resource.ProviderConfigKinds
		config resource.ProviderConfig
		usage  resource.ProviderConfigUsage
	}{
		{
			kinds: resource.ProviderConfigKinds{
				Config:    v1alpha1.ProviderConfigGroupVersionKind,
				Usage:     v1alpha1.ProviderConfigUsageGroupVersionKind,
				UsageList: v1alpha1.ProviderConfigUsageListGroupVersionKind,
			},
			config: &v1alpha1.ProviderConfig{},
			usage:  &v1alpha1.ProviderConfigUsage{},
		},
		{
			kinds: resource.ProviderConfigKinds{
				Config:    v1alpha1.ClusterProviderConfigGroupVersionKind,
				Usage:     v1alpha1.ClusterProviderConfigUsageGroupVersionKind,
				UsageList: v1alpha1.ClusterProviderConfigUsageListGroupVersionKind,
			},
			config: &v1alpha1.ClusterProviderConfig{},
			usage:  &v1alpha1.ClusterProviderConfigUsage{},
		},
	} {
		name := providerconfig.ControllerName(k.kinds.Config.GroupKind().String())
		r := providerconfig.NewReconciler(mgr, k.kinds,
			providerconfig.WithLogger(o.Logger.WithValues("controller", name)),
			providerconfig.WithRecorder(event.NewAPIRecorder(mgr.GetEventRecorderFor(name)))) //nolint:staticcheck // crossplane-runtime's recorder takes the old events API.
		err := ctrl.NewControllerManagedBy(mgr).
			Named(name).
			WithOptions(o.ForControllerRuntime()).
			For(k.config).
			Watches(k.usage, &resource.EnqueueRequestForProviderConfig{}).
			Complete(r)
		if err != nil {
			return errors.Wrapf(err, "cannot set up %s controller", name)
		}
	}
	return nil
}
