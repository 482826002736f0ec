package proxy

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/test"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/fake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/local"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

func TestImageAllowed(t *testing.T) {
	allowed := []string{"docker.io/ubuntu/squid", "registry.example.com/proxies/", "quay.io/x/squid:6.6", "localhost:5000/squid"}
	for image, want := range map[string]bool{
		"docker.io/ubuntu/squid":                       true,
		"docker.io/ubuntu/squid:5.2-22.04_beta":        true,
		"docker.io/ubuntu/squid@sha256:abc":            true,
		"docker.io/ubuntu/squidx":                      false, // shares a prefix, another repository
		"docker.io/ubuntu/squid/evil":                  false,
		"docker.io/ubuntu":                             false,
		"registry.example.com/proxies/squid:6":         true,
		"registry.example.com/proxies/../attacker/img": false,
		"registry.example.com/proxiesx/squid":          false,
		"registry.example.com/proxies/squid:6 --rm":    false,
		"quay.io/x/squid:6.6":                          true,
		"quay.io/x/squid:6.6-evil":                     false, // a tagged reference admits no other tag
		"quay.io/x/squid:6.7":                          false,
		"localhost:5000/squid:1":                       true,
		"":                                             false,
		"attacker/img":                                 false,
	} {
		if got := imageAllowed(image, allowed); got != want {
			t.Errorf("imageAllowed(%q) = %v, want %v", image, got, want)
		}
	}
}

