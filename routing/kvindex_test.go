package routing

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/kvevents"
	"github.com/switchboard-gw/switchboard/internal/stablehash"
	"github.com/switchboard-gw/switchboard/internal/testutil"
)

const kvBS = 4 // tokens per block in these tests

var kvT0 = time.Unix(1_780_000_000, 0)

// kvTokens returns n blocks of tokens, distinct for each base.
func kvTokens(base uint32, n int) []uint32 {
	t := make([]uint32, n*kvBS)
	for i := range t {
		t[i] = base*100_000 + uint32(i)
	}
	return t
}

// kvHashes returns n engine hashes first, first+1, ...
func kvHashes(first kvevents.Hash, n int) []kvevents.Hash {
	h := make([]kvevents.Hash, n)
	for i := range h {
		h[i] = first + kvevents.Hash(i)
	}
	return h
}

// kvStored is a BlockStored event of the blocks of tokens, engine hashes
// from first, on the GPU in group 0, with parent when parent != 0.
func kvStored(first kvevents.Hash, parent kvevents.Hash, tokens []uint32) kvevents.Event {
	return kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: kvHashes(first, len(tokens)/kvBS),
		ParentBlockHash: parent, HasParent: parent != 0, TokenIDs: tokens, BlockSize: kvBS, LoRAID: -1,
		Medium: "GPU", GroupIdx: 0, SlidingWindow: -1}
}

func kvRemoved(medium string, hashes ...kvevents.Hash) kvevents.Event {
	return kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: hashes, Medium: medium, LoRAID: -1,
		GroupIdx: -1, SlidingWindow: -1}
}

func kvBatch(evs ...kvevents.Event) *kvevents.Batch { return &kvevents.Batch{Events: evs, DPRank: -1} }

func kvKeys(tokens []uint32, seed uint64) []uint64 {
	return stablehash.TokenBlocks(nil, tokens, kvBS, seed)
}

func kvEndpoint(name string) *Endpoint { return NewEndpoint(name, nil) }

