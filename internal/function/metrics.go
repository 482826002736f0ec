package function

import (
	"sync"
	"time"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
)

// DefaultMaxRecvMessageMiB is the largest RunFunctionRequest the function
// takes by default (--max-recv-message-size): four times a fleet's at
// MaxReplicas, whose observed pools each carry a reference to every Proxy
// they compose (about 2.8 MiB at most, TestPoolMessageSizesBounded).
// Crossplane sends up to 2 GiB; it receives at most 4 MiB back.
const DefaultMaxRecvMessageMiB = 16

// Metrics of every RunFunction, by the kind of the composite it composes
// (ProxyFleet, ProxyPool, XProxyFleet): how long it took and how large its
// messages were, against what each may reach (the function's
// --max-recv-message-size for the request, 16 MiB by default, and
// Crossplane's 4 MiB receive limit for the response). The function-sdk
// serves the default registry on --metrics-address.
var (
	runSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "function_proxyfleet_run_seconds",
		Help:    "Time RunFunction took, by the kind of the composite resource.",
		Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5},
	}, []string{"kind"})
	messageBytes = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "function_proxyfleet_message_bytes",
		Help:    "Size of RunFunction requests and responses (direction request or response), by the kind of the composite resource; a request may be at most --max-recv-message-size (16 MiB by default), a response 4 MiB.",
		Buckets: prometheus.ExponentialBuckets(4096, 2, 13), // 4 KiB .. 16 MiB
	}, []string{"kind", "direction"})
	largestBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "function_proxyfleet_largest_message_bytes",
		Help: "The largest RunFunction request and response (direction) seen since the function started, by the kind of the composite resource.",
	}, []string{"kind", "direction"})

	largestMu sync.Mutex
	largest   = map[[2]string]int{}
)

func init() {
	prometheus.MustRegister(runSeconds, messageBytes, largestBytes)
}

// observeRun records one RunFunction.
func observeRun(req *fnv1.RunFunctionRequest, rsp *fnv1.RunFunctionResponse, took time.Duration) {
	kind := req.GetObserved().GetComposite().GetResource().GetFields()["kind"].GetStringValue()
	if kind == "" {
		kind = "unknown"
	}
	runSeconds.WithLabelValues(kind).Observe(took.Seconds())
	for dir, size := range map[string]int{"request": proto.Size(req), "response": proto.Size(rsp)} {
		messageBytes.WithLabelValues(kind, dir).Observe(float64(size))
		largestMu.Lock()
		if k := [2]string{kind, dir}; size > largest[k] {
			largest[k] = size
			largestBytes.WithLabelValues(kind, dir).Set(float64(size))
		}
		largestMu.Unlock()
	}
}