func TestAdmit(t *testing.T) {
	cluster := func(spec v1alpha1.ProviderConfigSpec) *config {
		return &config{Kind: v1alpha1.ClusterProviderConfigKind, Name: "platform", Spec: spec}
	}
	pods := v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendKubernetes, Kubernetes: &v1alpha1.KubernetesBackend{Namespace: "egress-proxies"}}
	vms := v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendGCP, GCP: &v1alpha1.GCPBackend{Project: "crawl-proj"}}
	pod := func(k v1alpha1.KubernetesPlacement) *v1alpha1.Proxy {
		return unitProxy(func(p *v1alpha1.Proxy) { p.Spec.ForProvider.Local, p.Spec.ForProvider.Kubernetes = nil, &k })
	}
	vm := func(g v1alpha1.GCPInstance) *v1alpha1.Proxy {
		return unitProxy(func(p *v1alpha1.Proxy) {
			p.Spec.ForProvider.Local = nil
			p.Spec.ForProvider.GCP = &v1alpha1.GCPPlacement{Zone: "europe-west1-b", GCPInstance: g}
		})
	}
	ec2 := v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendAWS, AWS: &v1alpha1.AWSBackend{Region: "us-east-1"}}
	instance := func(a v1alpha1.AWSPlacement) *v1alpha1.Proxy {
		return unitProxy(func(p *v1alpha1.Proxy) {
			p.Spec.ForProvider.Local = nil
			if a.Zone == "" {
				a.Zone = "us-east-1a"
			}
			p.Spec.ForProvider.AWS = &a
		})
	}
	ec2Listing := v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendAWS, AWS: &v1alpha1.AWSBackend{Region: "us-east-1"}, Policy: &v1alpha1.Policy{AWS: &v1alpha1.AWSPolicy{
		AllowedInstanceTypes: []string{"c7i.large"}, AllowedSubnets: []string{"subnet-1"}, AllowedSecurityGroups: []string{"sg-1"}, AllowUserData: true,
	}}}
	// What a refusal says: the field, the value, the ProviderConfig and
	// which of its policy's lists.
	notPermitted := func(field, value, kind, name, which string) string {
		return fmt.Sprintf(errFmtNotPermitted, field, value, kind, name, which)
	}
	for name, tc := range map[string]struct {
		p    *v1alpha1.Proxy
		pc   *config
		want string // "" admits
	}{
		"EC2Defaults":                 {instance(v1alpha1.AWSPlacement{}), cluster(ec2), ""},
		"EC2Type":                     {instance(v1alpha1.AWSPlacement{AWSInstance: v1alpha1.AWSInstance{InstanceType: "c7i.large"}}), cluster(ec2), notPermitted("aws.instanceType", "c7i.large", "ClusterProviderConfig", "platform", fmt.Sprintf(whichFmtUnset, "aws.allowedInstanceTypes", []string{"t3.micro", "t3.small", "t3a.micro", "t3a.small"}))},
		"EC2TypeListed":               {instance(v1alpha1.AWSPlacement{AWSInstance: v1alpha1.AWSInstance{InstanceType: "c7i.large", Subnet: "subnet-1", SecurityGroups: []string{"sg-1"}, UserData: &v1alpha1.CloudInit{}}}), cluster(ec2Listing), ""},
		"EC2DefaultTypeNotListed":     {instance(v1alpha1.AWSPlacement{}), cluster(ec2Listing), notPermitted("aws.instanceType", "t3.micro", "ClusterProviderConfig", "platform", fmt.Sprintf(whichFmtAllows, "aws.allowedInstanceTypes", []string{"c7i.large"}))},
		"EC2Image":                    {instance(v1alpha1.AWSPlacement{AWSInstance: v1alpha1.AWSInstance{Image: "ami-0evil"}}), cluster(ec2), notPermitted("aws.image", "ami-0evil", "ClusterProviderConfig", "platform", fmt.Sprintf(whichFmtUnset, "aws.allowedImages", []string{"resolve:ssm:/aws/service/debian/release/12/latest/amd64"}))},
		"EC2Subnet":                   {instance(v1alpha1.AWSPlacement{AWSInstance: v1alpha1.AWSInstance{Subnet: "subnet-2"}}), cluster(ec2), notPermitted("aws.subnet", "subnet-2", "ClusterProviderConfig", "platform", fmt.Sprintf(whichFmtNone, "aws.allowedSubnets"))},
		"EC2SecurityGroup":            {instance(v1alpha1.AWSPlacement{AWSInstance: v1alpha1.AWSInstance{InstanceType: "c7i.large", SecurityGroups: []string{"sg-1", "sg-2"}}}), cluster(ec2Listing), notPermitted("aws.securityGroups", "sg-2", "ClusterProviderConfig", "platform", fmt.Sprintf(whichFmtAllows, "aws.allowedSecurityGroups", []string{"sg-1"}))},
		"EC2UserData":                 {instance(v1alpha1.AWSPlacement{AWSInstance: v1alpha1.AWSInstance{UserData: &v1alpha1.CloudInit{}}}), cluster(ec2), fmt.Sprintf(errFmtOwnStartup, "aws.userData", "ClusterProviderConfig", "platform", "aws.allowUserData", "instances")},
		"EC2ZoneElsewhere":            {instance(v1alpha1.AWSPlacement{Zone: "eu-west-1a"}), cluster(ec2), fmt.Sprintf(errFmtZoneOutsideRegion, "eu-west-1a", "us-east-1", "ClusterProviderConfig", "platform", "us-east-1", "us-east-1")},
		"PodDefaults":                 {pod(v1alpha1.KubernetesPlacement{}), cluster(pods), ""},
		"PodZoneSelector":             {pod(v1alpha1.KubernetesPlacement{NodeSelector: map[string]string{"topology.kubernetes.io/zone": "a"}}), cluster(pods), ""},
		"PodConfigNamespaceExplicit":  {pod(v1alpha1.KubernetesPlacement{Namespace: "egress-proxies"}), cluster(pods), ""},
		"PodOtherNamespace":           {pod(v1alpha1.KubernetesPlacement{Namespace: "kube-system"}), cluster(pods), notPermitted("kubernetes.namespace", "kube-system", "ClusterProviderConfig", "platform", fmt.Sprintf(whichFmtUnset, "kubernetes.allowedNamespaces", []string{"egress-proxies"}))},
		"PodOwnNamespaceWithoutPodNS": {pod(v1alpha1.KubernetesPlacement{}), cluster(v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendKubernetes}), ""},
		"PodListedNamespace": {pod(v1alpha1.KubernetesPlacement{Namespace: "crawl-b"}), cluster(v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendKubernetes,
			Policy: &v1alpha1.Policy{Kubernetes: &v1alpha1.KubernetesPolicy{AllowedNamespaces: []string{"crawl-a", "crawl-b"}}}}), ""},
		"TenantPodElsewhere": {pod(v1alpha1.KubernetesPlacement{Namespace: "kube-system"}), &config{Kind: v1alpha1.ProviderConfigKind, Name: "mine", Namespace: "team",
			Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendKubernetes, Policy: &v1alpha1.Policy{Kubernetes: &v1alpha1.KubernetesPolicy{AllowedNamespaces: []string{"kube-system"}}}}},
			notPermitted("kubernetes.namespace", "kube-system", "ProviderConfig", "mine", fmt.Sprintf(whichFmtUnset, "kubernetes.allowedNamespaces", []string{"team"}))},
		"PodImage":               {pod(v1alpha1.KubernetesPlacement{Image: "attacker/img"}), cluster(pods), notPermitted("kubernetes.image", "attacker/img", "ClusterProviderConfig", "platform", fmt.Sprintf(whichFmtUnset, "kubernetes.allowedImages", []string{"gitea.home.hrajfrisbee.cz/kacerr/egress-squid:v0.1.0"}))},
		"PodNodeSelector":        {pod(v1alpha1.KubernetesPlacement{NodeSelector: map[string]string{"node-role.kubernetes.io/control-plane": ""}}), cluster(pods), notPermitted("kubernetes.nodeSelector", "node-role.kubernetes.io/control-plane", "ClusterProviderConfig", "platform", fmt.Sprintf(whichFmtUnset, "kubernetes.allowedNodeSelectorKeys", []string{"topology.kubernetes.io/zone"}))},
		"VMDefaults":             {vm(v1alpha1.GCPInstance{}), cluster(vms), ""},
		"VMNetworkByName":        {vm(v1alpha1.GCPInstance{Network: "default"}), cluster(vms), ""},
		"VMNetworkFullURL":       {vm(v1alpha1.GCPInstance{Network: "https://www.googleapis.com/compute/v1/projects/crawl-proj/global/networks/default"}), cluster(vms), ""},
		"VMOtherProjectsNetwork": {vm(v1alpha1.GCPInstance{Network: "projects/other/global/networks/default"}), cluster(vms), notPermitted("gcp.network", "projects/other/global/networks/default", "ClusterProviderConfig", "platform", fmt.Sprintf(whichFmtUnset, "gcp.allowedNetworks", []string{"global/networks/default"}))},
		"VMTag":                  {vm(v1alpha1.GCPInstance{NetworkTags: []v1alpha1.NetworkTag{"http-server"}}), cluster(vms), notPermitted("gcp.networkTags", "http-server", "ClusterProviderConfig", "platform", fmt.Sprintf(whichFmtNone, "gcp.allowedNetworkTags"))},
		"VMMachineZonalURL":      {vm(v1alpha1.GCPInstance{MachineType: "zones/europe-west1-b/machineTypes/e2-small"}), cluster(vms), ""},
		"VMMachine":              {vm(v1alpha1.GCPInstance{MachineType: "a3-megagpu-8g"}), cluster(vms), notPermitted("gcp.machineType", "a3-megagpu-8g", "ClusterProviderConfig", "platform", fmt.Sprintf(whichFmtUnset, "gcp.allowedMachineTypes", []string{"e2-micro", "e2-small", "e2-medium"}))},
		"VMMachineSmuggled":      {vm(v1alpha1.GCPInstance{MachineType: "zones/z/machineTypes/n2-highmem-96#/e2-micro"}), cluster(vms), notPermitted("gcp.machineType", "zones/z/machineTypes/n2-highmem-96#/e2-micro", "ClusterProviderConfig", "platform", fmt.Sprintf(whichFmtUnset, "gcp.allowedMachineTypes", []string{"e2-micro", "e2-small", "e2-medium"}))},
		"VMImage":                {vm(v1alpha1.GCPInstance{Image: "projects/debian-cloud/global/images/family/debian-12-evil"}), cluster(vms), notPermitted("gcp.image", "projects/debian-cloud/global/images/family/debian-12-evil", "ClusterProviderConfig", "platform", fmt.Sprintf(whichFmtUnset, "gcp.allowedImages", []string{"projects/debian-cloud/global/images/family/debian-12"}))},
		"VMSubnetworkByDefault":  {vm(v1alpha1.GCPInstance{Subnetwork: "regions/europe-west1/subnetworks/crawl"}), cluster(vms), notPermitted("gcp.subnetwork", "regions/europe-west1/subnetworks/crawl", "ClusterProviderConfig", "platform", fmt.Sprintf(whichFmtNone, "gcp.allowedSubnetworks"))},
		"VMSubnetworkAllowed": {vm(v1alpha1.GCPInstance{Network: "projects/net-host/global/networks/shared", Subnetwork: "https://www.googleapis.com/compute/v1/projects/net-host/regions/europe-west1/subnetworks/crawl"}), cluster(v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendGCP,
			GCP: &v1alpha1.GCPBackend{Project: "crawl-proj"}, Policy: &v1alpha1.Policy{GCP: &v1alpha1.GCPPolicy{
				AllowedNetworks: []string{"projects/net-host/global/networks/shared"}, AllowedSubnetworks: []string{"projects/net-host/regions/europe-west1/subnetworks/crawl"},
			}}}), ""},
		"VMSubnetworkOtherHost": {vm(v1alpha1.GCPInstance{Network: "projects/net-host/global/networks/shared", Subnetwork: "projects/evil-host/regions/europe-west1/subnetworks/crawl"}), cluster(v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendGCP,
			GCP: &v1alpha1.GCPBackend{Project: "crawl-proj"}, Policy: &v1alpha1.Policy{GCP: &v1alpha1.GCPPolicy{
				AllowedNetworks: []string{"projects/net-host/global/networks/shared"}, AllowedSubnetworks: []string{"projects/net-host/regions/europe-west1/subnetworks/crawl"},
			}}}), notPermitted("gcp.subnetwork", "projects/evil-host/regions/europe-west1/subnetworks/crawl", "ClusterProviderConfig", "platform", fmt.Sprintf(whichFmtAllows, "gcp.allowedSubnetworks", []string{"projects/net-host/regions/europe-west1/subnetworks/crawl"}))},
		"VMCloudInit": {vm(v1alpha1.GCPInstance{CloudInit: &v1alpha1.CloudInit{}}), cluster(vms), fmt.Sprintf(errFmtOwnStartup, "gcp.cloudInit", "ClusterProviderConfig", "platform", "gcp.allowCloudInit", "VMs")},
		"VMCloudInitAllowed": {vm(v1alpha1.GCPInstance{CloudInit: &v1alpha1.CloudInit{}}), cluster(v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendGCP,
			Policy: &v1alpha1.Policy{GCP: &v1alpha1.GCPPolicy{AllowCloudInit: true}}}), ""},
	} {
		err := admit(tc.p, tc.pc)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: want admitted, got %v", name, err)
		case tc.want != "" && (err == nil || err.Error() != tc.want):
			t.Errorf("%s: want the refusal %q, got %v", name, tc.want, err)
		}
	}
}

