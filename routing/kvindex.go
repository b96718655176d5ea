package routing

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchboard-gw/switchboard/internal/kvevents"
	"github.com/switchboard-gw/switchboard/internal/stablehash"
)

// KVIndexConfig bounds a [KVIndex] (config section kv_events.index, and
// kv_events.stale_after). The gateway validates it; [NewKVIndex] replaces
// a non-positive MaxBlocks, StaleAfter or SpeculativeEntries by its
// default.
type KVIndexConfig struct {
	// MaxBlocks is the most blocks held per engine, 1..2^24, default
	// 262144 (8 times the ~32,000 blocks of 16 tokens an 80 GB GPU holds
	// for an 8B model, so the engine's own BlockRemoved events, not this
	// bound, normally decide what is held). A store beyond it evicts the
	// engine's least recently stored or touched block. It takes
	// [KVEntryBytes] per block held.
	MaxBlocks int
	// SpeculativeTTL is how long a speculative entry lives ([KVIndex.Speculate]),
	// 0..1m, default 2s (llm-d's and vllm-project/router's speculative
	// TTL); 0 turns speculation off.
	SpeculativeTTL time.Duration
	// StaleAfter is how long an engine may stay silent after it was sent
	// blocks it did not hold before it stops being [KVIndex.Fresh], > 0,
	// default 10s.
	StaleAfter time.Duration
	// SpeculativeEntries is the capacity of the speculative table shared by
	// all engines, 8..2^28, default 65536, rounded up to a power of two;
	// it takes 16 bytes per entry, allocated at start.
	SpeculativeEntries int
}

// DefaultKVIndexConfig returns the defaults documented on [KVIndexConfig].
func DefaultKVIndexConfig() KVIndexConfig {
	return KVIndexConfig{MaxBlocks: 1 << 18, SpeculativeTTL: 2 * time.Second, StaleAfter: 10 * time.Second,
		SpeculativeEntries: 1 << 16}
}

// Validate reports every problem with c, joined; each message starts with
// its key (kv_events.index.<key> or kv_events.stale_after).
func (c KVIndexConfig) Validate() error {
	var errs []error
	if c.MaxBlocks < 1 || c.MaxBlocks > kvMaxBlocks {
		errs = append(errs, fmt.Errorf("kv_events.index.max_blocks must be 1..%d, got %d", kvMaxBlocks, c.MaxBlocks))
	}
	if c.SpeculativeTTL < 0 || c.SpeculativeTTL > time.Minute {
		errs = append(errs, fmt.Errorf("kv_events.index.speculative_ttl must be 0s..1m, got %v", c.SpeculativeTTL))
	}
	if c.StaleAfter <= 0 {
		errs = append(errs, fmt.Errorf("kv_events.stale_after must be > 0, got %v", c.StaleAfter))
	}
	if c.SpeculativeEntries < prefixWays || c.SpeculativeEntries > 1<<28 {
		errs = append(errs, fmt.Errorf("kv_events.index.speculative_entries must be %d..%d, got %d",
			prefixWays, 1<<28, c.SpeculativeEntries))
	}
	return errors.Join(errs...)
}

// kvMaxBlocks is the largest MaxBlocks: slab indexes are int32.
const kvMaxBlocks = 1 << 24

// KVEntryBytes is the memory one block held by one engine takes in a
// [KVIndex], in bytes: its slab entry (32), its engine-hash map slot and
// its own-key table slot, with the tables' slack. Measured as heap growth
// per block of one engine filled to the default MaxBlocks (262144), Go
// 1.26 linux/amd64, with
//
//	go test -run '^$' -bench 'KVIndexBytes/slab' -benchtime 3x ./routing/
//
// (its B/entry metric: 84.08).
const KVEntryBytes = 84

// kvSpecEntryBytes is the memory of one speculative table entry.
const kvSpecEntryBytes = 16

