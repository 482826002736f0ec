package proxy

import (
	"math/rand/v2"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
)

// scheduler decides when each Proxy is next probed. What it keeps in memory
// is only timing: the verdict itself lives in the Proxy's status.
type scheduler struct {
	started time.Time
	now     func() time.Time

	mu   sync.Mutex
	seen map[types.UID]time.Time // first probe time allowed after a restart
	last map[types.UID]time.Time // when each Proxy was last probed
}

func interval(p *v1alpha1.Proxy) time.Duration {
	return p.Spec.ForProvider.HealthCheck.IntervalOrDefault()
}

// nextProbe says when p is next due a probe.
func (s *scheduler) nextProbe(p *v1alpha1.Proxy) time.Time {
	ap := p.Status.AtProvider
	every := interval(p)
	if !ap.Healthy && ap.ConsecutiveSuccesses == 0 && ap.InstanceCreatedAt != nil && s.now().Sub(ap.InstanceCreatedAt.Time) < startupWindow {
		every = min(every, startupInterval)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// The status records probes only when they change something (see
	// probe), so this process's own memory is the fresher record.
	var last time.Time
	if ap.LastProbeTime != nil {
		last = ap.LastProbeTime.Time
	}
	if t, ok := s.last[p.GetUID()]; ok && t.After(last) {
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

// pollAfter is the managed reconciler's poll hook: come back when the next
// probe is due.
func (s *scheduler) pollAfter(mg resource.Managed, _ time.Duration) time.Duration {
	p, ok := mg.(*v1alpha1.Proxy)
	if !ok {
		return v1alpha1.DefaultProbeInterval
	}
	return max(s.nextProbe(p).Sub(s.now()), 200*time.Millisecond)
}