func TestKVIndexApply(t *testing.T) {
	prompt := kvTokens(1, 6) // 6 blocks
	keys := kvKeys(prompt, 0)
	other := kvKeys(kvTokens(2, 6), 0)
	withMedium := func(ev kvevents.Event, m string) kvevents.Event { ev.Medium = m; return ev }
	withGroup := func(ev kvevents.Event, g int) kvevents.Event { ev.GroupIdx = g; return ev }
	salted := kvStored(500, 0, prompt[:4*kvBS]) // same tokens, other engine hashes (cache_salt)
	tests := []struct {
		name    string
		batches []*kvevents.Batch
		want    []KVApplied // per batch
		keys    []uint64
		match   int
		blocks  int
	}{
		{
			name:    "chain in one event",
			batches: []*kvevents.Batch{kvBatch(kvStored(10, 0, prompt[:4*kvBS]))},
			want:    []KVApplied{{Stored: 4}},
			keys:    keys, match: 4, blocks: 4,
		},
		{
			name:    "a prefix of what is held",
			batches: []*kvevents.Batch{kvBatch(kvStored(10, 0, prompt[:4*kvBS]))},
			want:    []KVApplied{{Stored: 4}},
			keys:    keys[:2], match: 2, blocks: 4,
		},
		{
			name:    "another prompt",
			batches: []*kvevents.Batch{kvBatch(kvStored(10, 0, prompt[:4*kvBS]))},
			want:    []KVApplied{{Stored: 4}},
			keys:    other, match: 0, blocks: 4,
		},
		{
			name: "chain split over two events of one batch",
			batches: []*kvevents.Batch{kvBatch(kvStored(10, 0, prompt[:2*kvBS]),
				kvStored(20, 11, prompt[2*kvBS:]))},
			want: []KVApplied{{Stored: 6}},
			keys: keys, match: 6, blocks: 6,
		},
		{
			name: "chain split over two batches",
			batches: []*kvevents.Batch{kvBatch(kvStored(10, 0, prompt[:3*kvBS])),
				kvBatch(kvStored(20, 12, prompt[3*kvBS:5*kvBS]))},
			want: []KVApplied{{Stored: 3}, {Stored: 2}},
			keys: keys, match: 5, blocks: 5,
		},
		{
			name: "orphan: parent unknown",
			batches: []*kvevents.Batch{kvBatch(kvStored(10, 0, prompt[:2*kvBS]),
				kvStored(20, 99, prompt[2*kvBS:]))},
			want: []KVApplied{{Stored: 2, Orphans: 1}},
			keys: keys, match: 2, blocks: 2,
		},
		{
			name: "removal from the end",
			batches: []*kvevents.Batch{kvBatch(kvStored(10, 0, prompt)),
				kvBatch(kvRemoved("GPU", 15, 14, 777))},
			want: []KVApplied{{Stored: 6}, {Removed: 2}},
			keys: keys, match: 4, blocks: 4,
		},
		{
			name:    "all blocks cleared",
			batches: []*kvevents.Batch{kvBatch(kvStored(10, 0, prompt), kvevents.Event{Kind: kvevents.AllBlocksCleared})},
			want:    []KVApplied{{Stored: 6, Cleared: 1}},
			keys:    keys, match: 0, blocks: 0,
		},
		{
			name:    "store after clear",
			batches: []*kvevents.Batch{kvBatch(kvStored(10, 0, prompt), kvevents.Event{Kind: kvevents.AllBlocksCleared}, kvStored(30, 0, prompt[:kvBS]))},
			want:    []KVApplied{{Stored: 7, Cleared: 1}},
			keys:    keys, match: 1, blocks: 1,
		},
		{
			name: "media: removed from GPU, still on CPU",
			batches: []*kvevents.Batch{kvBatch(kvStored(10, 0, prompt), withMedium(kvStored(10, 0, prompt), "CPU")),
				kvBatch(kvRemoved("GPU", 10, 11, 12, 13, 14, 15))},
			want: []KVApplied{{Stored: 12}, {}},
			keys: keys, match: 6, blocks: 6,
		},
		{
			name: "media: removed from both",
			batches: []*kvevents.Batch{kvBatch(withMedium(kvStored(10, 0, prompt), ""), withMedium(kvStored(10, 0, prompt), "CPU")),
				kvBatch(kvRemoved("", 14, 15), kvRemoved("CPU", 15))},
			want: []KVApplied{{Stored: 12}, {Removed: 1}},
			keys: keys, match: 5, blocks: 5,
		},
		{
			name: "media: another tier",
			batches: []*kvevents.Batch{kvBatch(kvStored(10, 0, prompt), withMedium(kvStored(10, 0, prompt), "LMCACHE_DISK")),
				kvBatch(kvRemoved("GPU", 10, 11, 12, 13, 14, 15), kvRemoved("CPU", 10))},
			want: []KVApplied{{Stored: 12}, {}},
			keys: keys, match: 6, blocks: 6,
		},
		{
			name:    "group > 0 stored: ignored",
			batches: []*kvevents.Batch{kvBatch(withGroup(kvStored(10, 0, prompt), 1))},
			want:    []KVApplied{{}},
			keys:    keys, match: 0, blocks: 0,
		},
		{
			name: "group > 0 removed: ignored; group -1 counts",
			batches: []*kvevents.Batch{kvBatch(withGroup(kvStored(10, 0, prompt), -1)),
				kvBatch(withGroup(kvRemoved("GPU", 10, 11), 2))},
			want: []KVApplied{{Stored: 6}, {}},
			keys: keys, match: 6, blocks: 6,
		},
		{
			name:    "two engine hashes, one own key: first removed",
			batches: []*kvevents.Batch{kvBatch(kvStored(10, 0, prompt[:4*kvBS]), salted), kvBatch(kvRemoved("GPU", 13))},
			want:    []KVApplied{{Stored: 8}, {Removed: 1}},
			keys:    keys, match: 4, blocks: 7,
		},
		{
			name:    "two engine hashes, one own key: both removed",
			batches: []*kvevents.Batch{kvBatch(kvStored(10, 0, prompt[:4*kvBS]), salted), kvBatch(kvRemoved("GPU", 13, 503))},
			want:    []KVApplied{{Stored: 8}, {Removed: 2}},
			keys:    keys, match: 3, blocks: 6,
		},
		{
			name: "malformed: fewer tokens than hashes, block size 0",
			batches: []*kvevents.Batch{kvBatch(
				kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: kvHashes(10, 3), TokenIDs: prompt[:2*kvBS], BlockSize: kvBS, LoRAID: -1},
				kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: kvHashes(20, 3), TokenIDs: prompt, LoRAID: -1})},
			want: []KVApplied{{Stored: 2}},
			keys: keys, match: 2, blocks: 2,
		},
		{
			name:    "nil batch",
			batches: []*kvevents.Batch{nil},
			want:    []KVApplied{{}},
			keys:    keys, match: 0, blocks: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := NewKVIndex(DefaultKVIndexConfig())
			e := kvEndpoint("e")
			for i, b := range tt.batches {
				if got := x.Apply(e, b, kvT0); got != tt.want[i] {
					t.Errorf("Apply batch %d = %+v, want %+v", i, got, tt.want[i])
				}
			}
			if got := x.Match(tt.keys, e, kvT0); got != tt.match {
				t.Errorf("Match = %d, want %d", got, tt.match)
			}
			blocks, fresh, ok := x.EngineStats(e, kvT0)
			if blocks != tt.blocks || !fresh || !ok {
				t.Errorf("EngineStats = (%d, %v, %v), want (%d, true, true)", blocks, fresh, ok, tt.blocks)
			}
		})
	}
}

