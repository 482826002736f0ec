// Package apis aggregates the Go API types of every group this product
// serves, so binaries register them with one call.
package apis

import (
	"k8s.io/apimachinery/pkg/runtime"

	egressv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
)

// AddToSchemes may be used to add all resources defined in the project to a
// Scheme.
var AddToSchemes = runtime.SchemeBuilder{
	egressv1alpha1.SchemeBuilder.AddToScheme,
}

// AddToScheme adds all Resources to the Scheme.
func AddToScheme(s *runtime.Scheme) error {
	return AddToSchemes.AddToScheme(s)
}
