// Command egressctl is the crawler-side CLI of egress-discovery.
//
//	egressctl lease --fleet ns/name [--ttl 10m] -- <command> [args]
//
// runs the command with HTTP_PROXY and HTTPS_PROXY set to a leased proxy,
// renews the lease while the command runs, and releases it when the command
// ends, also on Ctrl-C.
//
//	egressctl proxies --fleet ns/name
//
// lists the fleet's healthy proxies.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
)

const usage = `egressctl talks to egress-discovery.

Usage:
  egressctl lease   --fleet <namespace>/<name> [flags] -- <command> [args...]
  egressctl proxies --fleet <namespace>/<name> [--zone z]

The server and token come from --server/--token or EGRESS_DISCOVERY_URL and
EGRESS_DISCOVERY_TOKEN (a ServiceAccount token or a static token).
`

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stderr, usage)
		return 2
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	fleet := fs.String("fleet", "", "The fleet, as <namespace>/<name>.")
	server := fs.String("server", os.Getenv("EGRESS_DISCOVERY_URL"), "egress-discovery's URL (env EGRESS_DISCOVERY_URL).")
	token := fs.String("token", os.Getenv("EGRESS_DISCOVERY_TOKEN"), "Bearer token (env EGRESS_DISCOVERY_TOKEN).")
	zone := fs.String("zone", "", "Only proxies in this zone.")
	ttl := fs.String("ttl", "", "Lease TTL, such as 10m; empty means the fleet's default.")
	holder := fs.String("holder", "", "Names this crawler on the lease; empty means egressctl@<hostname>.")
	sticky := fs.String("sticky-key", "", "Prefer the proxy this key was last given.")
	domain := fs.String("domain", "", "Skip proxies banned for this domain.")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if *fleet == "" || *server == "" {
		fmt.Fprintln(stderr, "egressctl: --fleet and --server (or EGRESS_DISCOVERY_URL) are required")
		return 2
	}
	c := &apiv1.Client{BaseURL: *server, Token: *token}
	switch args[0] {
	case "proxies":
		l, err := c.Proxies(ctx, *fleet, *zone)
		if err != nil {
			fmt.Fprintln(stderr, "egressctl:", err)
			return 1
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tZONE\tENDPOINT\tEGRESS-IP\tLATENCY\tLEASES")
		for _, p := range l.Items {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%dms\t%d/%d\n", p.Name, p.Zone, p.Endpoint, p.EgressIP, p.LatencyMs, p.Leases, p.MaxLeases)
		}
		_ = tw.Flush()
		return 0
	case "lease":
		if fs.NArg() == 0 {
			fmt.Fprintln(stderr, "egressctl lease: give the command to run after --")
			return 2
		}
		if *holder == "" {
			h, _ := os.Hostname()
			*holder = "egressctl@" + h
		}
		return runLeased(ctx, c, apiv1.AcquireRequest{Fleet: *fleet, Holder: *holder, TTL: *ttl, Zone: *zone, StickyKey: *sticky, Domain: *domain}, fs.Args(), stdout, stderr)
	default:
		fmt.Fprintf(stderr, "egressctl: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

func runLeased(ctx context.Context, c *apiv1.Client, req apiv1.AcquireRequest, argv []string, stdout, stderr io.Writer) int {
	l, err := c.Acquire(ctx, req)
	if err != nil {
		var ae *apiv1.APIError
		if errors.As(err, &ae) && ae.RetryAfter != "" {
			fmt.Fprintf(stderr, "egressctl: %v (retry after %ss)\n", err, ae.RetryAfter)
		} else {
			fmt.Fprintln(stderr, "egressctl:", err)
		}
		return 1
	}
	// Release on every way out; the command's own failure included.
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Release(rctx, l.LeaseID); err != nil {
			fmt.Fprintln(stderr, "egressctl: cannot release the lease:", err)
		}
	}()

	cmd := exec.Command(argv[0], argv[1:]...) //nolint:gosec // Running the user's command is the point.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	cmd.Env = append(os.Environ(),
		"HTTP_PROXY="+l.ProxyURL, "HTTPS_PROXY="+l.ProxyURL, "http_proxy="+l.ProxyURL, "https_proxy="+l.ProxyURL,
		"EGRESS_LEASE_ID="+l.LeaseID, "EGRESS_PROXY="+l.Proxy)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "egressctl:", err)
		return 127
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	renewEvery := max(time.Until(l.ExpiresAt)/3, time.Second)
	tick := time.NewTicker(renewEvery)
	defer tick.Stop()
	for {
		select {
		case s := <-sigs:
			_ = cmd.Process.Signal(s)
		case <-tick.C:
			if _, err := c.Renew(ctx, l.LeaseID, req.TTL); err != nil {
				fmt.Fprintln(stderr, "egressctl: cannot renew the lease:", err)
			}
		case err := <-done:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return ee.ExitCode()
			}
			if err != nil {
				fmt.Fprintln(stderr, "egressctl:", err)
				return 1
			}
			return 0
		}
	}
}
