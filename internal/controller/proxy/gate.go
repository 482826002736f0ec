package proxy

import (
	"fmt"
	"strconv"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
)

// Create failures are recorded in annotations because crossplane-runtime
// persists the annotations a Create sets, and nothing else. Observe reads
// them back and holds off the next Create, so a backend that keeps failing
// is not asked again and again: quota errors wait a growing backoff, and
// permanent errors wait until the spec (its generation) changes.
const (
	annotationCreateFailures   = "egress.crawl.example.com/create-failures"
	annotationCreateClass      = "egress.crawl.example.com/create-error-class"
	annotationCreateError      = "egress.crawl.example.com/create-error"
	annotationNextCreate       = "egress.crawl.example.com/next-create-attempt"
	annotationCreateGeneration = "egress.crawl.example.com/create-error-generation"
	// annotationCreateInputs records the versions of what the failed
	// create depended on besides the spec (its ProviderConfig, that
	// config's credentials Secret, the Proxy's auth and cloud-init
	// Secrets): a change to any of them lifts the hold at once.
	annotationCreateInputs = "egress.crawl.example.com/create-error-inputs"
	// annotationCreateOperation names a creation Create left running.
	annotationCreateOperation = "egress.crawl.example.com/create-operation"
	// annotationMadeInstance is the providerID of the instance Create
	// made last, written with the external-name: an external-name equal
	// to it asks for no import, even where a providerID does not say
	// whose instance it is (EC2's names the instance by its ID alone).
	annotationMadeInstance = "egress.crawl.example.com/made-instance"
	// annotationTerminations counts the instances that terminated in a
	// row, the last at annotationLastTermination.
	annotationTerminations    = "egress.crawl.example.com/terminations"
	annotationLastTermination = "egress.crawl.example.com/last-termination"
	// annotationTerminatedInstance names the terminated instance Observe
	// found (its ID and creation time), and annotationCountedTermination
	// the last one counted: an instance still on its way out is seen by
	// several reconciles, and counts once.
	annotationTerminatedInstance = "egress.crawl.example.com/terminated-instance"
	annotationCountedTermination = "egress.crawl.example.com/counted-termination"
)

// classTerminated holds off the replacement of an instance that keeps
// terminating (a pod whose image cannot run, a VM preempted again and
// again).
const classTerminated backend.Class = "Terminated"

// maxTerminationHold is the longest a replacement waits.
const maxTerminationHold = 10 * time.Minute

// terminationMemory is how long an instance must last for its
// predecessors' terminations to be forgotten.
const terminationMemory = 30 * time.Minute

// replaceTerminated counts a terminated instance about to be replaced and
// says how long its replacement must wait: not at all the first time, then
// 10s doubling to 10 minutes while instances keep terminating.
func replaceTerminated(p *v1alpha1.Proxy, now time.Time) (int, time.Duration) {
	a := p.GetAnnotations()
	n, _ := strconv.Atoi(a[annotationTerminations])
	if id := a[annotationTerminatedInstance]; id != "" && id == a[annotationCountedTermination] {
		// Counted already; it is still on its way out.
		return n, 0
	}
	last, _ := time.Parse(time.RFC3339, a[annotationLastTermination])
	// A time in the future (another replica's skewed clock, a hand edit)
	// counts as now.
	if last.After(now) {
		last = now
	}
	if now.Sub(last) > terminationMemory {
		n = 0
	}
	n++
	meta.AddAnnotations(p, map[string]string{
		annotationTerminations:       strconv.Itoa(n),
		annotationLastTermination:    now.UTC().Format(time.RFC3339),
		annotationCountedTermination: a[annotationTerminatedInstance],
	})
	if n == 1 {
		return n, 0
	}
	d := 10 * time.Second
	for i := 2; i < n && d < maxTerminationHold; i++ {
		d *= 2
	}
	return n, min(d, maxTerminationHold)
}

