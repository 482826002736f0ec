package devenv

import (
	"context"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// startTarget serves an HTTPS IP echo on TargetAddress with a certificate
// from a CA made for this run, which the provider trusts for its probes. It
// stands in for https://ifconfig.me/ip on a machine without internet.
func (s *Stack) startTarget(_ context.Context) error {
	ln, err := net.Listen("tcp", TargetAddress)
	if err != nil {
		return errors.Wrapf(err, "cannot listen on %s, which examples/local/proxyfleet.yaml probes; stop what uses it", TargetAddress)
	}
	if _, err := s.serveEcho(ln, "egress-devenv target CA", pkix.Name{CommonName: localhost}, []string{localhost}, []net.IP{net.IPv4(127, 0, 0, 1)}); err != nil {
		return err
	}
	s.TargetURL = "https://" + TargetAddress + "/ip"
	return nil
}

func (s *Stack) startProvider(ctx context.Context) error {
	ports, err := s.ports("provider-metrics", "provider-health")
	if err != nil {
		return err
	}
	metrics, health := ports[0], ports[1]
	args := append([]string{
		"--state-dir=" + s.SquidDir,
		"--probe-ca-bundle=" + s.TargetCA,
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metrics),
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", health),
	}, s.opts.ProviderArgs...)
	p, err := s.start(binProvider, s.bin(binProvider), args, "POD_NAMESPACE="+crossplaneNamespace)
	if err != nil {
		return err
	}
	if err := waitHTTP(ctx, p, fmt.Sprintf("http://127.0.0.1:%d/readyz", health), time.Minute); err != nil {
		return err
	}
	s.providerProc.Store(p)
	return nil
}

func (s *Stack) startDiscovery(ctx context.Context) error {
	ports, err := s.ports("discovery", "discovery-health", "discovery-gateway", "discovery-socks5")
	if err != nil {
		return err
	}
	api, health, gateway, socks := ports[0], ports[1], ports[2], ports[3]
	tokens := s.path("discovery-tokens")
	line := fmt.Sprintf("# egress-discovery static tokens: <token> <namespaces>\n%s %s\n", s.Token, ExampleNamespace)
	if err := os.WriteFile(tokens, []byte(line), 0o600); err != nil {
		return errors.Wrap(err, "cannot write the discovery token file")
	}
	// Discovery serves TLS here as in a cluster, with a CA made for this
	// run that egressctl and the tests trust through DiscoveryCA.
	s.DiscoveryCA = s.path("discovery-ca.crt")
	crt, key := s.path("discovery-tls.crt"), s.path("discovery-tls.key")
	if err := writeServerFiles("egress-devenv discovery CA", s.DiscoveryCA, crt, key); err != nil {
		return errors.Wrap(err, "cannot make discovery's certificate")
	}
	args := append([]string{
		fmt.Sprintf("--address=127.0.0.1:%d", api),
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", health),
		"--token-file=" + tokens,
		"--tls-cert-file=" + crt,
		"--tls-key-file=" + key,
		fmt.Sprintf("--gateway-address=127.0.0.1:%d", gateway),
		// SOCKS5 clients (curl, PySocks) speak no TLS to the proxy: in the
		// clear, on loopback.
		fmt.Sprintf("--socks5-address=127.0.0.1:%d", socks), "--socks5-plain",
	}, s.opts.DiscoveryArgs...)
	p, err := s.start(binDiscovery, s.bin(binDiscovery), args)
	if err != nil {
		return err
	}
	s.DiscoveryURL = fmt.Sprintf("https://127.0.0.1:%d", api)
	s.GatewayAddress = fmt.Sprintf("127.0.0.1:%d", gateway)
	s.SOCKS5Address = fmt.Sprintf("127.0.0.1:%d", socks)
	return waitHTTP(ctx, p, fmt.Sprintf("http://127.0.0.1:%d/readyz", health), time.Minute)
}

// applyExamples applies examples/local/ with kubectl, as a user would. The
// Namespace is applied first: kubectl applies a folder in name order.
func (s *Stack) applyExamples(ctx context.Context) error {
	dir := filepath.Join(s.opts.Root, "examples", "local")
	kubectl := func(args ...string) error {
		return s.run(ctx, "kubectl", s.bin("kubectl"), append([]string{"apply", "--server-side", "--force-conflicts"}, args...)...)
	}
	if err := kubectl("-f", filepath.Join(dir, "namespace.yaml")); err != nil {
		return err
	}
	s.ExamplesApplied = time.Now()
	return kubectl("-f", dir)
}
