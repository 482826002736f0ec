package proxy

import (
	"slices"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
)

// TestProbeSourcesMerged: a ProviderConfig's spec.probe.sourceRanges join
// the source ranges of each Proxy that restricts its clients (once, named
// apart, and changing its hash, since its Squid and firewall change), and
// nothing of a Proxy that admits any client with credentials, whose hash
// therefore stays as it was.
func TestProbeSourcesMerged(t *testing.T) {
	creds := &backend.Credentials{Username: "u", Password: "p"}
	plain := &config{Kind: "ClusterProviderConfig", Name: "c", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal}}
	probing := &config{Kind: plain.Kind, Name: plain.Name, Spec: *plain.Spec.DeepCopy()}
	probing.Spec.Probe = &v1alpha1.ProbeSource{SourceRanges: []v1alpha1.CIDR{"198.51.100.7/32", "127.0.0.0/8"}}

	restricted := unitProxy() // 127.0.0.0/8
	s := desiredSpec(restricted, probing, "unit", creds, "")
	if !slices.Equal(s.AllowedSourceRanges, []string{"127.0.0.0/8", "198.51.100.7/32"}) || !slices.Equal(s.ProbeSourceRanges, []string{"198.51.100.7/32"}) {
		t.Errorf("the probe's ranges join the Proxy's once: allowed %v, probe %v", s.AllowedSourceRanges, s.ProbeSourceRanges)
	}
	if s.Hash == desiredSpec(restricted, plain, "unit", creds, "").Hash {
		t.Error("adding probe ranges changes what the instance admits, so its hash")
	}

	open := unitProxy(func(p *v1alpha1.Proxy) { p.Spec.ForProvider.AllowedSourceRanges = nil })
	s = desiredSpec(open, probing, "unit", creds, "")
	if len(s.AllowedSourceRanges) != 0 || len(s.ProbeSourceRanges) != 0 {
		t.Errorf("a Proxy admitting any client with credentials gets nothing added: %v %v", s.AllowedSourceRanges, s.ProbeSourceRanges)
	}
	if s.Hash != desiredSpec(open, plain, "unit", creds, "").Hash {
		t.Error("such a Proxy's hash must not change, or setting probe ranges would replace it for nothing")
	}
}

// TestProbeSourcesAdmitted: a public probe range is refused for a Proxy
// without credentials that restricts its clients (it would open the proxy
// to everyone behind the provider's NAT), naming the ProviderConfig's
// field; with credentials, or from a private range, it is admitted.
func TestProbeSourcesAdmitted(t *testing.T) {
	pc := &config{Kind: "ClusterProviderConfig", Name: "c", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal,
		Probe: &v1alpha1.ProbeSource{SourceRanges: []v1alpha1.CIDR{"198.51.100.7/32"}}}}
	err := admit(unitProxy(), pc)
	if err == nil || !strings.Contains(err.Error(), "ClusterProviderConfig c spec.probe.sourceRanges \"198.51.100.7/32\"") || !strings.Contains(err.Error(), "authSecretRef") {
		t.Errorf("a public probe range into a proxy without credentials must be refused naming the field: %v", err)
	}
	withCreds := unitProxy(func(p *v1alpha1.Proxy) {
		p.Spec.ForProvider.AuthSecretRef = &v1alpha1.AuthSecretReference{Name: "auth"}
	})
	if err := admit(withCreds, pc); err != nil {
		t.Errorf("with credentials a public probe range is fine: %v", err)
	}
	pc.Spec.Probe.SourceRanges = []v1alpha1.CIDR{"10.8.0.0/16"}
	if err := admit(unitProxy(), pc); err != nil {
		t.Errorf("a private probe range is fine without credentials: %v", err)
	}
}
