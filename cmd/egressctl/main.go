// Command egressctl is the crawler-side CLI of egress-discovery.
//
//	egressctl lease --fleet ns/name [--ttl 10m] -- <command> [args]
//
// runs the command with HTTP_PROXY and HTTPS_PROXY set to a leased proxy,
// renews the lease while the command runs, and releases it when the command
// ends, also on Ctrl-C. It renews at a third of the TTL on its own clock,
// and when the lease cannot be renewed before it expires it stops the
// command (SIGTERM, then SIGKILL after --kill-grace) and exits with 75.
// The command runs in its own process group, to which egressctl passes the
// signals it gets, Ctrl-Z included; egressctl is for non-interactive
// commands, as one that reads the terminal is stopped. On Linux the
// command is killed when egressctl dies.
//
//	egressctl proxies --fleet ns/name
//
// lists the fleet's healthy proxies.
//
// main.go holds the commands, the lease's renewal schedule and the
// passing on of signals; sysproc_linux.go starts the command in its own
// process group and has the kernel kill it when egressctl dies, and
// sysproc_other.go does the former alone, elsewhere.
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/alecthomas/kong"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/cli"
)

// description is what --help says egressctl does.
const description = `egressctl talks to egress-discovery. The server and token come from --server and --token or --token-file, or EGRESS_DISCOVERY_URL and EGRESS_DISCOVERY_TOKEN or EGRESS_DISCOVERY_TOKEN_FILE (a ServiceAccount token or a static token; a file is read again for every request, as the kubelet rotates a projected token).`

// CLI is egressctl's commands, and the flags they share.
type CLI struct {
	Server string `help:"egress-discovery's URL." env:"EGRESS_DISCOVERY_URL" required:"" placeholder:"URL"`
	Token  string `help:"Bearer token." default:"" env:"EGRESS_DISCOVERY_TOKEN" placeholder:"TOKEN"`
	// TokenFile is read for every request, not once: a projected
	// ServiceAccount token is rewritten by the kubelet before it expires,
	// and a long job must keep renewing its lease after that.
	TokenFile string `name:"token-file" help:"File holding the bearer token, read again for every request, such as a projected ServiceAccount token that the kubelet rotates; instead of --token." default:"" env:"EGRESS_DISCOVERY_TOKEN_FILE" placeholder:"FILE"`
	CAFile    string `name:"ca-file" help:"PEM bundle of the CAs to trust for egress-discovery's certificate, instead of the system's; empty trusts the system's." default:"" env:"EGRESS_DISCOVERY_CA_FILE" placeholder:"FILE"`

	Lease      leaseCmd      `cmd:"" help:"Run a command with HTTP_PROXY and HTTPS_PROXY set to a leased proxy, renewing the lease while it runs."`
	Proxies    proxiesCmd    `cmd:"" help:"List the fleet's healthy proxies."`
	GatewayURL gatewayURLCmd `cmd:"" name:"gateway-url" help:"Print the proxy URL of egress-discovery's gateway for a fleet: the one setting a crawler tool needs (HTTPS_PROXY, Scrapy's HTTPPROXY, curl --proxy). It holds the token."`
}

type gatewayURLCmd struct {
	fleetFlags `embed:""`
	Session    string `help:"Keep every connection on one proxy while the session lives." default:""`
	Gateway    string `help:"The gateway's URL, such as https://egress-discovery.egress-system.svc:8888." env:"EGRESS_GATEWAY_URL" required:"" placeholder:"URL"`
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
	TTL        string        `name:"ttl" help:"Lease TTL, such as 10m; empty means the fleet's default." default:""`
	Holder     string        `help:"Names this crawler on the lease; empty means egressctl@<hostname>." default:""`
	StickyKey  string        `help:"Prefer the proxy this key was last given." default:""`
	Domain     string        `help:"Skip proxies banned for this domain." default:""`
	KillGrace  time.Duration `name:"kill-grace" help:"How long the command has to end after SIGTERM, when egressctl stops it because the lease cannot be renewed, before it is sent SIGKILL." default:"10s"`
	Wait       time.Duration `name:"wait" help:"How long to keep asking while the fleet has no free slot or too few healthy proxies (409), such as while an autoscaled fleet wakes from zero; each request also waits up to the fleet's spec.leases.admission.maxWait. 0 asks once." default:"0s"`

	Command []string `arg:"" passthrough:"partial" help:"The command to run, after --, and its arguments."`
}

