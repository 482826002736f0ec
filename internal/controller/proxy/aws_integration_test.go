package proxy_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/aws/ec2fake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestAWSProxy runs a Proxy on the AWS backend: the real EC2 client,
// signed with an access key from the ClusterProviderConfig's Secret,
// talks to the in-process fake of the EC2 API; the test plays the
// instance booting, running a real Squid from its user data on loopback,
// and the proxy becomes Ready through it. A policy refuses an instance
// type it does not list, naming the field, and makes nothing; deleting
// the Proxy terminates its instance.
func TestAWSProxy(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := namespace(t)
	fake := ec2fake.Start(t)
	fake.PendingFor = time.Hour // the test boots the instance
	target := testbed.StartEchoTarget(t)
	pm := metrics.NewProvider()
	prov := startAWSProvider(t, fake, target, func(o *proxy.Options) { o.Metrics = pm })
	defer prov.stop()
	ctx := context.Background()

	pc := "aws-" + ns
	create(t, awsConfig(ns, pc)...)
	p := vmProxy(ns, "ec2-proxy", 32340, target, pc, "")
	p.Spec.ForProvider.GCP = nil
	p.Spec.ForProvider.AWS = &v1alpha1.AWSPlacement{Zone: "us-east-1a"}
	p.Spec.ForProvider.AllowedSourceRanges = []v1alpha1.CIDR{"127.0.0.0/8"}
	big := vmProxy(ns, "too-big", 32341, target, pc, "")
	big.Spec.ForProvider.GCP = nil
	big.Spec.ForProvider.AWS = &v1alpha1.AWSPlacement{Zone: "us-east-1a", AWSInstance: v1alpha1.AWSInstance{InstanceType: "c7i.large"}}
	create(t,
		authSecret(ns), p, big,
	)
	key := types.NamespacedName{Namespace: ns, Name: "ec2-proxy"}

	var vm ec2fake.Instance
	testbed.Eventually(t, 10*time.Second, "the fake runs an instance", func() (bool, string) {
		all := fake.Instances()
		if len(all) == 1 {
			vm = all[0]
		}
		return len(all) == 1, fmt.Sprintf("%d instances, %d RunInstances", len(all), fake.Calls("RunInstances"))
	})
	testbed.Eventually(t, 5*time.Second, "provisioning while the instance boots", func() (bool, string) {
		c := get(t, key).GetCondition(xpv2.TypeReady)
		return c.Reason == proxy.ReasonProvisioning, string(c.Reason)
	})
	script, err := base64.StdEncoding.DecodeString(vm.UserData)
	if err != nil {
		t.Fatal(err)
	}
	testbed.StartScriptSquid(t, string(script), "127.0.0.1:32340", nil)
	fake.SetPublicIP(vm.ID, "127.0.0.1")
	fake.SetState(vm.ID, "running")
	testbed.Eventually(t, 15*time.Second, "Ready through the instance's Squid", ready(t, key, corev1.ConditionTrue))
	if ap := get(t, key).Status.AtProvider; ap.ProviderID != "aws:///us-east-1a/"+vm.ID || ap.EgressIP != "127.0.0.1" {
		t.Errorf("atProvider: %+v", ap)
	}
	// The monitoring pack's metrics name the backend.
	if n := testutil.ToFloat64(pm.ProbeResults.WithLabelValues(string(v1alpha1.BackendAWS), "success")); n < 1 {
		t.Errorf("probes of an EC2 proxy counted under backend %q: %v", v1alpha1.BackendAWS, n)
	}
	if n := testutil.ToFloat64(pm.Instances.WithLabelValues(string(v1alpha1.BackendAWS), string(v1alpha1.InstancePhaseRunning))); n != 1 {
		t.Errorf("running EC2 instances under backend %q: %v", v1alpha1.BackendAWS, n)
	}
	if c := get(t, types.NamespacedName{Namespace: ns, Name: "too-big"}).GetCondition(xpv2.TypeReady); !strings.Contains(c.Message, "spec.forProvider.aws.instanceType") {
		t.Errorf("an instance type the policy does not list: %q", c.Message)
	}
	if n := len(fake.Instances()); n != 1 {
		t.Errorf("the refused Proxy made an instance: %d", n)
	}

	if err := bed.Client.Delete(ctx, get(t, key)); err != nil {
		t.Fatal(err)
	}
	fake.TerminatingFor = 0
	testbed.Eventually(t, 15*time.Second, "the Proxy gone and its instance terminated", func() (bool, string) {
		err := bed.Client.Get(ctx, key, &v1alpha1.Proxy{})
		state := fake.Instances()[0].State
		return kerrors.IsNotFound(err) && (state == "terminated" || state == "shutting-down"), fmt.Sprintf("proxy err=%v, instance %s", err, state)
	})
	deleteProxies(t, ns)
}

