// Package controller wires every controller of provider-egressproxy into a
// manager: the Proxy managed reconciler and the configuration reconcilers.
package controller

import (
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	ctrl "sigs.k8s.io/controller-runtime"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/config"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
)

// Setup adds all of the provider's controllers to mgr.
func Setup(mgr ctrl.Manager, o proxy.Options) error {
	if err := config.Setup(mgr, o.Options); err != nil {
		return errors.Wrap(err, "cannot set up configuration controllers")
	}
	return errors.Wrap(proxy.Setup(mgr, o), "cannot set up Proxy controller")
}
