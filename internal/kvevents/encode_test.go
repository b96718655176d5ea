package kvevents

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
)

// equalDecoded reports whether a and b are the same batch as far as the
// wire carries it: TS compared by its bits (so NaN equals itself), Dropped,
// DropErr and Unknown ignored.
func equalDecoded(a, b Batch) bool {
	if math.Float64bits(a.TS) != math.Float64bits(b.TS) {
		return false
	}
	a.TS, b.TS = 0, 0
	a.Dropped, a.Unknown, b.Dropped, b.Unknown = 0, 0, 0, 0
	a.DropErr, b.DropErr = nil, nil
	return reflect.DeepEqual(a, b)
}

func richBatch() Batch {
	stored := Event{
		Kind: BlockStored, BlockHashes: []Hash{math.MaxUint64, 0, 1 << 63}, ParentBlockHash: 77, HasParent: true,
		TokenIDs: append(seqU32(0, 5), math.MaxUint32), BlockSize: 2, LoRAID: 7, LoRAName: "adapter",
		Medium: "CPU", ExtraKeys: pack(nil, []any{[]any{"adapter", []any{"img", 0}}, nil, []any{"salt"}}),
		GroupIdx: 2, SpecKind: "sliding_window", SlidingWindow: 1024,
	}
	bare := Event{Kind: BlockStored, BlockHashes: []Hash{5}, TokenIDs: seqU32(100, 16), BlockSize: 16,
		LoRAID: -1, GroupIdx: -1, SlidingWindow: -1}
	// Only the last field set: the array encoding keeps every nil before it.
	lastOnly := bare
	lastOnly.SlidingWindow = 0
	removed := Event{Kind: BlockRemoved, BlockHashes: []Hash{9, 10}, Medium: "GPU", GroupIdx: 0, LoRAID: -1, SlidingWindow: -1}
	return Batch{TS: 1789095808.83, DPRank: 5, Events: []Event{stored, bare, lastOnly, removed, nilEvent(AllBlocksCleared)}}
}

func TestAppendBatchRoundTrip(t *testing.T) {
	batches := map[string]Batch{
		"rich":     richBatch(),
		"empty":    {TS: 0, DPRank: -1, Events: []Event{}},
		"nan ts":   {TS: math.NaN(), DPRank: 0, Events: []Event{}},
		"max rank": {TS: -1, DPRank: math.MaxInt32, Events: []Event{nilEvent(AllBlocksCleared)}},
	}
	for _, g := range goldens() {
		batches["golden "+g.name] = g.want
	}
	for name, b := range batches {
		for _, enc := range []Encoding{EncodingArray, EncodingMap} {
			t.Run(name, func(t *testing.T) {
				prefix := []byte("prefix")
				out := AppendBatch(bytes.Clone(prefix), b, enc)
				if !bytes.HasPrefix(out, prefix) {
					t.Fatalf("AppendBatch lost dst: %q", out[:6])
				}
				got, err := DecodeBatch(out[len(prefix):])
				if err != nil {
					t.Fatalf("encoding %d: %v", enc, err)
				}
				if !equalDecoded(got, b) {
					t.Errorf("encoding %d: decode(encode(x)) =\n%+v\nwant\n%+v", enc, got, b)
				}
			})
		}
	}
}

func TestAppendBatchBytes(t *testing.T) {
	// The array encoding of the pre-#42892 golden batch is byte for byte
	// what msgspec wrote.
	i := slices.IndexFunc(goldens(), func(g golden) bool { return g.name == "array-events" })
	if i < 0 {
		t.Fatal("no array-events golden")
	}
	g := goldens()[i]
	want, err := os.ReadFile(filepath.Join("testdata", g.name+".msgpack"))
	if err != nil {
		t.Fatal(err)
	}
	if got := AppendBatch(nil, g.want, EncodingArray); !bytes.Equal(got, want) {
		t.Errorf("AppendBatch(array-events, EncodingArray) =\n% x\nwant\n% x", got, want)
	}
	b := Batch{TS: 2, DPRank: -1, Events: []Event{
		{Kind: BlockRemoved, BlockHashes: []Hash{300}, GroupIdx: 1, LoRAID: -1, SlidingWindow: -1},
		{Kind: Unknown},
		nilEvent(AllBlocksCleared),
		{Kind: AllBlocksCleared + 1},
		{Kind: BlockStored, BlockHashes: []Hash{1}, TokenIDs: []uint32{3}, BlockSize: 1, LoRAID: -1, GroupIdx: -1, SlidingWindow: -1},
	}}
	tests := []struct {
		enc  Encoding
		want any
	}{
		{EncodingArray, []any{2.0, []any{
			[]any{"BlockRemoved", []any{300}, nil, 1},
			[]any{"AllBlocksCleared"},
			[]any{"BlockStored", []any{1}, nil, []any{3}, 1},
		}, nil}},
		{EncodingMap, []any{2.0, []any{
			om{"type", "BlockRemoved", "block_hashes", []any{300}, "medium", nil, "group_idx", 1},
			om{"type", "AllBlocksCleared"},
			om{"type", "BlockStored", "block_hashes", []any{1}, "parent_block_hash", nil, "token_ids", []any{3},
				"block_size", 1, "lora_id", nil, "medium", nil, "lora_name", nil, "extra_keys", nil, "group_idx", nil,
				"kv_cache_spec_kind", nil, "kv_cache_spec_sliding_window", nil},
		}, nil}},
	}
	for _, tt := range tests {
		if got, want := AppendBatch(nil, b, tt.enc), pack(t, tt.want); !bytes.Equal(got, want) {
			t.Errorf("AppendBatch(encoding %d) =\n% x\nwant\n% x", tt.enc, got, want)
		}
	}
}
