// Package runner starts the long-running controller binaries
// (provider-egressproxy, egress-discovery) the same way: a context that
// ends at SIGINT or SIGTERM, and a logger that controller-runtime logs
// through too. It is apart from package cli so that egressctl, which
// parses its flags with cli, does not link controller-runtime.
package runner

import (
	"context"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// Start returns the context of a controller binary named name, which ends
// when the process is told to stop (a second signal exits at once), and
// its logger, at debug level when debug is set; controller-runtime logs
// through the same logger.
func Start(name string, debug bool) (context.Context, logging.Logger) {
	ctx := ctrl.SetupSignalHandler()
	zl := zap.New(zap.UseDevMode(debug))
	ctrl.SetLogger(zl)
	return ctx, logging.NewLogrLogger(zl.WithName(name))
}
