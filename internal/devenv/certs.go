package devenv

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// authority signs certificates for loopback servers.
type authority struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
}

// newAuthority makes a fresh self-signed CA.
func newAuthority(name string) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, errors.Wrap(err, "cannot generate a CA key")
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, errors.Wrap(err, "cannot self-sign the CA")
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, errors.Wrap(err, "cannot parse the CA")
	}
	return &authority{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// The errors loadAuthority wraps its causes in.
const (
	errParseCAKeyPair  = "cannot parse the CA key pair"
	errParseCACert     = "cannot parse the CA certificate"
	errCAKeyCannotSign = "the CA key cannot sign"
)

// loadAuthority reads a CA from PEM, as Crossplane keeps its own in a Secret.
func loadAuthority(certPEM, keyPEM []byte) (*authority, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, errors.Wrap(err, errParseCAKeyPair)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, errors.Wrap(err, errParseCACert)
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New(errCAKeyCannotSign)
	}
	return &authority{cert: cert, key: key, certPEM: certPEM}, nil
}

// issue signs a certificate for a server on 127.0.0.1 and localhost, usable
// as a client certificate too (function servers check Crossplane's, and
// Crossplane checks theirs).
func (a *authority) issue(cn string) (certPEM, keyPEM []byte, err error) {
	return a.issueFor(pkix.Name{CommonName: cn}, []string{cn, localhost}, []net.IP{net.IPv4(127, 0, 0, 1)})
}

// issueFor signs a certificate for subject, valid for the names and
// addresses given, as a server and as a client: a client certificate's
// subject is its Kubernetes user (CN) and groups (O).
func (a *authority) issueFor(subject pkix.Name, names []string, ips []net.IP) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, errors.Wrap(err, "cannot generate a key")
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      subject,
		DNSNames:     names,
		IPAddresses:  ips,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(90 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, key.Public(), a.key)
	if err != nil {
		return nil, nil, errors.Wrap(err, "cannot sign the certificate")
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, errors.Wrap(err, "cannot encode the key")
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// writeServerFiles makes a CA named caName and a certificate it signs for a
// server on 127.0.0.1 and localhost, and writes them as PEM: the CA to
// caFile, for the server's clients to trust, and the certificate and its
// key to certFile and keyFile, for the server.
func writeServerFiles(caName, caFile, certFile, keyFile string) error {
	ca, err := newAuthority(caName)
	if err != nil {
		return err
	}
	crt, key, err := ca.issue(localhost)
	if err != nil {
		return err
	}
	if err := os.WriteFile(caFile, ca.certPEM, 0o644); err != nil { //nolint:gosec // A CA certificate is public.
		return errors.Wrap(err, "cannot write the CA")
	}
	if err := os.WriteFile(certFile, crt, 0o644); err != nil { //nolint:gosec // A certificate is public.
		return errors.Wrap(err, "cannot write the certificate")
	}
	return errors.Wrap(os.WriteFile(keyFile, key, 0o600), "cannot write the key")
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}
