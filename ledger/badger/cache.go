package badger

import (
	"container/list"
	"hash/maphash"
	"sync"

	"github.com/toolfence/toolfence/residual"
)

// replayCache holds decoded succeeded residuals by store key, so that a replay needs
// neither a transaction nor a JSON decode. A cached record goes stale only through a write
// to the same key (a refused late commit or AppendEvidence adds evidence; a reserve that
// supersedes the success makes it pending; GC deletes it). Every write holds the keys it
// touched from before its commit until after the commit returned (tx.set and tx.del
// record them; Ledger.update holds and releases): while held, get misses them and add
// refuses them, and the release evicts them, so no answer comes from a record a commit has
// replaced. A fill is also refused when an eviction of its key's stripe happened after the
// filler took its stamp, before it opened its read transaction:
//
//   - a write visible to the filler's snapshot: the filler read the new record;
//   - a write committed after that snapshot: its eviction comes after the stamp, so either
//     it comes before add (add sees a changed stripe and refuses) or after add (it evicts
//     the entry).
//
// Only records that are durable are added (see awaitDurable), and cached records are never
// modified: get hands out the shared pointer and callers clone it. Size is bounded by an
// approximate byte budget (the stored JSON length), least recently used first out. The
// zero budget disables it.
type replayCache struct {
	budget int64
	seed   maphash.Seed

	mu      sync.Mutex
	used    int64
	lru     list.List // of *cacheEntry, most recently used at the front
	byKey   map[string]*list.Element
	stripes [cacheStripes]uint64 // evictions per stripe of keys
	held    [cacheStripes]int    // writes in flight per stripe of keys (hold, release)

	// hits and fills count, for tests.
	hits, fills uint64
}

// cacheStripes is how many eviction counters keys hash to: a write to one key refuses
// concurrent fills of about 1/cacheStripes of the other keys.
const cacheStripes = 256

// cacheEntryOverhead approximates the memory of an entry beyond its JSON length.
const cacheEntryOverhead = 256

type cacheEntry struct {
	key  string
	r    *residual.Residual
	size int64
}

func newReplayCache(budget int64) *replayCache {
	return &replayCache{budget: max(budget, 0), seed: maphash.MakeSeed(), byKey: map[string]*list.Element{}}
}

func (c *replayCache) stripe(key string) int {
	return int(maphash.String(c.seed, key) % cacheStripes)
}

// stamp returns the eviction count of key's stripe, to pass to add.
func (c *replayCache) stamp(key string) uint64 {
	if c.budget == 0 {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stripes[c.stripe(key)]
}

// get returns the cached residual of key, or nil. The result is shared: do not modify it.
func (c *replayCache) get(key string) *residual.Residual {
	if c.budget == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byKey[key]
	if !ok || c.held[c.stripe(key)] > 0 {
		return nil
	}
	c.lru.MoveToFront(e)
	c.hits++
	return e.Value.(*cacheEntry).r
}

// add caches r (which the cache then owns) under key, unless key's stripe saw an eviction
// since stamp was taken, or r alone exceeds the budget. storedLen is the stored JSON length.
func (c *replayCache) add(key string, r *residual.Residual, storedLen int, stamp uint64) {
	size := int64(storedLen) + int64(len(key)) + cacheEntryOverhead
	if c.budget == 0 || size > c.budget {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.stripe(key); c.stripes[s] != stamp || c.held[s] > 0 {
		return
	}
	if old, ok := c.byKey[key]; ok {
		c.remove(old)
	}
	c.byKey[key] = c.lru.PushFront(&cacheEntry{key: key, r: r, size: size})
	c.used += size
	c.fills++
	for c.used > c.budget {
		c.remove(c.lru.Back())
	}
}

// evict drops keys and refuses fills of their stripes that started before this call.
func (c *replayCache) evict(keys []string) { c.mark(keys, 0) }

// hold evicts keys before a commit that writes them, and until release makes get miss
// them and add refuse them (with every key of their stripes).
func (c *replayCache) hold(keys []string) { c.mark(keys, 1) }

// release ends a hold after the commit returned (or failed), evicting keys again.
func (c *replayCache) release(keys []string) { c.mark(keys, -1) }

// mark evicts keys and adds held to the holds of their stripes.
func (c *replayCache) mark(keys []string, held int) {
	if c.budget == 0 || len(keys) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, key := range keys {
		s := c.stripe(key)
		c.stripes[s]++
		c.held[s] += held
		if e, ok := c.byKey[key]; ok {
			c.remove(e)
		}
	}
}

func (c *replayCache) remove(e *list.Element) {
	ce := c.lru.Remove(e).(*cacheEntry)
	delete(c.byKey, ce.key)
	c.used -= ce.size
}

// len returns the number of cached residuals, for tests.
func (c *replayCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byKey)
}