func TestKVIndexLoRASeed(t *testing.T) {
	x := NewKVIndex(DefaultKVIndexConfig())
	e := kvEndpoint("e")
	prompt := kvTokens(1, 3)
	ev := kvStored(10, 0, prompt)
	ev.LoRAName, ev.LoRAID = "sql-adapter", 3
	child := kvStored(20, 12, kvTokens(2, 1)) // inherits the adapter through its parent
	byID := kvStored(30, 0, kvTokens(3, 1))
	byID.LoRAID = 4 // deprecated id only: its seed is unknown
	if got, want := x.Apply(e, kvBatch(ev, child, byID), kvT0), (KVApplied{Stored: 4, Orphans: 1}); got != want {
		t.Fatalf("Apply = %+v, want %+v", got, want)
	}
	lora := stablehash.String("sql-adapter")
	full := append(append([]uint32{}, prompt...), kvTokens(2, 1)...)
	for _, c := range []struct {
		name string
		keys []uint64
		want int
	}{
		{"base model keys", kvKeys(prompt, 0), 0},
		{"adapter keys", kvKeys(prompt, lora), 3},
		{"adapter keys with the child", kvKeys(full, lora), 4},
		{"another adapter", kvKeys(prompt, stablehash.String("other")), 0},
		{"the id-only block as base", kvKeys(kvTokens(3, 1), 0), 0},
	} {
		if got := x.Match(c.keys, e, kvT0); got != c.want {
			t.Errorf("%s: Match = %d, want %d", c.name, got, c.want)
		}
	}
}

func TestKVIndexEnginesIndependent(t *testing.T) {
	x := NewKVIndex(DefaultKVIndexConfig())
	a, b, c := kvEndpoint("a"), kvEndpoint("b"), kvEndpoint("c")
	pa, pb := kvTokens(1, 4), kvTokens(2, 4)
	// The same engine hashes on both engines: they are per engine.
	x.Apply(a, kvBatch(kvStored(10, 0, pa)), kvT0)
	x.Apply(b, kvBatch(kvStored(10, 0, pb[:2*kvBS])), kvT0)
	x.Apply(b, kvBatch(kvRemoved("GPU", 11)), kvT0)
	for _, m := range []struct {
		e    *Endpoint
		keys []uint64
		want int
	}{
		{a, kvKeys(pa, 0), 4}, {a, kvKeys(pb, 0), 0},
		{b, kvKeys(pa, 0), 0}, {b, kvKeys(pb, 0), 1},
		{c, kvKeys(pa, 0), 0}, {nil, kvKeys(pa, 0), 0},
	} {
		if got := x.Match(m.keys, m.e, kvT0); got != m.want {
			t.Errorf("Match(%v) = %d, want %d", m.e, got, m.want)
		}
	}
	if _, _, ok := x.EngineStats(c, kvT0); ok {
		t.Error("EngineStats(c) ok, want no state for an engine never applied")
	}
	x.Forget(a)
	if got := x.Match(kvKeys(pa, 0), a, kvT0); got != 0 {
		t.Errorf("Match after Forget = %d, want 0", got)
	}
	if _, _, ok := x.EngineStats(a, kvT0); ok {
		t.Error("EngineStats after Forget ok, want no state")
	}
	if blocks, _, _ := x.EngineStats(b, kvT0); blocks != 1 {
		t.Errorf("b blocks after Forget(a) = %d, want 1", blocks)
	}
	// A new incarnation of a does not see the old one's blocks.
	a2 := kvEndpoint("a")
	x.Apply(a2, kvBatch(), kvT0)
	if got := x.Match(kvKeys(pa, 0), a2, kvT0); got != 0 {
		t.Errorf("Match on a new incarnation = %d, want 0", got)
	}
	x.Forget(c) // never seen: no-op
	x.Forget(nil)
	x.Drop(nil, kvT0)
	if got := x.Apply(nil, kvBatch(kvStored(10, 0, pa)), kvT0); got != (KVApplied{}) {
		t.Errorf("Apply(nil endpoint) = %+v, want zero", got)
	}
}

