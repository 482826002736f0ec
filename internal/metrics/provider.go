// Package metrics holds the Prometheus metrics of the provider (probe
// results and latency, instances by backend and phase, and backend errors by
// class, which is what an operator alerts on) and of egress-discovery.
//
// provider.go holds the provider's set, with the count of instances by
// phase; discovery.go egress-discovery's (leases, waits, bans, summary
// writes); gateway.go that of its gateway (connections, bytes, upstream
// errors, sessions and seats).
package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
)

// Provider is the provider's metric set.
type Provider struct {
	ProbeDuration *prometheus.HistogramVec
	ProbeResults  *prometheus.CounterVec
	Instances     *prometheus.GaugeVec
	// CreatesHeld counts the Proxies whose next create the provider holds
	// back after failures, by backend and the failures' class: a fleet
	// kept below its size by a quota, a missing grant or a stockout.
	CreatesHeld   *prometheus.GaugeVec
	BackendErrors *prometheus.CounterVec
	Orphans       *prometheus.CounterVec
	// OpenProxies counts proxies found serving requests without the
	// credentials they have.
	OpenProxies *prometheus.CounterVec
	// ProbeLateness is how long after it was due each probe started: the
	// probe pool keeping up, or not.
	ProbeLateness prometheus.Histogram
	// ProbesInFlight counts the probe pool's busy workers.
	ProbesInFlight prometheus.Gauge
	// StatusWritesSkipped counts Proxy status writes left out because
	// they changed nothing.
	StatusWritesSkipped prometheus.Counter

	mu     sync.Mutex
	phases map[types.UID][2]string // backend, phase
	held   map[types.UID][2]string // backend, class
}

// labelBackend is the label that names a proxy's backend.
const labelBackend = "backend"

// NewProvider returns the provider's metrics, unregistered.
func NewProvider() *Provider {
	return &Provider{
		ProbeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "egress_proxy_probe_duration_seconds",
			Help:    "Time to fetch the probe URL through a proxy.",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
		}, []string{labelBackend}),
		ProbeResults: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egress_proxy_probes_total",
			Help: "Probes through proxies by outcome (success, failure).",
		}, []string{labelBackend, labelOutcome}),
		Instances: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "egress_proxy_instances",
			Help: "Proxy instances by backend and phase.",
		}, []string{labelBackend, "phase"}),
		CreatesHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "egress_proxy_creates_held",
			Help: "Proxies without an instance whose next create is held back after failures, by backend and the class of the failures (QuotaExceeded, ZoneExhausted, AccessDenied, Throttled, PermanentError, Terminated).",
		}, []string{labelBackend, "class"}),
		BackendErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egress_proxy_backend_errors_total",
			Help: "Backend API errors by backend, operation and class (Transient, Throttled, ZoneExhausted, AccessDenied, QuotaExceeded, PermanentError).",
		}, []string{labelBackend, "operation", "class"}),
		Orphans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egress_proxy_orphans_total",
			Help: "Instances no Proxy owns, by backend and what was done (deleted, dry-run, too-young; partial: a list that could read only part of what the backend holds).",
		}, []string{labelBackend, "action"}),
		OpenProxies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egress_proxy_open_proxies_total",
			Help: "Times a proxy with credentials was found serving a request without them, by backend.",
		}, []string{labelBackend}),
		ProbeLateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "egress_proxy_probe_lateness_seconds",
			Help:    "How long after it was due each probe started.",
			Buckets: []float64{0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}),
		ProbesInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "egress_proxy_probes_in_flight",
			Help: "Probes running now, out of --probe-concurrency workers.",
		}),
		StatusWritesSkipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "egress_proxy_status_writes_skipped_total",
			Help: "Proxy status writes left out because they changed nothing (the reconciler writes status at every reconcile).",
		}),
		phases: map[types.UID][2]string{},
		held:   map[types.UID][2]string{},
	}
}

// Collectors returns every collector, for registration.
func (p *Provider) Collectors() []prometheus.Collector {
	return []prometheus.Collector{p.ProbeDuration, p.ProbeResults, p.Instances, p.CreatesHeld, p.BackendErrors, p.Orphans, p.OpenProxies, p.ProbeLateness, p.ProbesInFlight, p.StatusWritesSkipped}
}

// SetPhase records that the Proxy with uid has an instance on backend in
// phase; an empty phase forgets it. The gauge is derived from these records,
// so a proxy is counted once whatever happens.
func (p *Provider) SetPhase(uid types.UID, backend, phase string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if old, ok := p.phases[uid]; ok {
		p.Instances.WithLabelValues(old[0], old[1]).Dec()
		delete(p.phases, uid)
	}
	if phase == "" {
		return
	}
	p.phases[uid] = [2]string{backend, phase}
	p.Instances.WithLabelValues(backend, phase).Inc()
}

// SetHeld records that the create of the Proxy with uid, on backend, is
// held back after failures of class; an empty class forgets it. As with
// SetPhase, the gauge is derived from these records.
func (p *Provider) SetHeld(uid types.UID, backend, class string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if old, ok := p.held[uid]; ok {
		if old == [2]string{backend, class} {
			return
		}
		p.CreatesHeld.WithLabelValues(old[0], old[1]).Dec()
		delete(p.held, uid)
	}
	if class == "" {
		return
	}
	p.held[uid] = [2]string{backend, class}
	p.CreatesHeld.WithLabelValues(backend, class).Inc()
}
