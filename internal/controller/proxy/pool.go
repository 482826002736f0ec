package proxy

import (
	"container/heap"
	"context"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
)

// DefaultProbeConcurrency is the probe pool's default size. 1000 proxies
// probed every 30 s make 33 probes a second. A healthy proxy answers a probe
// and its closure check in milliseconds; a black-holed one holds its worker
// for both timeouts (2 × 5 s by default), so with a tenth of such a fleet
// black-holed about 33 workers wait at any time. 128 leaves four times that
// for bursts; goroutines waiting on a socket cost next to nothing.
const DefaultProbeConcurrency = 128

// maxOutcomes bounds the outcomes kept for a Proxy between two Observes.
const maxOutcomes = 8

// probePool runs the probes of every running Proxy on its own workers, off
// the reconcile path, so a black-holed proxy ties up a probe worker for its
// timeout and never a reconcile worker. Observe tells the pool what to probe
// and when (watch) and folds what the pool found since (take). An outcome
// that changes the verdict requeues its Proxy, which is how Observe comes
// back when one is due; a steady pass waits for the next poll.
type probePool struct {
	prober  Prober
	now     func() time.Time
	workers int
	// poll is the provider's --poll: a steady Proxy's Observe comes at
	// least this often unless its own poll says otherwise.
	poll time.Duration
	// forget is told of each probing dropped for want of an Observe.
	forget  func(types.UID)
	metrics *metrics.Provider
	// requeue asks the controller to reconcile a Proxy.
	requeue func(ctx context.Context, key types.NamespacedName)

	mu      sync.Mutex
	entries map[types.UID]*probeEntry
	queue   dueQueue
	wake    chan struct{}
}

// probeEntry is one Proxy's probing: what Observe last asked for, and
// where the pool stands with it.
type probeEntry struct {
	probing
	uid types.UID
	// poll is how long until the Proxy's next poll, as the reconciler
	// last asked for it.
	poll    time.Duration
	due     time.Time
	running bool
	index   int // in queue; -1 when not queued
	// touched is when Observe last asked for this probing. One left
	// untouched for long belongs to a Proxy nobody reconciles any more
	// (deleted without a word, or paused), and is dropped.
	touched  time.Time
	outcomes []outcome
	// passes are the latencies of the last passing probes, newest last,
	// at most latencyWindow.
	passes []time.Duration
}

// latencyWindow is how many passing probes the recorded latency goes by:
// their median, so that one slow probe moves nothing.
const latencyWindow = 3

// outcome is one probe of one instance.
type outcome struct {
	// target is what was probed, credentials and all: an outcome of
	// credentials or a URL since replaced is not folded.
	target  probe.Target
	started time.Time
	res     probe.Result
	// checked says whether the closure check ran (the proxy has
	// credentials to refuse requests without).
	checked bool
	closure probe.Closure
	detail  string
	// counted says the probe's metrics were recorded when it ran.
	counted bool
	// typical is the latency the status goes by, the median of the last
	// passes of the same probing; zero for a probe made on its own, which
	// goes by its own latency.
	typical time.Duration
}

// latency is the latency the status records from o.
func (o outcome) latency() time.Duration {
	if o.typical > 0 {
		return o.typical
	}
	return o.res.Latency
}

func newProbePool(pr Prober, workers int, poll time.Duration, now func() time.Time, m *metrics.Provider) *probePool {
	return &probePool{prober: pr, workers: workers, poll: poll, now: now, metrics: m, entries: map[types.UID]*probeEntry{}, wake: make(chan struct{}, 1)}
}

// probing says what Observe wants probed.
type probing struct {
	key types.NamespacedName
	// instance identifies what is probed; outcomes of another instance are
	// never folded into this one's verdict.
	instance string
	target   probe.Target
	closure  bool
	every    time.Duration
	// backend names the backend in metrics.
	backend string
	// steady tells the outcomes that change nothing in the Proxy's status
	// as it is now; nil means none do.
	steady func(outcome) bool
}

// take returns the outcomes gathered for uid's instance since the last
// take, leaving out those of another target than t (credentials rotated,
// URL changed).
func (pp *probePool) take(uid types.UID, instance string, t probe.Target) []outcome {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	e, ok := pp.entries[uid]
	if !ok || e.instance != instance {
		return nil
	}
	out := make([]outcome, 0, len(e.outcomes))
	for _, o := range e.outcomes {
		if o.target == t {
			out = append(out, o)
		}
	}
	e.outcomes = nil
	return out
}

// watch probes uid as w says, next at due. A changed instance starts a new
// probing, probed at once: the old one's outcomes are dropped, and so is
// one in flight. due is taken as at most one interval from now, so a wall
// clock stepped back, or a status written by a replica whose clock ran
// ahead, never puts a probe off for longer.
func (pp *probePool) watch(uid types.UID, w probing, due time.Time) {
	pp.mu.Lock()
	now := pp.now()
	e, ok := pp.entries[uid]
	if ok && e.instance != w.instance {
		pp.dropLocked(e)
		ok = false
		due = now
	}
	if !ok {
		e = &probeEntry{uid: uid, index: -1}
		pp.entries[uid] = e
	}
	e.probing = w
	e.touched = now
	if !e.running {
		e.due = now.Add(min(max(due.Sub(now), 0), w.every))
		if e.index < 0 {
			heap.Push(&pp.queue, e)
		} else {
			heap.Fix(&pp.queue, e.index)
		}
	}
	pp.mu.Unlock()
	pp.poke()
}

