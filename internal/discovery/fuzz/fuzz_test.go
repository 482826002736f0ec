// Package fuzz_test fuzzes the discovery API's request decoders. It lives apart
// from the API tests because those start an apiserver in TestMain, which
// every fuzzing worker process would run again.
package fuzz_test

import (
	"bytes"
	"encoding/json"
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
		// What it accepts, sent again as the client would send it, is
		// accepted again as the same request: nothing the decoder takes
		// depends on how the JSON was spelled.
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		r2 := httptest.NewRequest(http.MethodPost, "/v1/leases", bytes.NewReader(again))
		req2, ns2, name2, err := discovery.DecodeAcquire(r2)
		if err != nil || *req2 != *req || ns2 != ns || name2 != name {
			t.Fatalf("accepted %q as %+v, but not the same when sent again as %s: %+v, %v", body, req, again, req2, err)
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
