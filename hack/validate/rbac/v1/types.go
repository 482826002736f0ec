// Package v1 describes, for crossplane beta validate, the Kubernetes
// RBAC kinds the examples use (Role, RoleBinding): Crossplane's validator
// reads schemas from CRDs only, so `go generate` here writes CRDs of the
// same fields as k8s.io/api's types, for hack/validate.sh to load
// offline. They are never installed.
//
// +kubebuilder:object:generate=false
// +groupName=rbac.authorization.k8s.io
package v1

//go:generate ../../../../bin/controller-gen crd:crdVersions=v1 paths=. output:crd:artifacts:config=../../schemas

import (
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Role is rbac.authorization.k8s.io/v1 Role.
// +kubebuilder:object:root=true
// +kubebuilder:storageversion
type Role struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// +optional
	Rules []rbacv1.PolicyRule `json:"rules,omitempty"`
}

// RoleBinding is rbac.authorization.k8s.io/v1 RoleBinding.
// +kubebuilder:object:root=true
// +kubebuilder:storageversion
type RoleBinding struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// +optional
	Subjects []rbacv1.Subject `json:"subjects,omitempty"`
	RoleRef  rbacv1.RoleRef   `json:"roleRef"`
}
