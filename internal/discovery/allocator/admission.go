package allocator

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
)

// HealthyFraction is the share of a fleet's proxies that take new
// crawlers, counted against spec.replicas (or the proxies that exist, if
// more), so that proxies gone altogether count as unhealthy. An autoscaled
// fleet's size is what demand asks for: proxies it is adding, not yet
// Ready, are no proxies lost, and count in neither part.
func HealthyFraction(ms []catalog.Member, p *catalog.Policy) float64 {
	serving, awake := catalog.CountServing(ms)
	return fraction(serving, awake, len(ms), p)
}

// membersHealthyFraction is HealthyFraction of the fleet's members,
// counted once.
func membersHealthyFraction(f *catalog.Members, p *catalog.Policy) float64 {
	return fraction(f.Serving, f.Awake, len(f.Items), p)
}

// fraction is the healthy share of a fleet of members proxies, of which
// serving serve and awake serve or are not booting.
func fraction(serving, awake, members int, p *catalog.Policy) float64 {
	of := members
	if p.Autoscaled {
		of = awake
	}
	of = max(of, p.Replicas)
	if of == 0 {
		return 0
	}
	return float64(serving) / float64(of)
}

// tooFewHealthy is the refusal of a new lease while a fleet is below its
// admission.minHealthyFraction.
func tooFewHealthy(ns, name string, frac float64, p *catalog.Policy) *problem.Error {
	return &problem.Error{
		Code: problem.StatusConflict, Reason: apiv1.ReasonTooFewHealthy, RetryAfter: 5,
		Msg: fmt.Sprintf("only %.0f%% of fleet %s/%s's proxies are healthy, under its spec.leases.admission.minHealthyFraction %.0f%%: new leases wait until more recover, so that the survivors are not overloaded", 100*frac, ns, name, 100*p.MinHealthyFraction),
	}
}

// waitQueues are the acquisitions waiting for a slot, first come, first
// served, by fleet. Only the one at the head of a fleet's queue tries;
// the others wait their turn. They are the only state a replica keeps in
// memory: a replica that dies loses its waiters, which see their
// connection fail, but no grant, which is in the API server only.
type waitQueues struct {
	mu sync.Mutex
	q  map[string][]*waiter
	n  int
	// by counts the waiters of each identity.
	by map[string]int
}

type waiter struct {
	// turn is closed when the waiter reaches the head of its queue.
	turn     chan struct{}
	identity string
}

// queueKey is the queue an acquisition waits in: its fleet and the
// filters that choose its proxies, so that one waiting for a zone or a
// domain no proxy serves does not hold up the others.
func queueKey(ns, fleet, zone, domain string) string {
	return ns + "/" + fleet + "\x00" + zone + "\x00" + strings.ToLower(domain)
}

// join queues a waiter at the tail of key's queue, unless the replica
// holds maxTotal waiters already, or the identity maxPerIdentity.
func (w *waitQueues) join(key, identity string, maxTotal, maxPerIdentity int) (*waiter, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.q == nil {
		w.q, w.by = map[string][]*waiter{}, map[string]int{}
	}
	if w.n >= maxTotal || w.by[identity] >= maxPerIdentity {
		return nil, false
	}
	w.by[identity]++
	wt := &waiter{turn: make(chan struct{}), identity: identity}
	w.q[key] = append(w.q[key], wt)
	if len(w.q[key]) == 1 {
		close(wt.turn)
	}
	w.n++
	return wt, true
}

// leave takes a waiter out of key's queue, granted or given up, and gives
// the next its turn.
func (w *waitQueues) leave(key string, wt *waiter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	q := w.q[key]
	for i, x := range q {
		if x != wt {
			continue
		}
		q = append(q[:i:i], q[i+1:]...)
		w.n--
		if w.by[wt.identity]--; w.by[wt.identity] <= 0 {
			delete(w.by, wt.identity)
		}
		if i == 0 && len(q) > 0 {
			close(q[0].turn)
		}
		break
	}
	if len(q) == 0 {
		delete(w.q, key)
		return
	}
	w.q[key] = q
}

