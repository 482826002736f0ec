//go:build e2e

package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/aws/ec2fake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/devenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// ec2 is the in-process fake of the EC2 API the stack's provider talks to
// (its hidden --aws-test-endpoint).
var (
	ec2       *ec2fake.Server
	instances = &ec2Instances{}
)

// ec2Instances plays the instances' network: each new instance gets a
// loopback address of its own as its public IPv4 address (127.3.0.N), so
// that nothing the provider probes leaves this host.
type ec2Instances struct{ next int }

// run is the fake's OnRun hook, under the fake's lock (which guards next
// too): the address only; the test boots the instance's Squid.
func (v *ec2Instances) run(i *ec2fake.Instance) {
	v.next++
	i.PublicIP = fmt.Sprintf("127.3.%d.%d", v.next/250, v.next%250+1)
}

// startEC2 starts the fake before the stack, whose provider is pointed at
// it by the flag it returns.
func startEC2() string {
	ec2 = ec2fake.New()
	ec2.OnRun = instances.run
	return "--aws-test-endpoint=" + ec2.URL
}

// awsFleetOnEC2 is examples/aws applied as written on real Crossplane,
// but for what this host needs: the fake's access key in the Secret, the
// provider's probe source (examples: the provider's NAT address; here
// 127.0.0.1) and the stack's echo target as the health check. Each
// instance the provider runs boots the Squid of its own user data,
// listening on its public address and leaving from it. The fleet becomes
// Ready with its 6 proxies spread over the 3 zones, each with an egress
// IP of its own that matches its instance's address, behind one security
// group that admits the crawlers' range and the probe's; deleting the
// fleet terminates every instance and deletes the group.
func awsFleetOnEC2(t *testing.T) {
	ctx := context.Background()
	const fleet, key = "ec2-fleet", "aws-egress-key"

	pc := &v1alpha1.ClusterProviderConfig{}
	readExample(t, "examples/aws/providerconfig.yaml", pc)
	pc.Spec.Probe.SourceRanges = []v1alpha1.CIDR{"127.0.0.1/32"}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: pc.Spec.AWS.Credentials.SecretRef.Namespace, Name: key},
		StringData: map[string]string{"credentials": "[default]\naws_access_key_id = " + ec2fake.AccessKey + "\naws_secret_access_key = " + ec2fake.SecretKey + "\n"}}
	u := &unstructured.Unstructured{}
	readExample(t, "examples/aws/proxyfleet.yaml", &u.Object)
	if err := unstructured.SetNestedField(u.Object, "https://"+devenv.TargetAddress+"/ip", "spec", "healthCheck", "url"); err != nil {
		t.Fatal(err)
	}
	if u.GetName() != fleet || u.GetNamespace() != ns || pc.Spec.AWS.Credentials.SecretRef.Name != key {
		t.Fatalf("examples/aws names %s/%s and Secret %s; this test expects %s/%s and %s", u.GetNamespace(), u.GetName(), pc.Spec.AWS.Credentials.SecretRef.Name, ns, fleet, key)
	}
	if err := stack.Client.Create(ctx, secret); err != nil && !kerrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := stack.Client.Create(ctx, pc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stack.Client.Delete(ctx, pc)
		_ = stack.Client.Delete(ctx, secret)
	})
	created := time.Now()
	if err := stack.Client.Create(ctx, u); err != nil {
		t.Fatalf("cannot create fleet %s: %v", fleet, err)
	}

	// Boot each instance as it appears: the Squid its user data writes,
	// bound to its address and leaving from it.
	squids := map[string]*exec.Cmd{}
	boot := func() {
		for _, i := range ec2.Instances() {
			if squids[i.ID] != nil || i.State != "running" || i.PublicIP == "" {
				continue
			}
			script, err := base64.StdEncoding.DecodeString(i.UserData)
			if err != nil {
				t.Fatal(err)
			}
			ip := i.PublicIP
			squids[i.ID] = testbed.StartScriptSquid(t, string(script), net.JoinHostPort(ip, "3128"), func(conf string) string {
				bound := strings.Replace(conf, "\nhttp_port 3128\n", "\nhttp_port "+net.JoinHostPort(ip, "3128")+"\n", 1)
				if bound == conf {
					t.Fatalf("the user data's Squid configuration has no line http_port 3128 to bind to %s:\n%s", ip, conf)
				}
				return bound + "tcp_outgoing_address " + ip + "\n"
			})
		}
	}
	testbed.Eventually(t, 3*time.Minute, "fleet "+fleet+" Ready with 6 healthy proxies on EC2", func() (bool, string) {
		boot()
		st, ps, err := observe(fleet)
		if err != nil {
			return false, err.Error()
		}
		_, ready := namesAndReady(ps)
		return st.ready && st.healthy == 6 && len(ps) == 6 && ready == 6,
			fmt.Sprintf("ready=%v healthy=%d proxies=%d Ready=%d instances=%d squids=%d: %s", st.ready, st.healthy, len(ps), ready, len(ec2.Instances()), len(squids), st.message)
	})
	t.Logf("6 proxies on EC2 Ready in %.1fs", time.Since(created).Seconds())

	// Each proxy left from its own instance's address, in its zone.
	ps, err := proxies(fleet)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]ec2fake.Instance{}
	for _, i := range ec2.Instances() {
		byID[i.ID] = i
	}
	zones := map[string]int{}
	for _, p := range ps {
		id := p.Status.AtProvider.ProviderID[strings.LastIndex(p.Status.AtProvider.ProviderID, "/")+1:]
		i, ok := byID[id]
		if !ok || i.State != "running" {
			t.Errorf("%s records %s, which is not a running instance", p.Name, p.Status.AtProvider.ProviderID)
			continue
		}
		if p.Status.AtProvider.EgressIP != i.PublicIP {
			t.Errorf("%s left from %q, its instance's address is %s", p.Name, p.Status.AtProvider.EgressIP, i.PublicIP)
		}
		if c := p.GetCondition("EgressIPMismatch"); c.Status == corev1.ConditionTrue {
			t.Errorf("%s: EgressIPMismatch %s", p.Name, c.Message)
		}
		zones[i.Zone]++
	}
	if len(zones) != 3 || zones["us-east-1a"] != 2 || zones["us-east-1b"] != 2 || zones["us-east-1c"] != 2 {
		t.Errorf("6 proxies over 3 zones: %v", zones)
	}
	if st, _ := fleetState(fleet); st.duplicates != "False" {
		t.Errorf("DuplicateEgressIP %q for 6 instances of 6 addresses", st.duplicates)
	}
	// One security group for the fleet: the crawlers' range and the probe's.
	groups := ec2.Groups()
	if len(groups) != 1 {
		t.Fatalf("one security group for the fleet, got %d: %+v", len(groups), groups)
	}
	for _, want := range []string{"tcp:3128-3128:203.0.113.0/24", "tcp:3128-3128:127.0.0.1/32"} {
		if !slices.Contains(groups[0].Ingress, want) {
			t.Errorf("the fleet's group %s lacks %s: %v", groups[0].Name, want, groups[0].Ingress)
		}
	}
	for _, i := range ec2.Instances() {
		if !slices.Equal(i.Groups, []string{groups[0].ID}) {
			t.Errorf("instance %s is in groups %v, not the fleet's %s alone", i.ID, i.Groups, groups[0].ID)
		}
	}

	// Deleting the fleet terminates every instance and deletes the group.
	if err := stack.Client.Delete(ctx, u); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 2*time.Minute, "the fleet, its Proxies, its instances and its group gone", func() (bool, string) {
		err := stack.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: fleet}, fleetObject(fleet))
		ps, lerr := proxies(fleet)
		var live []string
		for _, i := range ec2.Instances() {
			if i.State != "terminated" {
				live = append(live, i.ID+"="+i.State)
			}
		}
		groups := ec2.Groups()
		return kerrors.IsNotFound(err) && lerr == nil && len(ps) == 0 && len(live) == 0 && len(groups) == 0,
			fmt.Sprintf("fleet: %v, %d Proxies, instances not terminated %v, %d groups", err, len(ps), live, len(groups))
	})
	if n := ec2.Calls("RunInstances"); n < 6 {
		t.Errorf("RunInstances called %d times for 6 instances", n)
	}
}

// readExample reads a YAML file of the repository into into.
func readExample(t *testing.T, path string, into any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", path))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
