package squid

import (
	"crypto/md5" //nolint:gosec // APR1 is MD5-based by definition; it is what basic_ncsa_auth reads everywhere.
	"crypto/rand"
	"strings"
)

// The htpasswd hash of local proxies and pods is APR1 (Apache's
// MD5-crypt), because Squid's basic_ncsa_auth verifies it itself on every
// distribution, unlike the SHA-crypt variants that depend on the C
// library's crypt(3); their file is readable only by Squid's user and the
// Secret's readers, so the hash is a second line of defence. A VM's file
// travels in instance metadata, which more can read: it holds SHA-512
// crypt (shacrypt.go), which Debian's and Ubuntu's crypt(3) verify.

const apr1Magic = "$apr1$"

// itoa64 is the crypt(3) base-64 alphabet.
const itoa64 = "./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// newSalt returns eight random characters of the crypt alphabet.
func newSalt() (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	for i := range b {
		b[i] = itoa64[int(b[i])%len(itoa64)]
	}
	return string(b), nil
}

// apr1 hashes password with salt (at most eight characters are used).
func apr1(password, salt string) string {
	if len(salt) > 8 {
		salt = salt[:8]
	}
	pw := []byte(password)

	alt := md5.New() //nolint:gosec // See above.
	alt.Write(pw)
	alt.Write([]byte(salt))
	alt.Write(pw)
	altSum := alt.Sum(nil)

	ctx := md5.New() //nolint:gosec // See above.
	ctx.Write(pw)
	ctx.Write([]byte(apr1Magic))
	ctx.Write([]byte(salt))
	for n := len(pw); n > 0; n -= 16 {
		ctx.Write(altSum[:min(16, n)])
	}
	for n := len(pw); n > 0; n >>= 1 {
		if n&1 == 1 {
			ctx.Write([]byte{0})
		} else {
			ctx.Write(pw[:1])
		}
	}
	sum := ctx.Sum(nil)

	// A thousand rounds, mixing password, salt and the previous digest.
	for i := range 1000 {
		r := md5.New() //nolint:gosec // See above.
		if i&1 == 1 {
			r.Write(pw)
		} else {
			r.Write(sum)
		}
		if i%3 != 0 {
			r.Write([]byte(salt))
		}
		if i%7 != 0 {
			r.Write(pw)
		}
		if i&1 == 1 {
			r.Write(sum)
		} else {
			r.Write(pw)
		}
		sum = r.Sum(nil)
	}

	var out strings.Builder
	out.WriteString(apr1Magic)
	out.WriteString(salt)
	out.WriteByte('$')
	to64 := func(v uint32, n int) {
		for ; n > 0; n-- {
			out.WriteByte(itoa64[v&0x3f])
			v >>= 6
		}
	}
	for _, g := range [][3]int{{0, 6, 12}, {1, 7, 13}, {2, 8, 14}, {3, 9, 15}, {4, 10, 5}} {
		to64(uint32(sum[g[0]])<<16|uint32(sum[g[1]])<<8|uint32(sum[g[2]]), 4)
	}
	to64(uint32(sum[11]), 2)
	return out.String()
}
