// Command function runs function-proxyfleet, the composition function that
// expands a ProxyFleet into Proxy managed resources.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	function "github.com/crossplane/function-sdk-go"

	proxyfleet "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/function"
)

func main() {
	fs := flag.NewFlagSet("function", flag.ContinueOnError)
	debug := fs.Bool("debug", false, "Log at debug level.")
	insecure := fs.Bool("insecure", false, "Serve without TLS, as crossplane render expects (never in a cluster).")
	certs := fs.String("tls-certs-dir", os.Getenv("TLS_SERVER_CERTS_DIR"), "Folder holding tls.crt, tls.key and ca.crt for mTLS with Crossplane (env TLS_SERVER_CERTS_DIR).")
	address := fs.String("address", ":9443", "gRPC listen address.")
	metrics := fs.String("metrics-address", ":8080", "Address of the Prometheus /metrics endpoint.")
	maxRecv := fs.Int("max-recv-message-size", 4, "Largest gRPC request accepted, in MiB.")
	fixedTime := fs.String("fixed-time", "", "Use this RFC 3339 time as the clock, for reproducible renders; empty means the real clock.")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: function [flags]\n\nfunction-proxyfleet composes ProxyFleets into Proxy managed resources.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == flag.ErrHelp {
			return
		}
		os.Exit(2)
	}

	log, err := function.NewLogger(*debug)
	if err != nil {
		fmt.Fprintln(os.Stderr, "function:", err)
		os.Exit(1)
	}
	var now func() time.Time
	if *fixedTime != "" {
		t, err := time.Parse(time.RFC3339, *fixedTime)
		if err != nil {
			fmt.Fprintln(os.Stderr, "function: --fixed-time:", err)
			os.Exit(2)
		}
		now = func() time.Time { return t }
	}
	log.Info("Starting function-proxyfleet", "address", *address, "insecure", strconv.FormatBool(*insecure))
	err = function.Serve(proxyfleet.New(log, now),
		function.Listen("tcp", *address),
		function.MTLSCertificates(*certs),
		function.Insecure(*insecure),
		function.MaxRecvMessageSize(*maxRecv*1024*1024),
		function.WithMetricsServer(*metrics),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "function:", err)
		os.Exit(1)
	}
}