// Validate refuses a token and a token file together, whether from flags
// or the environment: either could be the stale one, and sending the wrong
// one fails only later, as a lease that cannot be renewed.
func (c *CLI) Validate() error {
	if c.Token != "" && c.TokenFile != "" {
		return errors.New("--token (EGRESS_DISCOVERY_TOKEN) and --token-file (EGRESS_DISCOVERY_TOKEN_FILE) exclude each other: set one")
	}
	return nil
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
	h, err := apiv1.NewHTTPClient(c.CAFile)
	if err == nil {
		err = kctx.Run(&apiv1.Client{BaseURL: c.Server, Token: c.Token, TokenFile: c.TokenFile, HTTP: h}, streams{out: stdout, err: stderr})
	}
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

// Run prints the gateway URL: the fleet and options in the username, in
// the gateway's grammar, and the token as the password.
func (g *gatewayURLCmd) Run(c *apiv1.Client, s streams) error {
	u, err := url.Parse(g.Gateway)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return errors.Errorf("--gateway (EGRESS_GATEWAY_URL) must be an https:// (or, on loopback, http://) URL, not %q", g.Gateway)
	}
	ns, name, ok := strings.Cut(g.Fleet, "/")
	if !ok || strings.Contains(g.Fleet, "_") {
		return errors.Errorf("--fleet must be <namespace>/<name> (Kubernetes names, without '_'), not %q", g.Fleet)
	}
	user := apiv1.GatewayUser{Namespace: ns, Fleet: name, Session: g.Session, Zone: g.Zone}.String()
	if _, err := apiv1.ParseGatewayUser(user); err != nil {
		return err
	}
	token := c.Token
	if c.TokenFile != "" {
		b, err := os.ReadFile(c.TokenFile)
		if err != nil {
			return errors.Wrap(err, "cannot read the token file")
		}
		token = strings.TrimSpace(string(b))
	}
	if token == "" {
		return errors.New("the gateway URL needs a token: --token or --token-file (EGRESS_DISCOVERY_TOKEN, EGRESS_DISCOVERY_TOKEN_FILE)")
	}
	out := url.URL{Scheme: u.Scheme, Host: u.Host, User: url.UserPassword(user, token)}
	_, err = fmt.Fprintln(s.out, out.String())
	return err
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
	if l.Wait < 0 {
		return errors.Errorf("--wait must not be negative, not %s", l.Wait)
	}
	if code := runLeased(ctx, c, req, l.command(), l.KillGrace, l.Wait, s.out, s.err); code != 0 {
		return exitCode(code)
	}
	return nil
}

// acquire asks for a lease, and asks again while the fleet answers 409 (no
// free slot, too few healthy proxies) until wait has passed, after the
// Retry-After the server suggests (at least a second, and no later than
// the deadline).
func acquire(ctx context.Context, c *apiv1.Client, req apiv1.AcquireRequest, wait time.Duration, stderr io.Writer) (*apiv1.Lease, error) {
	deadline := time.Now().Add(wait)
	for {
		l, err := c.Acquire(ctx, req)
		var ae *apiv1.APIError
		if err == nil || !errors.As(err, &ae) || ae.Status != http.StatusConflict {
			return l, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, err
		}
		after := time.Second
		if n, perr := strconv.Atoi(ae.RetryAfter); perr == nil && n > 1 {
			after = time.Duration(n) * time.Second
		}
		fmt.Fprintf(stderr, "egressctl: %v: asking again in %s\n", err, min(after, left).Round(time.Second))
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(min(after, left)):
		}
	}
}

// exitLeaseLost is egressctl's exit code when it stopped the command because
// the lease could not be renewed: EX_TEMPFAIL of sysexits.h, so that a
// wrapper can tell "run it again on a new lease" from the command's own
// failures, whose codes egressctl passes on.
const exitLeaseLost = 75