func TestTenantConfig(t *testing.T) {
	secret := xpv2.CredentialsSourceSecret
	for name, tc := range map[string]struct {
		pc   *config
		want string
	}{
		"ClusterMaySetAll": {&config{Kind: v1alpha1.ClusterProviderConfigKind, Name: "c", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal,
			Local: &v1alpha1.LocalBackend{SquidPath: "/usr/sbin/squid", StateDir: "/var/lib/x"}}}, ""},
		"TenantLocalDefaults": {&config{Kind: v1alpha1.ProviderConfigKind, Name: "p", Namespace: "team", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal}}, ""},
		"TenantSquidPath": {&config{Kind: v1alpha1.ProviderConfigKind, Name: "p", Namespace: "team", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal,
			Local: &v1alpha1.LocalBackend{SquidPath: "/tmp/evil"}}}, fmt.Sprintf(errFmtTenantHostField, "ProviderConfig team/p", "squidPath")},
		"TenantStateDir": {&config{Kind: v1alpha1.ProviderConfigKind, Name: "p", Namespace: "team", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal,
			Local: &v1alpha1.LocalBackend{StateDir: "/"}}}, fmt.Sprintf(errFmtTenantHostField, "ProviderConfig team/p", "stateDir")},
		"TenantPortRange": {&config{Kind: v1alpha1.ProviderConfigKind, Name: "p", Namespace: "team", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal,
			Local: &v1alpha1.LocalBackend{PortRange: &v1alpha1.PortRange{From: 2000, To: 2001}}}}, fmt.Sprintf(errFmtTenantHostField, "ProviderConfig team/p", "portRange")},
		"TenantPodsWithoutCredentials": {&config{Kind: v1alpha1.ProviderConfigKind, Name: "p", Namespace: "team", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendKubernetes}}, fmt.Sprintf(errFmtTenantIdentity, "ProviderConfig team/p", "kubernetes", "a kubeconfig")},
		"TenantPodsWithSecret": {&config{Kind: v1alpha1.ProviderConfigKind, Name: "p", Namespace: "team", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendKubernetes,
			Kubernetes: &v1alpha1.KubernetesBackend{Credentials: &v1alpha1.KubernetesCredentials{Source: secret}}}}, ""},
		"TenantGCPInjected": {&config{Kind: v1alpha1.ProviderConfigKind, Name: "p", Namespace: "team", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendGCP,
			GCP: &v1alpha1.GCPBackend{Project: "platform", Credentials: v1alpha1.GCPCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}}}}, fmt.Sprintf(errFmtTenantIdentity, "ProviderConfig team/p", "gcp", "a service-account key")},
		"TenantAWSInjected": {&config{Kind: v1alpha1.ProviderConfigKind, Name: "p", Namespace: "team", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendAWS,
			AWS: &v1alpha1.AWSBackend{Region: "us-east-1", Credentials: v1alpha1.AWSCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}}}}, fmt.Sprintf(errFmtTenantIdentity, "ProviderConfig team/p", "aws", "an access key")},
		"TenantAWSWithSecret": {&config{Kind: v1alpha1.ProviderConfigKind, Name: "p", Namespace: "team", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendAWS,
			AWS: &v1alpha1.AWSBackend{Region: "us-east-1", Credentials: v1alpha1.AWSCredentials{Source: secret}}}}, ""},
		"ClusterAWSInjected": {&config{Kind: v1alpha1.ClusterProviderConfigKind, Name: "c", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendAWS,
			AWS: &v1alpha1.AWSBackend{Region: "us-east-1", Credentials: v1alpha1.AWSCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}}}}, ""},
	} {
		err := tenantConfig(tc.pc)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: want accepted, got %v", name, err)
		case tc.want != "" && (err == nil || err.Error() != tc.want):
			t.Errorf("%s: want the refusal %q, got %v", name, tc.want, err)
		}
	}
	// The backend source refuses before it builds anything.
	b := NewBackends(BackendsConfig{StateDir: t.TempDir()})
	if _, err := b.For(t.Context(), &config{Kind: v1alpha1.ProviderConfigKind, Name: "p", Namespace: "team", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal,
		Local: &v1alpha1.LocalBackend{SquidPath: "/tmp/evil"}}}); err == nil || len(b.local) != 0 {
		t.Errorf("Backends.For must refuse a tenant's squidPath before making a backend: %v, %d local backends", err, len(b.local))
	}
}

