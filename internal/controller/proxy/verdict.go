package proxy

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"reflect"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe/pool"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/reach"
)

// probe folds the outcomes of probes through addr into the verdict and has
// the next one made when it is due: by the probe pool, off the reconcile
// path, or here when there is no pool. instance identifies what runs at
// addr; no other instance's outcomes are folded into its verdict.
func (e *external) probe(ctx context.Context, p *v1alpha1.Proxy, addr, instance string, creds *backend.Credentials) {
	hc := p.Spec.ForProvider.HealthCheck
	t := probe.Target{Proxy: addr, URL: hc.URL, Timeout: hc.TimeoutOrDefault(), ExpectedStatus: int(hc.ExpectedStatus), RootCAs: e.rootCAs}
	// An External proxy's endpoint is whatever its author wrote, and the
	// address a namespaced ProviderConfig's backend reports is its
	// tenant's to choose: the probe reaches them only where the platform
	// permits. A local proxy is reached where it is bound. The address of
	// a platform backend (a ClusterProviderConfig's pod or VM) is refused
	// only where no proxy ever is (link-local, metadata).
	fp := p.Spec.ForProvider
	if fp.Mode == v1alpha1.ProxyModeExternal || fp.Local != nil || reach.TenantBackend(p) {
		t.Reach = reach.For(p, e.tenantPrivate)
	} else {
		t.Reach = reach.Rule{}
	}
	if creds != nil {
		t.Username, t.Password = creds.Username, creds.Password
	}
	e.probing = true
	if pp := e.sched.pool; pp != nil {
		for _, o := range pp.Take(p.GetUID(), instance, t) {
			e.fold(p, addr, o)
		}
		e.setReadiness(p)
		pp.Watch(p.GetUID(), pool.Probing{
			Key: types.NamespacedName{Namespace: p.GetNamespace(), Name: p.GetName()}, Instance: instance,
			Target: t, Closure: creds != nil, Every: e.sched.every(p), Backend: e.backendName(), Steady: steady(p),
		}, e.sched.nextProbe(p))
		return
	}
	if e.now().Before(e.sched.nextProbe(p)) {
		e.setReadiness(p)
		return
	}
	o := pool.Outcome{Started: e.now(), Res: e.prober.Probe(ctx, t)}
	if creds != nil {
		o.Checked = true
		o.Closure, o.Detail = e.prober.Closed(ctx, t)
	}
	e.fold(p, addr, o)
	e.setReadiness(p)
}

// fold adds one probe's outcome to the Proxy's verdict.
func (e *external) fold(p *v1alpha1.Proxy, addr string, o pool.Outcome) {
	ap := &p.Status.AtProvider
	hc := p.Spec.ForProvider.HealthCheck
	res := o.Res
	if o.Checked {
		e.closure(p, o.Closure, o.Detail)
	} else {
		forgetClosure(p, "NoCredentials", "the proxy has no credentials to refuse requests without")
	}

	if !o.Counted {
		pool.CountProbe(e.metrics, e.backendName(), res)
	}

	was, before := ap.Healthy, *ap
	// A probe counts from when it started, so a slow one does not push
	// the cadence back.
	now := o.Started
	e.sched.probed(p.GetUID(), now)
	v := probe.Verdict{Healthy: ap.Healthy, ConsecutiveSuccesses: ap.ConsecutiveSuccesses, ConsecutiveFailures: ap.ConsecutiveFailures}.
		Next(res.OK, hc.SuccessThreshold, hc.FailureThreshold)
	ap.Healthy, ap.ConsecutiveSuccesses, ap.ConsecutiveFailures = v.Healthy, v.ConsecutiveSuccesses, v.ConsecutiveFailures
	// Every status change of a Proxy makes Crossplane compose its pool
	// again (applying each of its Proxies), so a probe that finds nothing
	// new must leave the status as it is: latency, which nothing decides
	// on, never makes a write of its own but rides along with another
	// change, as lastProbeTime does. There is no heartbeat: a write that
	// changed only lastProbeTime would compose the pool for nothing the
	// function reads (the provider's probe metrics say probes run).
	latency := ap.LatencyMilliseconds
	if res.OK {
		latency = latencyStep(ap.LatencyMilliseconds, o.Latency().Milliseconds())
		ap.LastProbeError = ""
		if res.EgressIP != "" && res.EgressIP != ap.EgressIP {
			if ap.EgressIP != "" {
				e.record.Event(p, event.Normal("EgressIPChanged", fmt.Sprintf("egress IP changed from %s to %s", ap.EgressIP, res.EgressIP)))
			}
			ap.EgressIP = res.EgressIP
		}
		e.egressMatch(p)
	} else {
		ap.LastProbeError = truncate(res.Error, 512)
	}
	switch {
	case v.Healthy && !was:
		e.record.Event(p, event.Normal("ProbePassing", fmt.Sprintf("proxy is healthy: probe through %s passed", addr)))
	case !v.Healthy && was:
		e.record.Event(p, event.Warning("ProbeFailing", errors.Errorf("proxy is unhealthy after %d failed probes: %s", v.ConsecutiveFailures, res.Error)))
	}
	before.LastProbeTime = ap.LastProbeTime
	if ap.LastProbeTime == nil || !reflect.DeepEqual(before, *ap) {
		ap.LastProbeTime = &metav1.Time{Time: now}
		ap.LatencyMilliseconds = latency
	}
}

