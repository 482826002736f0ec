//go:build tools

// Package promtool pins Prometheus, whose promtool tests the alerting rules
// of cluster/monitoring (`promtool test rules`). Its own module: its
// Kubernetes and cloud SDK pins are not ours.
package promtool

import _ "github.com/prometheus/prometheus/cmd/promtool"