// depth is how many acquisitions wait in key's queue.
func (w *waitQueues) depth(key string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.q[key])
}

// fleetDepth is how many acquisitions wait for any proxy of a fleet.
func (w *waitQueues) fleetDepth(ns, fleet string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	prefix := ns + "/" + fleet + "\x00"
	for k, q := range w.q {
		if strings.HasPrefix(k, prefix) {
			n += len(q)
		}
	}
	return n
}

// total is how many acquisitions wait in every queue.
func (w *waitQueues) total() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// retryPoll is how often the head of a queue looks for a change that may
// have freed a slot, and tries again on one, at most every retryMin;
// retryEvery is how often it tries again regardless (a lease expiring is
// no change any watch reports).
const (
	retryPoll  = 50 * time.Millisecond
	retryMin   = 250 * time.Millisecond
	retryEvery = time.Second
)

// Default bounds of the acquisitions waiting on a replica.
const (
	DefaultMaxWaiting            = 1024
	DefaultMaxWaitingPerIdentity = 32
)

// Refusal says whether an acquisition's error is one that waiting may
// mend: no free slot, or too few healthy proxies.
func Refusal(err error) bool {
	r := problem.ReasonOf(err)
	return r == apiv1.ReasonNoFreeSlot || r == apiv1.ReasonTooFewHealthy
}

// wait queues an acquisition that found no slot and tries it again, when
// its turn comes, whenever the fleet's proxies or leases change, until it
// is granted or wait has passed. It answers the last refusal then. A
// waiting request gives its in-flight slot back: waiters are bounded by
// MaxWaiting and MaxWaitingPerIdentity instead, and one over either is
// answered its refusal at once.
func (s *Allocator) wait(ctx context.Context, key, identity string, wait time.Duration, try func() (*Granted, error), first error) (*Granted, error) {
	wt, ok := s.queues.join(key, identity, s.MaxWaiting, s.MaxWaitingPerIdentity)
	if !ok {
		return nil, first
	}
	start := time.Now()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	beforeWait(ctx)
	s.Metrics.QueueDepth.Set(float64(s.queues.total()))
	defer func() {
		s.queues.leave(key, wt)
		s.Metrics.QueueDepth.Set(float64(s.queues.total()))
		s.Metrics.WaitTime.Observe(time.Since(start).Seconds())
	}()
	select {
	case <-wt.turn:
	case <-deadline.C:
		return nil, first
	case <-ctx.Done():
		return nil, first
	}
	last := first
	seen := s.version()
	tick := time.NewTicker(retryPoll)
	defer tick.Stop()
	tried := time.Time{}
	for {
		if v, since := s.version(), time.Since(tried); (v != seen && since >= retryMin) || since >= retryEvery {
			seen, tried = v, time.Now()
			g, err := try()
			if err == nil || !Refusal(err) {
				return g, err
			}
			last = err
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return nil, last
		case <-ctx.Done():
			return nil, last
		}
	}
}

// version is the watched objects' version; 0 when nothing is watched,
// which leaves waiters to try every retryEvery.
func (s *Allocator) version() uint64 {
	if s.Version == nil {
		return 0
	}
	return s.Version()
}

// beforeWaitKey keys, in a request's context, what to do before it waits
// for a slot.
type beforeWaitKey struct{}

// BeforeWait returns ctx carrying f, which an acquisition calls before it
// waits for a slot: the API's bound of requests in flight gives the
// request's place back, as waiters have a bound of their own.
func BeforeWait(ctx context.Context, f func()) context.Context {
	return context.WithValue(ctx, beforeWaitKey{}, f)
}

func beforeWait(ctx context.Context) {
	if f, ok := ctx.Value(beforeWaitKey{}).(func()); ok {
		f()
	}
}

// FleetDepth is how many acquisitions of the fleet wait on this replica.
func (s *Allocator) FleetDepth(namespace, fleet string) int {
	return s.queues.fleetDepth(namespace, fleet)
}