// TestTenantLocalProxiesDenyLoopback: only the platform's configuration
// lets local proxies reach the provider host's loopback services.
func TestTenantLocalProxiesDenyLoopback(t *testing.T) {
	p := unitProxy(func(*v1alpha1.Proxy) {})
	tenant := &config{Kind: v1alpha1.ProviderConfigKind, Name: "p", Namespace: "team", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal}}
	tenant.Spec.Policy = &v1alpha1.Policy{Local: &v1alpha1.LocalPolicy{AllowLoopbackDestinations: true}}
	platform := &config{Kind: v1alpha1.ClusterProviderConfigKind, Name: "c", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal}}
	if desiredSpec(p, tenant, "c1", nil, "").AllowLoopbackDestinations {
		t.Error("a tenant's local proxy must not reach the provider host's loopback, whatever its policy says")
	}
	if desiredSpec(p, platform, "c1", nil, "").AllowLoopbackDestinations {
		t.Error("the platform's local proxies reach loopback only when its policy says so")
	}
	platform.Spec.Policy = &v1alpha1.Policy{Local: &v1alpha1.LocalPolicy{AllowLoopbackDestinations: true}}
	if !desiredSpec(p, platform, "c1", nil, "").AllowLoopbackDestinations {
		t.Error("the platform's local proxies reach loopback, where local targets live, when its policy says so")
	}
}