// KVIndex is the precise prefix index: which engine holds which prompt
// blocks in its KV cache, learned from the engines' own KV-cache events
// (vLLM's BlockStored, BlockRemoved and AllBlocksCleared, decoded by
// internal/kvevents), where [PrefixIndex] guesses from what it routed.
//
// # Keys
//
// Blocks are keyed by the gateway's own chained block keys
// ([stablehash.TokenBlocks] over token ids), which the request side can
// compute from a prompt's tokens; the engines' own hashes cannot be
// reproduced outside vLLM (pickle and a random per-process seed). A
// BlockStored event's key chain is seeded with the own key of its parent
// block, found through the engine's engine-hash -> own-key map, or, for a
// chain's first block, 0 for the base model and stablehash.String of the
// adapter's name for a LoRA adapter. llm-d (pkg/kvevents) and Dynamo
// (kv_router) index the same way. Extra keys (cache_salt, multimodal
// identifiers) are not part of the own key, so two engine hashes may share
// one; own keys are reference counted.
//
// # Data structure
//
// Per engine, under the engine's mutex, its single writer (the engine's
// subscriber calling Apply) keeps a slab of entries (engine hash, own key,
// media bitmask, intrusive LRU links as int32 slab indexes) and a Go map
// engine hash -> slab index; and it publishes the set of own keys it holds
// in an open-addressing table of atomic words that Match reads without a
// lock. Match takes no lock and does not allocate: it finds the engine's
// state in a copy-on-write table by Endpoint id, then probes the own-key
// table (one cache line per probe). Speculative entries live in one
// shared, fixed-size, lock-free set-associative table like
// [PrefixIndex]'s, stamped with their expiry.
//
// kvindex_bench_test.go measures the choice against the textbook
// alternative, a map engine hash -> container/list element plus a map own
// key -> references under a sync.RWMutex that Match read-locks (engines
// found as cheaply in both). ns/op, median (fastest) of 5 runs; Go 1.26,
// linux/amd64, 2 cores shared with other work, so the spread is wide:
//
//	                                    slab + atomic table   list + RWMutex
//	Match, 8 candidates x 256 keys      272 (267), 0 allocs   494 (474), 0 allocs
//	Match, 64 candidates x 256 keys     2551 (2469), 0 allocs 4815 (4573), 0 allocs
//	  the same, every one speculating   3490 (3163), 0 allocs
//	Match, 64 candidates, parallel      3058 (2324), 0 allocs 6831 (4446), 0 allocs
//	store + remove one block            195 (180), 0 allocs   422 (418), 2 allocs
//	bytes per block held                84                    144
//
// Match is about 2x faster alone and under concurrent requests (where the
// RWMutex's reader count is one contended cache line), and the slab takes
// 40% less memory and no allocation per block (10 B/op amortized: the
// own-key table's rebuilds). Apply through the API (BlockStored events of
// 16 blocks of 16 tokens, own keys hashed, and as many blocks removed,
// 65536 held) costs 135 (127) ns per block, 0 allocs/op.
//
// # Gaps
//
// Match assumes that what e holds of a chain is a prefix of it: vLLM frees
// a request's blocks from the end of its prefix first, so its evictions
// keep that shape, and the index's own LRU bound keeps it by stamping a
// stored chain's first block (and the parent it extends) as the most
// recent. When a gap does occur, Match may count blocks past it.
//
// All methods are safe for concurrent use. Apply must be called by one
// goroutine per engine at a time (its subscriber); Drop and Forget may be
// called from any goroutine.
type KVIndex struct {
	cfg  KVIndexConfig
	seed uint64 // per-process placement seed of the own-key tables

	mu      sync.Mutex                // serializes changes to engines
	engines atomic.Pointer[kvEngines] // copy-on-write
	spec    []prefixBucket            // speculative (key, engine) -> expiry; nil if off
	mask    uint64
	clock   func() time.Time // for Stats; tests replace it
}

// kvEngines is the set of engines with state, immutable once published:
// an open-addressing table by Endpoint.id (numbered in sequence, so the
// low bits place them without collisions among recent incarnations): a
// Go map lookup was a third of Match's time in a CPU profile of
// BenchmarkKVIndexMatch at 64 candidates.
type kvEngines struct {
	slots []*kvEngine
	mask  uint64
	n     int
}

func newKVEngines(list []*kvEngine) *kvEngines {
	size := 8
	for size < 2*len(list) {
		size <<= 1
	}
	t := &kvEngines{slots: make([]*kvEngine, size), mask: uint64(size - 1), n: len(list)}
	for _, s := range list {
		i := s.id & t.mask
		for t.slots[i] != nil {
			i = (i + 1) & t.mask
		}
		t.slots[i] = s
	}
	return t
}

func (t *kvEngines) get(id uint64) *kvEngine {
	for i := id & t.mask; ; i = (i + 1) & t.mask {
		s := t.slots[i]
		if s == nil || s.id == id {
			return s
		}
	}
}

