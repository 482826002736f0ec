package function

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
)

// TestRunMetrics: every RunFunction is timed and its messages measured by
// the kind it composes, and the largest is kept.
func TestRunMetrics(t *testing.T) {
	kind := "ProxyFleet"
	runs := testutil.CollectAndCount(runSeconds)
	req := fleetRequest(30)
	rsp := run(t, req)
	if got := testutil.CollectAndCount(runSeconds); got < max(runs, 1) {
		t.Errorf("run_seconds has %d series after a run", got)
	}
	big := fleetRequest(60)
	run(t, big)
	run(t, req) // smaller: the largest stays
	if got, want := testutil.ToFloat64(largestBytes.WithLabelValues(kind, "request")), float64(proto.Size(big)); got < want {
		t.Errorf("largest request %.0f B, want at least the 60-proxy fleet's %.0f B", got, want)
	}
	if got := testutil.ToFloat64(largestBytes.WithLabelValues(kind, "response")); got < float64(proto.Size(rsp)) {
		t.Errorf("largest response %.0f B, want at least %d B", got, proto.Size(rsp))
	}
	if n := testutil.CollectAndCount(messageBytes, "function_proxyfleet_message_bytes"); n < 2 {
		t.Errorf("message_bytes has %d series, want request and response", n)
	}
}
