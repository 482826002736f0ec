package cloudvm

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"sync"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
)

// maxLines bounds the lines remembered: past it the cache starts afresh.
// A provider serves a few credentials per fleet, not a thousand.
const maxLines = 1024

// htpasswdLines is the start-up scripts' cache of htpasswd lines.
var htpasswdLines = newLineCache(squid.HtpasswdSHA512)

// lineCache remembers the htpasswd line made for a username and password.
// A SHA-512 crypt of squid.ShaCryptRounds rounds costs 20 to 30 ms of CPU,
// and a fleet's VMs share their credentials: bringing up 10 000 VMs, the
// hashes were half of the provider's CPU and held its creates to about
// eight a second on two cores (make scale). The first VM's salt then
// serves every later VM with the same credentials, so their lines are the
// same: a reader of one VM's metadata learns nothing of another that the
// shared password did not tell already. A changed password or username is
// a new key, hashed afresh. Keys are an HMAC of the credentials under a
// key of this process, so the map holds no password, nor an unsalted hash
// of one.
type lineCache struct {
	key  []byte
	hash func(username, password, salt string) ([]byte, error)

	mu    sync.Mutex
	lines map[[sha256.Size]byte]*line
}

// line is one credentials' line, made once however many VMs ask at once.
type line struct {
	once sync.Once
	text []byte
	err  error
}

func newLineCache(hash func(username, password, salt string) ([]byte, error)) *lineCache {
	return &lineCache{key: []byte(rand.Text()), hash: hash, lines: map[[sha256.Size]byte]*line{}}
}

// get is the line for username and password, hashed with salt if none is
// remembered. A failed hash is not remembered.
func (c *lineCache) get(username, password, salt string) ([]byte, error) {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte(username))
	m.Write([]byte{0})
	m.Write([]byte(password))
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
	l.once.Do(func() { l.text, l.err = c.hash(username, password, salt) })
	if l.err != nil {
		c.mu.Lock()
		if c.lines[k] == l {
			delete(c.lines, k)
		}
		c.mu.Unlock()
	}
	return l.text, l.err
}