// TestRefusedInstanceGrace: an instance its ProviderConfig no longer
// permits is not handed out at once, and deleted only once the refusal has
// stood for the grace period (a policy typo fixed within it costs
// nothing), and never when the Proxy's management policies keep the
// provider from deleting.
func TestRefusedInstanceGrace(t *testing.T) {
	inst := backend.Instance{Ref: backend.Ref{Name: ownership.InstanceName("uid-1")}, ProviderID: "local/" + ownership.InstanceName("uid-1"), Host: "127.0.0.1", Port: 3128,
		Phase: v1alpha1.InstancePhaseRunning, CreatedAt: epoch.Add(-time.Hour)}
	refused := func(mods ...func(*v1alpha1.Proxy)) *v1alpha1.Proxy {
		return unitProxy(append([]func(*v1alpha1.Proxy){func(p *v1alpha1.Proxy) {
			p.Spec.ForProvider.AllowedPrivateDestinations = []v1alpha1.CIDR{"10.1.0.0/16"}
			p.SetConditions(xpv2.Available())
		}}, mods...)...)
	}
	c := &clock{t: epoch}
	b := fake.New()
	b.Put(inst)
	e := newExternal(b, &fakeProber{}, c)
	e.refusedGrace = 5 * time.Minute
	p := refused()
	if _, err := e.Observe(context.Background(), p); cmp.Diff(admit(refused(), e.pc), err, test.EquateErrors()) != "" {
		t.Fatalf("a refused Proxy's Observe must fail with the policy's refusal, got %v", err)
	}
	if r := p.GetCondition(xpv2.TypeReady); r.Reason != ReasonNotPermitted || b.CallCount("Delete") != 0 {
		t.Fatalf("at first refusal: not handed out, not yet deleted; got Ready %s, %d deletes", r.Reason, b.CallCount("Delete"))
	}
	c.t = epoch.Add(4 * time.Minute)
	_, _ = e.Observe(context.Background(), p)
	if b.CallCount("Delete") != 0 {
		t.Fatal("deleted within the grace period")
	}
	c.t = epoch.Add(5 * time.Minute)
	_, _ = e.Observe(context.Background(), p)
	if b.CallCount("Delete") != 1 {
		t.Fatalf("once the refusal has stood for the grace period the instance goes; %d deletes", b.CallCount("Delete"))
	}

	// Observe-only: the provider never deletes.
	b = fake.New()
	b.Put(inst)
	e = newExternal(b, &fakeProber{}, &clock{t: epoch})
	p = refused(func(p *v1alpha1.Proxy) {
		p.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve})
	})
	_, _ = e.Observe(context.Background(), p)
	if b.CallCount("Delete") != 0 {
		t.Error("an Observe-only Proxy's instance must never be deleted")
	}
	if r := p.GetCondition(xpv2.TypeReady); r.Reason != ReasonNotPermitted {
		t.Errorf("but it is not handed out either: Ready %s", r.Reason)
	}
}