// egressMatch compares, for a VM that has its own external address (GCP
// and EC2, where the published host is that address), the egress IP the probe saw
// with it, and sets EgressIPMismatch when they differ; a Warning event
// marks each turn to a mismatch. The condition changes only with one of
// the two addresses, so it cannot flap between probes.
func (e *external) egressMatch(p *v1alpha1.Proxy) {
	if !comparesEgress(p) {
		return
	}
	host, egress := netip.MustParseAddr(p.Status.AtProvider.Host), netip.MustParseAddr(p.Status.AtProvider.EgressIP)
	if host.Unmap() == egress.Unmap() {
		p.SetConditions(xpv2.Condition{Type: TypeEgressIPMismatch, Status: corev1.ConditionFalse, Reason: ReasonEgressIsExternal,
			Message: fmt.Sprintf("traffic leaves from the VM's external IP %s", host), LastTransitionTime: metav1.Time{Time: e.now()}})
		return
	}
	msg := fmt.Sprintf("traffic leaves from %s, not from the VM's external IP %s: a Cloud NAT, a route or another interface sends it elsewhere, so this proxy may share its egress address with others; crawlers are told %s", egress, host, egress)
	if c := p.GetCondition(TypeEgressIPMismatch); c.Status != corev1.ConditionTrue || c.Message != msg {
		e.record.Event(p, event.Warning(event.Reason(ReasonEgressNotExternal), errors.New(msg)))
	}
	p.SetConditions(xpv2.Condition{Type: TypeEgressIPMismatch, Status: corev1.ConditionTrue, Reason: ReasonEgressNotExternal,
		Message: msg, LastTransitionTime: metav1.Time{Time: e.now()}})
}

// comparesEgress says whether p is a VM published at its own external
// address with an egress IP seen, which egressMatch compares.
func comparesEgress(p *v1alpha1.Proxy) bool {
	host, err := netip.ParseAddr(p.Status.AtProvider.Host)
	_, err2 := netip.ParseAddr(p.Status.AtProvider.EgressIP)
	// A published internal address (gcp.publishedAddress Internal) is
	// never the egress IP.
	vm := p.Spec.ForProvider.GCP != nil || p.Spec.ForProvider.AWS != nil
	return vm && err == nil && err2 == nil && !host.IsPrivate() && !cgnat.Contains(host)
}

var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// steady returns what tells the outcomes that would change nothing in p's
// status as it is now: a pass of a proxy healthy at its thresholds, from
// the same egress IP (at whatever latency: it waits for another change),
// with the same closure verdict. The probe pool requeues a Proxy at
// once for any other outcome; steady ones wait for the next poll, which
// folds them all, so a steady fleet costs a probe and no reconcile.
// TestSteadyChangesNothing holds this to fold.
func steady(p *v1alpha1.Proxy) func(pool.Outcome) bool {
	ap := p.Status.AtProvider
	threshold := max(p.Spec.ForProvider.HealthCheck.SuccessThreshold, 1)
	open := p.GetCondition(TypeOpenProxy)
	settled := ap.Healthy && ap.ConsecutiveFailures == 0 && ap.ConsecutiveSuccesses == threshold &&
		ap.LastProbeError == "" && ap.LastProbeTime != nil && p.GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue &&
		(!comparesEgress(p) || p.GetCondition(TypeEgressIPMismatch).Status != corev1.ConditionUnknown)
	return func(o pool.Outcome) bool {
		switch {
		case !settled, !o.Res.OK,
			o.Res.EgressIP != "" && o.Res.EgressIP != ap.EgressIP:
			return false
		case o.Checked:
			return o.Closure == probe.ClosureClosed && open.Status == corev1.ConditionFalse && open.Reason == ReasonDemandsCredentials && open.Message == o.Detail
		default:
			return open.Status == corev1.ConditionUnknown
		}
	}
}