// holdTerminated records, in the create gate, that the replacement of a
// terminated instance waits until now+d.
func holdTerminated(p *v1alpha1.Proxy, n int, d time.Duration, now time.Time) string {
	msg := fmt.Sprintf("%d instances terminated in a row; the next is made at %s", n, now.Add(d).UTC().Format(time.RFC3339))
	meta.AddAnnotations(p, map[string]string{
		annotationCreateFailures:   strconv.Itoa(n),
		annotationCreateClass:      string(classTerminated),
		annotationCreateError:      msg,
		annotationNextCreate:       now.Add(d).UTC().Format(time.RFC3339),
		annotationCreateGeneration: strconv.FormatInt(p.GetGeneration(), 10),
	})
	return msg
}

// Condition reasons of Ready=False.
const (
	ReasonProvisioning  xpv2.ConditionReason = "Provisioning"
	ReasonAwaitingProbe xpv2.ConditionReason = v1alpha1.ReasonAwaitingProbe
	ReasonProbeFailing  xpv2.ConditionReason = "ProbeFailing"
	// ReasonProbeRefused: the provider's own probe is dropped on its way
	// to the proxy, or refused by the proxy's client ACL: the provider's
	// address is not let in (the ProviderConfig's spec.probe.sourceRanges).
	ReasonProbeRefused xpv2.ConditionReason = "ProbeRefused"
	ReasonTerminated   xpv2.ConditionReason = "Terminated"
	ReasonBackendError xpv2.ConditionReason = "BackendError"
	// ReasonOpenProxy: the proxy serves requests without credentials.
	ReasonOpenProxy xpv2.ConditionReason = "OpenProxy"
	// ReasonNotPermitted: the Proxy asks for what its ProviderConfig's
	// policy does not permit.
	ReasonNotPermitted xpv2.ConditionReason = v1alpha1.ReasonNotPermitted
	// ReasonSecretUnavailable: the Proxy's auth or cloud-init Secret cannot
	// be used, so the instance is not handed out.
	ReasonSecretUnavailable xpv2.ConditionReason = "SecretUnavailable"
	// ReasonOutOfDate: the spec changed, and the instance cannot be
	// replaced to match it.
	ReasonOutOfDate xpv2.ConditionReason = "OutOfDate"
	// ReasonCrashLoopBackOff: the proxy keeps exiting soon after it
	// starts; it is held out of service until it stays up.
	ReasonCrashLoopBackOff xpv2.ConditionReason = "CrashLoopBackOff"
)

// The OpenProxy condition says whether a proxy with credentials serves
// requests without them, as the closure check found.
const (
	TypeOpenProxy                  xpv2.ConditionType   = "OpenProxy"
	ReasonServesWithoutCredentials xpv2.ConditionReason = "ServesWithoutCredentials"
	ReasonDemandsCredentials       xpv2.ConditionReason = "DemandsCredentials"
	// ReasonClosureUnknown: the check could not tell, and says why.
	ReasonClosureUnknown xpv2.ConditionReason = "Inconclusive"
)

// The EgressIPMismatch condition says, for a proxy on a VM with its own
// external address (GCP), whether its traffic leaves from another one: a
// NAT, a route or a second interface that the platform did not mean, which
// makes the fleet's distinct addresses less distinct than it reports.
// Nothing else changes: the proxy serves, and crawlers are told the
// address the probe saw.
const (
	TypeEgressIPMismatch    xpv2.ConditionType   = "EgressIPMismatch"
	ReasonEgressNotExternal xpv2.ConditionReason = "EgressIsNotExternalIP"
	ReasonEgressIsExternal  xpv2.ConditionReason = "EgressIsExternalIP"
)

func unavailable(reason xpv2.ConditionReason, msg string) xpv2.Condition {
	c := xpv2.Unavailable()
	c.Reason = reason
	c.Message = msg
	return c
}

// createGate is the recorded state of past create failures.
type createGate struct {
	Inputs     string
	Failures   int
	Class      backend.Class
	Message    string
	Next       time.Time
	Generation int64
}

