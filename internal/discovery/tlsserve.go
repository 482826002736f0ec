package discovery

import (
	"bytes"
	"context"
	"crypto/tls"
	"os"
	"sync/atomic"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
)

// KeyPairPollInterval is how often the files of a served key pair are read
// again. The kubelet takes up to a minute or so to show a changed Secret in
// its volume, so a few seconds more do not matter, and reading two small
// files costs nothing.
const KeyPairPollInterval = 5 * time.Second

// KeyPair serves the TLS certificate and key of two PEM files, and the new
// pair once the files change, without a restart. cert-manager renews a
// certificate well before it expires and the kubelet then swaps the Secret
// volume's files in place (through its ..data symlink), so discovery must
// pick the renewal up by itself. The files are compared by their contents,
// not their times, so a swapped symlink, a rewritten file and a clock that
// jumps are all seen alike.
type KeyPair struct {
	certFile, keyFile string
	served            atomic.Pointer[servedPair]
}

// servedPair is the pair being served and the files it was read from.
type servedPair struct {
	cert            *tls.Certificate
	certPEM, keyPEM []byte
}

// LoadKeyPair reads the pair of certFile and keyFile. Discovery cannot
// serve without a pair, so one that does not load is an error here, unlike
// on a later Reload.
func LoadKeyPair(certFile, keyFile string) (*KeyPair, error) {
	k := &KeyPair{certFile: certFile, keyFile: keyFile}
	if _, err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// Reload reads the files again and serves the pair they hold when it is not
// the one served already, telling whether it changed. A pair that does not
// load, such as a certificate whose new key is not written yet, is an
// error, and the previous pair is served still: the next Reload tries
// again.
func (k *KeyPair) Reload() (changed bool, err error) {
	certPEM, err := os.ReadFile(k.certFile)
	if err != nil {
		return false, errors.Wrap(err, "cannot read the TLS certificate")
	}
	keyPEM, err := os.ReadFile(k.keyFile)
	if err != nil {
		return false, errors.Wrap(err, "cannot read the TLS key")
	}
	if cur := k.served.Load(); cur != nil && bytes.Equal(cur.certPEM, certPEM) && bytes.Equal(cur.keyPEM, keyPEM) {
		return false, nil
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return false, errors.Wrapf(err, "cannot load the TLS key pair of %s and %s", k.certFile, k.keyFile)
	}
	k.served.Store(&servedPair{cert: &cert, certPEM: certPEM, keyPEM: keyPEM})
	return true, nil
}

// Watch reloads the pair every interval until ctx ends. It logs each new
// certificate, and a pair that does not load once rather than at every
// look, until the files change again.
func (k *KeyPair) Watch(ctx context.Context, every time.Duration, log logging.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	failed := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		changed, err := k.Reload()
		switch {
		case err != nil && err.Error() != failed:
			log.Info("Cannot load the changed TLS key pair; serving the previous one until it loads", "error", err)
		case changed:
			log.Info("Serving a new TLS certificate", k.Describe()...)
		}
		failed = ""
		if err != nil {
			failed = err.Error()
		}
	}
}

// Describe names the served certificate for a log line: its subject and
// when it expires.
func (k *KeyPair) Describe() []any {
	leaf := k.served.Load().cert.Leaf
	if leaf == nil {
		return nil
	}
	return []any{"subject", leaf.Subject.String(), "notAfter", leaf.NotAfter}
}

// GetCertificate is the served certificate, for tls.Config.GetCertificate:
// every handshake takes the latest pair.
func (k *KeyPair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return k.served.Load().cert, nil
}

// TLSConfig serves the pair to TLS 1.2 clients and later; older versions
// have known weaknesses and every current client speaks 1.2.
func (k *KeyPair) TLSConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: k.GetCertificate}
}