func TestKVIndexDropAndFresh(t *testing.T) {
	cfg := DefaultKVIndexConfig()
	x := NewKVIndex(cfg)
	e := kvEndpoint("e")
	keys := kvKeys(kvTokens(1, 4), 0)
	if x.Fresh(e, kvT0) {
		t.Fatal("Fresh before any Apply")
	}
	x.Apply(e, kvBatch(kvStored(10, 0, kvTokens(1, 4))), kvT0)
	if !x.Fresh(e, kvT0) {
		t.Fatal("not Fresh after Apply")
	}
	x.Drop(e, kvT0)
	if x.Fresh(e, kvT0) {
		t.Error("Fresh after Drop")
	}
	if got := x.Match(keys, e, kvT0); got != 0 {
		t.Errorf("Match after Drop = %d, want 0", got)
	}
	if blocks, fresh, ok := x.EngineStats(e, kvT0); blocks != 0 || fresh || !ok {
		t.Errorf("EngineStats after Drop = (%d, %v, %v), want (0, false, true)", blocks, fresh, ok)
	}
	x.Apply(e, kvBatch(), kvT0.Add(time.Second)) // an empty batch is a sign of life
	if x.Fresh(e, kvT0.Add(time.Second)) {
		t.Error("Fresh 1 s after a Drop: its blocks are being rebuilt for StaleAfter")
	}
	if !x.Fresh(e, kvT0.Add(DefaultKVIndexConfig().StaleAfter)) {
		t.Error("not Fresh StaleAfter after a Drop, with an Apply since")
	}
	x.Forget(e)
	if x.Fresh(e, kvT0) {
		t.Error("Fresh after Forget")
	}
}

func TestKVIndexSpeculative(t *testing.T) {
	cfg := DefaultKVIndexConfig()
	x := NewKVIndex(cfg)
	a, b := kvEndpoint("a"), kvEndpoint("b")
	prompt := kvTokens(1, 8)
	keys := kvKeys(prompt, 0)
	x.Speculate(keys, a, kvT0) // no state yet: ignored
	if got := x.Match(keys, a, kvT0); got != 0 {
		t.Fatalf("Match after Speculate on an engine without state = %d, want 0", got)
	}
	x.Apply(a, kvBatch(kvStored(10, 0, prompt[:3*kvBS])), kvT0)
	x.Apply(b, kvBatch(), kvT0)
	x.Speculate(keys, a, kvT0)
	for _, c := range []struct {
		name string
		e    *Endpoint
		at   time.Duration
		keys []uint64
		want int
	}{
		{"at once", a, 0, keys, 8},
		{"a prefix", a, time.Second, keys[:5], 5},
		{"just before the TTL", a, cfg.SpeculativeTTL - 1, keys, 8},
		{"at the TTL: stored blocks only", a, cfg.SpeculativeTTL, keys, 3},
		{"another engine", b, 0, keys, 0},
	} {
		if got := x.Match(c.keys, c.e, kvT0.Add(c.at)); got != c.want {
			t.Errorf("%s: Match = %d, want %d", c.name, got, c.want)
		}
	}
	// A speculative entry stands for the whole prompt e was sent (keys
	// are chained): stored blocks under it that go meanwhile are computed
	// again by that request.
	z := NewKVIndex(cfg)
	z.Apply(a, kvBatch(kvStored(10, 0, prompt[:3*kvBS])), kvT0)
	z.Speculate(keys, a, kvT0)
	z.Apply(a, kvBatch(kvRemoved("GPU", 11, 12)), kvT0)
	if got := z.Match(keys, a, kvT0); got != 8 {
		t.Errorf("Match after stored blocks under the speculative ones went = %d, want 8", got)
	}
	if got := z.Match(keys[:3], a, kvT0); got != 1 {
		t.Errorf("Match of the stored part alone after its blocks 1 and 2 went = %d, want 1", got)
	}
	// Once the engine confirms speculative blocks and then evicts them,
	// the speculation about them is over too: the engine's word wins.
	w := NewKVIndex(cfg)
	w.Apply(a, kvBatch(kvStored(10, 0, prompt[:3*kvBS])), kvT0)
	w.Speculate(keys, a, kvT0)
	w.Apply(a, kvBatch(kvStored(13, 12, prompt[3*kvBS:])), kvT0)
	w.Apply(a, kvBatch(kvRemoved("GPU", 15, 16, 17)), kvT0)
	if got := w.Match(keys, a, kvT0); got != 5 {
		t.Errorf("Match after confirmed speculative blocks 5..7 were evicted = %d, want 5", got)
	}
	// Speculating again extends the entries.
	x.Speculate(keys, a, kvT0.Add(time.Second))
	if got := x.Match(keys, a, kvT0.Add(time.Second+cfg.SpeculativeTTL-1)); got != 8 {
		t.Errorf("Match after a second Speculate = %d, want 8", got)
	}

	off := DefaultKVIndexConfig()
	off.SpeculativeTTL = 0
	y := NewKVIndex(off)
	y.Apply(a, kvBatch(), kvT0)
	y.Speculate(keys, a, kvT0)
	if got := y.Match(keys, a, kvT0); got != 0 {
		t.Errorf("Match with speculation off = %d, want 0", got)
	}
	if y.Fresh(a, kvT0.Add(off.StaleAfter+1)) {
		t.Error("with speculation off, Fresh after StaleAfter owing blocks: Speculate must still start the staleness clock")
	}
}

