// Package pool is the provider's probe pool: it runs the probes of every
// running Proxy on workers of its own, off the reconcile path, each when it
// is due, and hands each Outcome to the Proxy's next Observe, requeueing
// the Proxy when an Outcome changes its verdict. pool.go holds it all.
package pool

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

// DefaultConcurrency is the probe pool's default size. 1000 proxies
// probed every 30 s make 33 probes a second. A healthy proxy answers a probe
// and its closure check in milliseconds; a black-holed one holds its worker
// for both timeouts (2 × 5 s by default), so with a tenth of such a fleet
// black-holed about 33 workers wait at any time. 128 leaves four times that
// for bursts; goroutines waiting on a socket cost next to nothing.
const DefaultConcurrency = 128

// maxOutcomes bounds the outcomes kept for a Proxy between two Observes.
const maxOutcomes = 8

// Pool runs the probes of every running Proxy on its own workers, off
// the reconcile path, so a black-holed proxy ties up a probe worker for its
// timeout and never a reconcile worker. Observe tells the pool what to probe
// and when (Watch) and folds what the pool found since (Take). An Outcome
// that changes the verdict requeues its Proxy, which is how Observe comes
// back when one is due; a steady pass waits for the next poll. Build it
// with New.
type Pool struct {
	Config

	mu      sync.Mutex
	entries map[types.UID]*entry
	queue   dueQueue
	wake    chan struct{}
}

// entry is one Proxy's Probing: what Observe last asked for, and
// where the pool stands with it.
type entry struct {
	Probing
	uid types.UID
	// poll is how long until the Proxy's next poll, as the reconciler
	// last asked for it.
	poll    time.Duration
	due     time.Time
	running bool
	index   int // in queue; -1 when not queued
	// touched is when Observe last asked for this Probing. One left
	// untouched for long belongs to a Proxy nobody reconciles any more
	// (deleted without a word, or paused), and is dropped.
	touched  time.Time
	outcomes []Outcome
	// passes are the latencies of the last passing probes, newest last,
	// at most latencyWindow.
	passes []time.Duration
}

// latencyWindow is how many passing probes the recorded latency goes by:
// their median, so that one slow probe moves nothing.
const latencyWindow = 3

// Outcome is one probe of one instance.
type Outcome struct {
	// Target is what was probed, credentials and all: an Outcome of
	// credentials or a URL since replaced is not folded.
	Target  probe.Target
	Started time.Time
	Res     probe.Result
	// Checked says whether the closure check ran (the proxy has
	// credentials to refuse requests without).
	Checked bool
	Closure probe.Closure
	Detail  string
	// Counted says the probe's metrics were recorded when it ran.
	Counted bool
	// Typical is the latency the status goes by, the median of the last
	// passes of the same Probing; zero for a probe made on its own, which
	// goes by its own latency.
	Typical time.Duration
}

// Latency is the latency the status records from o.
func (o Outcome) Latency() time.Duration {
	if o.Typical > 0 {
		return o.Typical
	}
	return o.Res.Latency
}

// Prober probes through a proxy: what was fetched through it, and whether
// it refuses requests without credentials.
type Prober interface {
	Probe(ctx context.Context, t probe.Target) probe.Result
	Closed(ctx context.Context, t probe.Target) (probe.Closure, string)
}

// Config is what New builds a Pool from.
type Config struct {
	// Prober probes through a proxy.
	Prober Prober
	// Workers is how many probes run at once; zero means
	// DefaultConcurrency.
	Workers int
	// Poll is the provider's --poll: a steady Proxy's Observe comes at
	// least this often unless its own poll says otherwise.
	Poll time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Metrics is where probes are counted; nil means metrics of the pool's
	// own, registered nowhere.
	Metrics *metrics.Provider
	// Requeue asks the controller to reconcile a Proxy; Forget is told of
	// each Probing dropped for want of an Observe. nil does nothing.
	Requeue func(ctx context.Context, key types.NamespacedName)
	Forget  func(types.UID)
}