func readGate(p *v1alpha1.Proxy) createGate {
	a := p.GetAnnotations()
	g := createGate{Class: backend.Class(a[annotationCreateClass]), Message: a[annotationCreateError], Inputs: a[annotationCreateInputs]}
	g.Failures, _ = strconv.Atoi(a[annotationCreateFailures])
	g.Generation, _ = strconv.ParseInt(a[annotationCreateGeneration], 10, 64)
	g.Next, _ = time.Parse(time.RFC3339, a[annotationNextCreate])
	return g
}

// recordCreateFailure notes a failed Create on the Proxy's annotations.
func recordCreateFailure(p *v1alpha1.Proxy, err error, now time.Time) {
	g := readGate(p)
	class := backend.ClassOf(err)
	// A new spec, or another kind of failure, starts the count again:
	// AccessDenied turns permanent only after failures of its own in a row.
	if g.Generation != p.GetGeneration() || g.Class != class {
		g.Failures = 0
	}
	g.Failures++
	next := now.Add(backend.Backoff(class, g.Failures))
	meta.AddAnnotations(p, map[string]string{
		annotationCreateFailures:   strconv.Itoa(g.Failures),
		annotationCreateClass:      string(class),
		annotationCreateError:      truncate(err.Error(), 512),
		annotationNextCreate:       next.UTC().Format(time.RFC3339),
		annotationCreateGeneration: strconv.FormatInt(p.GetGeneration(), 10),
	})
}

// clearCreateFailures forgets past failures after a successful Create.
func clearCreateFailures(p *v1alpha1.Proxy) {
	meta.RemoveAnnotations(p, annotationCreateFailures, annotationCreateClass, annotationCreateError, annotationNextCreate, annotationCreateGeneration, annotationCreateInputs)
}

// blocked says whether a Create must wait, and returns the condition that
// tells the user why and what to do.
func (g createGate) blocked(p *v1alpha1.Proxy, now time.Time) (xpv2.Condition, bool) {
	if g.Failures == 0 {
		return xpv2.Condition{}, false
	}
	switch g.Class {
	case classTerminated:
		// A hold longer than the longest back-off comes from a skewed
		// clock or a hand edit: it is not honoured.
		if now.Before(g.Next) && g.Next.Sub(now) <= maxTerminationHold {
			return unavailable(ReasonTerminated, g.Message), true
		}
	case backend.ClassPermanent:
		if g.Generation == p.GetGeneration() {
			return unavailable(xpv2.ConditionReason(backend.ClassPermanent),
				fmt.Sprintf("create failed permanently and is not retried until the spec changes: %s", g.Message)), true
		}
	case backend.ClassAccessDenied:
		if g.Generation == p.GetGeneration() && g.Failures >= backend.AccessDeniedAttempts {
			return unavailable(xpv2.ConditionReason(backend.ClassPermanent),
				fmt.Sprintf("access denied %d times in a row, so it is taken as permanent and not retried until the spec changes: %s", g.Failures, g.Message)), true
		}
		fallthrough
	case backend.ClassQuota, backend.ClassStockout, backend.ClassThrottled:
		if now.Before(g.Next) {
			return unavailable(xpv2.ConditionReason(g.Class),
				fmt.Sprintf("%s (%d attempts); next create attempt at %s: %s", gateWhat[g.Class], g.Failures, g.Next.Format(time.RFC3339), g.Message)), true
		}
	}
	return xpv2.Condition{}, false
}

// gateWhat says in words what a class of create failure means.
var gateWhat = map[backend.Class]string{
	backend.ClassQuota:        "backend quota exceeded",
	backend.ClassStockout:     "the zone has no capacity for this instance now",
	backend.ClassThrottled:    "the backend is rate-limiting requests",
	backend.ClassAccessDenied: "the backend denied access, which may heal once an API is enabled or an IAM grant propagates",
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
