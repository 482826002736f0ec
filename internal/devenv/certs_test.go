package devenv

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestIssuedCertificatesChainToTheirCA(t *testing.T) {
	fresh, err := newAuthority("test CA")
	if err != nil {
		t.Fatal(err)
	}
	other, err := newAuthority("other CA")
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		reason string
		ca     *authority
		roots  *authority
		ok     bool
	}{
		"Fresh": {
			reason: "A certificate from a fresh CA verifies against it for 127.0.0.1, as server and as client.",
			ca:     fresh, roots: fresh, ok: true,
		},
		"OtherCA": {
			reason: "It does not verify against another CA.",
			ca:     fresh, roots: other, ok: false,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			crt, key, err := tc.ca.issue("kacerr-function-proxyfleet")
			if err != nil {
				t.Fatal(err)
			}
			pair, err := tls.X509KeyPair(crt, key)
			if err != nil {
				t.Fatalf("issued pair does not load: %v", err)
			}
			leaf, err := x509.ParseCertificate(pair.Certificate[0])
			if err != nil {
				t.Fatal(err)
			}
			roots := x509.NewCertPool()
			roots.AppendCertsFromPEM(tc.roots.certPEM)
			for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
				_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}})
				if (err == nil) != tc.ok {
					t.Errorf("%s\nverify for usage %v: %v", tc.reason, usage, err)
				}
			}
			if err := leaf.VerifyHostname("127.0.0.1"); err != nil {
				t.Errorf("the certificate must name 127.0.0.1, where Crossplane dials the function: %v", err)
			}
		})
	}
}

func TestLoadAuthority(t *testing.T) {
	ca, err := newAuthority("test CA")
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: caKey})
	cases := map[string]struct {
		reason  string
		cert    []byte
		key     []byte
		wantErr string // what the error begins with, when one is wanted
	}{
		"FromSecret": {
			reason: "A CA read back from PEM, as from Crossplane's Secret, issues certificates that chain to it.",
			cert:   ca.certPEM, key: keyPEM,
		},
		"BrokenKey": {
			reason: "A Secret with a broken key is an error, not a CA.",
			cert:   ca.certPEM, key: []byte("not a key"), wantErr: errParseCAKeyPair + ": ",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			loaded, err := loadAuthority(tc.cert, tc.key)
			if (err != nil) != (tc.wantErr != "") || err != nil && !strings.HasPrefix(err.Error(), tc.wantErr) {
				t.Fatalf("%s\nwant an error beginning %q, got %v", tc.reason, tc.wantErr, err)
			}
			if err != nil {
				return
			}
			crt, _, err := loaded.issue("x")
			if err != nil {
				t.Fatal(err)
			}
			block, _ := pem.Decode(crt)
			leaf, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			roots := x509.NewCertPool()
			roots.AddCert(ca.cert)
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots}); err != nil {
				t.Errorf("%s\n%v", tc.reason, err)
			}
		})
	}
}

// TestWriteServerFiles: the files egress-discovery is started with load as
// a key pair, the certificate verifies for 127.0.0.1 against the CA file
// egressctl and the tests are given, and only the owner may read the key.
func TestWriteServerFiles(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := writeServerFiles("test CA", caFile, certFile, keyFile); err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatalf("the written pair does not load: %v", err)
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("the CA file holds no certificate")
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "127.0.0.1"}); err != nil {
		t.Errorf("the certificate must verify for 127.0.0.1, the discovery URL's host, against the CA file: %v", err)
	}
	fi, err := os.Stat(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("the key must be readable by its owner only, got %v", fi.Mode())
	}
}
