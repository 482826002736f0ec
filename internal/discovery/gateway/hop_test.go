package gateway

import (
	"net/http"
	"testing"
)

// TestDropHopHeaders: the hop-by-hop headers, the gateway's own
// Proxy-Authorization and every header a Connection header names are
// dropped; end-to-end headers stay.
func TestDropHopHeaders(t *testing.T) {
	h := http.Header{}
	h.Add("Connection", "X-One, keep-alive")
	h.Add("Connection", " X-Two ")
	for _, k := range []string{"X-One", "X-Two", "Keep-Alive", "Proxy-Authorization", "Te", "Upgrade", "Accept", "X-Kept"} {
		h.Set(k, "v")
	}
	dropHopHeaders(h)
	for _, k := range []string{"Connection", "X-One", "X-Two", "Keep-Alive", "Proxy-Authorization", "Te", "Upgrade"} {
		if h.Get(k) != "" {
			t.Errorf("%s was not dropped", k)
		}
	}
	for _, k := range []string{"Accept", "X-Kept"} {
		if h.Get(k) == "" {
			t.Errorf("%s was dropped", k)
		}
	}
}
