package cloudvm

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"sync"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
)

// maxLines bounds the lines remembered: past it the cache starts afresh,
// which costs hashes, never a different line (each is the same whenever
// it is made).
const maxLines = 1024

// htpasswdLines is the start-up scripts' cache of htpasswd lines.
var htpasswdLines = newLineCache(squid.HtpasswdSHA512)

// htpasswdScope is what VMs share one htpasswd line within: a fleet, or a
// Proxy of none; in one cluster and namespace, so that no tenant's VM ever
// carries a line made for another's (which would let a tenant test a
// guess of another's credentials against its own VM's metadata).
func htpasswdScope(o ownership.Owner) string {
	if o.Fleet != "" {
		return o.ClusterID + "/" + o.Namespace + "/fleet/" + o.Fleet
	}
	return o.ClusterID + "/" + o.Namespace + "/proxy/" + string(o.UID)
}

// scopeSalt is a scope's salt: 16 hex digits of its SHA-256. It is the
// same in every process, so a VM's script is too (AWS's ClientToken digests
// it: a create retried after a restart must ask for the same instance).
func scopeSalt(scope string) string {
	sum := sha256.Sum256([]byte("egress-proxy htpasswd salt\x00" + scope))
	return hex.EncodeToString(sum[:8])
}

// lineCache remembers the htpasswd line made for a scope's credentials. A
// SHA-512 crypt of squid.ShaCryptRounds rounds costs 20 to 30 ms of CPU,
// and a fleet's VMs share their credentials: bringing up 10 000 VMs, the
// hashes were half of the provider's CPU and held its creates to about
// eight a second on two cores (make scale). Every VM of a scope gets the
// same line, salted by the scope: a reader of one VM's metadata learns
// nothing of its fleet's others that the shared password did not tell
// already, and nothing of another scope's. A changed password or username
// is a new key, hashed afresh. Keys are an HMAC of the scope and the
// credentials under a key of this process, so the map holds no password,
// nor an unsalted hash of one.
type lineCache struct {
	key  []byte
	hash func(username, password, salt string) ([]byte, error)

	mu    sync.Mutex
	lines map[[sha256.Size]byte]*line
}

// line is one scope's credentials' line, made once however many VMs ask
// at once.
type line struct {
	once sync.Once
	text []byte
	err  error
}

func newLineCache(hash func(username, password, salt string) ([]byte, error)) *lineCache {
	return &lineCache{key: []byte(rand.Text()), hash: hash, lines: map[[sha256.Size]byte]*line{}}
}

// get is the line of username and password in scope. A failed hash is not
// remembered.
func (c *lineCache) get(scope, username, password string) ([]byte, error) {
	m := hmac.New(sha256.New, c.key)
	// Each field length-prefixed: ("a\x00b", "c") and ("a", "b\x00c") differ.
	for _, f := range []string{scope, username, password} {
		_ = binary.Write(m, binary.BigEndian, uint64(len(f)))
		m.Write([]byte(f))
	}
	var k [sha256.Size]byte
	copy(k[:], m.Sum(nil))
	c.mu.Lock()
	l := c.lines[k]
	if l == nil {
		if len(c.lines) >= maxLines {
			clear(c.lines)
		}
		l = &line{}
		c.lines[k] = l
	}
	c.mu.Unlock()
	l.once.Do(func() { l.text, l.err = c.hash(username, password, scopeSalt(scope)) })
	if l.err != nil {
		c.mu.Lock()
		if c.lines[k] == l {
			delete(c.lines, k)
		}
		c.mu.Unlock()
	}
	return l.text, l.err
}
