// Package leasewire is the wire format of the Lease objects and
// LeaseSummaries that egress-discovery writes and function-proxyfleet
// reads: their names, labels, annotations, freshness and clock-skew rules.
// It does no I/O, so the function, which does none either, imports it
// rather than the lease store.
//
//   - doc.go: this package comment;
//   - demand.go: a replica's demand Lease of a fleet (held, waiting and
//     refused acquisitions), written and read back;
//   - summary.go: LeaseSummary names, labels and freshness, and the skew
//     margin both sides allow between clocks.
package leasewire
