package proxy

import (
	"math/rand/v2"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe/pool"
)

// scheduler decides when each Proxy is next probed. What it keeps in memory
// is only timing: the verdict itself lives in the Proxy's status.
type scheduler struct {
	started time.Time
	now     func() time.Time
	// pool runs the probes; nil means Observe runs them itself.
	pool *pool.Pool

	mu   sync.Mutex
	seen map[types.UID]time.Time // first probe time allowed after a restart
	last map[types.UID]time.Time // when each Proxy was last probed
}

func interval(p *v1alpha1.Proxy) time.Duration {
	return p.Spec.ForProvider.HealthCheck.IntervalOrDefault()
}

// every says how often p is probed now: its interval, or faster while a
// new instance waits for its first verdict.
func (s *scheduler) every(p *v1alpha1.Proxy) time.Duration {
	ap := p.Status.AtProvider
	every := interval(p)
	if !ap.Healthy && ap.ConsecutiveSuccesses == 0 && ap.InstanceCreatedAt != nil && s.now().Sub(ap.InstanceCreatedAt.Time) < startupWindow {
		every = min(every, startupInterval)
	}
	return every
}

// nextProbe says when p is next due a probe.
func (s *scheduler) nextProbe(p *v1alpha1.Proxy) time.Time {
	ap := p.Status.AtProvider
	every := s.every(p)
	s.mu.Lock()
	defer s.mu.Unlock()
	// The status records probes only when they change something (see
	// probe), so this process's own memory is the fresher record.
	var last time.Time
	if ap.LastProbeTime != nil {
		last = ap.LastProbeTime.Time
	}
	if t, ok := s.last[p.GetUID()]; ok {
		// This process's own record, on its monotonic clock, beats
		// a wall time read back from the API.
		last = t
	}
	var due time.Time
	if !last.IsZero() {
		due = last.Add(every)
	}
	first, ok := s.seen[p.GetUID()]
	if !ok {
		// First sight since this process started. A proxy overdue for its
		// probe (the provider was down) gets a jittered slot, so a restart
		// does not probe the whole fleet at once.
		first = s.now()
		if !last.IsZero() && due.Before(first) {
			first = first.Add(rand.N(min(restartJitter, every)))
		}
		s.seen[p.GetUID()] = first
	}
	if due.Before(first) {
		return first
	}
	return due
}

// probed records that a Proxy was probed at t.
func (s *scheduler) probed(uid types.UID, t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		s.last = map[types.UID]time.Time{}
	}
	s.last[uid] = t
}

func (s *scheduler) forget(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.seen, uid)
	delete(s.last, uid)
}

// pollAfter is the managed reconciler's poll hook. A Proxy the pool probes
// is requeued by every outcome that changes its verdict (a failing probe of
// a vanished instance among them), so its poll folds steady passes and
// looks at the backend for drift (an edited firewall rule, say): every
// --poll, or every probe when probes are further apart. Any other (provisioning, waiting, kept while terminated)
// is looked at again soon while it is young and then less and less often:
// a VM that boots for minutes is not read every second.
func (s *scheduler) pollAfter(mg resource.Managed, poll time.Duration) time.Duration {
	p, ok := mg.(*v1alpha1.Proxy)
	if !ok {
		return v1alpha1.DefaultProbeInterval
	}
	d := s.pollEvery(p, poll)
	// Previous credentials are retired when their grace ends, not at the
	// next poll, so that the status says so on time.
	if u := p.Status.AtProvider.PreviousCredentialsUntil; u != nil && u.After(s.now()) {
		d = min(d, u.Sub(s.now())+time.Second)
	}
	return d
}

func (s *scheduler) pollEvery(p *v1alpha1.Proxy, poll time.Duration) time.Duration {
	if s.pool == nil {
		return max(s.nextProbe(p).Sub(s.now()), 200*time.Millisecond)
	}
	if every, ok := s.pool.Polled(p.GetUID(), poll); ok {
		return max(poll, every)
	}
	since := p.GetCreationTimestamp().Time
	if ap := p.Status.AtProvider; ap.InstanceCreatedAt != nil {
		since = ap.InstanceCreatedAt.Time
	}
	return min(max(s.now().Sub(since)/4, startupInterval), maxProvisioningPoll)
}

// maxProvisioningPoll bounds the poll of a Proxy that is not probed.
const maxProvisioningPoll = 30 * time.Second
