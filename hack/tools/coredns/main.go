// Command coredns is the cluster DNS of `make cluster`: CoreDNS from its own
// module, with only the plugins the cluster's Corefile uses compiled in
// (cluster/images packs it into an image). The plugins register themselves
// by being imported; CoreDNS's own directive list orders them.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() { coremain.Run() }
