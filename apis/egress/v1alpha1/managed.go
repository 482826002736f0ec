package v1alpha1

import (
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
)

// These method sets are what crossplane-tools' angryjet would generate. Its
// module is not served by the module proxy this project builds from, so they
// are written by hand; managed_test.go proves each getter returns what its
// setter stored.

// GetCondition of this Proxy.
func (mg *Proxy) GetCondition(ct xpv2.ConditionType) xpv2.Condition {
	return mg.Status.GetCondition(ct)
}

// SetConditions of this Proxy.
func (mg *Proxy) SetConditions(c ...xpv2.Condition) {
	mg.Status.SetConditions(c...)
}

// GetManagementPolicies of this Proxy.
func (mg *Proxy) GetManagementPolicies() xpv2.ManagementPolicies {
	return mg.Spec.ManagementPolicies
}

// SetManagementPolicies of this Proxy.
func (mg *Proxy) SetManagementPolicies(r xpv2.ManagementPolicies) {
	mg.Spec.ManagementPolicies = r
}

// GetProviderConfigReference of this Proxy.
func (mg *Proxy) GetProviderConfigReference() *xpv2.ProviderConfigReference {
	return mg.Spec.ProviderConfigReference
}

// SetProviderConfigReference of this Proxy.
func (mg *Proxy) SetProviderConfigReference(r *xpv2.ProviderConfigReference) {
	mg.Spec.ProviderConfigReference = r
}

// GetWriteConnectionSecretToReference of this Proxy.
func (mg *Proxy) GetWriteConnectionSecretToReference() *xpv2.LocalSecretReference {
	return mg.Spec.WriteConnectionSecretToReference
}

// SetWriteConnectionSecretToReference of this Proxy.
func (mg *Proxy) SetWriteConnectionSecretToReference(r *xpv2.LocalSecretReference) {
	mg.Spec.WriteConnectionSecretToReference = r
}

// GetItems of this ProxyList.
func (l *ProxyList) GetItems() []resource.Managed {
	items := make([]resource.Managed, len(l.Items))
	for i := range l.Items {
		items[i] = &l.Items[i]
	}
	return items
}

// GetCondition of this ProviderConfig.
func (pc *ProviderConfig) GetCondition(ct xpv2.ConditionType) xpv2.Condition {
	return pc.Status.GetCondition(ct)
}

// SetConditions of this ProviderConfig.
func (pc *ProviderConfig) SetConditions(c ...xpv2.Condition) {
	pc.Status.SetConditions(c...)
}

// GetUsers of this ProviderConfig.
func (pc *ProviderConfig) GetUsers() int64 {
	return pc.Status.Users
}

// SetUsers of this ProviderConfig.
func (pc *ProviderConfig) SetUsers(i int64) {
	pc.Status.Users = i
}

// GetCondition of this ClusterProviderConfig.
func (pc *ClusterProviderConfig) GetCondition(ct xpv2.ConditionType) xpv2.Condition {
	return pc.Status.GetCondition(ct)
}

// SetConditions of this ClusterProviderConfig.
func (pc *ClusterProviderConfig) SetConditions(c ...xpv2.Condition) {
	pc.Status.SetConditions(c...)
}

// GetUsers of this ClusterProviderConfig.
func (pc *ClusterProviderConfig) GetUsers() int64 {
	return pc.Status.Users
}

// SetUsers of this ClusterProviderConfig.
func (pc *ClusterProviderConfig) SetUsers(i int64) {
	pc.Status.Users = i
}

// GetProviderConfigReference of this ProviderConfigUsage.
func (u *ProviderConfigUsage) GetProviderConfigReference() xpv2.ProviderConfigReference {
	return u.ProviderConfigReference
}

// SetProviderConfigReference of this ProviderConfigUsage.
func (u *ProviderConfigUsage) SetProviderConfigReference(r xpv2.ProviderConfigReference) {
	u.ProviderConfigReference = r
}

// GetResourceReference of this ProviderConfigUsage.
func (u *ProviderConfigUsage) GetResourceReference() xpv2.TypedReference {
	return u.ResourceReference
}

// SetResourceReference of this ProviderConfigUsage.
func (u *ProviderConfigUsage) SetResourceReference(r xpv2.TypedReference) {
	u.ResourceReference = r
}

// GetItems of this ProviderConfigUsageList.
func (l *ProviderConfigUsageList) GetItems() []resource.ProviderConfigUsage {
	items := make([]resource.ProviderConfigUsage, len(l.Items))
	for i := range l.Items {
		items[i] = &l.Items[i]
	}
	return items
}

// GetProviderConfigReference of this ClusterProviderConfigUsage.
func (u *ClusterProviderConfigUsage) GetProviderConfigReference() xpv2.ProviderConfigReference {
	return u.ProviderConfigReference
}

// SetProviderConfigReference of this ClusterProviderConfigUsage.
func (u *ClusterProviderConfigUsage) SetProviderConfigReference(r xpv2.ProviderConfigReference) {
	u.ProviderConfigReference = r
}

// GetResourceReference of this ClusterProviderConfigUsage.
func (u *ClusterProviderConfigUsage) GetResourceReference() xpv2.TypedReference {
	return u.ResourceReference
}

// SetResourceReference of this ClusterProviderConfigUsage.
func (u *ClusterProviderConfigUsage) SetResourceReference(r xpv2.TypedReference) {
	u.ResourceReference = r
}

// GetItems of this ClusterProviderConfigUsageList.
func (l *ClusterProviderConfigUsageList) GetItems() []resource.ProviderConfigUsage {
	items := make([]resource.ProviderConfigUsage, len(l.Items))
	for i := range l.Items {
		items[i] = &l.Items[i]
	}
	return items
}

// Compile-time proof that the types satisfy crossplane-runtime's interfaces.
var (
	_ resource.ModernManaged            = &Proxy{}
	_ resource.ManagedList              = &ProxyList{}
	_ resource.ProviderConfig           = &ProviderConfig{}
	_ resource.ProviderConfig           = &ClusterProviderConfig{}
	_ resource.TypedProviderConfigUsage = &ProviderConfigUsage{}
	_ resource.TypedProviderConfigUsage = &ClusterProviderConfigUsage{}
	_ resource.ProviderConfigUsageList  = &ProviderConfigUsageList{}
	_ resource.ProviderConfigUsageList  = &ClusterProviderConfigUsageList{}
)
