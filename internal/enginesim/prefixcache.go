package enginesim

import (
	"container/list"
	"hash/fnv"
	"sync"
)

// prefixCache simulates vLLM's automatic prefix caching: an LRU set of at most capacity
// block hashes. Block i's hash chains the hashes of blocks 0..i, so a block only matches when
// the whole prefix before it matches too. It is safe for concurrent use.
type prefixCache struct {
	blockSize int
	capacity  int

	mu    sync.Mutex
	lru   list.List // of uint64, most recently used at the front
	index map[uint64]*list.Element
}

func newPrefixCache(blockSize, capacity int) *prefixCache {
	return &prefixCache{blockSize: blockSize, capacity: capacity, index: make(map[uint64]*list.Element)}
}

// blockHashes returns the chained hashes of the full blocks of words, seeded with the model
// name so that models never share blocks. A trailing partial block is not hashed, as in vLLM.
func (c *prefixCache) blockHashes(model string, words []string) []uint64 {
	n := len(words) / c.blockSize
	if n == 0 {
		return nil
	}
	hashes := make([]uint64, n)
	h := fnv.New64a()
	_, _ = h.Write([]byte(model))
	prev := h.Sum64()
	for i := range n {
		h.Reset()
		var b [8]byte
		for j := range 8 {
			b[j] = byte(prev >> (8 * j))
		}
		_, _ = h.Write(b[:])
		for _, w := range words[i*c.blockSize : (i+1)*c.blockSize] {
			_, _ = h.Write([]byte(w))
			_, _ = h.Write([]byte{0})
		}
		prev = h.Sum64()
		hashes[i] = prev
	}
	return hashes
}

// lookupAndInsert returns the number of leading tokens of words already cached for model,
// then records all of the prompt's full blocks as most recently used, evicting the least
// recently used blocks beyond capacity.
func (c *prefixCache) lookupAndInsert(model string, words []string) (cachedTokens int) {
	hashes := c.blockHashes(model, words)
	c.mu.Lock()
	defer c.mu.Unlock()
	hit := 0
	for _, h := range hashes {
		if _, ok := c.index[h]; !ok {
			break
		}
		hit++
	}
	// Touch the blocks last to first, so that block 0 ends up most recently used: a later
	// block is useless without the ones before it, so it should be evicted first (as vLLM does).
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if el, ok := c.index[h]; ok {
			c.lru.MoveToFront(el)
			continue
		}
		c.index[h] = c.lru.PushFront(h)
	}
	for c.lru.Len() > c.capacity {
		el := c.lru.Back()
		delete(c.index, c.lru.Remove(el).(uint64))
	}
	return hit * c.blockSize
}

// reset forgets every cached block (POST /reset_prefix_cache, POST /sleep).
func (c *prefixCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lru.Init()
	clear(c.index)
}