// awsConfig is a ClusterProviderConfig pc of the AWS backend, signing
// with an access key the fake accepts, from a Secret in ns: both objects.
func awsConfig(ns, pc string) []client.Object {
	return []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "aws-key"}, StringData: map[string]string{
			"credentials": "[default]\naws_access_key_id = " + ec2fake.AccessKey + "\naws_secret_access_key = " + ec2fake.SecretKey + "\n",
		}},
		&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: pc}, Spec: v1alpha1.ProviderConfigSpec{
			Backend: v1alpha1.BackendAWS,
			AWS: &v1alpha1.AWSBackend{Region: ec2fake.Region, Credentials: v1alpha1.AWSCredentials{Source: xpv2.CredentialsSourceSecret,
				CommonCredentialSelectors: xpv2.CommonCredentialSelectors{SecretRef: &xpv2.SecretKeySelector{SecretReference: xpv2.SecretReference{Namespace: ns, Name: "aws-key"}, Key: "credentials"}}}},
		}},
	}
}

// awsProxy is a Proxy on an instance in us-east-1a through pc.
func awsProxy(ns, name string, port int32, target testbed.Target, pc string) *v1alpha1.Proxy {
	p := vmProxy(ns, name, port, target, pc, "")
	p.Spec.ForProvider.GCP = nil
	p.Spec.ForProvider.AWS = &v1alpha1.AWSPlacement{Zone: ec2fake.Region + "a"}
	p.Spec.ForProvider.AllowedSourceRanges = []v1alpha1.CIDR{"127.0.0.0/8"}
	return p
}

// TestAWSKeptAndImported: a Proxy whose management policies leave out
// Delete tags its instance to outlive it; deleted, it leaves the instance
// running, and the orphan collector leaves it too; a new Proxy naming the
// instance in its external-name imports it (its tags then name the
// importer) and becomes Ready through it, and its own deletion, with
// every policy, terminates it.
func TestAWSKeptAndImported(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := namespace(t)
	ctx := context.Background()
	fake := ec2fake.Start(t)
	fake.PendingFor = time.Hour // the test boots the instance
	target := testbed.StartEchoTarget(t)
	prov := startAWSProvider(t, fake, target)
	defer prov.stop()
	defer deleteProxies(t, ns)
	pc := "aws-kept-" + ns
	create(t, awsConfig(ns, pc)...)
	kept := awsProxy(ns, "kept", 32342, target, pc)
	kept.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate, xpv2.ManagementActionLateInitialize})
	create(t, authSecret(ns), kept)
	var vm ec2fake.Instance
	testbed.Eventually(t, 10*time.Second, "an instance tagged to outlive its Proxy", func() (bool, string) {
		all := fake.Instances()
		if len(all) != 1 {
			return false, fmt.Sprintf("%d instances", len(all))
		}
		vm = all[0]
		return vm.Tags[ownership.LabelRetain] == "true", fmt.Sprint(vm.Tags)
	})
	key := types.NamespacedName{Namespace: ns, Name: "kept"}
	if err := bed.Client.Delete(ctx, get(t, key)); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, "the Proxy gone", func() (bool, string) {
		err := bed.Client.Get(ctx, key, &v1alpha1.Proxy{})
		return kerrors.IsNotFound(err), fmt.Sprint(err)
	})
	if r, err := collectorAnHourAhead(bed, prov).Collect(ctx); err != nil || fake.Instances()[0].State != "pending" {
		t.Fatalf("the orphan collector leaves a retained instance: %+v %v, %s", r, err, fake.Instances()[0].State)
	}

	imp := awsProxy(ns, "importer", 32342, target, pc)
	imp.SetAnnotations(map[string]string{"crossplane.io/external-name": "aws:///us-east-1a/" + vm.ID})
	create(t, imp)
	ikey := types.NamespacedName{Namespace: ns, Name: "importer"}
	testbed.Eventually(t, 10*time.Second, "imported", func() (bool, string) {
		ap := get(t, ikey).Status.AtProvider
		return ap.ImportedFrom == "aws:///us-east-1a/"+vm.ID, fmt.Sprintf("%+v %v", ap, get(t, ikey).GetCondition(xpv2.TypeReady))
	})
	if o, _ := ownership.FromLabels(fake.Instances()[0].Tags); o.Holder() != get(t, ikey).UID || o.Retain {
		t.Errorf("the instance's tags name the importer, not to be retained: %v", fake.Instances()[0].Tags)
	}
	script, err := base64.StdEncoding.DecodeString(vm.UserData)
	if err != nil {
		t.Fatal(err)
	}
	testbed.StartScriptSquid(t, string(script), "127.0.0.1:32342", nil)
	fake.SetPublicIP(vm.ID, "127.0.0.1")
	fake.SetState(vm.ID, "running")
	testbed.Eventually(t, 15*time.Second, "Ready through the imported instance", ready(t, ikey, corev1.ConditionTrue))
	if n := fake.Calls("RunInstances"); n != 1 {
		t.Errorf("the import made no instance of its own: %d RunInstances", n)
	}
	if err := bed.Client.Delete(ctx, get(t, ikey)); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, "the importer gone and the instance terminated", func() (bool, string) {
		err := bed.Client.Get(ctx, ikey, &v1alpha1.Proxy{})
		state := fake.Instances()[0].State
		return kerrors.IsNotFound(err) && (state == "shutting-down" || state == "terminated"), fmt.Sprintf("%v, %s", err, state)
	})
	// The kept Proxy's own group outlived it with its instance; with the
	// instance gone, the orphan collector takes it.
	testbed.Eventually(t, 10*time.Second, "no security group left", func() (bool, string) {
		r, err := collectorAnHourAhead(bed, prov).Collect(ctx)
		return len(fake.Groups()) == 0, fmt.Sprintf("%+v %v %+v", r, err, fake.Groups())
	})
}

