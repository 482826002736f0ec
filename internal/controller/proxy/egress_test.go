package proxy

import (
	"strings"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/fake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe/pool"
)

// TestEgressComparedWithExternalIP: a VM's traffic that leaves from
// another address than its external IP (a Cloud NAT, a route) raises
// EgressIPMismatch with one Warning event, without taking the proxy out
// of service; traffic from the external IP clears it; a proxy not on a VM
// of its own address gets no such condition.
func TestEgressComparedWithExternalIP(t *testing.T) {
	c := &clock{t: epoch}
	rec := &countingRecorder{}
	e := newExternal(fake.New(), &fakeProber{}, c)
	e.record = rec
	vm := unitProxy(func(p *v1alpha1.Proxy) {
		p.Spec.ForProvider.Local = nil
		p.Spec.ForProvider.GCP = &v1alpha1.GCPPlacement{Zone: "europe-west1-b"}
	})
	resetInstanceStatus(vm)
	vm.Status.AtProvider.Host = "198.51.100.7"
	pass := func(p *v1alpha1.Proxy, egress string) {
		c.t = c.t.Add(30 * time.Second)
		e.fold(p, "198.51.100.7:3128", pool.Outcome{Started: c.t, Res: probe.Result{OK: true, Latency: 5 * time.Millisecond, EgressIP: egress}})
		e.setReadiness(p)
	}

	pass(vm, "203.0.113.50")
	got := vm.GetCondition(TypeEgressIPMismatch)
	if got.Status != corev1.ConditionTrue || got.Reason != ReasonEgressNotExternal || !strings.Contains(got.Message, "203.0.113.50") || !strings.Contains(got.Message, "198.51.100.7") {
		t.Errorf("egress from a NAT address is flagged, naming both addresses: %+v", got)
	}
	if vm.GetCondition(xpv2.TypeReady).Status != corev1.ConditionTrue {
		t.Errorf("the proxy still serves: %+v", vm.GetCondition(xpv2.TypeReady))
	}
	pass(vm, "203.0.113.50")
	if n := rec.reasons[string(ReasonEgressNotExternal)]; n != 1 {
		t.Errorf("one Warning event for the turn, none for each probe after: %d", n)
	}
	pass(vm, "198.51.100.7")
	if got := vm.GetCondition(TypeEgressIPMismatch); got.Status != corev1.ConditionFalse || got.Reason != ReasonEgressIsExternal {
		t.Errorf("egress from the external IP clears it: %+v", got)
	}

	local := unitProxy()
	resetInstanceStatus(local)
	local.Status.AtProvider.Host = "127.0.0.1"
	pass(local, "203.0.113.50")
	if got := local.GetCondition(TypeEgressIPMismatch); got.Status != corev1.ConditionUnknown || got.Reason != "" {
		t.Errorf("a local proxy leaves from the host's address, which is no mismatch: %+v", got)
	}
}
