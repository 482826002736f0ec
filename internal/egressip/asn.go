package egressip

import (
	"net/netip"

	"github.com/oschwald/maxminddb-golang/v2"
	"github.com/pkg/errors"
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

// Close releases the database.
func (d *ASNDB) Close() error { return d.r.Close() }
