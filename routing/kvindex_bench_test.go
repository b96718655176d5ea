package routing

// These benchmarks justify KVIndex's data structure: a per-engine slab with
// intrusive int32 LRU links and a Go map engine hash -> slab index, written
// under the engine's mutex, publishing its own keys in a lock-free
// open-addressing table of atomic words (variant "slab"), against the
// textbook alternative: a map engine hash -> container/list element and a
// map own key -> references under a sync.RWMutex that Match read-locks
// (variant "list"). Run with
//
//	go test -run '^$' -bench 'KVIndex' -benchmem ./routing/
//	go test -run '^$' -bench 'KVIndexBytes' -benchtime 3x ./routing/
//
// The numbers are summarized on KVIndex.

import (
	"container/list"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/kvevents"
	"github.com/switchboard-gw/switchboard/internal/stablehash"
)

// kvListEngine is the alternative per-engine state.
type kvListEngine struct {
	mu     sync.RWMutex
	byHash map[kvevents.Hash]*list.Element // of *kvListBlock
	refs   map[uint64]int32
	lru    list.List // front: most recent
	max    int
}

type kvListBlock struct {
	hash  kvevents.Hash
	own   uint64
	media uint8
}

func newKVListEngine(maxBlocks int) *kvListEngine {
	return &kvListEngine{byHash: map[kvevents.Hash]*list.Element{}, refs: map[uint64]int32{}, max: maxBlocks}
}

// store is KVIndex.store's counterpart; s.mu is held for writing.
func (s *kvListEngine) store(h kvevents.Hash, own uint64, bit uint8) {
	if el, ok := s.byHash[h]; ok {
		el.Value.(*kvListBlock).media |= bit
		s.lru.MoveToFront(el)
		return
	}
	if s.lru.Len() >= s.max {
		s.drop(s.lru.Back())
	}
	s.byHash[h] = s.lru.PushFront(&kvListBlock{hash: h, own: own, media: bit})
	s.refs[own]++
}

func (s *kvListEngine) remove(h kvevents.Hash, bit uint8) {
	if el, ok := s.byHash[h]; ok {
		b := el.Value.(*kvListBlock)
		if b.media &^= bit; b.media == 0 {
			s.drop(el)
		}
	}
}

func (s *kvListEngine) drop(el *list.Element) {
	b := s.lru.Remove(el).(*kvListBlock)
	delete(s.byHash, b.hash)
	if s.refs[b.own]--; s.refs[b.own] <= 0 {
		delete(s.refs, b.own)
	}
}