func TestKVIndexSpeculativeTableFull(t *testing.T) {
	cfg := DefaultKVIndexConfig()
	cfg.SpeculativeEntries = 8 // one bucket
	x := NewKVIndex(cfg)
	e := kvEndpoint("e")
	x.Apply(e, kvBatch(), kvT0)
	keys := kvKeys(kvTokens(1, 9), 0)
	// Keys 0..7 at t0, key 8 later: it replaces the entry closest to
	// expiry, one of the first eight.
	x.Speculate(keys[:8], e, kvT0)
	x.Speculate(keys[8:], e, kvT0.Add(time.Millisecond))
	x.clock = func() time.Time { return kvT0.Add(time.Millisecond) }
	if got := x.Stats().Speculative; got != 8 {
		t.Errorf("Stats.Speculative = %d, want 8", got)
	}
	held := 0
	for _, k := range keys {
		if x.Match([]uint64{k}, e, kvT0.Add(time.Millisecond)) == 1 {
			held++
		}
	}
	if held != 8 {
		t.Errorf("%d keys speculative in a table of 8, want 8", held)
	}
	if x.Match(keys[8:], e, kvT0.Add(time.Millisecond)) != 1 {
		t.Error("the newest speculative entry was not kept")
	}
}

func TestKVIndexStaleness(t *testing.T) {
	cfg := DefaultKVIndexConfig()
	x := NewKVIndex(cfg)
	e := kvEndpoint("e")
	prompt := kvTokens(1, 4)
	held := kvKeys(prompt[:2*kvBS], 0)
	keys := kvKeys(prompt, 0)
	x.Apply(e, kvBatch(kvStored(10, 0, prompt[:2*kvBS])), kvT0)

	// Sent only blocks it holds: nothing owed, fresh however long it is silent.
	x.Speculate(held, e, kvT0)
	if !x.Fresh(e, kvT0.Add(time.Hour)) {
		t.Fatal("not Fresh after a prompt it already held")
	}
	// Sent new blocks at t1: owes events from t1.
	t1 := kvT0.Add(time.Minute)
	x.Speculate(keys, e, t1)
	x.Speculate(keys, e, t1.Add(5*time.Second)) // does not move the clock
	if !x.Fresh(e, t1.Add(cfg.StaleAfter)) {
		t.Error("not Fresh at StaleAfter")
	}
	if x.Fresh(e, t1.Add(cfg.StaleAfter+1)) {
		t.Error("Fresh after StaleAfter with events owed")
	}
	if n := x.Stats(); n.Engines != 1 {
		t.Errorf("Stats.Engines = %d, want 1", n.Engines)
	}
	// Its events arrive: fresh again, nothing owed.
	t2 := t1.Add(time.Minute)
	x.Apply(e, kvBatch(kvStored(20, 11, prompt[2*kvBS:])), t2)
	if !x.Fresh(e, t2.Add(time.Hour)) {
		t.Error("not Fresh after Apply")
	}
	// A speculative entry is not a held block: a second prompt within
	// the TTL still owes events.
	x.Speculate(kvKeys(kvTokens(2, 2), 0), e, t2)
	x.Apply(e, kvBatch(), t2)
	x.Speculate(kvKeys(kvTokens(2, 2), 0), e, t2.Add(time.Second))
	if x.Fresh(e, t2.Add(time.Second+cfg.StaleAfter+1)) {
		t.Error("Fresh although the speculated blocks were never stored")
	}
}

func TestKVIndexStats(t *testing.T) {
	x := NewKVIndex(DefaultKVIndexConfig())
	x.clock = func() time.Time { return kvT0.Add(time.Second) }
	a, b := kvEndpoint("a"), kvEndpoint("b")
	x.Apply(a, kvBatch(kvStored(10, 0, kvTokens(1, 5))), kvT0)
	x.Apply(b, kvBatch(kvStored(10, 0, kvTokens(2, 3))), kvT0)
	x.Drop(b, kvT0)
	x.Apply(b, kvBatch(kvStored(10, 0, kvTokens(2, 2))), kvT0)
	x.Drop(b, kvT0)
	x.Speculate(kvKeys(kvTokens(3, 4), 0), a, kvT0)
	x.Speculate(kvKeys(kvTokens(4, 2), 0), a, kvT0.Add(-2*time.Second)) // expired by the clock
	want := KVIndexStats{Engines: 2, Stale: 1, Blocks: 5, Speculative: 4,
		Bytes: 5*KVEntryBytes + 65536*16}
	if got := x.Stats(); got != want {
		t.Errorf("Stats = %+v, want %+v", got, want)
	}
}

