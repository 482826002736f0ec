// Command function runs function-proxyfleet, the composition function that
// expands a ProxyFleet into Proxy managed resources.
package main

import (
	"strconv"
	"time"

	"github.com/alecthomas/kong"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	function "github.com/crossplane/function-sdk-go"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/cli"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/egressip"
	proxyfleet "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/function"
)

// defaults are the defaults the function package keeps, as the flags show
// and pass them.
func defaults() kong.Vars {
	return kong.Vars{
		"discovery_service_account": proxyfleet.DefaultDiscoveryServiceAccount.String(),
		"max_recv_message_size":     strconv.Itoa(proxyfleet.DefaultMaxRecvMessageMiB),
	}
}

// description is what --help says the function does.
const description = "function-proxyfleet composes ProxyFleets into Proxy managed resources."

// CLI is the function's settings; each can also come from the environment.
type CLI struct {
	Debug              bool    `help:"Log at debug level." default:"false" env:"DEBUG"`
	Insecure           bool    `help:"Serve without TLS, as crossplane render expects (never in a cluster)." default:"false" env:"FUNCTION_INSECURE"`
	TLSCertsDir        string  `name:"tls-certs-dir" help:"Folder holding tls.crt, tls.key and ca.crt for mTLS with Crossplane." default:"" env:"TLS_SERVER_CERTS_DIR"`
	Address            string  `help:"gRPC listen address." default:":9443" env:"ADDRESS"`
	MetricsAddress     string  `help:"Address of the Prometheus /metrics endpoint." default:":8080" env:"METRICS_ADDRESS"`
	MaxRecvMessageSize int     `help:"Largest gRPC request accepted, in MiB." default:"${max_recv_message_size}" env:"MAX_RECV_MESSAGE_SIZE"`
	FixedTime          instant `help:"Use this RFC 3339 time as the clock, for reproducible renders; empty means the real clock." default:"" env:"FIXED_TIME" placeholder:"TIME"`
	ASNDatabase        string  `name:"asn-database" help:"An IP-to-ASN database in the MaxMind DB format (GeoLite2-ASN, an IPinfo ASN export), for spec.diversity.maxPerASN; none is shipped. Empty counts no ASN." default:"" env:"ASN_DATABASE" placeholder:"FILE"`
	DiscoveryAccount   string  `name:"discovery-service-account" help:"egress-discovery's ServiceAccount (namespace/name), which each fleet grants get on its auth Secret and Lease writes in its namespace; none grants nothing." default:"${discovery_service_account}" env:"DISCOVERY_SERVICE_ACCOUNT"`
}

// Validate checks the settings that the grammar cannot.
func (c *CLI) Validate() error {
	if err := egressip.CheckASNDB(c.ASNDatabase); err != nil {
		return errors.Wrap(err, "--asn-database (ASN_DATABASE)")
	}
	_, err := c.discovery()
	return err
}

func (c *CLI) discovery() (*types.NamespacedName, error) {
	if c.DiscoveryAccount == "none" {
		return &types.NamespacedName{}, nil // grants none, as "" does
	}
	sa, err := proxyfleet.ParseServiceAccount(c.DiscoveryAccount)
	if err != nil {
		return nil, errors.Wrap(err, "--discovery-service-account (DISCOVERY_SERVICE_ACCOUNT)")
	}
	return sa, nil
}

// instant is an RFC 3339 time, or the zero time when empty. Parsing it in
// the grammar makes a bad --fixed-time or FIXED_TIME an error that names it.
type instant struct{ time.Time }

// Decode parses an instant from the command line or the environment.
func (i *instant) Decode(ctx *kong.DecodeContext) error {
	var s string
	if err := ctx.Scan.PopValueInto("time", &s); err != nil {
		return err
	}
	if s == "" {
		i.Time = time.Time{}
		return nil
	}
	t, err := time.Parse(time.RFC3339, s)
	i.Time = t
	return err
}

func main() {
	ctx := cli.Parse("function", description, &CLI{}, defaults())
	ctx.FatalIfErrorf(ctx.Run())
}

// Run serves the function until the process is stopped.
func (c *CLI) Run() error {
	log, err := function.NewLogger(c.Debug)
	if err != nil {
		return errors.Wrap(err, "cannot create logger")
	}
	var now func() time.Time
	if !c.FixedTime.IsZero() {
		now = func() time.Time { return c.FixedTime.Time }
	}
	log.Info("Starting function-proxyfleet", "address", c.Address, "insecure", strconv.FormatBool(c.Insecure))
	sa, err := c.discovery()
	if err != nil {
		return err
	}
	cfg := proxyfleet.Config{Log: log, Now: now, Discovery: sa}
	if c.ASNDatabase != "" {
		db, err := egressip.OpenASNDB(c.ASNDatabase)
		if err != nil {
			return errors.Wrap(err, "--asn-database (ASN_DATABASE)")
		}
		defer db.Close() //nolint:errcheck // Read only.
		cfg.ASN = db
	}
	fn := proxyfleet.New(cfg)
	err = function.Serve(fn,
		function.Listen("tcp", c.Address),
		function.MTLSCertificates(c.TLSCertsDir),
		function.Insecure(c.Insecure),
		function.MaxRecvMessageSize(c.MaxRecvMessageSize*1024*1024),
		function.WithMetricsServer(c.MetricsAddress),
	)
	return errors.Wrap(err, "cannot serve the function")
}
