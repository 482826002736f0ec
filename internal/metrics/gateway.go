package metrics

import "github.com/prometheus/client_golang/prometheus"

// Gateway is the metric set of egress-discovery's forward-proxy gateway.
type Gateway struct {
	// Connections are the connections open (CONNECT tunnels and plain HTTP
	// requests), by fleet; ConnectionsTotal counts them.
	Connections      *prometheus.GaugeVec
	ConnectionsTotal *prometheus.CounterVec
	// Bytes counts what crossed the gateway, by direction (up: from the
	// crawler to the upstream; down: back).
	Bytes *prometheus.CounterVec
	// ChooseLatency is how long choosing an upstream took: authorisation,
	// a lease (or the session's), its credentials.
	ChooseLatency prometheus.Histogram
	// UpstreamErrors counts upstreams that failed, by reason (dial,
	// address, handshake, status).
	UpstreamErrors *prometheus.CounterVec
	// IdleTunnels counts tunnels closed for moving nothing for the idle
	// timeout.
	IdleTunnels prometheus.Counter
	// Sessions is how many sessions hold a lease on this replica.
	Sessions prometheus.Gauge
	// Seats is how many seats (the replica's own leases for connections
	// without a session) it holds.
	Seats prometheus.Gauge
	// SessionsAdopted counts sessions this replica took up from the lease
	// another replica granted them.
	SessionsAdopted prometheus.Counter
	// SessionsMoved counts loose sessions moved off a proxy that stopped
	// serving them; StrictRefusals the connections of strict sessions
	// answered 502 instead; SessionsEnded the sessions started again on
	// another proxy when their lifetime was over.
	SessionsMoved, StrictRefusals, SessionsEnded prometheus.Counter
	// SOCKSRefusals counts SOCKS5 connections refused, by reply code
	// (RFC 1928) or "auth" for a failed sign-in.
	SOCKSRefusals *prometheus.CounterVec
	// Paced counts connections pacing changed, by fleet and outcome:
	// diverted (a proxy passed over for its paced IP), waited (for the
	// first IP free) or refused (429).
	Paced *prometheus.CounterVec
	// Bans counts the bans the gateway took from an origin's answer
	// (spec.gateway.banStatusCodes), by outcome: recorded, refused by the
	// bounds, failed (the write), or dropped (too many writes in flight).
	Bans *prometheus.CounterVec
}

// labelFleet labels a gateway series with its fleet (namespace/name).
const labelFleet = "fleet"

// labelOutcome labels a series with what came of each event.
const labelOutcome = "outcome"

// NewGateway returns the gateway's metrics, unregistered.
func NewGateway() *Gateway {
	return &Gateway{
		Connections: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "egress_discovery_gateway_connections", Help: "Connections open through the gateway, by fleet (namespace/name).",
		}, []string{labelFleet}),
		ConnectionsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egress_discovery_gateway_connections_total", Help: "Connections accepted by the gateway and chained to an upstream proxy, by fleet.",
		}, []string{labelFleet}),
		Bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egress_discovery_gateway_bytes_total", Help: "Bytes through the gateway, by direction: up (crawler to upstream) and down.",
		}, []string{"direction"}),
		ChooseLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "egress_discovery_gateway_upstream_choice_seconds", Help: "Time to choose an upstream: authorisation, a lease or the session's, its credentials.",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5},
		}),
		UpstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egress_discovery_gateway_upstream_errors_total", Help: "Upstream proxies that failed a connection, by reason (dial, address: published where the gateway does not dial, status, handshake).",
		}, []string{"reason"}),
		IdleTunnels: prometheus.NewCounter(prometheus.CounterOpts{Name: "egress_discovery_gateway_idle_tunnels_closed_total",
			Help: "CONNECT tunnels closed for moving nothing either way for the idle timeout (--gateway-tunnel-idle)."}),
		Sessions: prometheus.NewGauge(prometheus.GaugeOpts{Name: "egress_discovery_gateway_sessions", Help: "Gateway sessions holding a lease on this replica."}),
		Seats:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "egress_discovery_gateway_seats", Help: "Seats (leases this replica holds for gateway connections without a session, one per proxy in use)."}),
		SessionsAdopted: prometheus.NewCounter(prometheus.CounterOpts{Name: "egress_discovery_gateway_sessions_adopted_total",
			Help: "Gateway sessions this replica took up from the lease another replica granted them, keeping their proxy."}),
		SessionsMoved: prometheus.NewCounter(prometheus.CounterOpts{Name: "egress_discovery_gateway_sessions_moved_total",
			Help: "Gateway sessions moved to another proxy because theirs stopped serving them (a loose session; X-Egress-Session-Moved names the proxy left)."}),
		StrictRefusals: prometheus.NewCounter(prometheus.CounterOpts{Name: "egress_discovery_gateway_strict_refusals_total",
			Help: "Connections of strict gateway sessions answered 502 because the session's proxy stopped serving it."}),
		SessionsEnded: prometheus.NewCounter(prometheus.CounterOpts{Name: "egress_discovery_gateway_sessions_ended_total",
			Help: "Gateway sessions started again on another proxy because their lifetime (_lifetime_) was over."}),
		SOCKSRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "egress_discovery_gateway_socks5_refusals_total",
			Help: "SOCKS5 connections the gateway refused, by reply: the RFC 1928 reply code, or auth for a failed sign-in."}, []string{"reply"}),
		Paced: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "egress_discovery_gateway_paced_total",
			Help: "Gateway connections pacing (spec.gateway.pacing) changed, by fleet and outcome: diverted (it left through an unpaced IP while proxies it could have used were passed over for their paced IP; in a large fleet under a busy rule most connections are), waited for the first IP free when every one that could serve was paced, or refused 429."}, []string{labelFleet, labelOutcome}),
		Bans: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "egress_discovery_gateway_bans_total",
			Help: "Bans the gateway took from an origin's answer to a plain-HTTP request (spec.gateway.banStatusCodes), by outcome: recorded; refused by the bounds (at most half of the fleet's serving proxies out for a domain, a budget of a quarter of --max-bans-per-fleet); failed (the write did not go through); or dropped, with too many such writes in flight on the replica or for the namespace."}, []string{labelOutcome}),
	}
}

// Collectors returns every collector, for registration.
func (g *Gateway) Collectors() []prometheus.Collector {
	return []prometheus.Collector{g.Connections, g.ConnectionsTotal, g.Bytes, g.ChooseLatency, g.UpstreamErrors, g.IdleTunnels, g.Sessions, g.Seats, g.SessionsAdopted, g.SessionsMoved, g.StrictRefusals, g.SessionsEnded, g.SOCKSRefusals, g.Paced, g.Bans}
}