// TestLocalBackendFollowsItsConfig: the local backend is one per state
// dir, since it supervises the dir's processes, and a ClusterProviderConfig
// whose port range changed gets that backend with the new range at once,
// not after the provider restarts.
func TestLocalBackendFollowsItsConfig(t *testing.T) {
	b := NewBackends(BackendsConfig{StateDir: testbed.SquidStateDir(t)})
	squid := testbed.SquidBinary(t)
	pc := func(to int32) *config {
		return &config{Kind: v1alpha1.ClusterProviderConfigKind, Name: "local", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal,
			Local: &v1alpha1.LocalBackend{SquidPath: squid, PortRange: &v1alpha1.PortRange{From: 31280, To: to}}}}
	}
	first, err := b.For(t.Context(), pc(31299))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	again, err := b.For(t.Context(), pc(31999))
	if err != nil {
		t.Fatal(err)
	}
	lb, ok := again.(*local.Backend)
	if !ok || again != first {
		t.Fatalf("a changed config got another backend for the same state dir: %T", again)
	}
	if pr := lb.PortRange(); pr == nil || pr.To != 31999 {
		t.Errorf("the backend's port range after the config changed: %+v, want 31280-31999", pr)
	}
	// A tenant's ProviderConfig on the same state dir, which names no
	// range (it may not), leaves the platform's alone.
	tenant := &config{Kind: v1alpha1.ProviderConfigKind, Name: "own", Namespace: "team", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal}}
	if _, err := b.For(t.Context(), tenant); err != nil {
		t.Fatal(err)
	}
	if pr := lb.PortRange(); pr == nil || pr.To != 31999 {
		t.Errorf("a tenant's config reset the platform's port range to %+v", pr)
	}
}
