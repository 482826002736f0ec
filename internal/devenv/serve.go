package devenv

import (
	"context"
	"crypto/tls"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
)

// serveRegistry serves an in-process OCI registry on addr until Down, and
// returns its handler, for a second listener.
func (s *core) serveRegistry(addr string) (http.Handler, error) {
	logf, err := os.OpenFile(s.path("logs", "registry.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, errors.Wrap(err, "cannot open the registry log")
	}
	h := registry.New(registry.Logger(log.New(logf, "", log.LstdFlags)))
	if err := s.serve("registry", addr, h); err != nil {
		_ = logf.Close()
		return nil, err
	}
	s.onDown("registry log", logf.Close)
	s.Registry = addr
	s.pushTo = addr
	return h, nil
}

// serve serves h on addr until Down.
func (s *core) serve(name, addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return errors.Wrapf(err, "cannot listen for the %s on %s", name, addr)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // Ends with Close.
	s.onDown(name, srv.Close)
	return nil
}

// readOnly lets only pulls through: every pod reaches the registry on the
// node's address, and none may replace what it serves.
func readOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusMethodNotAllowed)
			_, _ = io.WriteString(w, `{"errors":[{"code":"DENIED","message":"this registry only serves pulls here"}]}`+"\n")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// pushPackages pushes the three packages of dir into the registry at
// version, where refAt names them.
func (s *core) pushPackages(ctx context.Context, dir, version string) error {
	for _, p := range packages {
		if err := s.push(ctx, filepath.Join(dir, p+".xpkg"), fmt.Sprintf("%s/kacerr/%s:%s", s.pushTo, p, version)); err != nil {
			return err
		}
	}
	return nil
}

func (s *core) push(ctx context.Context, tarPath, to string) error {
	img, err := tarball.ImageFromPath(tarPath, nil)
	if err != nil {
		return errors.Wrapf(err, "cannot read %s", tarPath)
	}
	ref, err := name.ParseReference(to)
	if err != nil {
		return errors.Wrapf(err, "cannot name %s", to)
	}
	return errors.Wrapf(remote.Write(ref, img, remote.WithContext(ctx)), "cannot push %s", ref)
}

// serveEcho serves an HTTPS IP echo on ln until Down, with a certificate
// for names and ips from a CA made for it, which it writes to TargetCA.
func (s *core) serveEcho(ln net.Listener, caName string, subject pkix.Name, names []string, ips []net.IP) (*authority, error) {
	ca, err := newAuthority(caName)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	crt, key, err := ca.issueFor(subject, names, ips)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	pair, err := tls.X509KeyPair(crt, key)
	if err != nil {
		_ = ln.Close()
		return nil, errors.Wrap(err, "cannot load the target's certificate")
	}
	s.TargetCA = s.path("target-ca.crt")
	if err := os.WriteFile(s.TargetCA, ca.certPEM, 0o644); err != nil { //nolint:gosec // A CA certificate is public.
		_ = ln.Close()
		return nil, errors.Wrap(err, "cannot write the target's CA")
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(probe.EchoIP),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
	}
	go srv.ServeTLS(ln, "", "") //nolint:errcheck // Ends with Close.
	s.onDown("probe target", srv.Close)
	return ca, nil
}