// match is KVIndex.match's search over the read-locked refs map.
func (s *kvListEngine) match(keys []uint64) int {
	n := len(keys)
	if n == 0 {
		return 0
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	has := func(k uint64) bool { _, ok := s.refs[k]; return ok }
	if has(keys[n-1]) {
		return n
	}
	if !has(keys[0]) {
		return 0
	}
	lo, hi := 1, n-1
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if has(keys[mid]) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// kvListIndex finds engines at least as cheaply as KVIndex does: by
// Endpoint.id in a dense slice (ids are sequential in the benchmarks), so
// the comparison is of the per-engine structures.
type kvListIndex struct {
	first   uint64
	engines atomic.Pointer[[]*kvListEngine]
}

func (x *kvListIndex) engine(e *Endpoint) *kvListEngine {
	all := *x.engines.Load()
	if i := e.id - x.first; i < uint64(len(all)) {
		return all[i]
	}
	return nil
}

func (x *kvListIndex) Match(keys []uint64, e *Endpoint) int {
	s := x.engine(e)
	if s == nil {
		return 0
	}
	return s.match(keys)
}

// kvBenchFleet returns n endpoints of which candidate i holds the first
// (i*37)%257 of 256 keys (0..256: a spread of none, partial and whole
// prefixes), in a KVIndex and in the alternative.
func kvBenchFleet(n int) (*KVIndex, *kvListIndex, []*Endpoint, []uint64) {
	const blocks = 256
	tokens := kvTokens(7, blocks)
	keys := stablehash.TokenBlocks(nil, tokens, kvBS, 0)
	x := NewKVIndex(DefaultKVIndexConfig())
	alt := &kvListIndex{}
	var all []*kvListEngine
	eps := make([]*Endpoint, n)
	for i := range eps {
		eps[i] = kvEndpoint("e" + strconv.Itoa(i))
		held := (i * 37) % (blocks + 1)
		x.Apply(eps[i], kvBatch(kvStored(1, 0, tokens[:held*kvBS])), kvT0)
		s := newKVListEngine(1 << 18)
		for j, k := range keys[:held] {
			s.store(kvevents.Hash(1+j), k, 1)
		}
		if i == 0 {
			alt.first = eps[0].id
		}
		all = append(all, s) // ids of eps are consecutive: nothing else makes endpoints meanwhile
	}
	alt.engines.Store(&all)
	return x, alt, eps, keys
}

func BenchmarkKVIndexMatch(b *testing.B) {
	for _, n := range []int{8, 64} {
		x, alt, eps, keys := kvBenchFleet(n)
		b.Run("slab/candidates="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			sum := 0
			for b.Loop() {
				for _, e := range eps {
					sum += x.Match(keys, e, kvT0)
				}
			}
			_ = sum
		})
		b.Run("slab-speculating/candidates="+strconv.Itoa(n), func(b *testing.B) {
			// Every candidate was just picked for other prompts: each probe
			// that misses the stored blocks also probes the speculative table.
			y, _, eps, keys := kvBenchFleet(n)
			for i, e := range eps {
				y.Speculate(kvKeys(kvTokens(uint32(100+i), 64), 0), e, kvT0)
			}
			b.ReportAllocs()
			sum := 0
			for b.Loop() {
				for _, e := range eps {
					sum += y.Match(keys, e, kvT0)
				}
			}
			_ = sum
		})
		b.Run("list/candidates="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			sum := 0
			for b.Loop() {
				for _, e := range eps {
					sum += alt.Match(keys, e)
				}
			}
			_ = sum
		})
	}
}

// BenchmarkKVIndexMatchParallel is Match over 64 candidates from every
// core while one subscriber applies a store and a removal every 50µs
// (20,000 events a second) to one engine.
func BenchmarkKVIndexMatchParallel(b *testing.B) {
	x, alt, eps, keys := kvBenchFleet(64)
	extra := kvTokens(9, 1)
	extraKey := stablehash.TokenBlocks(nil, extra, kvBS, 0)[0]
	run := func(b *testing.B, write func(), match func(e *Endpoint) int) {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			tk := time.NewTicker(50 * time.Microsecond)
			defer tk.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tk.C:
					write()
				}
			}
		})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			sum := 0
			for pb.Next() {
				for _, e := range eps {
					sum += match(e)
				}
			}
			_ = sum
		})
		close(stop)
		wg.Wait()
	}
	b.Run("slab", func(b *testing.B) {
		batch := kvBatch(kvStored(1_000_000, 0, extra), kvRemoved("GPU", 1_000_000))
		run(b, func() { x.Apply(eps[5], batch, kvT0) }, func(e *Endpoint) int { return x.Match(keys, e, kvT0) })
	})
	b.Run("list", func(b *testing.B) {
		s := alt.engine(eps[5])
		run(b, func() {
			s.mu.Lock()
			s.store(1_000_000, extraKey, 1)
			s.remove(1_000_000, 1)
			s.mu.Unlock()
		}, func(e *Endpoint) int { return alt.Match(keys, e) })
	})
}

// BenchmarkKVIndexApply measures the structures alone: one op stores a new
// block and removes the one stored live ops before, at 32768 blocks held,
// with precomputed own keys.
func BenchmarkKVIndexApply(b *testing.B) {
	const live = 1 << 15
	own := func(i int) uint64 { return stablehash.Mix64(uint64(i) + 1) }
	b.Run("slab", func(b *testing.B) {
		x := NewKVIndex(DefaultKVIndexConfig())
		e := kvEndpoint("e")
		x.Apply(e, kvBatch(), kvT0)
		s := x.engine(e)
		i := 0
		op := func() {
			s.mu.Lock()
			x.store(s, kvevents.Hash(i), own(i), 1)
			if j, ok := s.byHash[kvevents.Hash(i-live)]; ok {
				s.remove(j)
			}
			s.mu.Unlock()
			i++
		}
		for range live {
			op()
		}
		b.ReportAllocs()
		for b.Loop() {
			op()
		}
	})
	b.Run("list", func(b *testing.B) {
		s := newKVListEngine(1 << 18)
		i := 0
		op := func() {
			s.mu.Lock()
			s.store(kvevents.Hash(i), own(i), 1)
			s.remove(kvevents.Hash(i-live), 1)
			s.mu.Unlock()
			i++
		}
		for range live {
			op()
		}
		b.ReportAllocs()
		for b.Loop() {
			op()
		}
	})
}

