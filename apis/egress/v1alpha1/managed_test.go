package v1alpha1

import (
	"testing"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
)

// The method sets are hand-written (see managed.go); these tests prove that
// each getter returns what its setter stored, through the interfaces
// crossplane-runtime calls them by.

func TestManagedMethods(t *testing.T) {
	cases := map[string]struct {
		reason string
		mg     resource.ModernManaged
	}{
		"Proxy": {reason: "A Proxy is a modern (namespaced) managed resource.", mg: &Proxy{}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ready := xpv2.Available()
			tc.mg.SetConditions(ready)
			if diff := cmp.Diff(ready, tc.mg.GetCondition(xpv2.TypeReady)); diff != "" {
				t.Errorf("%s\nconditions: -want, +got:\n%s", tc.reason, diff)
			}

			policies := xpv2.ManagementPolicies{xpv2.ManagementActionObserve}
			tc.mg.SetManagementPolicies(policies)
			if diff := cmp.Diff(policies, tc.mg.GetManagementPolicies()); diff != "" {
				t.Errorf("%s\nmanagement policies: -want, +got:\n%s", tc.reason, diff)
			}

			pc := &xpv2.ProviderConfigReference{Kind: "ProviderConfig", Name: "local"}
			tc.mg.SetProviderConfigReference(pc)
			if diff := cmp.Diff(pc, tc.mg.GetProviderConfigReference()); diff != "" {
				t.Errorf("%s\nprovider config reference: -want, +got:\n%s", tc.reason, diff)
			}

			sec := &xpv2.LocalSecretReference{Name: "conn"}
			tc.mg.SetWriteConnectionSecretToReference(sec)
			if diff := cmp.Diff(sec, tc.mg.GetWriteConnectionSecretToReference()); diff != "" {
				t.Errorf("%s\nconnection secret reference: -want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}

func TestProviderConfigMethods(t *testing.T) {
	cases := map[string]struct {
		reason string
		pc     resource.ProviderConfig
	}{
		"ProviderConfig":        {reason: "A namespaced ProviderConfig counts its users.", pc: &ProviderConfig{}},
		"ClusterProviderConfig": {reason: "A ClusterProviderConfig counts its users.", pc: &ClusterProviderConfig{}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tc.pc.SetUsers(7)
			if got := tc.pc.GetUsers(); got != 7 {
				t.Errorf("%s\nusers: want 7, got %d", tc.reason, got)
			}
			c := xpv2.ReconcileSuccess()
			tc.pc.SetConditions(c)
			if diff := cmp.Diff(c, tc.pc.GetCondition(xpv2.TypeSynced)); diff != "" {
				t.Errorf("%s\nconditions: -want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}

func TestProviderConfigUsageMethods(t *testing.T) {
	cases := map[string]struct {
		reason string
		u      resource.TypedProviderConfigUsage
		list   resource.ProviderConfigUsageList
		add    func(resource.ProviderConfigUsageList)
	}{
		"ProviderConfigUsage": {
			reason: "A ProviderConfigUsage records a ProviderConfig's user.",
			u:      &ProviderConfigUsage{},
			list:   &ProviderConfigUsageList{},
			add: func(l resource.ProviderConfigUsageList) {
				l.(*ProviderConfigUsageList).Items = append(l.(*ProviderConfigUsageList).Items, ProviderConfigUsage{})
			},
		},
		"ClusterProviderConfigUsage": {
			reason: "A ClusterProviderConfigUsage records a ClusterProviderConfig's user.",
			u:      &ClusterProviderConfigUsage{},
			list:   &ClusterProviderConfigUsageList{},
			add: func(l resource.ProviderConfigUsageList) {
				l.(*ClusterProviderConfigUsageList).Items = append(l.(*ClusterProviderConfigUsageList).Items, ClusterProviderConfigUsage{})
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			pc := xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "default"}
			tc.u.SetProviderConfigReference(pc)
			if diff := cmp.Diff(pc, tc.u.GetProviderConfigReference()); diff != "" {
				t.Errorf("%s\nprovider config reference: -want, +got:\n%s", tc.reason, diff)
			}
			ref := xpv2.TypedReference{APIVersion: SchemeGroupVersion.String(), Kind: ProxyKind, Name: "p", UID: "u"}
			tc.u.SetResourceReference(ref)
			if diff := cmp.Diff(ref, tc.u.GetResourceReference()); diff != "" {
				t.Errorf("%s\nresource reference: -want, +got:\n%s", tc.reason, diff)
			}
			tc.add(tc.list)
			tc.add(tc.list)
			items := tc.list.GetItems()
			if len(items) != 2 {
				t.Fatalf("%s\nGetItems: want 2 items, got %d", tc.reason, len(items))
			}
			// GetItems must point into the list, not at copies, so that
			// callers can update usages in place.
			items[0].SetResourceReference(ref)
			again := tc.list.GetItems()
			if diff := cmp.Diff(ref, again[0].(resource.TypedProviderConfigUsage).GetResourceReference()); diff != "" {
				t.Errorf("%s\nGetItems must return pointers into the list: -want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}

func TestProxyListItems(t *testing.T) {
	l := &ProxyList{Items: []Proxy{{}, {}}}
	items := l.GetItems()
	items[1].SetConditions(xpv2.Unavailable())
	if got := l.Items[1].Status.GetCondition(xpv2.TypeReady).Status; got != corev1.ConditionFalse {
		t.Errorf("GetItems must return pointers into the list: Ready of item 1 is %q, want False", got)
	}
}
