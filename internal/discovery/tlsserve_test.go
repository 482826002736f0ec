package discovery_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// testCA signs the certificates of a TLS test.
type testCA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// issue signs a server certificate for 127.0.0.1 with the given serial
// number, by which a test tells which certificate a server served.
func (ca *testCA) issue(t *testing.T, serial int64) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: fmt.Sprintf("egress-discovery %d", serial)},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:   time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// secretVolume lays a folder out as the kubelet lays out a Secret volume:
// each key is a symlink through ..data into a folder of one generation,
// and an update writes a new generation and swaps ..data in one rename.
type secretVolume struct {
	dir string
	gen int
}

func (v *secretVolume) path(name string) string { return filepath.Join(v.dir, name) }

func (v *secretVolume) write(t *testing.T, crt, key []byte) {
	t.Helper()
	v.gen++
	gen := fmt.Sprintf("..gen_%d", v.gen)
	if err := os.Mkdir(v.path(gen), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"tls.crt": crt, "tls.key": key} {
		if err := os.WriteFile(filepath.Join(v.path(gen), name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(gen, v.path("..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(v.path("..data_tmp"), v.path("..data")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", name), v.path(name)); err != nil && !errors.Is(err, os.ErrExist) {
			t.Fatal(err)
		}
	}
}

// writeIssued writes a new certificate from ca, with the given serial, and
// its key.
func (v *secretVolume) writeIssued(t *testing.T, ca *testCA, serial int64) {
	t.Helper()
	crt, key := ca.issue(t, serial)
	v.write(t, crt, key)
}

// recordingLog keeps the messages logged to it.
type recordingLog struct {
	mu   *sync.Mutex
	msgs *[]string
}

func newRecordingLog() recordingLog { return recordingLog{mu: &sync.Mutex{}, msgs: &[]string{}} }

func (l recordingLog) Info(msg string, kv ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	*l.msgs = append(*l.msgs, fmt.Sprint(append([]any{msg}, kv...)...))
}
func (l recordingLog) Debug(msg string, kv ...any)      { l.Info(msg, kv...) }
func (l recordingLog) WithValues(...any) logging.Logger { return l }
func (l recordingLog) logged(substr string) (found bool, all string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	all = strings.Join(*l.msgs, "\n")
	return strings.Contains(all, substr), all
}

// serveTLS serves a 204 with the key pair on 127.0.0.1, as discovery
// serves its API, and returns the address.
func serveTLS(t *testing.T, kp *discovery.KeyPair) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }),
		TLSConfig:         kp.TLSConfig(),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go srv.ServeTLS(ln, "", "") //nolint:errcheck // Ends with Close.
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// servedSerial makes a new connection to addr, trusting ca only, and tells
// the serial number of the certificate served, or why there was none.
func servedSerial(addr string, ca *testCA) (int64, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true,
	}}
	rsp, err := c.Get("https://" + addr + "/")
	if err != nil {
		return 0, err
	}
	defer rsp.Body.Close() //nolint:errcheck // Read-only.
	if rsp.StatusCode != http.StatusNoContent || rsp.TLS == nil {
		return 0, fmt.Errorf("want 204 over TLS, got %s", rsp.Status)
	}
	return rsp.TLS.PeerCertificates[0].SerialNumber.Int64(), nil
}