// closure folds a closure check, a request sent without credentials
// through a proxy that has them, which it must refuse. An open proxy is
// flagged with the OpenProxy condition, a Warning event and a metric, and is
// not Ready, so egress-discovery never hands it out. An inconclusive check keeps a verdict the Proxy has, so
// that one unreachable moment does not flap the condition, and otherwise
// says why there is none yet.
func (e *external) closure(p *v1alpha1.Proxy, closure probe.Closure, detail string) {
	was := p.GetCondition(TypeOpenProxy).Status
	switch closure {
	case probe.ClosureOpen:
		p.SetConditions(xpv2.Condition{Type: TypeOpenProxy, Status: corev1.ConditionTrue, Reason: ReasonServesWithoutCredentials,
			Message: detail, LastTransitionTime: metav1.Time{Time: e.now()}})
		if was != corev1.ConditionTrue {
			e.metrics.OpenProxies.WithLabelValues(e.backendName()).Inc()
			e.record.Event(p, event.Warning(event.Reason(ReasonServesWithoutCredentials), errors.New(detail)))
		}
	case probe.ClosureClosed:
		p.SetConditions(xpv2.Condition{Type: TypeOpenProxy, Status: corev1.ConditionFalse, Reason: ReasonDemandsCredentials,
			Message: detail, LastTransitionTime: metav1.Time{Time: e.now()}})
	default:
		if c := p.GetCondition(TypeOpenProxy); c.Status == corev1.ConditionUnknown && c.Message != truncate(detail, 512) {
			p.SetConditions(xpv2.Condition{Type: TypeOpenProxy, Status: corev1.ConditionUnknown, Reason: ReasonClosureUnknown,
				Message: truncate(detail, 512), LastTransitionTime: metav1.Time{Time: e.now()}})
		}
	}
}

// latencySteps are the values status.atProvider.latencyMilliseconds takes:
// a 1-2-5 series, so the figure moves in coarse steps a reader can still
// use, not with every probe's noise.
var latencySteps = []int64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000}

// latencyBand is how far, as a factor, a probe's latency must be from the
// recorded step before the step moves: beyond the neighbouring steps, so
// that a latency near the edge between two steps does not flap. Within
// latencyFloor milliseconds of it, it never moves: a proxy on the same
// host answers in one to a few milliseconds, and which of those is
// scheduling noise.
const (
	latencyBand  = 2.5
	latencyFloor = 20
)

// latencyStep returns the latency to record after a probe measured
// measured, with recorded in the status: recorded while the measurement is
// within latencyBand or latencyFloor of it, and otherwise the step nearest
// the measurement. Nothing recorded yet (0) takes the nearest step.
func latencyStep(recorded, measured int64) int64 {
	m := float64(max(measured, 1))
	if r := float64(recorded); recorded > 0 && (m <= r*latencyBand && m*latencyBand >= r || math.Abs(m-r) <= latencyFloor) {
		return recorded
	}
	best := latencySteps[0]
	for _, s := range latencySteps {
		// Nearest on a log scale: s/m and m/best compared as ratios.
		if math.Abs(math.Log(float64(s)/m)) < math.Abs(math.Log(float64(best)/m)) {
			best = s
		}
	}
	return best
}

// setReadiness sets Ready from the verdict. It changes only when the verdict
// does, so the condition does not flap with single probe results.
func (e *external) setReadiness(p *v1alpha1.Proxy) {
	ap := p.Status.AtProvider
	open := p.GetCondition(TypeOpenProxy)
	switch {
	case open.Status == corev1.ConditionTrue:
		p.SetConditions(unavailable(ReasonOpenProxy, "the proxy serves requests without credentials, so it is never handed out: "+open.Message))
	case e.crashLoop != "":
		p.SetConditions(unavailable(ReasonCrashLoopBackOff, e.crashLoop))
	case p.Spec.ForProvider.AuthSecretRef != nil && open.Status != corev1.ConditionFalse && ap.Healthy:
		p.SetConditions(unavailable(ReasonAwaitingProbe, "the proxy passes its probe; waiting to see it demand credentials (407) of a request without them: "+open.Message))
	case ap.Healthy:
		p.SetConditions(xpv2.Available())
	case ap.LastProbeTime == nil:
		p.SetConditions(unavailable(ReasonAwaitingProbe, fmt.Sprintf("instance %s runs; waiting for the first probe through it", ap.ProviderID)))
	case probe.Refused(ap.LastProbeError):
		p.SetConditions(unavailable(ReasonProbeRefused, fmt.Sprintf("the provider's probe does not get through to the proxy: %s", ap.LastProbeError)))
	default:
		p.SetConditions(unavailable(ReasonProbeFailing, fmt.Sprintf("probe through the proxy is failing: %s", ap.LastProbeError)))
	}
}
