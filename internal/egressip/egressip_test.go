package egressip_test

import (
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/maxmind/mmdbwriter"
	"github.com/maxmind/mmdbwriter/mmdbtype"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/egressip"
)

func TestPrefixOf(t *testing.T) {
	for in, want := range map[string]string{
		"203.0.113.7":             "203.0.113.0/24",
		"203.0.113.255":           "203.0.113.0/24",
		"203.0.112.255":           "203.0.112.0/24",
		"::ffff:203.0.113.7":      "203.0.113.0/24", // IPv4-mapped: its IPv4 /24
		"2001:db8:1:2:3:4:5:6":    "2001:db8:1:2::/64",
		"2001:db8:1:3::1":         "2001:db8:1:3::/64",
		"fe80::1%eth0":            "fe80::/64",
		"2001:db8:1:2:ffff::ffff": "2001:db8:1:2::/64",
	} {
		if got := egressip.PrefixOf(netip.MustParseAddr(in)); got.String() != want {
			t.Errorf("PrefixOf(%s) = %s, want %s", in, got, want)
		}
	}
	if p := egressip.PrefixOf(netip.Addr{}); p.IsValid() {
		t.Errorf("an invalid address has no prefix: %s", p)
	}
}

func members(pairs ...string) []egressip.Member {
	var out []egressip.Member
	for i := 0; i < len(pairs); i += 2 {
		ip, _ := netip.ParseAddr(pairs[i+1])
		out = append(out, egressip.Member{Name: pairs[i], IP: ip})
	}
	return out
}

// TestAssess: distinct addresses, /24s and /64s counted; the proxies past
// a cap, the last by name in each group, named with why; unknown
// addresses ignored; no cap, no excess.
func TestAssess(t *testing.T) {
	ms := members(
		"p1", "203.0.113.1", "p2", "203.0.113.2", "p3", "203.0.113.3", // one /24, three proxies
		"p4", "198.51.100.9", "p5", "::ffff:198.51.100.9", // one address, mapped or not
		"p6", "2001:db8:0:1::1", "p7", "2001:db8:0:1::2", "p8", "2001:db8:0:2::1",
		"p9", "", // not known yet
	)
	r := egressip.Assess(ms, egressip.Limits{}, nil)
	if r.Addresses != 7 || r.Prefixes4 != 2 || r.Prefixes6 != 2 || r.ASNs != -1 || len(r.Excess) != 0 {
		t.Errorf("no caps: %+v", r)
	}
	r = egressip.Assess(ms, egressip.Limits{PerPrefix4: 2, PerPrefix6: 1}, nil)
	want := map[string]string{
		"p3": "203.0.113.0/24 holds its limit of 2 proxies already",
		"p7": "2001:db8:0:1::/64 holds its limit of 1 proxies already",
	}
	if !reflect.DeepEqual(r.Excess, want) {
		t.Errorf("capped: %v, want %v", r.Excess, want)
	}
	// Stable: the same members in another order, the same excess.
	rev := append([]egressip.Member(nil), ms...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	if r2 := egressip.Assess(rev, egressip.Limits{PerPrefix4: 2, PerPrefix6: 1}, nil); !reflect.DeepEqual(r2.Excess, want) {
		t.Errorf("order changed the excess: %v", r2.Excess)
	}
}

// TestASNDB: an ASN database in the MaxMind DB format, written here,
// counts the networks and caps them.
func TestASNDB(t *testing.T) {
	tree, err := mmdbwriter.New(mmdbwriter.Options{DatabaseType: "GeoLite2-ASN", IncludeReservedNetworks: true, RecordSize: 24})
	if err != nil {
		t.Fatal(err)
	}
	for cidr, asn := range map[string]uint32{"203.0.113.0/24": 64500, "198.51.100.0/24": 64500, "2001:db8::/32": 64501} {
		_, n, err := net.ParseCIDR(cidr)
		if err != nil {
			t.Fatal(err)
		}
		if err := tree.Insert(n, mmdbtype.Map{"autonomous_system_number": mmdbtype.Uint32(asn), "autonomous_system_organization": mmdbtype.String("Example")}); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "asn.mmdb")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tree.WriteTo(f); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	db, err := egressip.OpenASNDB(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close() //nolint:errcheck // A test's reader.
	if n, ok := db.ASN(netip.MustParseAddr("::ffff:198.51.100.4")); !ok || n != 64500 {
		t.Errorf("a mapped address's network: %d %v", n, ok)
	}
	if _, ok := db.ASN(netip.MustParseAddr("192.0.2.1")); ok {
		t.Error("an address the database does not hold has no network")
	}
	ms := members("a", "203.0.113.1", "b", "198.51.100.1", "c", "2001:db8::1", "d", "192.0.2.1")
	r := egressip.Assess(ms, egressip.Limits{PerASN: 1}, db)
	if r.ASNs != 2 || !reflect.DeepEqual(r.Excess, map[string]string{"b": "AS64500 holds its limit of 1 proxies already"}) {
		t.Errorf("by network: %+v", r)
	}
	if _, err := egressip.OpenASNDB(filepath.Join(t.TempDir(), "missing.mmdb")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing database opens, or fails for another reason: %v", err)
	}
}

// TestTable: the longest prefix holding an address names its ASN; an
// IPv4-mapped address is looked up as its IPv4 address.
func TestTable(t *testing.T) {
	tab := egressip.Table{netip.MustParsePrefix("203.0.0.0/16"): 64500, netip.MustParsePrefix("203.0.113.0/24"): 64501}
	for ip, want := range map[string]uint32{"203.0.1.1": 64500, "203.0.113.9": 64501, "::ffff:203.0.113.9": 64501, "198.51.100.1": 0} {
		got, ok := tab.ASN(netip.MustParseAddr(ip))
		if got != want || ok != (want != 0) {
			t.Errorf("%s: AS%d %v, want AS%d", ip, got, ok, want)
		}
	}
}

// TestCapsTogether: a proxy beyond a prefix cap takes no place under its
// ASN's: p0-p2 share a /24 (cap 1: p1 and p2 beyond), p3 is alone in
// another, all four in one ASN (cap 3): p0 and p3 keep both caps.
func TestCapsTogether(t *testing.T) {
	ms := []egressip.Member{
		{Name: "p0", IP: netip.MustParseAddr("203.0.113.1"), Order: 0},
		{Name: "p1", IP: netip.MustParseAddr("203.0.113.2"), Order: 1},
		{Name: "p2", IP: netip.MustParseAddr("203.0.113.3"), Order: 2},
		{Name: "p3", IP: netip.MustParseAddr("203.0.114.1"), Order: 3},
	}
	r := egressip.Assess(ms, egressip.Limits{PerPrefix4: 1, PerASN: 3}, egressip.Table{netip.MustParsePrefix("203.0.0.0/16"): 64500})
	if _, ok := r.Excess["p3"]; ok || len(r.Excess) != 2 {
		t.Errorf("beyond: %v; want p1 and p2 only", r.Excess)
	}
}
