package routing

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/switchboard-gw/switchboard/internal/stablehash"
)

// PrefixConfig sets how prompts are cut into blocks for prefix-aware and
// scorer, and the size of their [PrefixIndex] (routing.prefix). It is
// shared by both policies, so it is [Config]'s own section rather than
// one policy's.
type PrefixConfig struct {
	// BlockBytes is the size of a prompt block in bytes of prompt text,
	// 16..65536, default 64: about 16 tokens, vLLM's default KV block size,
	// and the Gateway API Inference Extension's default block of 64
	// characters.
	BlockBytes int `koanf:"block_bytes"`
	// MaxBlocks caps the blocks hashed per prompt, 1..65536, default 1024
	// (the first 64 KiB of prompt text at the default block size): longer
	// prompts are matched on their first MaxBlocks blocks.
	MaxBlocks int `koanf:"max_blocks"`
	// IndexEntries is the capacity of the index of recently routed
	// (block, engine) pairs, 8..2^28, default 1048576, which takes 16 bytes
	// per entry (16 MiB), allocated at start and never more; it is rounded
	// up to a power of two.
	// The default remembers 32 engines' worth of about 32,000 blocks each,
	// the ~500,000 tokens of KV cache of an 80 GB GPU serving an 8B model
	// (the Inference Extension sizes its per-server LRU the same way).
	IndexEntries int `koanf:"index_entries"`
}

// defaultPrefixConfig returns the defaults documented on [PrefixConfig].
func defaultPrefixConfig() PrefixConfig {
	return PrefixConfig{BlockBytes: 64, MaxBlocks: 1024, IndexEntries: 1 << 20}
}

// Validate reports every problem with c, joined; each message starts with
// its key under routing.prefix.
func (c PrefixConfig) Validate() error {
	var errs []error
	if c.BlockBytes < 16 || c.BlockBytes > 65536 {
		errs = append(errs, fmt.Errorf("routing.prefix.block_bytes must be 16..65536, got %d", c.BlockBytes))
	}
	if c.MaxBlocks < 1 || c.MaxBlocks > 65536 {
		errs = append(errs, fmt.Errorf("routing.prefix.max_blocks must be 1..65536, got %d", c.MaxBlocks))
	}
	if c.IndexEntries < prefixWays || c.IndexEntries > 1<<28 {
		errs = append(errs, fmt.Errorf("routing.prefix.index_entries must be %d..%d, got %d", prefixWays, 1<<28, c.IndexEntries))
	}
	return errors.Join(errs...)
}

// PrefixIndex remembers which engines were recently sent which prompt
// blocks, so a policy can route a prompt to the engine most likely to hold
// its prefix in its KV cache. It is the gateway-side approximation of the
// engines' prefix caches that SGLang's cache-aware router keeps as a radix
// tree per worker and the Gateway API Inference Extension's prefix-cache
// scorer keeps as an LRU of block hashes per server; here it is one
// fixed-size table, so its memory is allocated once and never grows,
// whatever the traffic.
//
// An entry is (block hash, engine incarnation). The table is
// set-associative: a key maps to one bucket of 8 entries, and an insert into
// a full bucket replaces its least recently used entry, so the table as a
// whole approximates an LRU over every engine's blocks at a hard bound of
// 16 bytes per entry. Engines share the capacity in proportion to the
// traffic they are sent, which is how their own caches fill.
//
// All methods are safe for concurrent use and lock-free. Concurrent inserts
// into one bucket may overwrite each other's new entry; the index is a
// routing hint, and losing an entry costs at most one colder pick.
type PrefixIndex struct {
	buckets []prefixBucket
	mask    uint64
	clock   atomic.Uint64 // recency stamps
}

const prefixWays = 8

type prefixBucket [prefixWays]prefixEntry

type prefixEntry struct {
	key   atomic.Uint64 // 0: empty
	stamp atomic.Uint64
}

// PrefixEntryBytes is the memory one index entry takes, in bytes.
const PrefixEntryBytes = 16

// NewPrefixIndex returns an index of at least entries entries (rounded up
// to a power of two buckets of 8, so up to twice entries; at least one
// bucket), taking PrefixEntryBytes per entry, allocated now.
func NewPrefixIndex(entries int) *PrefixIndex {
	nb := 1
	for nb*prefixWays < entries {
		nb <<= 1
	}
	return &PrefixIndex{buckets: make([]prefixBucket, nb), mask: uint64(nb - 1)}
}

