package leasetest

import (
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// check runs CheckExclusive and returns its failure message, or "".
func check(log []Grant, maxLeases int) string {
	return testbed.Failure(func(t testing.TB) { CheckExclusive(t, log, maxLeases) })
}

func TestCheckExclusive(t *testing.T) {
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	s := func(n int) time.Time { return at.Add(time.Duration(n) * time.Second) }
	cases := map[string]struct {
		reason    string
		log       []Grant
		maxLeases int
		wantFail  string
	}{
		"OneAfterAnother": {
			reason:    "A slot handed on the instant it was released was never held twice.",
			log:       []Grant{{"p0", "0", "a", s(0), s(2), ""}, {"p0", "0", "b", s(2), s(4), ""}},
			maxLeases: 1,
		},
		"SlotDoubleGranted": {
			reason:    "A slot granted again before its holder released it was held twice.",
			log:       []Grant{{"p0", "0", "a", s(0), s(2), ""}, {"p0", "0", "b", s(1), s(3), ""}},
			maxLeases: 2,
			wantFail:  "slot p0/0 double-granted",
		},
		"HiddenBehindShortHold": {
			reason:    "A long hold overlapping a later grant is caught even with a short record of the same grant between them.",
			log:       []Grant{{"p0", "0", "a", s(0), s(10), "u1"}, {"p0", "0", "a", s(1), s(2), "u1"}, {"p0", "0", "c", s(3), s(4), "u3"}},
			maxLeases: 5,
			wantFail:  "slot p0/0 double-granted",
		},
		"SameGrant": {
			reason:    "Two records of one grant (one UID) are one hold.",
			log:       []Grant{{"p0", "0", "a", s(0), s(2), "u1"}, {"p0", "0", "a", s(1), s(3), "u1"}},
			maxLeases: 2,
		},
		"TwoSlotsWithinMax": {
			reason:    "Two slots of a proxy held at once are fine with maxLeases 2.",
			log:       []Grant{{"p0", "0", "a", s(0), s(2), ""}, {"p0", "1", "b", s(1), s(3), ""}},
			maxLeases: 2,
		},
		"ProxyOverMax": {
			reason:    "Three holders at once on a proxy with maxLeases 2 is one too many, even on three slots.",
			log:       []Grant{{"p0", "0", "a", s(0), s(3), ""}, {"p0", "1", "b", s(1), s(3), ""}, {"p0", "2", "c", s(2), s(3), ""}},
			maxLeases: 2,
			wantFail:  "proxy p0 had 3 live holders",
		},
		"OtherProxies": {
			reason:    "Holders of different proxies do not add up.",
			log:       []Grant{{"p0", "0", "a", s(0), s(2), ""}, {"p1", "0", "b", s(1), s(3), ""}},
			maxLeases: 1,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := check(tc.log, tc.maxLeases)
			if tc.wantFail == "" && got != "" || !strings.Contains(got, tc.wantFail) {
				t.Errorf("%s\nwant failure %q, got %q", tc.reason, tc.wantFail, got)
			}
		})
	}
}