// New returns a pool, cfg's zero settings taking their defaults.
func New(cfg Config) *Pool {
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultConcurrency
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.NewProvider()
	}
	if cfg.Requeue == nil {
		cfg.Requeue = func(context.Context, types.NamespacedName) {}
	}
	if cfg.Forget == nil {
		cfg.Forget = func(types.UID) {}
	}
	return &Pool{Config: cfg, entries: map[types.UID]*entry{}, wake: make(chan struct{}, 1)}
}

// Probing says what Observe wants probed.
type Probing struct {
	Key types.NamespacedName
	// Instance identifies what is probed; outcomes of another instance are
	// never folded into this one's verdict.
	Instance string
	Target   probe.Target
	Closure  bool
	Every    time.Duration
	// Backend names the backend in metrics.
	Backend string
	// Steady tells the outcomes that change nothing in the Proxy's status
	// as it is now; nil means none do.
	Steady func(Outcome) bool
}

// Take returns the outcomes gathered for uid's instance since the last
// take, leaving out those of another target than t (credentials rotated,
// URL changed).
func (pp *Pool) Take(uid types.UID, instance string, t probe.Target) []Outcome {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	e, ok := pp.entries[uid]
	if !ok || e.Instance != instance {
		return nil
	}
	out := make([]Outcome, 0, len(e.outcomes))
	for _, o := range e.outcomes {
		if o.Target == t {
			out = append(out, o)
		}
	}
	e.outcomes = nil
	return out
}

// Watch probes uid as w says, next at due. A changed instance starts a new
// Probing, probed at once: the old one's outcomes are dropped, and so is
// one in flight. due is taken as at most one interval from now, so a wall
// clock stepped back, or a status written by a replica whose clock ran
// ahead, never puts a probe off for longer.
func (pp *Pool) Watch(uid types.UID, w Probing, due time.Time) {
	pp.mu.Lock()
	now := pp.Now()
	e, ok := pp.entries[uid]
	if ok && e.Instance != w.Instance {
		pp.dropLocked(e)
		ok = false
		due = now
	}
	if !ok {
		e = &entry{uid: uid, index: -1}
		pp.entries[uid] = e
	}
	e.Probing = w
	e.touched = now
	if !e.running {
		e.due = now.Add(min(max(due.Sub(now), 0), w.Every))
		if e.index < 0 {
			heap.Push(&pp.queue, e)
		} else {
			heap.Fix(&pp.queue, e.index)
		}
	}
	pp.mu.Unlock()
	pp.poke()
}

// Polled notes that uid's next poll is poll away, and reports whether uid
// is being probed, and how often.
func (pp *Pool) Polled(uid types.UID, poll time.Duration) (time.Duration, bool) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	e, ok := pp.entries[uid]
	if !ok {
		return 0, false
	}
	e.poll = max(poll, e.Every)
	return e.Every, true
}

// Stop ends uid's Probing; an Outcome still in flight is dropped.
func (pp *Pool) Stop(uid types.UID) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if e, ok := pp.entries[uid]; ok {
		pp.dropLocked(e)
	}
}

func (pp *Pool) dropLocked(e *entry) {
	if e.index >= 0 {
		heap.Remove(&pp.queue, e.index)
	}
	delete(pp.entries, e.uid)
}

func (pp *Pool) poke() {
	select {
	case pp.wake <- struct{}{}:
	default:
	}
}

// staleAfter is how long a Probing lives without Observe asking for it:
// two missed polls (a steady proxy's Observe comes at each poll, its own
// or the provider's, whether or not its status changes) and then some.
func (pp *Pool) staleAfter(e *entry) time.Duration {
	return 2*max(pp.Poll, e.poll, e.Every) + 2*e.Target.Timeout + time.Minute
}