// Capacity returns the number of entries the index holds at most.
func (x *PrefixIndex) Capacity() int { return len(x.buckets) * prefixWays }

// Bytes returns the memory the index's table takes, in bytes (fixed).
func (x *PrefixIndex) Bytes() int { return x.Capacity() * PrefixEntryBytes }

// Len returns the number of entries in use (a scan of the table; for tests
// and status pages, not the request path).
func (x *PrefixIndex) Len() int {
	n := 0
	for i := range x.buckets {
		for j := range x.buckets[i] {
			if x.buckets[i][j].key.Load() != 0 {
				n++
			}
		}
	}
	return n
}

// entryKey combines a block hash with an engine incarnation; never 0.
func entryKey(block uint64, e *Endpoint) uint64 {
	k := stablehash.Mix64(block ^ e.id*0x9e3779b97f4a7c15)
	if k == 0 {
		k = 1
	}
	return k
}

func (x *PrefixIndex) bucket(k uint64) *prefixBucket {
	// The low bits pick the bucket; the key is already mixed.
	return &x.buckets[k&x.mask]
}

func (x *PrefixIndex) has(k uint64) bool {
	b := x.bucket(k)
	for i := range b {
		if b[i].key.Load() == k {
			return true
		}
	}
	return false
}

// Match returns how many leading blocks of hashes e was recently sent. The
// hashes are chained, so finding hashes[i] stored for e proves e was sent
// blocks 0..i: the answer is one more than the highest stored index. It is
// found by a binary search that treats a stored block as proof and a missing
// one as a probable end: Record stamps a prompt's first block as the most
// recent, so a prompt's blocks are mostly evicted from the end backwards, but
// eviction is per bucket, so a full index can have gaps. A missing block is
// therefore confirmed by the next two blocks before the search moves left,
// and the last block is probed first (a prompt seen whole before, the common
// case for a repeated prefix, costs one probe), then the first (an engine
// that lacks it is taken to have nothing, since a prompt's first block is
// evicted last; two probes for most candidates). The result never overstates
// what e was sent; a gap can make it understate. It does not allocate.
func (x *PrefixIndex) Match(hashes []uint64, e *Endpoint) int {
	n := len(hashes)
	if n == 0 {
		return 0
	}
	if x.has(entryKey(hashes[n-1], e)) {
		return n
	}
	if !x.has(entryKey(hashes[0], e)) {
		return 0 // the first block is evicted last: most engines cost two probes
	}
	lo, hi := 1, n-1 // blocks [0,lo) proven; [hi,n) probably absent
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		found := -1
		for k := mid; k < min(mid+3, hi); k++ {
			if x.has(entryKey(hashes[k], e)) {
				found = k
				break
			}
		}
		if found >= 0 {
			lo = found + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// Record notes that e was sent a prompt with these block hashes: each
// becomes e's most recently used entry, the first block most recent of all.
// It does not allocate.
func (x *PrefixIndex) Record(hashes []uint64, e *Endpoint) {
	if len(hashes) == 0 {
		return
	}
	top := x.clock.Add(uint64(len(hashes)))
	for i, h := range hashes {
		x.put(entryKey(h, e), top-uint64(i))
	}
}

// Forget removes the entries of these block hashes for e (the policies
// pass the blocks a pick recorded beyond those e already had), freeing
// them for new ones. Every copy goes: concurrent puts can rarely leave a
// key twice in a bucket. It does not allocate.
func (x *PrefixIndex) Forget(hashes []uint64, e *Endpoint) {
	for _, h := range hashes {
		k := entryKey(h, e)
		b := x.bucket(k)
		for i := range b {
			b[i].key.CompareAndSwap(k, 0)
		}
	}
}

func (x *PrefixIndex) put(k, stamp uint64) {
	b := x.bucket(k)
	free := -1
	for i := range b {
		switch b[i].key.Load() {
		case k:
			b[i].stamp.Store(stamp)
			return
		case 0:
			if free < 0 {
				free = i
			}
		}
	}
	if free < 0 { // full: replace the least recently used
		oldest := uint64(1<<64 - 1)
		for i := range b {
			if s := b[i].stamp.Load(); s < oldest {
				free, oldest = i, s
			}
		}
	}
	b[free].stamp.Store(stamp)
	b[free].key.Store(k)
}