func runLeased(ctx context.Context, c *apiv1.Client, req apiv1.AcquireRequest, argv []string, killGrace, wait time.Duration, stdout, stderr io.Writer) int {
	asked := time.Now()
	l, err := acquire(ctx, c, req, wait, stderr)
	granted := time.Now()
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
		// A lease that is gone already needs no release.
		var ae *apiv1.APIError
		if err := c.Release(rctx, l.LeaseID); err != nil && (!errors.As(err, &ae) || ae.Status != http.StatusNotFound) {
			fmt.Fprintln(stderr, "egressctl: cannot release the lease:", err)
		}
	}()
	// Renewals are planned on egressctl's own clock, never from expiresAt,
	// which is on the server's, maybe skewed one: the first comes a third
	// of the TTL after the grant. The server granted the lease no earlier
	// than the request left, so the lease is counted from then, which keeps
	// egressctl's deadline before the real one.
	sch := &schedule{}
	sch.renewed(asked, leaseTTL(l))
	sch.next = granted.Add(sch.ttl / 3)

	cmd := exec.Command(argv[0], argv[1:]...) //nolint:gosec // Running the user's command is the point.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	cmd.Env = append(os.Environ(),
		"HTTP_PROXY="+l.ProxyURL, "HTTPS_PROXY="+l.ProxyURL, "http_proxy="+l.ProxyURL, "https_proxy="+l.ProxyURL,
		"EGRESS_LEASE_ID="+l.LeaseID, "EGRESS_PROXY="+l.Proxy)
	// The command gets its own process group, so that stopping it when the
	// lease is lost also stops what it started, such as a script's
	// children, which would otherwise go on using the proxy. Like any
	// background job, it is stopped (SIGTTIN) when it reads the terminal:
	// egressctl is for non-interactive commands, such as crawlers.
	cmd.SysProcAttr = sysProcAttr()
	// Out of the terminal's foreground group the command no longer gets
	// what the terminal sends, so egressctl passes it on to the whole group.
	// It listens before the command starts, so that a signal in between is
	// passed on rather than ending or stopping egressctl alone.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGTSTP, syscall.SIGCONT)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "egressctl:", err)
		return 127
	}
	pgid := cmd.Process.Pid
	group := func(s syscall.Signal) { _ = syscall.Kill(-pgid, s) }

	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// Every return below but a panic's comes after the command ended. A
	// panic releases the lease on its way out, so it kills the command
	// first, which would otherwise go on using the proxy unrenewed. This
	// runs before the release, as deferred calls run last first.
	ended := false
	defer func() {
		if !ended {
			group(syscall.SIGKILL)
		}
	}()

	// A renewal runs beside the loop, so that a slow server never holds up
	// signals or the command's exit; it ends when runLeased does.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan renewal, 1)
	stopping := false
	var lastErr error
	var renewTimer, killTimer <-chan time.Time
	arm := func() { renewTimer = time.After(time.Until(sch.next)) }
	stop := func(why string) {
		fmt.Fprintf(stderr, "egressctl: lease %s %s: stopping the command\n", l.LeaseID, why)
		stopping, renewTimer = true, nil
		group(syscall.SIGTERM)
		killTimer = time.After(killGrace)
	}
	arm()
	for {
		select {
		case s := <-sigs:
			passOn(s, pgid)
		case <-renewTimer:
			renewTimer = nil
			if !time.Now().Before(sch.giveUp()) {
				stop(expired(sch.deadline, lastErr))
				continue
			}
			// One attempt never runs past the last moment to retry, nor so
			// long that there would be no time for another.
			start := time.Now()
			by := earlier(sch.giveUp(), start.Add(max(sch.ttl/10, time.Second)))
			go func() {
				actx, acancel := context.WithDeadline(rctx, by)
				defer acancel()
				nl, err := c.Renew(actx, l.LeaseID, req.TTL)
				results <- renewal{start: start, lease: nl, err: err}
			}()
		case r := <-results:
			// Only one renewal runs at a time, and none once stopping.
			if r.err == nil {
				// The child's environment cannot change, so a new ProxyURL
				// in the answer is not passed on.
				sch.renewed(r.start, leaseTTL(r.lease))
				lastErr = nil
				arm()
				continue
			}
			lastErr = r.err
			if leaseGone(r.err) {
				stop(fmt.Sprintf("can no longer be renewed (%v)", r.err))
				continue
			}
			sch.failed(time.Now())
			fmt.Fprintf(stderr, "egressctl: cannot renew the lease, retrying until %s: %v\n", sch.giveUp().Format("15:04:05 MST"), r.err)
			arm()
		case <-killTimer:
			killTimer = nil
			fmt.Fprintf(stderr, "egressctl: the command did not end within %s of SIGTERM: sending SIGKILL\n", killGrace)
			group(syscall.SIGKILL)
		case err := <-done:
			ended = true
			if stopping {
				return exitLeaseLost
			}
			return commandCode(err, stderr)
		}
	}
}