func TestKVIndexLRU(t *testing.T) {
	cfg := DefaultKVIndexConfig()
	cfg.MaxBlocks = 3
	x := NewKVIndex(cfg)
	e := kvEndpoint("e")
	a := kvTokens(1, 3)
	// A chain is evicted from its end: its first block is the most recent.
	x.Apply(e, kvBatch(kvStored(10, 0, a)), kvT0)
	x.Apply(e, kvBatch(kvStored(20, 0, kvTokens(2, 1))), kvT0)
	if got := x.Match(kvKeys(a, 0), e, kvT0); got != 2 {
		t.Errorf("Match after one eviction = %d, want 2", got)
	}
	// A child touches its parent: extending a0 keeps a0 over the rest.
	x.Apply(e, kvBatch(kvStored(30, 10, kvTokens(3, 1))), kvT0) // evicts a1 or b0, whichever is older: a1
	if got := x.Match(kvKeys(a, 0), e, kvT0); got != 1 {
		t.Errorf("Match after two evictions = %d, want 1", got)
	}
	if got := x.Match(kvKeys(kvTokens(2, 1), 0), e, kvT0); got != 1 {
		t.Errorf("b0 evicted before a1: Match = %d, want 1", got)
	}
	// Stored before b0 but touched by its child since, a0 outlives b0.
	x.Apply(e, kvBatch(kvStored(40, 0, kvTokens(4, 1))), kvT0)
	if got := x.Match(kvKeys(kvTokens(2, 1), 0), e, kvT0); got != 0 {
		t.Errorf("b0 after a third eviction: Match = %d, want 0", got)
	}
	if got := x.Match(kvKeys(a, 0), e, kvT0); got != 1 {
		t.Errorf("a0 after a third eviction: Match = %d, want 1", got)
	}
}

func TestKVIndexFloodKeepsMaxBlocks(t *testing.T) {
	cfg := DefaultKVIndexConfig()
	cfg.MaxBlocks = 1000
	x := NewKVIndex(cfg)
	e := kvEndpoint("e")
	const total = 10 * 1000
	var applied KVApplied
	for i := range total {
		r := x.Apply(e, kvBatch(kvStored(kvevents.Hash(1_000_000+i), 0, kvTokens(uint32(i), 1))), kvT0)
		applied.Stored += r.Stored
	}
	if applied.Stored != total {
		t.Errorf("stored %d, want %d", applied.Stored, total)
	}
	if blocks, _, _ := x.EngineStats(e, kvT0); blocks != cfg.MaxBlocks {
		t.Errorf("blocks = %d, want %d", blocks, cfg.MaxBlocks)
	}
	for i := range total {
		want := 0
		if i >= total-cfg.MaxBlocks {
			want = 1 // the newest MaxBlocks stay; every older one was evicted
		}
		if got := x.Match(kvKeys(kvTokens(uint32(i), 1), 0), e, kvT0); got != want {
			t.Fatalf("block %d: Match = %d, want %d", i, got, want)
		}
	}
	// The engine hash map forgot the evicted: removing one counts nothing.
	if got := x.Apply(e, kvBatch(kvRemoved("GPU", 1_000_000)), kvT0); got.Removed != 0 {
		t.Errorf("removing an evicted block: Removed = %d, want 0", got.Removed)
	}
	if got := x.Apply(e, kvBatch(kvRemoved("GPU", 1_000_000+total-1)), kvT0); got.Removed != 1 {
		t.Errorf("removing a held block: Removed = %d, want 1", got.Removed)
	}
	s := x.engine(e)
	s.mu.Lock()
	defer s.mu.Unlock()
	if tb := s.keys.Load(); tb.live != cfg.MaxBlocks-1 || len(tb.keys) > 4*cfg.MaxBlocks {
		t.Errorf("own-key table: %d live in %d slots, want %d in at most %d", tb.live, len(tb.keys), cfg.MaxBlocks-1, 4*cfg.MaxBlocks)
	}
	if cap(s.slab) > cfg.MaxBlocks {
		t.Errorf("slab capacity %d > MaxBlocks %d", cap(s.slab), cfg.MaxBlocks)
	}
}

