//go:build tools

// Package core pins Crossplane core (the control plane `make run` and
// `make e2e` start) apart from hack/tools, because core v2.4.0 needs
// crossplane/apis v2.4.0 while crank v2.2.1 there needs an older set.
package core

import (
	_ "github.com/crossplane/crossplane/v2/cmd/crossplane"
)