// Start runs the pool until ctx ends. As a manager runnable it runs on the
// elected leader only.
func (pp *Pool) Start(ctx context.Context) error {
	jobs := make(chan *entry)
	var wg sync.WaitGroup
	for range pp.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := range jobs {
				_, _ = pp.run(ctx, e)
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

// Step runs the first probing due now on the caller's goroutine, as a
// worker would, and says what it probed; false when none is due. Start's
// workers do this on their own: Step is for a caller that drives the pool
// by hand, as the controller's tests do.
func (pp *Pool) Step(ctx context.Context) (probe.Target, bool) {
	e, _ := pp.next()
	if e == nil {
		return probe.Target{}, false
	}
	return pp.run(ctx, e)
}

// next pops the first probing that is due, or says how long until one is.
func (pp *Pool) next() (*entry, time.Duration) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	now := pp.Now()
	for pp.queue.Len() > 0 {
		e := pp.queue[0]
		if e.due.After(now) {
			return nil, e.due.Sub(now)
		}
		heap.Pop(&pp.queue)
		if now.Sub(e.touched) > pp.staleAfter(e) {
			delete(pp.entries, e.uid)
			pp.Forget(e.uid)
			continue
		}
		e.running = true
		pp.Metrics.ProbeLateness.Observe(now.Sub(e.due).Seconds())
		return e, 0
	}
	return nil, time.Hour
}

// run probes e once and hands the Outcome to its Proxy; it returns what
// it probed, and false when e was stopped or replaced before its turn.
func (pp *Pool) run(ctx context.Context, e *entry) (probe.Target, bool) {
	pp.mu.Lock()
	if pp.entries[e.uid] != e {
		// Stopped or replaced while it waited for a worker: its
		// credentials are not sent to an address that may be another's
		// by now.
		e.running = false
		pp.mu.Unlock()
		return probe.Target{}, false
	}
	w := e.Probing
	pp.mu.Unlock()
	pp.Metrics.ProbesInFlight.Inc()
	o := Outcome{Target: w.Target, Started: pp.Now(), Counted: true}
	o.Res = pp.Prober.Probe(ctx, w.Target)
	if w.Closure {
		o.Checked = true
		o.Closure, o.Detail = pp.Prober.Closed(ctx, w.Target)
	}
	pp.Metrics.ProbesInFlight.Dec()
	CountProbe(pp.Metrics, w.Backend, o.Res)

	pp.mu.Lock()
	if o.Res.OK {
		e.passes = append(e.passes, o.Res.Latency)
		if len(e.passes) > latencyWindow {
			e.passes = e.passes[1:]
		}
		o.Typical = median(e.passes)
	}
	pp.mu.Unlock()
	news := w.Steady == nil || !w.Steady(o)

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
				if w.Steady != nil && w.Steady(old) {
					drop = i
					break
				}
			}
			e.outcomes = slices.Delete(e.outcomes, drop, drop+1)
		}
		// Until Observe says otherwise, the next probe is one interval
		// after this one started: a slow probe does not push the cadence.
		e.due = o.Started.Add(e.Every)
		heap.Push(&pp.queue, e)
	}
	key := e.Key
	pp.mu.Unlock()
	if current {
		pp.poke()
	}
	if current && news {
		pp.Requeue(ctx, key)
	}
	return w.Target, true
}

// median is the middle of ds (the upper middle of an even count).
func median(ds []time.Duration) time.Duration {
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	return sorted[len(sorted)/2]
}

// dueQueue orders probings by when they are due.
type dueQueue []*entry

func (q dueQueue) Len() int           { return len(q) }
func (q dueQueue) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q dueQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}

func (q *dueQueue) Push(x any) {
	e := x.(*entry) //nolint:forcetypeassert // Only probe entries are pushed.
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

// CountProbe counts a probe of a proxy of the named backend in m: its
// result, and its latency when it passed.
func CountProbe(m *metrics.Provider, backendName string, res probe.Result) {
	result := "failure"
	if res.OK {
		result = "success"
		m.ProbeDuration.WithLabelValues(backendName).Observe(res.Latency.Seconds())
	}
	m.ProbeResults.WithLabelValues(backendName, result).Inc()
}
