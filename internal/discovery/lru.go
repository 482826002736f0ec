package discovery

import (
	"container/list"
	"time"
)

// ttlCache remembers at most size answers, each for ttl after it was
// given, and forgets the least recently used first: a crawler sending
// random tokens, or asking for random fleets, costs a review each time but
// never more memory than size entries.
type ttlCache[V any] struct {
	size  int
	ll    *list.List // front: most recently used
	items map[string]*list.Element
}

type ttlEntry[V any] struct {
	key string
	v   V
	at  time.Time
}

func newTTLCache[V any](size int) *ttlCache[V] {
	return &ttlCache[V]{size: max(size, 1), ll: list.New(), items: map[string]*list.Element{}}
}

// get returns the answer for key given less than ttl before now.
func (c *ttlCache[V]) get(key string, now time.Time, ttl time.Duration) (V, bool) {
	var zero V
	e, ok := c.items[key]
	if !ok {
		return zero, false
	}
	en := e.Value.(*ttlEntry[V]) //nolint:forcetypeassert // Only entries are stored.
	if now.Sub(en.at) >= ttl || now.Before(en.at) {
		c.ll.Remove(e)
		delete(c.items, key)
		return zero, false
	}
	c.ll.MoveToFront(e)
	return en.v, true
}

// add remembers the answer for key, given at now.
func (c *ttlCache[V]) add(key string, v V, now time.Time) {
	if e, ok := c.items[key]; ok {
		e.Value = &ttlEntry[V]{key: key, v: v, at: now}
		c.ll.MoveToFront(e)
		return
	}
	c.items[key] = c.ll.PushFront(&ttlEntry[V]{key: key, v: v, at: now})
	for c.ll.Len() > c.size {
		last := c.ll.Back()
		c.ll.Remove(last)
		delete(c.items, last.Value.(*ttlEntry[V]).key) //nolint:forcetypeassert // Only entries are stored.
	}
}

func (c *ttlCache[V]) len() int { return c.ll.Len() }