// polled notes that uid's next poll is poll away, and reports whether uid
// is being probed, and how often.
func (pp *probePool) polled(uid types.UID, poll time.Duration) (time.Duration, bool) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	e, ok := pp.entries[uid]
	if !ok {
		return 0, false
	}
	e.poll = max(poll, e.every)
	return e.every, true
}

// stop ends uid's probing; an outcome still in flight is dropped.
func (pp *probePool) stop(uid types.UID) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if e, ok := pp.entries[uid]; ok {
		pp.dropLocked(e)
	}
}

func (pp *probePool) dropLocked(e *probeEntry) {
	if e.index >= 0 {
		heap.Remove(&pp.queue, e.index)
	}
	delete(pp.entries, e.uid)
}

func (pp *probePool) poke() {
	select {
	case pp.wake <- struct{}{}:
	default:
	}
}

// staleAfter is how long a probing lives without Observe asking for it:
// two missed polls (a steady proxy's Observe comes at each poll, its own
// or the provider's, whether or not its status changes) and then some.
func (pp *probePool) staleAfter(e *probeEntry) time.Duration {
	return 2*max(pp.poll, e.poll, e.every) + 2*e.target.Timeout + time.Minute
}

// Start runs the pool until ctx ends. As a manager runnable it runs on the
// elected leader only.
func (pp *probePool) Start(ctx context.Context) error {
	jobs := make(chan *probeEntry)
	var wg sync.WaitGroup
	for range pp.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := range jobs {
				pp.run(ctx, e)
			}
		}()
	}
	defer wg.Wait()
	defer close(jobs)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		e, wait := pp.next()
		if e != nil {
			select {
			case jobs <- e:
				continue
			case <-ctx.Done():
				return nil
			}
		}
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-pp.wake:
		case <-ctx.Done():
			return nil
		}
	}
}

// next pops the first probing that is due, or says how long until one is.
func (pp *probePool) next() (*probeEntry, time.Duration) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	now := pp.now()
	for pp.queue.Len() > 0 {
		e := pp.queue[0]
		if e.due.After(now) {
			return nil, e.due.Sub(now)
		}
		heap.Pop(&pp.queue)
		if now.Sub(e.touched) > pp.staleAfter(e) {
			delete(pp.entries, e.uid)
			if pp.forget != nil {
				pp.forget(e.uid)
			}
			continue
		}
		e.running = true
		pp.metrics.ProbeLateness.Observe(now.Sub(e.due).Seconds())
		return e, 0
	}
	return nil, time.Hour
}

// run probes e once and hands the outcome to its Proxy.
func (pp *probePool) run(ctx context.Context, e *probeEntry) {
	pp.mu.Lock()
	if pp.entries[e.uid] != e {
		// Stopped or replaced while it waited for a worker: its
		// credentials are not sent to an address that may be another's
		// by now.
		e.running = false
		pp.mu.Unlock()
		return
	}
	w := e.probing
	pp.mu.Unlock()
	pp.metrics.ProbesInFlight.Inc()
	o := outcome{target: w.target, started: pp.now(), counted: true}
	o.res = pp.prober.Probe(ctx, w.target)
	if w.closure {
		o.checked = true
		o.closure, o.detail = pp.prober.Closed(ctx, w.target)
	}
	pp.metrics.ProbesInFlight.Dec()
	countProbe(pp.metrics, w.backend, o.res)

	pp.mu.Lock()
	if o.res.OK {
		e.passes = append(e.passes, o.res.Latency)
		if len(e.passes) > latencyWindow {
			e.passes = e.passes[1:]
		}
		o.typical = median(e.passes)
	}
	pp.mu.Unlock()
	news := w.steady == nil || !w.steady(o)

	pp.mu.Lock()
	e.running = false
	current := pp.entries[e.uid] == e
	if current {
		e.outcomes = append(e.outcomes, o)
		if len(e.outcomes) > maxOutcomes {
			// The oldest steady pass goes first: one that found the
			// proxy open or failing is kept for Observe.
			drop := 0
			for i, old := range e.outcomes {
				if w.steady != nil && w.steady(old) {
					drop = i
					break
				}
			}
			e.outcomes = slices.Delete(e.outcomes, drop, drop+1)
		}
		// Until Observe says otherwise, the next probe is one interval
		// after this one started: a slow probe does not push the cadence.
		e.due = o.started.Add(e.every)
		heap.Push(&pp.queue, e)
	}
	key := e.key
	pp.mu.Unlock()
	if current {
		pp.poke()
	}
	if current && news {
		pp.requeue(ctx, key)
	}
}

// median is the middle of ds (the upper middle of an even count).
func median(ds []time.Duration) time.Duration {
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	return sorted[len(sorted)/2]
}

// dueQueue orders probings by when they are due.
type dueQueue []*probeEntry

func (q dueQueue) Len() int           { return len(q) }
func (q dueQueue) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q dueQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}

func (q *dueQueue) Push(x any) {
	e := x.(*probeEntry) //nolint:forcetypeassert // Only probe entries are pushed.
	e.index = len(*q)
	*q = append(*q, e)
}

func (q *dueQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = nil
	e.index = -1
	*q = old[:len(old)-1]
	return e
}
