package squid

import (
	"crypto/sha512"
	"strconv"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// SHA-512 crypt ("$6$", Ulrich Drepper's "Unix crypt using SHA-256 and
// SHA-512", the scheme glibc and libxcrypt implement). basic_ncsa_auth
// hands any hash it does not verify itself to crypt(3), which on Debian and
// Ubuntu verifies it; so a VM's htpasswd can hold a hash that costs an
// attacker who reads it (from instance metadata, say) thousands of SHA-512
// rounds per guess rather than APR1's thousand MD5s.

const (
	sha512Magic = "$6$"
	// ShaCryptRounds is the cost written into the hashes made here: about
	// 40 ms for Squid's helper to verify, once per credentials TTL.
	ShaCryptRounds = 50000
	shaSaltMax     = 16
	shaRoundsMin   = 1000
	shaRoundsMax   = 999999999
)

// sha512Crypt returns the "$6$" crypt hash of password with salt and rounds
// (the rounds= field is written unless rounds is the scheme's default,
// 5000, as crypt(3) writes it).
func sha512Crypt(password, salt string, rounds int) string {
	if len(salt) > shaSaltMax {
		salt = salt[:shaSaltMax]
	}
	rounds = min(max(rounds, shaRoundsMin), shaRoundsMax)
	p, s := []byte(password), []byte(salt)

	h := sha512.New()
	h.Write(p)
	h.Write(s)
	h.Write(p)
	b := h.Sum(nil)

	h.Reset()
	h.Write(p)
	h.Write(s)
	for n := len(p); n > 0; n -= sha512.Size {
		h.Write(b[:min(n, sha512.Size)])
	}
	for n := len(p); n > 0; n >>= 1 {
		if n&1 != 0 {
			h.Write(b)
		} else {
			h.Write(p)
		}
	}
	a := h.Sum(nil)

	h.Reset()
	for range len(p) {
		h.Write(p)
	}
	dp := h.Sum(nil)
	pp := make([]byte, 0, len(p))
	for len(pp) < len(p) {
		pp = append(pp, dp[:min(len(p)-len(pp), len(dp))]...)
	}

	h.Reset()
	for range 16 + int(a[0]) {
		h.Write(s)
	}
	ds := h.Sum(nil)
	ss := ds[:len(s)]

	c := a
	for i := range rounds {
		h.Reset()
		if i%2 != 0 {
			h.Write(pp)
		} else {
			h.Write(c)
		}
		if i%3 != 0 {
			h.Write(ss)
		}
		if i%7 != 0 {
			h.Write(pp)
		}
		if i%2 != 0 {
			h.Write(c)
		} else {
			h.Write(pp)
		}
		c = h.Sum(c[:0])
	}

	var out strings.Builder
	out.WriteString(sha512Magic)
	if rounds != 5000 {
		out.WriteString("rounds=" + strconv.Itoa(rounds) + "$")
	}
	out.WriteString(salt)
	out.WriteByte('$')
	enc := func(b2, b1, b0 byte, n int) {
		w := uint(b2)<<16 | uint(b1)<<8 | uint(b0)
		for range n {
			out.WriteByte(itoa64[w&0x3f])
			w >>= 6
		}
	}
	for _, t := range [][3]int{
		{0, 21, 42}, {22, 43, 1}, {44, 2, 23}, {3, 24, 45}, {25, 46, 4}, {47, 5, 26}, {6, 27, 48},
		{28, 49, 7}, {50, 8, 29}, {9, 30, 51}, {31, 52, 10}, {53, 11, 32}, {12, 33, 54}, {34, 55, 13},
		{56, 14, 35}, {15, 36, 57}, {37, 58, 16}, {59, 17, 38}, {18, 39, 60}, {40, 61, 19}, {62, 20, 41},
	} {
		enc(c[t[0]], c[t[1]], c[t[2]], 4)
	}
	enc(0, 0, c[63], 2)
	return out.String()
}

// HtpasswdSHA512 returns an htpasswd line holding username and a "$6$"
// hash of password with the given salt (stable, as HtpasswdWithSalt's) and
// ShaCryptRounds rounds. Only a Squid whose C library's crypt(3) knows
// SHA-512 crypt (glibc, libxcrypt: every Debian and Ubuntu) verifies it.
func HtpasswdSHA512(username, password, salt string) ([]byte, error) {
	if err := checkHtpasswd(username, password, salt); err != nil {
		return nil, err
	}
	if salt == "" || len(salt) > shaSaltMax {
		return nil, errors.Errorf(errFmtShaSalt, shaSaltMax, len(salt))
	}
	return []byte(username + ":" + sha512Crypt(password, salt, ShaCryptRounds) + "\n"), nil
}

// errFmtShaSalt refuses a salt SHA-512 crypt cannot take.
const errFmtShaSalt = "a SHA-512 crypt salt holds 1 to %d characters, not %d"
