// Package ttlcache is a bounded memory of answers, each valid for a while
// after it was given, that forgets the least recently used first:
// egress-discovery's caches of token and access reviews, of rate-limit
// buckets and of the gateway's rotation. Not safe for concurrent use: its
// users hold their own lock. One file: ttlcache.go.
package ttlcache

import (
	"container/list"
	"iter"
	"time"
)

// Cache remembers at most size answers, each for ttl after it was
// given, and forgets the least recently used first: a crawler sending
// random tokens, or asking for random fleets, costs a review each time but
// never more memory than size entries.
type Cache[V any] struct {
	size  int
	ll    *list.List // front: most recently used
	items map[string]*list.Element
}

type ttlEntry[V any] struct {
	key string
	v   V
	at  time.Time
}

// New is a Cache of at most size entries (at least one).
func New[V any](size int) *Cache[V] {
	return &Cache[V]{size: max(size, 1), ll: list.New(), items: map[string]*list.Element{}}
}

// Get returns the answer for key given less than ttl before now.
func (c *Cache[V]) Get(key string, now time.Time, ttl time.Duration) (V, bool) {
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

// Add remembers the answer for key, given at now.
func (c *Cache[V]) Add(key string, v V, now time.Time) {
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

// Len is how many entries it holds.
func (c *Cache[V]) Len() int { return c.ll.Len() }

// Keys yields the keys it holds, most recently used first, expired or not.
func (c *Cache[V]) Keys() iter.Seq[string] {
	return func(yield func(string) bool) {
		for e := c.ll.Front(); e != nil; e = e.Next() {
			if !yield(e.Value.(*ttlEntry[V]).key) { //nolint:forcetypeassert // Only entries are stored.
				return
			}
		}
	}
}