// TestAWSInstanceReplaced: an instance EC2 ends (a spot interruption) is
// replaced by a new one, more than once: the Proxy's external-name still
// names the first instance, which its own create made, and that asks for
// no import.
func TestAWSInstanceReplaced(t *testing.T) {
	ns := namespace(t)
	fake := ec2fake.Start(t)
	fake.PendingFor, fake.TerminatingFor = time.Hour, 100*time.Millisecond // the test boots each instance
	target := testbed.StartEchoTarget(t)
	prov := startAWSProvider(t, fake, target, func(o *proxy.Options) { o.PollInterval = 2 * time.Second }) // to see the instance end
	defer prov.stop()
	defer deleteProxies(t, ns)
	pc := "aws-replaced-" + ns
	create(t, awsConfig(ns, pc)...)
	create(t, authSecret(ns), awsProxy(ns, "spot", 32343, target, pc))
	key := types.NamespacedName{Namespace: ns, Name: "spot"}
	booted := map[string]bool{}
	for round := 1; round <= 3; round++ {
		var vm ec2fake.Instance
		testbed.Eventually(t, 20*time.Second, fmt.Sprintf("instance %d launched", round), func() (bool, string) {
			for _, i := range fake.Instances() {
				if i.State == "pending" && !booted[i.ID] {
					vm = i
					return true, ""
				}
			}
			c := get(t, key).GetCondition(xpv2.TypeReady)
			return false, fmt.Sprintf("%d RunInstances; %s: %s", fake.Calls("RunInstances"), c.Reason, c.Message)
		})
		booted[vm.ID] = true
		if round == 1 {
			script, err := base64.StdEncoding.DecodeString(vm.UserData)
			if err != nil {
				t.Fatal(err)
			}
			testbed.StartScriptSquid(t, string(script), "127.0.0.1:32343", nil)
		}
		fake.SetPublicIP(vm.ID, "127.0.0.1")
		fake.SetState(vm.ID, "running")
		testbed.Eventually(t, 20*time.Second, fmt.Sprintf("Ready on instance %d", round), func() (bool, string) {
			p := get(t, key)
			c := p.GetCondition(xpv2.TypeReady)
			return c.Status == corev1.ConditionTrue && p.Status.AtProvider.ProviderID == "aws:///us-east-1a/"+vm.ID, fmt.Sprintf("%s: %s", c.Reason, c.Message)
		})
		if c := get(t, key).GetCondition(xpv2.TypeReady); c.Reason == proxy.ReasonImportRefused {
			t.Fatalf("its own instance taken for an import: %s", c.Message)
		}
		if !fake.Interrupt(vm.ID, "Server.SpotInstanceTermination: Spot instance termination") {
			t.Fatal("no instance to interrupt")
		}
	}
}

// startAWSProvider starts the provider with its EC2 clients aimed at fake,
// one attempt a call and a listing trusted for a second, then tweak.
func startAWSProvider(t *testing.T, fake *ec2fake.Server, target testbed.Target, tweak ...func(*proxy.Options)) *provider {
	t.Helper()
	return startProvider(t, testbed.SquidStateDir(t), providerLogs(t), target, append([]func(*proxy.Options){func(o *proxy.Options) {
		o.Backends.(*proxy.Backends).AWSEndpoint = fake.URL
		o.Backends.(*proxy.Backends).AWSMaxAttempts = 1
		o.Backends.(*proxy.Backends).AWSListingMaxAge = time.Second
	}}, tweak...)...)
}
