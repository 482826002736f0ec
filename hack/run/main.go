// Command run is `make run`: the whole product on this machine with real
// Crossplane, until Ctrl-C. See internal/devenv for what it starts.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/devenv"
)

func main() {
	root, _ := os.Getwd()
	state := flag.String("state-dir", filepath.Join(root, ".local"), "Folder for the cluster's data, logs and certificates; a second run reuses it.")
	examples := flag.Bool("examples", true, "Apply examples/local/ (a ProviderConfig and a 3-replica ProxyFleet).")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := devenv.Up(ctx, devenv.Options{Root: root, StateDir: *state, Progress: os.Stdout, ApplyExamples: *examples})
	if err != nil {
		fmt.Fprintf(os.Stderr, "make run failed: %v\nlogs: %s\n", err, filepath.Join(*state, "logs"))
		os.Exit(1)
	}
	rel := func(p string) string {
		if r, err := filepath.Rel(root, p); err == nil {
			return r
		}
		return p
	}
	fmt.Printf(`
Everything runs. Ctrl-C stops it all; make run again resumes from %[1]s.

  kubeconfig      export KUBECONFIG=%[2]s
  watch the fleet bin/kubectl get proxyfleets,proxies -n %[3]s
  discovery API   %[4]s/v1/fleets   (status page: %[4]s/)
  discovery CA    %[9]s   (curl --cacert, EGRESS_DISCOVERY_CA_FILE)
  logs            %[5]s

Or fetch through the gateway, with nothing but its URL (the fleet and a session in the username):

  curl --proxy https://%[3]s_crawlers_session_s1:%[6]s@%[10]s --proxy-cacert %[9]s --cacert %[7]s %[8]s

Without a session each fetch rotates to the next proxy; the same through SOCKS5:

  curl --proxy https://%[3]s_crawlers:%[6]s@%[10]s --proxy-cacert %[9]s --cacert %[7]s %[8]s
  curl --proxy socks5h://%[3]s_crawlers:%[6]s@%[11]s --cacert %[7]s %[8]s

Lease a proxy and fetch through it:

  EGRESS_DISCOVERY_URL=%[4]s EGRESS_DISCOVERY_TOKEN=%[6]s EGRESS_DISCOVERY_CA_FILE=%[9]s \
    bin/egressctl lease --fleet %[3]s/crawlers -- curl -s --cacert %[7]s %[8]s

`, rel(*state), s.Kubeconfig, devenv.ExampleNamespace, s.DiscoveryURL, rel(filepath.Join(*state, "logs")), s.Token, rel(s.TargetCA), s.TargetURL, rel(s.DiscoveryCA), s.GatewayAddress, s.SOCKS5Address)
	<-ctx.Done()
	stop()
	s.Logf("stopping everything ...")
	s.Down()
	s.Logf("stopped")
}