// BenchmarkKVIndexApplyEvents is Apply through the API: each batch stores
// a chain of 16 blocks of 16 tokens (own keys hashed) under a parent and
// removes 16 blocks, at default MaxBlocks with 65536 blocks held; the
// metric ns/block counts the 32 blocks of a batch.
func BenchmarkKVIndexApplyEvents(b *testing.B) {
	const (
		perEvent = 16
		bs       = 16
		ring     = 4096 // batches kept before removal: 4096*16 blocks held
	)
	x := NewKVIndex(DefaultKVIndexConfig())
	e := kvEndpoint("e")
	x.Apply(e, kvBatch(kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: []kvevents.Hash{1},
		TokenIDs: make([]uint32, bs), BlockSize: bs, LoRAID: -1}), kvT0)
	tokens := make([]uint32, perEvent*bs)
	stored := kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: make([]kvevents.Hash, perEvent),
		ParentBlockHash: 1, HasParent: true, TokenIDs: tokens, BlockSize: bs, LoRAID: -1, Medium: "GPU"}
	removed := kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: make([]kvevents.Hash, perEvent), Medium: "GPU"}
	batch := kvBatch(stored, removed)
	n := 0
	op := func() KVApplied {
		ev := &batch.Events[0]
		for i := range ev.BlockHashes {
			ev.BlockHashes[i] = kvevents.Hash(1<<40 + n*perEvent + i)
			batch.Events[1].BlockHashes[i] = kvevents.Hash(1<<40 + (n-ring)*perEvent + i) // not held while n < ring
		}
		for i := range tokens {
			tokens[i] = uint32(n*len(tokens) + i)
		}
		n++
		return x.Apply(e, batch, kvT0)
	}
	for range ring {
		op()
	}
	if r := op(); r != (KVApplied{Stored: perEvent, Removed: perEvent}) {
		b.Fatalf("Apply = %+v, want %d stored and removed", r, perEvent)
	}
	b.ReportAllocs()
	for b.Loop() {
		op()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/(2*perEvent), "ns/block")
}

// BenchmarkKVIndexBytes measures the heap one engine holding 262144
// blocks (the default MaxBlocks) takes, per block: the B/entry metric.
// KVEntryBytes is its slab value. Run with -benchtime 3x.
func BenchmarkKVIndexBytes(b *testing.B) {
	const n = 1 << 18
	own := func(i int) uint64 { return stablehash.Mix64(uint64(i) + 1) }
	measure := func(b *testing.B, build func() any) {
		var perEntry float64
		for b.Loop() {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			v := build()
			runtime.GC()
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(v)
			perEntry = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
		}
		b.ReportMetric(perEntry, "B/entry")
	}
	b.Run("slab", func(b *testing.B) {
		cfg := DefaultKVIndexConfig()
		cfg.SpeculativeTTL = 0 // the fixed speculative table is not per entry
		measure(b, func() any {
			x := NewKVIndex(cfg)
			e := kvEndpoint("e")
			x.Apply(e, kvBatch(), kvT0)
			s := x.engine(e)
			s.mu.Lock()
			for i := range n {
				x.store(s, kvevents.Hash(i), own(i), 1)
			}
			s.mu.Unlock()
			return x
		})
	})
	b.Run("list", func(b *testing.B) {
		measure(b, func() any {
			s := newKVListEngine(n)
			for i := range n {
				s.store(kvevents.Hash(i), own(i), 1)
			}
			return s
		})
	})
}
