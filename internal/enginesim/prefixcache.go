package enginesim

import (
	"container/list"
	"sync"

	"github.com/switchboard-gw/switchboard/internal/kvevents"
)

// prefixCache simulates vLLM's automatic prefix caching: an LRU set of at most capacity
// block hashes. A block is blockSize prompt tokens, keyed by their token ids (the ids
// /tokenize returns); block i's hash chains the hashes of blocks 0..i, so a block only
// matches when the whole prefix before it matches too. It is safe for concurrent use.
//
// With a publisher (pub), every change is published as vLLM's block pool reports it
// (vllm/v1/core/block_pool.py): a lookup that evicts or stores blocks makes one batch of
// a BlockRemoved per evicted block followed by one BlockStored of the prompt's new blocks,
// and reset makes a batch of one AllBlocksCleared. The batches are handed to the publisher
// while the cache is locked, so their sequence numbers follow the cache's own order.
type prefixCache struct {
	blockSize int
	capacity  int

	// bases names the served models: a lookup under any other name is a LoRA adapter's,
	// whose BlockStored events carry its lora_name. Set before the first lookup; nil makes
	// every name a base model's.
	bases map[string]bool
	// pub receives the cache's KV events; nil when they are off. Set before the first
	// lookup.
	pub *kvPublisher

	mu    sync.Mutex
	lru   list.List // of uint64, most recently used at the front
	index map[uint64]*list.Element
}

func newPrefixCache(blockSize, capacity int) *prefixCache {
	return &prefixCache{blockSize: blockSize, capacity: capacity, index: make(map[uint64]*list.Element)}
}

// FNV-1a, 64 bits, written out so that hashing a block allocates nothing.
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// fnvUint64 folds the 8 little-endian bytes of v into the FNV-1a hash h.
func fnvUint64(h, v uint64) uint64 {
	for range 8 {
		h ^= v & 0xff
		h *= fnvPrime64
		v >>= 8
	}
	return h
}

// blockHashes returns the chained hashes of the blocks of ids (a whole number of blocks),
// seeded with the model name so that models, and a LoRA adapter and its base model, never
// share blocks: block i's hash is FNV-1a over block i-1's hash and block i's token ids.
// These are the simulator's own engine hashes; vLLM's (SHA-256 over pickled tuples, seeded
// at random per process) cannot be reproduced anyway.
func (c *prefixCache) blockHashes(model string, ids []int) []uint64 {
	n := len(ids) / c.blockSize
	if n == 0 {
		return nil
	}
	prev := uint64(fnvOffset64)
	for i := range len(model) {
		prev ^= uint64(model[i])
		prev *= fnvPrime64
	}
	hashes := make([]uint64, n)
	for i := range n {
		h := fnvUint64(fnvOffset64, prev)
		for _, id := range ids[i*c.blockSize : (i+1)*c.blockSize] {
			h = fnvUint64(h, uint64(id))
		}
		prev = h
		hashes[i] = h
	}
	return hashes
}

