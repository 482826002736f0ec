package v1alpha1

import (
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	corev1 "k8s.io/api/core/v1"
)

// UsableSecret refuses a Secret not labelled LabelProxySecret=true: a
// fleet author names Secrets, but only someone who may write a Secret may
// label it, so neither a proxy nor egress-discovery (for the proxy's
// crawlers) reads another Secret of the namespace on the author's say.
func UsableSecret(s *corev1.Secret) error {
	if s.Labels[LabelProxySecret] != "true" {
		return errors.Errorf("secret %s/%s is not labelled %s=true: label it to let proxies use it", s.Namespace, s.Name, LabelProxySecret)
	}
	return nil
}
