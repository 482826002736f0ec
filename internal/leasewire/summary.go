package leasewire

import (
	"crypto/sha256"
	"encoding/hex"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// HoldSkew is how much longer than its TTL Holds counts a lease as held:
// the clocks of the discovery replica that renewed it and of the reader may
// disagree by this much.
const HoldSkew = 30 * time.Second

// A LeaseSummary (apis/egress/v1alpha1) is one egress-discovery replica's
// account of one fleet's leases: written when it changes, at most every
// SummaryInterval, and every SummaryRefresh regardless, so that it stays
// valid (SummaryFreshness after it was observed) while its replica lives.
//
// Every write of a summary makes Crossplane compose the fleet or pools
// that require it again (a steady pool requires none), each applying all
// its Proxies, so the refresh is rare: at 30 s
// (a minute's freshness) a steady fleet cost 4 applies per proxy a minute
// from refreshes alone (make scale, BENCHMARKS.md). What a long freshness
// costs is time after a replica crashes (a graceful stop deletes its
// summaries): its last summary counts as its live account for up to
// SummaryFreshness, and no drain it does not list completes meanwhile,
// so removals wait (nothing unsafe is removed).
const (
	SummaryFreshness = 10 * time.Minute
	SummaryRefresh   = 5 * time.Minute
	SummaryInterval  = 10 * time.Second
	// SummaryValidCeiling is the longest a summary counts after it was
	// observed, whatever its validUntil says: a replica of another release
	// may give its summaries another freshness, up to this.
	SummaryValidCeiling = time.Hour
	// SummarySweepAfter is how long after it stopped counting a summary
	// is deleted by any replica: its own replica is gone.
	SummarySweepAfter = 10 * time.Minute
)

// CountsUntil is when a summary stops counting as its replica's live
// account (before the skew margin): its validUntil, but no later than
// SummaryValidCeiling after it was observed.
func CountsUntil(s *v1alpha1.LeaseSummarySpec) time.Time {
	until := s.ValidUntil.Time
	if limit := s.ObservedAt.Add(SummaryValidCeiling); until.After(limit) {
		return limit
	}
	return until
}

// SummaryName is the name of a replica's summary of a fleet: a hash, since
// a fleet's name and a replica's together may exceed what a name holds.
func SummaryName(fleet, replica string) string {
	sum := sha256.Sum256([]byte(fleet + "\x00" + replica))
	return "egress-leases-" + hex.EncodeToString(sum[:])[:20]
}

// PoolSummaryName is the name of a replica's summary of one pool of a
// fleet (pool is the pool's label value).
func PoolSummaryName(fleet, pool, replica string) string {
	if pool == "" {
		return SummaryName(fleet, replica)
	}
	sum := sha256.Sum256([]byte(fleet + "\x00" + replica + "\x00" + pool))
	return "egress-leases-" + hex.EncodeToString(sum[:])[:20]
}

// SummarySelector selects the summaries of a fleet (a long name's label is
// a hash prefix: spec.fleet decides): of a fleet without pools, all its
// summaries.
func SummarySelector(fleet string) map[string]string {
	return map[string]string{fleetv1alpha1.LabelFleet: ownership.LabelValue(fleet)}
}

// SummaryLabels are the labels of a summary of a fleet's pool (its label
// value; "" for the fleet as a whole, whose label is then empty, not
// absent, so that a pooled fleet selects it alone).
func SummaryLabels(fleet, pool string) map[string]string {
	return map[string]string{fleetv1alpha1.LabelFleet: ownership.LabelValue(fleet), fleetv1alpha1.LabelPool: pool}
}