func TestKVIndexConfigValidate(t *testing.T) {
	if err := DefaultKVIndexConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	tests := []struct {
		name string
		set  func(*KVIndexConfig)
		want string
	}{
		{"max_blocks 0", func(c *KVIndexConfig) { c.MaxBlocks = 0 }, "kv_events.index.max_blocks must be 1..16777216, got 0"},
		{"max_blocks too many", func(c *KVIndexConfig) { c.MaxBlocks = 1<<24 + 1 }, "kv_events.index.max_blocks"},
		{"speculative_ttl negative", func(c *KVIndexConfig) { c.SpeculativeTTL = -1 }, "kv_events.index.speculative_ttl must be 0s..1m, got -1ns"},
		{"speculative_ttl long", func(c *KVIndexConfig) { c.SpeculativeTTL = time.Hour }, "kv_events.index.speculative_ttl"},
		{"stale_after 0", func(c *KVIndexConfig) { c.StaleAfter = 0 }, "kv_events.stale_after must be > 0, got 0s"},
		{"speculative_entries small", func(c *KVIndexConfig) { c.SpeculativeEntries = 7 }, "kv_events.index.speculative_entries must be 8..268435456, got 7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultKVIndexConfig()
			tt.set(&c)
			err := c.Validate()
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("Validate = %v, want prefix %q", err, tt.want)
			}
		})
	}
	c := KVIndexConfig{MaxBlocks: -1, SpeculativeTTL: -1, StaleAfter: -1, SpeculativeEntries: -1}
	if err := c.Validate(); err == nil || strings.Count(err.Error(), "\n") != 3 {
		t.Errorf("Validate of four bad keys = %v, want four joined errors", err)
	}
	// NewKVIndex takes defaults for what cannot work, and does not panic.
	x := NewKVIndex(KVIndexConfig{})
	if x.cfg.MaxBlocks != 1<<18 || x.cfg.StaleAfter != 10*time.Second || x.spec != nil {
		t.Errorf("NewKVIndex(zero) cfg = %+v, spec %v", x.cfg, x.spec != nil)
	}
}

func TestKVIndexMatchAllocs(t *testing.T) {
	if testutil.RaceEnabled {
		t.Skip("the race detector allocates")
	}
	x := NewKVIndex(DefaultKVIndexConfig())
	eps := []*Endpoint{kvEndpoint("a"), kvEndpoint("b"), kvEndpoint("c")}
	prompt := kvTokens(1, 256)
	keys := kvKeys(prompt, 0)
	x.Apply(eps[0], kvBatch(kvStored(10, 0, prompt[:100*kvBS])), kvT0)
	x.Apply(eps[1], kvBatch(), kvT0)
	x.Speculate(keys, eps[1], kvT0)
	sum := 0
	allocs := testing.AllocsPerRun(100, func() {
		for _, e := range eps {
			sum += x.Match(keys, e, kvT0)
		}
		x.Speculate(keys, eps[1], kvT0)
		if !x.Fresh(eps[0], kvT0) {
			sum = -1
		}
	})
	if allocs != 0 {
		t.Errorf("Match, Speculate and Fresh: %v allocs, want 0", allocs)
	}
	if want := 101 * (100 + 256); sum != want {
		t.Errorf("sum of matches = %d, want %d", sum, want)
	}
	// Apply of events that do not grow or rebuild the tables (here: CPU
	// offloading of held blocks, and their removal from the CPU) does not
	// allocate; BenchmarkKVIndexApply measures churn.
	cpu := kvStored(10, 0, prompt[:100*kvBS])
	cpu.Medium = "CPU"
	ev := kvBatch(cpu, kvRemoved("CPU", kvHashes(10, 100)...))
	if allocs := testing.AllocsPerRun(100, func() { x.Apply(eps[0], ev, kvT0) }); allocs != 0 {
		t.Errorf("Apply: %v allocs, want 0", allocs)
	}
	if got := x.Match(keys, eps[0], kvT0); got != 100 {
		t.Errorf("Match after CPU store and removal = %d, want 100", got)
	}
}

