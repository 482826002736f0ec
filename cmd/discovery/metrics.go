package main

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// promhttpHandler serves the controller-runtime registry, which holds the
// API's metrics and the client and cache metrics.
func promhttpHandler() http.Handler {
	return promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{})
}
