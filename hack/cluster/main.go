// Command cluster is `make cluster`: a one-node Kubernetes cluster on this
// machine (kubelet and containerd, no Docker) with Crossplane installing
// the packages with its default runtime, until Ctrl-C. See
// internal/devenv.UpCluster for what it starts.
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
	state := flag.String("state-dir", filepath.Join(root, ".local", "cluster"), "Folder for the cluster's data, logs and certificates; emptied at every start.")
	down := flag.Bool("down", false, "Stop a running make cluster (its pid file names it) and clear what any earlier one left behind.")
	flag.Parse()
	if *down {
		if err := devenv.DownCluster(devenv.Options{Root: root, StateDir: *state, Progress: os.Stdout}); err != nil {
			fmt.Fprintln(os.Stderr, "make cluster-down:", err)
			os.Exit(1)
		}
		return
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := devenv.UpCluster(ctx, devenv.Options{Root: root, StateDir: *state, Progress: os.Stdout})
	if err != nil {
		fmt.Fprintf(os.Stderr, "make cluster failed: %v\nlogs: %s\n", err, filepath.Join(*state, "logs"))
		os.Exit(1)
	}
	fmt.Printf(`
The cluster runs. Ctrl-C (or make cluster-down from another shell) stops it all.

  kubeconfig      export KUBECONFIG=%[1]s
  nodes and pods  bin/kubectl get nodes,pods -A
  discovery API   %[2]s/v1/fleets   (CA: %[3]s)
  test target     %[4]s   (CA: %[5]s), on a test host of the pod network
  logs            %[6]s

`, s.Kubeconfig, s.DiscoveryURL, s.DiscoveryCA, s.TargetURL, s.TargetCA, filepath.Join(*state, "logs"))
	<-ctx.Done()
	stop()
	s.Logf("stopping everything ...")
	s.Down()
	s.Logf("stopped")
}