// TestKeyPairReloads: a server keeps serving while the Secret volume it
// reads its certificate from is updated; each new connection gets the new
// certificate, a pair that does not load is logged and leaves the previous
// one served, and a good pair after it is served again.
func TestKeyPairReloads(t *testing.T) {
	ca := newTestCA(t)
	vol := &secretVolume{dir: t.TempDir()}
	vol.writeIssued(t, ca, 100)
	kp, err := discovery.LoadKeyPair(vol.path("tls.crt"), vol.path("tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, kp)
	log := newRecordingLog()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go kp.Watch(ctx, 10*time.Millisecond, log)

	waitServed := func(want int64, why string) {
		t.Helper()
		testbed.Eventually(t, 10*time.Second, why, func() (bool, string) {
			got, err := servedSerial(addr, ca)
			return err == nil && got == want, fmt.Sprintf("serial %d, error %v", got, err)
		})
	}
	waitServed(100, "the first certificate served")

	vol.writeIssued(t, ca, 200)
	waitServed(200, "the renewed certificate served after the Secret volume's swap, without a restart")
	if ok, all := log.logged("Serving a new TLS certificate"); !ok {
		t.Errorf("a new certificate must be logged, got:\n%s", all)
	}

	// A certificate with another certificate's key: half a renewal.
	crt, _ := ca.issue(t, 300)
	_, otherKey := ca.issue(t, 301)
	vol.write(t, crt, otherKey)
	testbed.Eventually(t, 10*time.Second, "the pair that does not load logged", func() (bool, string) {
		return log.logged("Cannot load the changed TLS key pair")
	})
	if got, err := servedSerial(addr, ca); err != nil || got != 200 {
		t.Errorf("a pair that does not load must leave the previous one served: want serial 200, got %d, error %v", got, err)
	}

	vol.writeIssued(t, ca, 400)
	waitServed(400, "a good pair after a broken one served")
}

// TestKeyPairLoad: discovery does not start without a pair it can serve.
func TestKeyPairLoad(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	crt, key := ca.issue(t, 1)
	_, otherKey := ca.issue(t, 2)
	good, goodKey, wrongKey := write("good.crt", crt), write("good.key", key), write("other.key", otherKey)
	cases := map[string]struct {
		reason        string
		certFile, key string
		ok            bool
	}{
		"Pair":        {reason: "A certificate and its key load.", certFile: good, key: goodKey, ok: true},
		"MissingCert": {reason: "A certificate file that is not there is an error.", certFile: filepath.Join(dir, "none.crt"), key: goodKey},
		"MissingKey":  {reason: "A key file that is not there is an error.", certFile: good, key: filepath.Join(dir, "none.key")},
		"WrongKey":    {reason: "A key that is not the certificate's is an error.", certFile: good, key: wrongKey},
		"NotPEM":      {reason: "A file that is not PEM is an error.", certFile: write("junk.crt", []byte("junk")), key: goodKey},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := discovery.LoadKeyPair(tc.certFile, tc.key)
			if (err == nil) != tc.ok {
				t.Errorf("%s\nLoadKeyPair: %v", tc.reason, err)
			}
		})
	}
}

// TestKeyPairServesTLS12AndLater: TLS 1.2 and 1.3 clients are served, a
// TLS 1.1 client is refused, and a plain HTTP request to the TLS port gets
// Go's own 400 rather than a hang or an answer in the clear.
func TestKeyPairServesTLS12AndLater(t *testing.T) {
	ca := newTestCA(t)
	vol := &secretVolume{dir: t.TempDir()}
	vol.writeIssued(t, ca, 7)
	kp, err := discovery.LoadKeyPair(vol.path("tls.crt"), vol.path("tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, kp)
	for name, tc := range map[string]struct {
		version uint16
		ok      bool
	}{
		"TLS11": {version: tls.VersionTLS11},
		"TLS12": {version: tls.VersionTLS12, ok: true},
		"TLS13": {version: tls.VersionTLS13, ok: true},
	} {
		t.Run(name, func(t *testing.T) {
			d := &tls.Dialer{Config: &tls.Config{RootCAs: ca.pool, MinVersion: tc.version, MaxVersion: tc.version}} //nolint:gosec // Offering TLS 1.1 is the test.
			c, err := d.DialContext(context.Background(), "tcp", addr)
			if (err == nil) != tc.ok {
				t.Errorf("handshake at %s: want success %v, got error %v", name, tc.ok, err)
			}
			if c != nil {
				_ = c.Close()
			}
		})
	}
	rsp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer rsp.Body.Close() //nolint:errcheck // Read-only.
	body, _ := io.ReadAll(rsp.Body)
	if rsp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "HTTPS") {
		t.Errorf("plain HTTP to the TLS port: want Go's 400 naming HTTPS, got %s %q", rsp.Status, body)
	}
}