// all returns the engines in a new slice.
func (t *kvEngines) all() []*kvEngine {
	out := make([]*kvEngine, 0, t.n+1)
	for _, s := range t.slots {
		if s != nil {
			out = append(out, s)
		}
	}
	return out
}

// kvEngine is one engine's state.
type kvEngine struct {
	id      uint64       // Endpoint.id
	synced  atomic.Bool  // an Apply was seen since the state was created or dropped
	pending atomic.Int64 // unix nanos since new blocks are awaited, 0 = none
	hold    atomic.Int64 // unix nanos before which e is not fresh: a Drop's now + StaleAfter
	spec    atomic.Int64 // latest expiry of e's speculative entries, unix nanos
	keys    atomic.Pointer[kvKeyTable]

	mu      sync.Mutex // guards the rest; held by Apply, Drop, Forget, stats
	byHash  map[kvevents.Hash]int32
	slab    []kvBlock
	free    int32 // free slab list, through next; -1 = empty
	head    int32 // most recently stored or touched; -1 = empty
	tail    int32 // least recently; -1 = empty
	live    int
	scratch []uint64 // own keys of the event being applied
}

// kvBlock is one engine hash held by an engine.
type kvBlock struct {
	hash       kvevents.Hash
	own        uint64
	prev, next int32
	media      uint8 // bit per medium holding it (kvMedium); 0 = free slot
}

// NewKVIndex returns an empty index bounded by cfg, with its speculative
// table (16 bytes x SpeculativeEntries rounded up) allocated now when
// SpeculativeTTL > 0.
func NewKVIndex(cfg KVIndexConfig) *KVIndex {
	def := DefaultKVIndexConfig()
	if cfg.MaxBlocks <= 0 {
		cfg.MaxBlocks = def.MaxBlocks
	}
	cfg.MaxBlocks = min(cfg.MaxBlocks, kvMaxBlocks)
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = def.StaleAfter
	}
	if cfg.SpeculativeEntries <= 0 {
		cfg.SpeculativeEntries = def.SpeculativeEntries
	}
	cfg.SpeculativeEntries = min(cfg.SpeculativeEntries, 1<<28)
	x := &KVIndex{cfg: cfg, seed: rand.Uint64(), clock: time.Now}
	if cfg.SpeculativeTTL > 0 {
		nb := 1
		for nb*prefixWays < cfg.SpeculativeEntries {
			nb <<= 1
		}
		x.spec, x.mask = make([]prefixBucket, nb), uint64(nb-1)
	}
	x.engines.Store(newKVEngines(nil))
	return x
}

// engine returns e's state, or nil.
func (x *KVIndex) engine(e *Endpoint) *kvEngine {
	if e == nil {
		return nil
	}
	return x.engines.Load().get(e.id)
}