// lookupAndInsert returns the number of leading tokens of words already cached for model
// that the prompt's prefill may skip (at most its length less one token, as in vLLM),
// then records the prompt's full blocks (at most capacity of them) as most recently used,
// first evicting the least recently used blocks that do not fit, as vLLM allocates the
// blocks of a prompt's uncached part from its free queue. A trailing partial block is not
// cached, as in vLLM.
func (c *prefixCache) lookupAndInsert(model string, words []string) (cachedTokens int) {
	n := min(len(words)/c.blockSize, c.capacity)
	ids := make([]int, n*c.blockSize)
	for i := range ids {
		ids[i] = tokenID(words[i])
	}
	hashes := c.blockHashes(model, ids)

	c.mu.Lock()
	defer c.mu.Unlock()
	hit := 0
	for hit < n {
		if _, ok := c.index[hashes[hit]]; !ok {
			break
		}
		hit++
	}
	// Touch the hit blocks last to first, so that block 0 ends up most recently used: a
	// later block is useless without the ones before it, so it should be evicted first (as
	// vLLM frees a request's blocks in reverse order). A cached block's parent is therefore
	// never evicted before it, and no block after the hit prefix is cached.
	for i := hit - 1; i >= 0; i-- {
		c.lru.MoveToFront(c.index[hashes[i]])
	}
	var events []kvevents.Event
	for c.lru.Len() > c.capacity-(n-hit) {
		h := c.lru.Remove(c.lru.Back()).(uint64)
		delete(c.index, h)
		if c.pub != nil {
			events = append(events, kvevents.Event{
				Kind: kvevents.BlockRemoved, BlockHashes: []kvevents.Hash{kvevents.Hash(h)},
				Medium: kvMediumGPU, GroupIdx: 0, LoRAID: -1, SlidingWindow: -1,
			})
		}
	}
	// The new blocks go right after the hit ones, in chain order.
	var at *list.Element
	if hit > 0 {
		at = c.index[hashes[hit-1]]
	}
	for _, h := range hashes[hit:] {
		if el, ok := c.index[h]; ok { // only on a 64-bit hash collision
			c.lru.Remove(el)
		}
		if at == nil {
			at = c.lru.PushFront(h)
		} else {
			at = c.lru.InsertAfter(h, at)
		}
		c.index[h] = at
	}
	if c.pub != nil && hit < n {
		events = append(events, c.stored(model, hashes, ids, hit))
	}
	if len(events) > 0 {
		c.pub.enqueue(events)
	}
	// A prompt found whole still has its last token computed, for its
	// logits: vLLM looks for a hit of at most the prompt's length less one
	// token (vllm/v1/core/kv_cache_manager.py get_computed_blocks,
	// max_cache_hit_length), so a prompt of whole blocks found whole
	// reports its last block uncached.
	return min(hit, (len(words)-1)/c.blockSize) * c.blockSize
}

// stored returns the BlockStored event of the blocks hashes[first:] of a prompt of token
// ids under model, as vLLM's BlockPool.cache_full_blocks reports newly cached blocks:
// the parent is the hash of the block before the first new one (none for a prompt's
// first block), token_ids the new blocks' tokens, lora_name the adapter's name for an
// adapter's request, extra_keys one entry per block (the adapter's name, or nil), medium
// "GPU", group 0 of kind "full_attention". lora_id is nil: the simulator's adapters have
// no integer id (vLLM deprecated the field for lora_name).
func (c *prefixCache) stored(model string, hashes []uint64, ids []int, first int) kvevents.Event {
	ev := kvevents.Event{
		Kind:          kvevents.BlockStored,
		BlockHashes:   make([]kvevents.Hash, len(hashes)-first),
		TokenIDs:      make([]uint32, len(ids)-first*c.blockSize),
		BlockSize:     c.blockSize,
		LoRAID:        -1,
		Medium:        kvMediumGPU,
		GroupIdx:      0,
		SpecKind:      kvSpecFullAttention,
		SlidingWindow: -1,
	}
	for i, h := range hashes[first:] {
		ev.BlockHashes[i] = kvevents.Hash(h)
	}
	if first > 0 {
		ev.ParentBlockHash, ev.HasParent = kvevents.Hash(hashes[first-1]), true
	}
	for i, id := range ids[first*c.blockSize:] {
		ev.TokenIDs[i] = uint32(id) // the wire's ids are uint32; larger decimal words wrap
	}
	if c.bases != nil && !c.bases[model] {
		ev.LoRAName = model
	}
	ev.ExtraKeys = extraKeys(len(ev.BlockHashes), ev.LoRAName)
	return ev
}

// reset forgets every cached block (POST /reset_prefix_cache, POST /sleep) and publishes
// AllBlocksCleared, as vLLM's BlockPool.reset_prefix_cache does.
func (c *prefixCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lru.Init()
	clear(c.index)
	if c.pub != nil {
		c.pub.enqueue([]kvevents.Event{{Kind: kvevents.AllBlocksCleared, LoRAID: -1, GroupIdx: -1, SlidingWindow: -1}})
	}
}

// restart forgets every cached block without an event and starts the publisher's
// sequence over, as a restarted engine process would (the KV-events restart fault).
func (c *prefixCache) restart() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lru.Init()
	clear(c.index)
	if c.pub != nil {
		c.pub.restart()
	}
}
