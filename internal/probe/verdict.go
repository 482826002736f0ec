package probe

import (
	"fmt"
	"net"
	"net/http"
)

// Verdict is a proxy's health after thresholds: one failed probe does not
// make a healthy proxy unhealthy, nor one passing probe a sick one healthy.
type Verdict struct {
	Healthy              bool
	ConsecutiveSuccesses int32
	ConsecutiveFailures  int32
}

// Next folds one probe outcome into v. A proxy that was never probed starts
// unhealthy: no verdict yet is not healthy. The counters stop at their
// thresholds, beyond which they decide nothing, so that a steady proxy's
// verdict, which is kept in its status, does not change with every probe.
func (v Verdict) Next(ok bool, successThreshold, failureThreshold int32) Verdict {
	successThreshold = max(successThreshold, 1)
	failureThreshold = max(failureThreshold, 1)
	if ok {
		v.ConsecutiveSuccesses = min(v.ConsecutiveSuccesses+1, successThreshold)
		v.ConsecutiveFailures = 0
		if v.ConsecutiveSuccesses >= successThreshold {
			v.Healthy = true
		}
		return v
	}
	v.ConsecutiveFailures = min(v.ConsecutiveFailures+1, failureThreshold)
	v.ConsecutiveSuccesses = 0
	if v.ConsecutiveFailures >= failureThreshold {
		v.Healthy = false
	}
	return v
}

// EchoIP answers with the caller's IP as plain text, as ifconfig.me/ip does.
// Reached through a proxy, the caller is the proxy, so the answer is the
// proxy's egress IP: a probe target for machines without internet access
// (make run serves it, and tests do).
func EchoIP(w http.ResponseWriter, r *http.Request) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprintln(w, host)
}