// engineOrNew returns e's state, creating it (not synced) if needed.
func (x *KVIndex) engineOrNew(e *Endpoint) *kvEngine {
	if s := x.engine(e); s != nil {
		return s
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.engines.Load()
	if s := old.get(e.id); s != nil {
		return s
	}
	s := &kvEngine{id: e.id, free: -1, head: -1, tail: -1, byHash: map[kvevents.Hash]int32{}}
	s.keys.Store(newKVKeyTable(kvKeyTableMin, x.seed))
	x.engines.Store(newKVEngines(append(old.all(), s)))
	return s
}

// KVApplied counts what one [KVIndex.Apply] did.
type KVApplied struct {
	// Stored is the number of blocks of applied BlockStored events (a
	// block already held, maybe on another medium, counts again).
	Stored int
	// Removed is the number of blocks that BlockRemoved events made the
	// engine stop holding (on every medium).
	Removed int
	// Orphans is the number of BlockStored events skipped because their
	// parent block is unknown (stored before the index started, or
	// evicted from it), or because their adapter is named only by the
	// deprecated lora_id, so their own keys cannot be computed.
	Orphans int
	// Cleared is the number of AllBlocksCleared events.
	Cleared int
}

// Apply applies one of e's event batches, in order, at now, and marks e
// synced with nothing pending ([KVIndex.Fresh]); it creates e's state on
// first use. It must be called by one goroutine per engine at a time (the
// engine's subscriber), and may run concurrently with every other method.
// It allocates only to grow its tables, and to rebuild its own-key table
// when deleted keys fill a quarter of it (readers may still be probing the
// old one, so it is not rebuilt in place): amortized, well under one
// allocation per event.
//
// Events of a KV-cache group other than 0 (GroupIdx > 0: hybrid models'
// sliding-window or Mamba groups) are ignored. vLLM's hybrid coordinator
// (HybridKVCacheCoordinator.find_longest_cache_hit in
// vllm/v1/core/kv_cache_coordinator.py) takes the shortest hit over its
// attention types, full attention first as the downward-closed bound, so
// a block is usable only if the full-attention group holds it; group 0
// (or -1 when the engine sends no group) is taken to be that group. The
// other groups are not checked, so for a hybrid model Match can overstate
// (a sliding-window group missing its last window); choosing the group by
// the event's SpecKind ("full_attention") would be a refinement. Media (vLLM's Medium:
// "GPU", "" meaning GPU, "CPU" with KV offloading, or another tier) are
// tracked per block, so a block removed from one medium stays held while
// another has it. now is unused by the current rules (a batch is a sign
// of life whenever it comes); it is part of the signature for symmetry
// with the request side.
func (x *KVIndex) Apply(e *Endpoint, b *kvevents.Batch, now time.Time) KVApplied {
	var r KVApplied
	if e == nil {
		return r
	}
	s := x.engineOrNew(e)
	s.mu.Lock()
	if b != nil {
		for i := range b.Events {
			x.applyEvent(s, e, &b.Events[i], &r)
		}
	}
	// Under the lock, so that a Drop from another goroutine is not
	// overwritten.
	s.pending.Store(0)
	s.synced.Store(true)
	s.mu.Unlock()
	return r
}

func (x *KVIndex) applyEvent(s *kvEngine, e *Endpoint, ev *kvevents.Event, r *KVApplied) {
	if ev.GroupIdx > 0 {
		return
	}
	switch ev.Kind {
	case kvevents.BlockStored:
		parent := int32(-1)
		var seed uint64
		switch {
		case ev.HasParent:
			p, ok := s.byHash[ev.ParentBlockHash]
			if !ok {
				r.Orphans++
				return
			}
			parent, seed = p, s.slab[p].own
		case ev.LoRAName != "":
			seed = stablehash.String(ev.LoRAName)
		case ev.LoRAID >= 0:
			r.Orphans++ // an adapter without its name: its seed is unknown
			return
		}
		s.scratch = stablehash.TokenBlocks(s.scratch[:0], ev.TokenIDs, ev.BlockSize, seed)
		n := min(len(s.scratch), len(ev.BlockHashes))
		bit := kvMedium(ev.Medium)
		// Last block first, so the chain's first block ends most recent
		// and the LRU bound evicts a chain from its end, as vLLM does.
		for i := n - 1; i >= 0; i-- {
			x.store(s, ev.BlockHashes[i], s.scratch[i], bit)
		}
		if parent >= 0 && s.slab[parent].media != 0 && s.slab[parent].hash == ev.ParentBlockHash { // not evicted meanwhile
			s.touch(parent)
		}
		r.Stored += n
	case kvevents.BlockRemoved:
		bit := kvMedium(ev.Medium)
		for _, h := range ev.BlockHashes {
			i, ok := s.byHash[h]
			if !ok {
				continue
			}
			if s.slab[i].media &^= bit; s.slab[i].media == 0 {
				// The engine says it no longer holds the block: a
				// speculation that it would is over too.
				x.unspec(s.slab[i].own, e)
				s.remove(i)
				r.Removed++
			}
		}
	case kvevents.AllBlocksCleared:
		x.clear(s)
		r.Cleared++
	}
}

// kvMedium returns the bit of a medium: GPU (or none) 1, CPU 2, any other
// tier one of the six others by its name's hash.
func kvMedium(m string) uint8 {
	switch m {
	case "", "GPU":
		return 1
	case "CPU":
		return 2
	}
	return 4 << (stablehash.String(m) % 6)
}

// store makes s hold engine hash h with own key own on the media bit, as
// its most recent block, evicting the least recent one at MaxBlocks.
func (x *KVIndex) store(s *kvEngine, h kvevents.Hash, own uint64, bit uint8) {
	if i, ok := s.byHash[h]; ok {
		b := &s.slab[i]
		b.media |= bit
		if b.own != own { // cannot happen with vLLM's hashes; keep the map exact anyway
			s.keys.Load().unref(b.own)
			b.own = own
			s.ref(own)
		}
		s.touch(i)
		return
	}
	if s.live >= x.cfg.MaxBlocks {
		s.remove(s.tail)
	}
	i := s.free
	if i >= 0 {
		s.free = s.slab[i].next
	} else {
		if len(s.slab) == cap(s.slab) {
			grown := make([]kvBlock, len(s.slab), min(max(2*cap(s.slab), 64), x.cfg.MaxBlocks))
			copy(grown, s.slab)
			s.slab = grown
		}
		i = int32(len(s.slab))
		s.slab = s.slab[:i+1]
	}
	s.slab[i] = kvBlock{hash: h, own: own, prev: -1, next: -1, media: bit}
	s.byHash[h] = i
	s.ref(own)
	s.pushFront(i)
	s.live++
}

// ref adds a reference to own in the published table, growing or
// rebuilding it first when it is 3/4 used.
func (s *kvEngine) ref(own uint64) {
	t := s.keys.Load()
	if t.used+1 > len(t.keys)/4*3 {
		t = t.rebuild(kvKeyTableSize(t.live + 1))
		s.keys.Store(t)
	}
	t.ref(own)
}

// remove frees slab entry i.
func (s *kvEngine) remove(i int32) {
	b := &s.slab[i]
	delete(s.byHash, b.hash)
	s.keys.Load().unref(b.own)
	s.unlink(i)
	*b = kvBlock{next: s.free}
	s.free = i
	s.live--
}

func (s *kvEngine) pushFront(i int32) {
	b := &s.slab[i]
	b.prev, b.next = -1, s.head
	if s.head >= 0 {
		s.slab[s.head].prev = i
	}
	s.head = i
	if s.tail < 0 {
		s.tail = i
	}
}

func (s *kvEngine) unlink(i int32) {
	b := &s.slab[i]
	if b.prev >= 0 {
		s.slab[b.prev].next = b.next
	} else {
		s.head = b.next
	}
	if b.next >= 0 {
		s.slab[b.next].prev = b.prev
	} else {
		s.tail = b.prev
	}
}

func (s *kvEngine) touch(i int32) {
	if s.head != i {
		s.unlink(i)
		s.pushFront(i)
	}
}

// clear forgets every block of s, releasing its memory. s.mu is held.
func (x *KVIndex) clear(s *kvEngine) {
	s.byHash = map[kvevents.Hash]int32{}
	s.slab, s.free, s.head, s.tail, s.live = nil, -1, -1, -1, 0
	s.keys.Store(newKVKeyTable(kvKeyTableMin, x.seed))
}

// Drop forgets every block e holds, because what it holds is no longer
// known (a sequence gap that could not be replayed, a publisher restart):
// e is not [KVIndex.Fresh] until its next Apply and for StaleAfter from
// now, while its events rebuild what it holds (a conversation's blocks
// stored before the loss have parents the index no longer knows, so their
// successors are skipped as orphans meanwhile). It keeps e's state, so its
// speculation and staleness go on. An engine without state is left
// without.
func (x *KVIndex) Drop(e *Endpoint, now time.Time) {
	s := x.engine(e)
	if s == nil {
		return
	}
	s.mu.Lock()
	s.synced.Store(false)
	s.hold.Store(now.UnixNano() + int64(x.cfg.StaleAfter))
	x.clear(s)
	s.mu.Unlock()
}

// Reset forgets every block e holds because its cache is empty: a new
// engine process (its events' sequence started again). Unlike [KVIndex.Drop]
// nothing is unknown, so e is fresh again at its next Apply. An engine
// without state is left without.
func (x *KVIndex) Reset(e *Endpoint) {
	s := x.engine(e)
	if s == nil {
		return
	}
	s.mu.Lock()
	s.synced.Store(false)
	x.clear(s)
	s.mu.Unlock()
}

// Forget frees all of e's state: e left the fleet. Its speculative entries
// stay in the shared table until they expire or are replaced, unused. Call
// it after e's subscriber has stopped: an Apply after it creates new state.
func (x *KVIndex) Forget(e *Endpoint) {
	if e == nil {
		return
	}
	x.mu.Lock()
	old := x.engines.Load()
	s := old.get(e.id)
	if s != nil {
		rest := old.all()
		rest = slices.DeleteFunc(rest, func(v *kvEngine) bool { return v == s })
		x.engines.Store(newKVEngines(rest))
	}
	x.mu.Unlock()
	if s != nil {
		s.mu.Lock()
		s.synced.Store(false)
		x.clear(s)
		s.scratch = nil
		s.mu.Unlock()
	}
}

// Match returns how many leading keys of keys e holds at now: stored by
// its events, or speculative and unexpired ([KVIndex.Speculate]). An
// engine without state (no Apply yet, or forgotten) holds none. Keys are
// chained, so a held key i stands for keys 0..i: the last key is probed
// first (a prefix held whole costs one probe), then the first (an engine
// without the prefix costs two), then a binary search finds the end of
// the held prefix (see Gaps on [KVIndex]). The stored blocks are searched
// first; when e has unexpired speculative entries the prefix is then
// extended through them the same way (Speculate records what follows the
// stored prefix). It takes no lock and does not allocate.
func (x *KVIndex) Match(keys []uint64, e *Endpoint, now time.Time) int {
	s := x.engine(e)
	if s == nil || len(keys) == 0 {
		return 0
	}
	nowNs := now.UnixNano()
	spec := x.spec != nil && s.spec.Load() > nowNs
	return x.match(s.keys.Load(), keys, e, nowNs, spec)
}

// MatchStored is Match without speculative entries: how many leading keys
// e reported storing in its events, what a prediction of the engine's
// cached tokens rests on. It takes no lock and does not allocate.
func (x *KVIndex) MatchStored(keys []uint64, e *Endpoint) int {
	s := x.engine(e)
	if s == nil || len(keys) == 0 {
		return 0
	}
	return x.prefix(s.keys.Load(), keys, 0, e, 0, false)
}

// Unspeculate removes e's speculative entries for keys: the request
// [KVIndex.Speculate] noted them for went elsewhere (its attempt on e
// failed before e saw it). It does not allocate.
func (x *KVIndex) Unspeculate(keys []uint64, e *Endpoint) {
	for _, k := range keys {
		x.unspec(k, e)
	}
}

// match is Match on table t, with speculative entries if spec.
func (x *KVIndex) match(t *kvKeyTable, keys []uint64, e *Endpoint, nowNs int64, spec bool) int {
	m := x.prefix(t, keys, 0, e, nowNs, false)
	if spec && m < len(keys) {
		// Speculate recorded what follows the stored blocks: the held
		// prefix goes on through speculative entries, searched alone, so a
		// candidate with speculation costs two more probes, not twice as
		// many.
		m = x.prefix(t, keys, m, e, nowNs, true)
	}
	return m
}

// prefix returns the end of the held run of keys that starts at from
// (keys[:from] are known held): of stored keys, or if spec of unexpired
// speculative entries of e.
func (x *KVIndex) prefix(t *kvKeyTable, keys []uint64, from int, e *Endpoint, nowNs int64, spec bool) int {
	n := len(keys)
	if from >= n || x.held(t, keys[n-1], e, nowNs, spec) {
		return n
	}
	if !x.held(t, keys[from], e, nowNs, spec) {
		return from
	}
	lo, hi := from+1, n-1 // keys[:lo] held; keys[hi] not
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if x.held(t, keys[mid], e, nowNs, spec) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// held reports whether e holds k: stored in t, or if spec speculative.
func (x *KVIndex) held(t *kvKeyTable, k uint64, e *Endpoint, nowNs int64, spec bool) bool {
	if !spec {
		return t.has(k)
	}
	ek := entryKey(k, e)
	b := &x.spec[ek&x.mask]
	for i := range b {
		if b[i].key.Load() == ek && int64(b[i].stamp.Load()) > nowNs {
			return true
		}
	}
	return false
}

// Speculate notes that e was just picked for a prompt with these keys, at
// now: until now+SpeculativeTTL, Match counts the keys e does not hold yet
// as held, so a burst of requests with one prefix stays on one engine
// before its events arrive (llm-d and vLLM's router do the same, with a
// TTL of about 2s). The speculative table is shared and bounded: a full
// bucket replaces its entry closest to expiry, so under pressure an entry
// can go early. It also starts the staleness clock ([KVIndex.Fresh]): when
// e's stored blocks (speculative ones aside: they are what is awaited) do
// not cover keys, e now owes events, unless it already did. An engine
// without state is ignored. It does not allocate.
func (x *KVIndex) Speculate(keys []uint64, e *Endpoint, now time.Time) {
	s := x.engine(e)
	if s == nil || len(keys) == 0 {
		return
	}
	nowNs := now.UnixNano()
	m := x.match(s.keys.Load(), keys, e, nowNs, false)
	if m == len(keys) {
		return
	}
	if s.pending.Load() == 0 {
		s.pending.CompareAndSwap(0, max(nowNs, 1))
	}
	if x.spec == nil {
		return
	}
	exp := nowNs + int64(x.cfg.SpeculativeTTL)
	for {
		old := s.spec.Load()
		if old >= exp || s.spec.CompareAndSwap(old, exp) {
			break
		}
	}
	for _, k := range keys[m:] {
		x.putSpec(entryKey(k, e), exp)
	}
}

// unspec removes the speculative entry of key k on e, if any (every copy:
// concurrent puts can rarely leave one twice in a bucket).
func (x *KVIndex) unspec(k uint64, e *Endpoint) {
	if x.spec == nil {
		return
	}
	ek := entryKey(k, e)
	b := &x.spec[ek&x.mask]
	for i := range b {
		b[i].key.CompareAndSwap(ek, 0)
	}
}

// putSpec stores speculative entry k expiring at exp: in place, else in
// the bucket's empty slot or over its entry closest to expiry (an expired
// one first).
func (x *KVIndex) putSpec(k uint64, exp int64) {
	b := &x.spec[k&x.mask]
	slot, soonest := 0, int64(1<<63-1)
	for i := range b {
		st := int64(0) // an empty slot goes first
		switch b[i].key.Load() {
		case k:
			if int64(b[i].stamp.Load()) < exp {
				b[i].stamp.Store(uint64(exp))
			}
			return
		case 0:
		default:
			st = int64(b[i].stamp.Load())
		}
		if st < soonest {
			slot, soonest = i, st
		}
	}
	b[slot].stamp.Store(uint64(exp))
	b[slot].key.Store(k)
}

// Fresh reports whether e's blocks can be trusted at now: e has state, an
// Apply was seen since that state was created or last dropped, and e does
// not owe events for longer than StaleAfter (a [KVIndex.Speculate] of keys
// it did not hold, with no Apply since). vLLM publishes only when blocks
// change, so an idle engine is silent and fresh; one that was sent new
// blocks and published nothing for StaleAfter has stopped publishing.
func (x *KVIndex) Fresh(e *Endpoint, now time.Time) bool {
	s := x.engine(e)
	return s != nil && x.fresh(s, now.UnixNano())
}

func (x *KVIndex) fresh(s *kvEngine, nowNs int64) bool {
	if !s.synced.Load() || nowNs < s.hold.Load() {
		return false
	}
	p := s.pending.Load()
	return p == 0 || nowNs-p <= int64(x.cfg.StaleAfter)
}

// KVIndexStats is a summary of a [KVIndex], for status pages and metrics.
type KVIndexStats struct {
	// Engines is the number of engines with state; Stale how many of
	// them are not Fresh now.
	Engines, Stale int
	// Blocks is the number of (engine hash, engine) blocks held.
	Blocks int
	// Speculative is the number of unexpired speculative entries.
	Speculative int
	// Bytes is the memory the index takes: Blocks x [KVEntryBytes] plus
	// the speculative table's fixed 16 bytes per entry.
	Bytes int64
}

// Stats returns a summary at the current time, taking each engine's lock
// in turn and scanning the speculative table: not for the request path.
func (x *KVIndex) Stats() KVIndexStats {
	nowNs := x.clock().UnixNano()
	var st KVIndexStats
	for _, s := range x.engines.Load().all() {
		st.Engines++
		if !x.fresh(s, nowNs) {
			st.Stale++
		}
		s.mu.Lock()
		st.Blocks += s.live
		s.mu.Unlock()
	}
	for i := range x.spec {
		for j := range x.spec[i] {
			if x.spec[i][j].key.Load() != 0 && int64(x.spec[i][j].stamp.Load()) > nowNs {
				st.Speculative++
			}
		}
	}
	st.Bytes = int64(st.Blocks)*KVEntryBytes + int64(len(x.spec))*prefixWays*kvSpecEntryBytes
	return st
}

// EngineStats returns how many blocks e holds and whether it is Fresh at
// now; ok is false when e has no state.
func (x *KVIndex) EngineStats(e *Endpoint, now time.Time) (blocks int, fresh bool, ok bool) {
	s := x.engine(e)
	if s == nil {
		return 0, false, false
	}
	s.mu.Lock()
	blocks = s.live
	s.mu.Unlock()
	return blocks, x.fresh(s, now.UnixNano()), true
}

// kvKeyTable is the set of own keys an engine holds, as Match reads it: an
// open-addressing table with linear probing of atomic words, 0 for an
// empty slot and 1 for a deleted one (own keys 0 and 1 are stored as 2 and
// 3), placed by Fibonacci hashing of the key xor a per-process seed (own
// keys come from prompts, so their placement must not be predictable).
// The engine's writer changes it in place under the engine's lock (a
// probe chain never breaks: a deleted key leaves a tombstone) and replaces
// it by a rebuilt copy when 3/4 of its slots are used; readers hold a
// consistent table either way. A key held more than once (two engine
// hashes with one own key: extra keys such as cache_salt differ) has its
// extra references in multi, so a slot is one word and a probe one cache
// line. multi, live and used are the writer's.
type kvKeyTable struct {
	keys        []atomic.Uint64
	seed        uint64
	shift, mask uint64
	multi       map[uint64]int32 // references beyond the first, by slot key
	live, used  int
}

const kvKeyTableMin = 64

func newKVKeyTable(size int, seed uint64) *kvKeyTable {
	shift := uint64(64)
	for n := size; n > 1; n >>= 1 {
		shift--
	}
	return &kvKeyTable{keys: make([]atomic.Uint64, size), seed: seed, shift: shift, mask: uint64(size - 1)}
}

// kvKeyTableSize is the size of a table for live keys: a power of two at
// least twice live.
func kvKeyTableSize(live int) int {
	n := kvKeyTableMin
	for n < 2*live {
		n <<= 1
	}
	return n
}

func kvSlotKey(k uint64) uint64 {
	if k < 2 {
		k += 2
	}
	return k
}

// slot is the first slot of slot key k's probe chain.
func (t *kvKeyTable) slot(k uint64) uint64 { return ((k ^ t.seed) * 0x9e3779b97f4a7c15) >> t.shift }

// has reports whether k is in t. It does not allocate.
func (t *kvKeyTable) has(k uint64) bool {
	k = kvSlotKey(k)
	for i := t.slot(k); ; i = (i + 1) & t.mask {
		switch t.keys[i].Load() {
		case k:
			return true
		case 0:
			return false
		}
	}
}

// ref adds a reference to k; t has a free slot.
func (t *kvKeyTable) ref(k uint64) {
	k = kvSlotKey(k)
	tomb := -1
	for i := t.slot(k); ; i = (i + 1) & t.mask {
		switch t.keys[i].Load() {
		case k:
			if t.multi == nil {
				t.multi = map[uint64]int32{}
			}
			t.multi[k]++
			return
		case 1:
			if tomb < 0 {
				tomb = int(i)
			}
		case 0:
			if tomb < 0 {
				tomb = int(i)
				t.used++
			}
			t.keys[tomb].Store(k)
			t.live++
			return
		}
	}
}

// unref drops a reference to k, deleting it at none.
func (t *kvKeyTable) unref(k uint64) {
	k = kvSlotKey(k)
	if n, ok := t.multi[k]; ok {
		if n <= 1 {
			delete(t.multi, k)
		} else {
			t.multi[k] = n - 1
		}
		return
	}
	for i := t.slot(k); ; i = (i + 1) & t.mask {
		switch t.keys[i].Load() {
		case k:
			t.keys[i].Store(1)
			t.live--
			return
		case 0:
			return
		}
	}
}

// rebuild returns a copy of t's live keys in a new table of size slots.
func (t *kvKeyTable) rebuild(size int) *kvKeyTable {
	n := newKVKeyTable(size, t.seed)
	n.multi = t.multi // the writer's; t is not written again
	for i := range t.keys {
		k := t.keys[i].Load()
		if k < 2 {
			continue
		}
		j := n.slot(k)
		for n.keys[j].Load() != 0 {
			j = (j + 1) & n.mask
		}
		n.keys[j].Store(k)
		n.live++
		n.used++
	}
	return n
}
