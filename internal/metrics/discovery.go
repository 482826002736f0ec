package metrics

import "github.com/prometheus/client_golang/prometheus"

// Discovery is egress-discovery's metric set: leases granted and refused
// (by the reason code the API answers), how long acquisitions take and
// wait, how many wait, and bans reported.
type Discovery struct {
	Acquisitions   prometheus.Counter
	Denials        *prometheus.CounterVec
	AcquireLatency prometheus.Histogram
	Bans           prometheus.Counter
	// WaitTime is how long acquisitions that found no slot (or too few
	// healthy proxies) waited, granted or not.
	WaitTime prometheus.Histogram
	// QueueDepth is how many acquisitions wait on this replica.
	QueueDepth prometheus.Gauge
	// SummaryWrites counts this replica's LeaseSummary writes, by result
	// (written, failed): one that cannot write keeps its last summary
	// counting, and every drain it does not list waits.
	SummaryWrites *prometheus.CounterVec
	// Rankings counts acquisition tries by what they ranked: a sample of
	// a large fleet, or the whole fleet (a small one, or a large one
	// whose sample had no free slot: a fleet close to full).
	Rankings *prometheus.CounterVec
}

// NewDiscovery returns egress-discovery's metrics, unregistered.
func NewDiscovery() *Discovery {
	return &Discovery{
		Acquisitions: prometheus.NewCounter(prometheus.CounterOpts{Name: "egress_discovery_lease_acquisitions_total", Help: "Leases granted."}),
		Denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egress_discovery_lease_denials_total",
			Help: "Lease requests refused, by the reason code answered (NoFreeSlot, TooFewHealthy, QuotaExceeded, Forbidden, FleetNotFound, Invalid, APIServerUnavailable, ...).",
		}, []string{"reason"}),
		AcquireLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "egress_discovery_acquire_duration_seconds", Help: "Time to grant a lease, waiting included.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20},
		}),
		Bans: prometheus.NewCounter(prometheus.CounterOpts{Name: "egress_discovery_bans_total", Help: "Proxies reported banned for a domain."}),
		WaitTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "egress_discovery_lease_wait_seconds", Help: "How long acquisitions that found no free slot, or too few healthy proxies, waited for one, granted or not.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20},
		}),
		QueueDepth: prometheus.NewGauge(prometheus.GaugeOpts{Name: "egress_discovery_lease_queue_depth", Help: "Acquisitions waiting for a slot on this replica."}),
		SummaryWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egress_discovery_lease_summary_writes_total",
			Help: "This replica's LeaseSummary writes, by result (written, failed). While they fail, its last summary counts until it expires and no drain it does not list completes.",
		}, []string{"result"}),
		Rankings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egress_discovery_lease_rankings_total",
			Help: "Acquisition tries by what they ranked: sample (a random sample of a fleet of over 128 proxies had a free slot) or fleet (every proxy of the fleet: a smaller fleet, or a sample with no free slot, as in a fleet close to full).",
		}, []string{"scope"}),
	}
}

// Collectors returns every collector, for registration.
func (m *Discovery) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Acquisitions, m.Denials, m.AcquireLatency, m.Bans, m.WaitTime, m.QueueDepth, m.SummaryWrites, m.Rankings}
}
