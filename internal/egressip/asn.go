package egressip

import (
	"net/netip"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/oschwald/maxminddb-golang/v2"
)

// ASNDB is an offline IP-to-ASN database in the MaxMind DB format (such as
// GeoLite2-ASN or an IPinfo ASN export), which the platform provides as a
// file: none is shipped or fetched.
type ASNDB struct {
	r *maxminddb.Reader
}

// asnRecord is the part of a record ASNDB reads.
type asnRecord struct {
	Number uint32 `maxminddb:"autonomous_system_number"`
}

// OpenASNDB opens the database at path.
func OpenASNDB(path string) (*ASNDB, error) {
	r, err := maxminddb.Open(path)
	if err != nil {
		return nil, errors.Wrapf(err, "cannot open the ASN database %s", path)
	}
	return &ASNDB{r: r}, nil
}

// CheckASNDB says whether path ("" for none) is an ASN database that
// opens, for a command's flag check.
func CheckASNDB(path string) error {
	if path == "" {
		return nil
	}
	db, err := OpenASNDB(path)
	if err != nil {
		return err
	}
	return db.Close()
}

// ASN is the autonomous system a belongs to, false when the database
// does not know.
func (d *ASNDB) ASN(a netip.Addr) (uint32, bool) {
	var rec asnRecord
	res := d.r.Lookup(a.Unmap().WithZone(""))
	if !res.Found() || res.Decode(&rec) != nil || rec.Number == 0 {
		return 0, false
	}
	return rec.Number, true
}

// Table is an IP-to-ASN lookup of a few prefixes, for tests and small
// fixed setups: the longest prefix holding an address names its ASN.
type Table map[netip.Prefix]uint32

// ASN is the autonomous system of the longest prefix holding a.
func (t Table) ASN(a netip.Addr) (uint32, bool) {
	a = a.Unmap().WithZone("")
	best, n := -1, uint32(0)
	for p, asn := range t {
		if p.Contains(a) && p.Bits() > best {
			best, n = p.Bits(), asn
		}
	}
	return n, best >= 0
}

// Close releases the database.
func (d *ASNDB) Close() error { return d.r.Close() }