func TestKVIndexConcurrentSafe(t *testing.T) {
	cfg := DefaultKVIndexConfig()
	cfg.MaxBlocks = 200
	cfg.SpeculativeEntries = 64
	x := NewKVIndex(cfg)
	eps := []*Endpoint{kvEndpoint("a"), kvEndpoint("b")}
	prompts := make([][]uint32, 16)
	keys := make([][]uint64, len(prompts))
	for i := range prompts {
		prompts[i] = kvTokens(uint32(i), 32)
		keys[i] = kvKeys(prompts[i], 0)
	}
	const rounds = 300
	var wg sync.WaitGroup
	for ei, e := range eps { // one subscriber per engine
		wg.Go(func() {
			for r := range rounds {
				p := (r + ei) % len(prompts)
				base := kvevents.Hash(p * 1000)
				switch r % 10 {
				case 9:
					x.Drop(e, kvT0)
				case 7:
					x.Apply(e, kvBatch(kvevents.Event{Kind: kvevents.AllBlocksCleared}), kvT0)
				default:
					x.Apply(e, kvBatch(kvStored(base, 0, prompts[p][:16*kvBS]), kvStored(base+16, base+15, prompts[p][16*kvBS:]),
						kvRemoved("GPU", base+30, base+31)), kvT0)
				}
			}
		})
	}
	for w := range 4 { // requests
		wg.Go(func() {
			for r := range rounds {
				ks := keys[(r*7+w)%len(keys)]
				now := kvT0.Add(time.Duration(r) * time.Millisecond)
				best, bestM := eps[0], -1
				for _, e := range eps {
					m := x.Match(ks, e, now)
					if m < 0 || m > len(ks) {
						t.Errorf("Match = %d out of 0..%d", m, len(ks))
						return
					}
					if m > bestM {
						best, bestM = e, m
					}
					x.Fresh(e, now)
				}
				x.Speculate(ks, best, now)
				if r%50 == 0 {
					x.Stats()
					x.EngineStats(best, now)
				}
			}
		})
	}
	wg.Go(func() { // fleet changes
		for range 20 {
			e := kvEndpoint("tmp")
			x.Apply(e, kvBatch(kvStored(1, 0, prompts[0])), kvT0)
			x.Match(keys[0], e, kvT0)
			x.Forget(e)
		}
	})
	wg.Wait()
	if st := x.Stats(); st.Engines != 2 || st.Blocks > 2*cfg.MaxBlocks {
		t.Errorf("Stats = %+v, want 2 engines and at most %d blocks", st, 2*cfg.MaxBlocks)
	}
}

func TestKVIndexSharedOwnKeysAcrossRebuild(t *testing.T) {
	x := NewKVIndex(DefaultKVIndexConfig())
	e := kvEndpoint("e")
	prompt := kvTokens(1, 200) // the own-key table grows from 64 slots: rebuilt on the way
	keys := kvKeys(prompt, 0)
	x.Apply(e, kvBatch(kvStored(1000, 0, prompt[:100*kvBS])), kvT0)
	x.Apply(e, kvBatch(kvStored(5000, 0, prompt)), kvT0) // other engine hashes, same tokens
	if got := x.Match(keys, e, kvT0); got != 200 {
		t.Fatalf("Match = %d, want 200", got)
	}
	if got := x.Apply(e, kvBatch(kvRemoved("GPU", kvHashes(5000, 200)...)), kvT0); got.Removed != 200 {
		t.Errorf("Removed = %d, want 200", got.Removed)
	}
	if got := x.Match(keys, e, kvT0); got != 100 {
		t.Errorf("Match after removing the second copy = %d, want 100", got)
	}
	x.Apply(e, kvBatch(kvRemoved("GPU", kvHashes(1000, 100)...)), kvT0)
	if got := x.Match(keys, e, kvT0); got != 0 {
		t.Errorf("Match after removing both = %d, want 0", got)
	}
	s := x.engine(e)
	s.mu.Lock()
	defer s.mu.Unlock()
	if tb := s.keys.Load(); tb.live != 0 || len(tb.multi) != 0 {
		t.Errorf("own-key table: %d live, %d shared, want none", tb.live, len(tb.multi))
	}
}

// TestKVIndexReset: a restarted engine's blocks are forgotten and, its
// cache being empty, it is fresh at its next Apply (no rebuilding time, as
// after a Drop).
func TestKVIndexReset(t *testing.T) {
	x := NewKVIndex(DefaultKVIndexConfig())
	e := kvEndpoint("e")
	x.Reset(e) // no state: nothing happens
	if _, _, ok := x.EngineStats(e, kvT0); ok {
		t.Fatal("Reset created state")
	}
	x.Apply(e, kvBatch(kvStored(10, 0, kvTokens(1, 4))), kvT0)
	x.Reset(e)
	if blocks, fresh, _ := x.EngineStats(e, kvT0); blocks != 0 || fresh {
		t.Errorf("after Reset: %d blocks, fresh %v; want 0, not fresh until the next batch", blocks, fresh)
	}
	x.Apply(e, kvBatch(kvStored(20, 0, kvTokens(2, 2))), kvT0.Add(time.Millisecond))
	if blocks, fresh, _ := x.EngineStats(e, kvT0.Add(time.Millisecond)); blocks != 2 || !fresh {
		t.Errorf("after Reset and a batch: %d blocks, fresh %v; want 2, fresh", blocks, fresh)
	}
}
