package probe_test

import (
	"context"
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
)

// TestRedactsPassword gives the probe errors that do carry the password,
// plain and URL-escaped, as a proxy or a library echoing the request
// might: they must come out without it. (The probe's own messages never
// hold the password, so a test of those alone could not fail.)
func TestRedactsPassword(t *testing.T) {
	const password = "p@ss word/42"
	for name, echoed := range map[string]string{
		"Plain":   "proxy closed the connection after CONNECT with Proxy-Authorization crawler:" + password,
		"Escaped": "dial http://crawler:" + url.QueryEscape(password) + "@127.0.0.1:1: refused",
	} {
		t.Run(name, func(t *testing.T) {
			p := probe.Prober{Dial: func(context.Context, string, string) (net.Conn, error) { return nil, errors.New(echoed) }}
			got := p.Probe(context.Background(), probe.Target{Proxy: "127.0.0.1:1", Username: "crawler", Password: password, URL: "http://127.0.0.1:2/"})
			if got.OK {
				t.Fatal("a probe whose dial fails is not OK")
			}
			if strings.Contains(got.Error, password) || strings.Contains(got.Error, url.QueryEscape(password)) {
				t.Errorf("the password is in the probe's error: %q", got.Error)
			}
			if !strings.Contains(got.Error, "<redacted>") {
				t.Errorf("the error no longer says what failed, or never carried the password: %q", got.Error)
			}
		})
	}
}
