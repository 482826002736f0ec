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
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/alecthomas/kong"
	"github.com/pkg/errors"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/cli"
)

// description is what --help says egressctl does.
const description = `egressctl talks to egress-discovery. The server and token come from --server/--token or EGRESS_DISCOVERY_URL and EGRESS_DISCOVERY_TOKEN (a ServiceAccount token or a static token).`

// CLI is egressctl's commands, and the flags they share.
type CLI struct {
	Server string `help:"egress-discovery's URL." env:"EGRESS_DISCOVERY_URL" required:"" placeholder:"URL"`
	Token  string `help:"Bearer token." default:"" env:"EGRESS_DISCOVERY_TOKEN" placeholder:"TOKEN"`

	Lease   leaseCmd   `cmd:"" help:"Run a command with HTTP_PROXY and HTTPS_PROXY set to a leased proxy, renewing the lease while it runs."`
	Proxies proxiesCmd `cmd:"" help:"List the fleet's healthy proxies."`
}

// fleetFlags choose the proxies a command works on.
type fleetFlags struct {
	Fleet string `help:"The fleet, as <namespace>/<name>." required:""`
	Zone  string `help:"Only proxies in this zone." default:""`
}

type proxiesCmd struct {
	fleetFlags `embed:""`
}

type leaseCmd struct {
	fleetFlags `embed:""`
	TTL        string `name:"ttl" help:"Lease TTL, such as 10m; empty means the fleet's default." default:""`
	Holder     string `help:"Names this crawler on the lease; empty means egressctl@<hostname>." default:""`
	StickyKey  string `help:"Prefer the proxy this key was last given." default:""`
	Domain     string `help:"Skip proxies banned for this domain." default:""`

	Command []string `arg:"" passthrough:"partial" help:"The command to run, after --, and its arguments."`
}

// streams are where a command writes.
type streams struct{ out, err io.Writer }

// exitCode is an exit code a command decided and explained itself, such as
// the leased command's own.
type exitCode int

func (e exitCode) Error() string { return "exit status " + strconv.Itoa(int(e)) }

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := &CLI{}
	k, err := cli.New("egressctl", description, c, kong.Writers(stdout, stderr), kong.ShortUsageOnError())
	if err != nil {
		panic(err) // The tests build the grammar: never reached in a release.
	}
	kctx, code := cli.ParseArgs(k, args)
	if kctx == nil {
		return code
	}
	kctx.BindTo(ctx, (*context.Context)(nil))
	err = kctx.Run(&apiv1.Client{BaseURL: c.Server, Token: c.Token}, streams{out: stdout, err: stderr})
	var ec exitCode
	switch {
	case errors.As(err, &ec):
		return int(ec)
	case err != nil:
		fmt.Fprintln(stderr, "egressctl:", err)
		return 1
	}
	return 0
}

// Run lists the fleet's proxies.
func (p *proxiesCmd) Run(ctx context.Context, c *apiv1.Client, s streams) error {
	l, err := c.Proxies(ctx, p.Fleet, p.Zone)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tZONE\tENDPOINT\tEGRESS-IP\tLATENCY\tLEASES")
	for _, px := range l.Items {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%dms\t%d/%d\n", px.Name, px.Zone, px.Endpoint, px.EgressIP, px.LatencyMs, px.Leases, px.MaxLeases)
	}
	return tw.Flush()
}

// command is the command to run, without the -- that kong keeps in front.
func (l *leaseCmd) command() []string {
	if len(l.Command) > 0 && l.Command[0] == "--" {
		return l.Command[1:]
	}
	return l.Command
}

// Validate requires a command after the --.
func (l *leaseCmd) Validate() error {
	if len(l.command()) == 0 {
		return errors.New("give the command to run after --")
	}
	return nil
}

// Run runs the command through a leased proxy.
func (l *leaseCmd) Run(ctx context.Context, c *apiv1.Client, s streams) error {
	holder := l.Holder
	if holder == "" {
		h, _ := os.Hostname()
		holder = "egressctl@" + h
	}
	req := apiv1.AcquireRequest{Fleet: l.Fleet, Holder: holder, TTL: l.TTL, Zone: l.Zone, StickyKey: l.StickyKey, Domain: l.Domain}
	if code := runLeased(ctx, c, req, l.command(), s.out, s.err); code != 0 {
		return exitCode(code)
	}
	return nil
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
