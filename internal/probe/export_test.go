package probe

import "crypto/tls"

// SetProbeTLS makes probes use cache and curves until the returned func
// restores what they used: BenchmarkProbeTLS compares with how probes
// made their handshakes before.
func SetProbeTLS(cache tls.ClientSessionCache, curves []tls.CurveID) (restore func()) {
	was, wasCurves := sessions, probeCurves
	sessions, probeCurves = cache, curves
	return func() { sessions, probeCurves = was, wasCurves }
}

// ProbeCurves are the curves probes offer.
func ProbeCurves() []tls.CurveID { return probeCurves }
