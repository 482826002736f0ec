// Package fuzz_test fuzzes the discovery API's request decoders. It lives apart
// from the API tests because those start an apiserver in TestMain, which
// every fuzzing worker process would run again.
package fuzz_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// FuzzDecodeAcquire feeds arbitrary bodies to the acquire decoder: it must
// never panic, and whatever it accepts must be a valid request. The seed
// corpus is in testdata/fuzz/FuzzDecodeAcquire.
func FuzzDecodeAcquire(f *testing.F) {
	f.Add([]byte(`{"fleet": "team/crawlers", "holder": "scrapy-1", "ttl": "10m", "zone": "a", "stickyKey": "s", "domain": "shop.example"}`))
	f.Add([]byte(`{"fleet": "team/crawlers"}`))
	f.Add([]byte(`{"fleet": 7}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest(http.MethodPost, "/v1/leases", bytes.NewReader(body))
		r.Body = http.MaxBytesReader(httptest.NewRecorder(), r.Body, 16<<10)
		req, ns, name, err := discovery.DecodeAcquire(r)
		if err != nil {
			return
		}
		if ns == "" || name == "" || strings.Contains(name, "/") || req.Holder == "" || len(req.Holder) > 253 {
			t.Fatalf("accepted an invalid request: %+v (%q, %q)", req, ns, name)
		}
	})
}

// FuzzParseID checks the lease ID parser never panics and only accepts
// three non-empty parts.
func FuzzParseID(f *testing.F) {
	f.Add("team/crawlers-0-slot-0/abcdef")
	f.Add("//")
	f.Fuzz(func(t *testing.T, id string) {
		ns, name, tok, err := lease.ParseID(id)
		if err == nil && (ns == "" || name == "" || tok == "" || ns+"/"+name+"/"+tok != id) {
			t.Fatalf("ParseID(%q) accepted %q %q %q", id, ns, name, tok)
		}
	})
}
