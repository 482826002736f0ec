package kubernetes

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
)

// networkPolicy confines one proxy pod at the network layer, apart from
// Squid's own rules, where the cluster's CNI enforces NetworkPolicy: in
// only to the proxy port from its allowed source ranges and client
// namespaces (anyone, when it has credentials and neither), out only to DNS and to the public internet,
// plus the private destinations its ProviderConfig permitted. It is named
// and labelled like the pod and deleted with it.
func (b *Backend) networkPolicy(s backend.Spec) *networkingv1.NetworkPolicy {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	dns := intstr.FromInt32(53)
	port := intstr.FromInt32(s.Port)

	in := networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}}
	for _, r := range s.AllowedSourceRanges {
		in.From = append(in.From, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: r}})
	}
	if ns := s.Kubernetes.ClientNamespaces; len(ns) > 0 {
		in.From = append(in.From, networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpIn, Values: ns}},
		}})
	}

	// The public internet: everything but the private destinations, per
	// address family.
	var public []networkingv1.NetworkPolicyPeer
	for _, all := range []string{"0.0.0.0/0", "::/0"} {
		is4 := netip.MustParsePrefix(all).Addr().Is4()
		block := &networkingv1.IPBlock{CIDR: all}
		for _, p := range squid.PrivateDestinations {
			if p.Addr().Is4() == is4 {
				block.Except = append(block.Except, p.String())
			}
		}
		for _, p := range []string{"127.0.0.0/8", "0.0.0.0/8", "::1/128", "::/128"} {
			if netip.MustParsePrefix(p).Addr().Is4() == is4 {
				block.Except = append(block.Except, p)
			}
		}
		public = append(public, networkingv1.NetworkPolicyPeer{IPBlock: block})
	}
	for _, r := range s.AllowedPrivateDestinations {
		public = append(public, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: r}})
	}

	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, Labels: b.labels(s)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{ownership.LabelUID: ownership.LabelValue(string(s.Owner.UID))}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{in},
			Egress: []networkingv1.NetworkPolicyEgressRule{
				{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns}}},
				{To: public},
			},
		},
	}
}