// passOn passes the signal s that egressctl got on to the command's
// process group pgid, and stops egressctl too on Ctrl-Z, once the command
// is stopped: stopped, egressctl renews nothing, and must not leave the
// command running on the lease. It stops with SIGSTOP, as it catches
// SIGTSTP; the shell's SIGCONT resumes it, and it then resumes the command.
func passOn(s os.Signal, pgid int) {
	if ss, ok := s.(syscall.Signal); ok && forward(ss, pgid) {
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	}
}

// forward passes the signal s that egressctl got on to the command's
// process group pgid, and reports whether egressctl must now stop itself.
// A SIGTSTP (Ctrl-Z) reaches egressctl alone, out of the terminal's
// foreground group the command is: the command gets SIGSTOP, which it
// cannot ignore, since a command left running while egressctl is stopped
// would use the proxy on a lease nobody renews. The SIGCONT that resumes
// egressctl is passed on like any other signal.
func forward(s syscall.Signal, pgid int) (stopSelf bool) {
	if s == syscall.SIGTSTP {
		_ = syscall.Kill(-pgid, syscall.SIGSTOP)
		return true
	}
	_ = syscall.Kill(-pgid, s)
	return false
}

// commandCode is the exit code egressctl passes on for the command's end,
// err from its Wait.
func commandCode(err error, stderr io.Writer) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		// Killed by a signal: 128 plus its number, as a shell says.
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	if err != nil {
		fmt.Fprintln(stderr, "egressctl:", err)
		return 1
	}
	return 0
}

// expired says why a lease that expires at deadline, on egressctl's clock,
// is given up, lastErr being its last renewal's failure.
func expired(deadline time.Time, lastErr error) string {
	last := "no renewal was tried in time"
	if lastErr != nil {
		last = "last error: " + lastErr.Error()
	}
	return fmt.Sprintf("could not be renewed before it expires at %s (local clock; %s)", deadline.Format("15:04:05 MST"), last)
}

// renewal is the outcome of one renewal request, started at start on
// egressctl's clock.
type renewal struct {
	start time.Time
	lease *apiv1.Lease
	err   error
}

// leaseTTL is how long l runs from its grant or renewal.
func leaseTTL(l *apiv1.Lease) time.Duration {
	if l.TTLSeconds > 0 {
		return time.Duration(l.TTLSeconds) * time.Second
	}
	// A server older than ttlSeconds only says when the lease expires, on
	// its clock: the time left by egressctl's clock is the best guess, right
	// while the clocks agree, and at least a second so that renewals never
	// spin.
	return max(time.Until(l.ExpiresAt), time.Second)
}

// leaseGone reports whether err says that no retry can renew the lease: it
// is gone (404), not the caller's (403), or its proxy is being replaced and
// no longer renews it (409).
func leaseGone(err error) bool {
	var ae *apiv1.APIError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.Status {
	case http.StatusNotFound, http.StatusForbidden, http.StatusConflict:
		return true
	}
	return false
}

// schedule plans a lease's renewals on egressctl's own clock.
type schedule struct {
	// ttl is the lease's TTL at its last grant or renewal.
	ttl time.Duration
	// deadline is when the lease expires at the latest.
	deadline time.Time
	// next is when to renew next.
	next time.Time
	// backoff is the wait before the next retry; 0 while renewals succeed.
	backoff time.Duration
}

// renewed records a grant or renewal of ttl whose request started at start:
// the lease runs at least until start plus ttl, and is renewed at a third
// of it, leaving two more chances before it expires.
func (s *schedule) renewed(start time.Time, ttl time.Duration) {
	s.ttl, s.deadline, s.next, s.backoff = ttl, start.Add(ttl), start.Add(ttl/3), 0
}

// giveUp is the last moment to try a renewal: a margin before the deadline
// leaves the command time to hear it must stop while the lease still
// holds.
func (s *schedule) giveUp() time.Time {
	return s.deadline.Add(-min(5*time.Second, s.ttl/10))
}

// failed plans the retry of a renewal that failed at now: soon at first,
// then less often, never past giveUp.
func (s *schedule) failed(now time.Time) {
	if s.backoff == 0 {
		s.backoff = min(time.Second, s.ttl/10)
	} else {
		s.backoff = min(2*s.backoff, s.ttl/10)
	}
	s.next = earlier(now.Add(s.backoff), s.giveUp())
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
