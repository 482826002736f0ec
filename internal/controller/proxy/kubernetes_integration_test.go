package proxy_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/kubernetes"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestKubernetesProxy runs a Proxy on the pod backend against the real
// apiserver. There is no kubelet, so the test plays one: it runs a real Squid
// from the pod's config and patches the pod's status.
func TestKubernetesProxy(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := namespace(t)
	podNS := namespace(t)
	target := testbed.StartEchoTarget(t)
	logs := providerLogs(t)
	prov := startProvider(t, testbed.SquidStateDir(t), logs, target)
	defer prov.stop()
	ctx := context.Background()

	p := proxyObject(ns, "pod-proxy", 32320, target.URL)
	p.Labels = map[string]string{fleetv1alpha1.LabelFleet: "crawlers"}
	p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "pods-" + ns}
	p.Spec.ForProvider.Local = nil
	p.Spec.ForProvider.Kubernetes = &v1alpha1.KubernetesPlacement{NodeSelector: map[string]string{"topology.kubernetes.io/zone": "zone-a"}}
	create(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "crawler", "password": password}},
		&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "pods-" + ns}, Spec: v1alpha1.ProviderConfigSpec{
			Backend:    v1alpha1.BackendKubernetes,
			Kubernetes: &v1alpha1.KubernetesBackend{Namespace: podNS, Credentials: &v1alpha1.KubernetesCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}},
		}},
		p,
	)
	key := types.NamespacedName{Namespace: ns, Name: "pod-proxy"}

	// The pod appears, with the config Secret beside it.
	pod := &corev1.Pod{}
	testbed.Eventually(t, 10*time.Second, "pod created", func() (bool, string) {
		l := &corev1.PodList{}
		_ = bed.Client.List(ctx, l, client.InNamespace(podNS))
		if len(l.Items) == 1 {
			pod = &l.Items[0]
		}
		return len(l.Items) == 1, fmt.Sprintf("%d pods", len(l.Items))
	})
	proxy := get(t, key)
	if want := ownership.InstanceName(proxy.UID); pod.Name != want {
		t.Errorf("pod name: want %s (derived from the Proxy UID), got %s", want, pod.Name)
	}
	wantLabels := map[string]string{
		ownership.LabelManagedBy: ownership.ManagedBy, ownership.LabelCluster: "it", ownership.LabelNamespace: ns,
		ownership.LabelName: "pod-proxy", ownership.LabelUID: string(proxy.UID), ownership.LabelOwnerFleet: "crawlers",
		"app.kubernetes.io/name": "egress-proxy",
	}
	if diff := cmp.Diff(wantLabels, pod.Labels); diff != "" {
		t.Errorf("pod labels: -want, +got:\n%s", diff)
	}
	c := pod.Spec.Containers[0]
	if c.Image != kubernetes.DefaultImage || c.Ports[0].ContainerPort != 32320 || pod.Spec.NodeSelector["topology.kubernetes.io/zone"] != "zone-a" ||
		pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
		t.Errorf("pod spec: image %s, port %d, nodeSelector %v, automount %v", c.Image, c.Ports[0].ContainerPort, pod.Spec.NodeSelector, pod.Spec.AutomountServiceAccountToken)
	}
	sec := &corev1.Secret{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: podNS, Name: pod.Name}, sec); err != nil {
		t.Fatalf("config secret: %v", err)
	}
	conf := string(sec.Data["squid.conf"])
	for _, want := range []string{"http_port 32320", "auth_param basic program", "http_access deny egress_loopback", "via off", "forwarded_for delete"} {
		if !strings.Contains(conf, want) {
			t.Errorf("pod squid.conf lacks %q", want)
		}
	}
	np := &networkingv1.NetworkPolicy{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: podNS, Name: pod.Name}, np); err != nil {
		t.Fatalf("network policy beside the pod: %v", err)
	}
	if diff := cmp.Diff(wantLabels, np.Labels); diff != "" {
		t.Errorf("network policy labels, like the pod's: -want, +got:\n%s", diff)
	}
	if sel := np.Spec.PodSelector.MatchLabels; sel[ownership.LabelUID] != string(proxy.UID) || len(np.Spec.PolicyTypes) != 2 {
		t.Errorf("the policy selects exactly this pod, in and out: %+v", np.Spec)
	}
	egress := np.Spec.Egress[len(np.Spec.Egress)-1].To[0].IPBlock
	if egress == nil || egress.CIDR != "0.0.0.0/0" || !slices.Contains(egress.Except, "10.0.0.0/8") || !slices.Contains(egress.Except, "169.254.0.0/16") {
		t.Errorf("egress goes to the public internet only: %+v", egress)
	}
	if strings.Contains(string(sec.Data["htpasswd"]), password) || !strings.HasPrefix(string(sec.Data["htpasswd"]), "crawler:$apr1$") {
		t.Errorf("htpasswd must hold an APR1 hash, never the password: %q", sec.Data["htpasswd"])
	}

	setStatus := func(s corev1.PodStatus) {
		t.Helper()
		cur := &corev1.Pod{}
		if err := bed.Client.Get(ctx, client.ObjectKeyFromObject(pod), cur); err != nil {
			t.Fatal(err)
		}
		cur.Status = s
		if err := bed.Client.Status().Update(ctx, cur); err != nil {
			t.Fatal(err)
		}
	}
	reason := func(want xpv2.ConditionReason) func() (bool, string) {
		return func() (bool, string) {
			c := get(t, key).GetCondition(xpv2.TypeReady)
			return c.Reason == want, fmt.Sprintf("%s %s", c.Reason, c.Message)
		}
	}

	t.Run("RunningWithoutIPIsProvisioning", func(t *testing.T) {
		setStatus(corev1.PodStatus{Phase: corev1.PodRunning})
		testbed.Eventually(t, 5*time.Second, "Provisioning", reason("Provisioning"))
	})

	t.Run("RunningBecomesReady", func(t *testing.T) {
		// A pod's loopback is its own; on this shared host the test lets the
		// probe reach the echo target on loopback.
		hostConf := strings.Replace(conf, "http_access deny egress_loopback\n", "", 1)
		files := map[string][]byte{}
		for k, v := range sec.Data {
			if k != "squid.conf" {
				files[k] = v
			}
		}
		testbed.RunSquid(t, []byte(hostConf), "/etc/egress-proxy", files, "127.0.0.1:32320")
		setStatus(corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"})
		testbed.Eventually(t, 10*time.Second, "Ready=True", ready(t, key, corev1.ConditionTrue))
		ap := get(t, key).Status.AtProvider
		if ap.ProviderID != podNS+"/"+pod.Name || ap.Host != "127.0.0.1" || ap.EgressIP != "127.0.0.1" {
			t.Errorf("atProvider: %+v", ap)
		}
	})

	t.Run("FailedPodIsRecreated", func(t *testing.T) {
		old := pod.UID
		setStatus(corev1.PodStatus{Phase: corev1.PodFailed})
		testbed.Eventually(t, 10*time.Second, "a new pod replaces the failed one", func() (bool, string) {
			cur := &corev1.Pod{}
			err := bed.Client.Get(ctx, client.ObjectKeyFromObject(pod), cur)
			return err == nil && cur.UID != old, fmt.Sprintf("err=%v uid=%s", err, cur.UID)
		})
		testbed.Eventually(t, 5*time.Second, "the new pod is provisioning, with no inherited verdict", reason("Provisioning"))
		if ap := get(t, key).Status.AtProvider; ap.Healthy || ap.EgressIP != "" {
			t.Errorf("a new instance must not inherit the old verdict: %+v", ap)
		}
	})

	t.Run("DeleteRemovesPodAndSecret", func(t *testing.T) {
		if err := bed.Client.Delete(ctx, get(t, key)); err != nil {
			t.Fatal(err)
		}
		testbed.Eventually(t, 10*time.Second, "pod, config secret and network policy gone", func() (bool, string) {
			pods, secs, nps := &corev1.PodList{}, &corev1.SecretList{}, &networkingv1.NetworkPolicyList{}
			_ = bed.Client.List(ctx, pods, client.InNamespace(podNS))
			_ = bed.Client.List(ctx, secs, client.InNamespace(podNS), client.MatchingLabels(ownership.Selector("it")))
			_ = bed.Client.List(ctx, nps, client.InNamespace(podNS), client.MatchingLabels(ownership.Selector("it")))
			return len(pods.Items) == 0 && len(secs.Items) == 0 && len(nps.Items) == 0,
				fmt.Sprintf("%d pods, %d secrets, %d network policies", len(pods.Items), len(secs.Items), len(nps.Items))
		})
		// And the Proxy itself, once its finalizer is removed.
		deleteProxies(t, ns)
	})
}
