package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// nilEvent returns an event of kind k with every field nil.
func nilEvent(k Kind) Event { return Event{Kind: k, LoRAID: -1, GroupIdx: -1, SlidingWindow: -1} }

func TestDecodeBatch(t *testing.T) {
	removed := func(hs ...Hash) Event {
		e := nilEvent(BlockRemoved)
		e.BlockHashes = hs
		return e
	}
	tests := []struct {
		name  string
		value any
		want  Batch
	}{
		{"two-element array batch", []any{1.0, []any{}}, Batch{TS: 1, DPRank: -1, Events: []Event{}}},
		{"extra batch elements ignored", []any{1.0, []any{}, 0, "x", []any{1}}, Batch{TS: 1, DPRank: 0, Events: []Event{}}},
		{"integer ts", []any{7, []any{}, 0}, Batch{TS: 7, DPRank: 0, Events: []Event{}}},
		{"map batch without rank", om{"events", []any{}, "ts", 1.5}, Batch{TS: 1.5, DPRank: -1, Events: []Event{}}},
		{"map batch with non-string key", om{1, 2, "ts", 1.0, "events", []any{}}, Batch{TS: 1, DPRank: -1, Events: []Event{}}},
		{"type after the fields", []any{1.0, []any{om{"block_hashes", []any{5}, "type", "BlockRemoved"}}},
			Batch{TS: 1, DPRank: -1, Events: []Event{removed(5)}}},
		{"removed ignores stored-only keys", []any{1.0, []any{om{"type", "BlockRemoved", "block_hashes", []any{5}, "token_ids", []any{1}, "lora_id", 3}}},
			Batch{TS: 1, DPRank: -1, Events: []Event{removed(5)}}},
		{"array event extra positions ignored", []any{1.0, []any{[]any{"BlockRemoved", []any{5}, nil, nil, "later", om{"a", 1}}}},
			Batch{TS: 1, DPRank: -1, Events: []Event{removed(5)}}},
		{"empty stored event is valid", []any{1.0, []any{[]any{"BlockStored", []any{}, nil, []any{}, 16}}},
			Batch{TS: 1, DPRank: -1, Events: []Event{{Kind: BlockStored, BlockHashes: []Hash{}, TokenIDs: []uint32{}, BlockSize: 16, LoRAID: -1, GroupIdx: -1, SlidingWindow: -1}}}},
		{"short bin hash zero-extended", []any{1.0, []any{[]any{"BlockRemoved", []any{[]byte{1, 2}}}}},
			Batch{TS: 1, DPRank: -1, Events: []Event{removed(0x0102)}}},
		{"int8 negative hash keeps its bits", []any{1.0, []any{[]any{"BlockRemoved", []any{-1}}}},
			Batch{TS: 1, DPRank: -1, Events: []Event{removed(0xffffffffffffffff)}}},
		{"ext values skipped", []any{1.0, []any{om{"type", "BlockRemoved", "block_hashes", []any{5},
			"a", msgpack.RawMessage{0xd4, 1, 2}, "b", msgpack.RawMessage{0xd8, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
			"c", msgpack.RawMessage{0xc7, 3, 5, 1, 2, 3}, "d", msgpack.RawMessage{0xc8, 0, 2, 5, 1, 2},
			"e", msgpack.RawMessage{0xc9, 0, 0, 0, 1, 5, 9}}}},
			Batch{TS: 1, DPRank: -1, Events: []Event{removed(5)}}},
		{"unknown array and map tags", []any{1.0, []any{[]any{"X"}, om{"type", "Y"}}, 0},
			Batch{TS: 1, DPRank: 0, Unknown: 2, Events: []Event{}}},
	}
	drops := []struct {
		name  string
		event any
		// msg is DropErr's message after "event 0 dropped: ".
		msg string
	}{
		{"not an array or map", "BlockStored", "code 0xab where an array is required"},
		{"empty array", []any{}, "empty event"},
		{"tag not a string", []any{1}, "type: code 0x1 where a string is required"},
		{"map without type", om{"block_hashes", []any{1}}, "event without \"type\""},
		{"map type not a string", om{"type", 1}, "type: code 0x1 where a string is required"},
		{"map key not a string", om{"type", "BlockRemoved", 1, 2, "block_hashes", []any{1}}, "key: code 0x1 where a string is required"},
		{"stored without block_size", []any{"BlockStored", []any{1}, nil, seq(0, 16)}, "BlockStored without block_hashes, token_ids or block_size"},
		{"stored block_size zero", []any{"BlockStored", []any{}, nil, []any{}, 0}, "block_size 0, want at least 1"},
		{"stored block_size negative", []any{"BlockStored", []any{}, nil, []any{}, -16}, "block_size: integer -16 out of range [0, 2147483647]"},
		{"stored block_size float", []any{"BlockStored", []any{}, nil, []any{}, 16.0}, "block_size: code 0xcb where an integer is required"},
		{"stored tokens not a multiple", []any{"BlockStored", []any{1}, nil, seq(0, 17), 16}, "17 tokens for 1 blocks of 16"},
		{"stored too few hashes", []any{"BlockStored", []any{1}, nil, seq(0, 32), 16}, "32 tokens for 1 blocks of 16"},
		{"stored too many hashes", []any{"BlockStored", []any{1, 2}, nil, seq(0, 16), 16}, "16 tokens for 2 blocks of 16"},
		{"token id negative", []any{"BlockStored", []any{1}, nil, append(seq(0, 15), -1), 16}, "token_ids: integer -1 out of range [0, 4294967295]"},
		{"token id over uint32", []any{"BlockStored", []any{1}, nil, append(seq(0, 15), 1<<32), 16}, "token_ids: integer 4294967296 out of range [0, 4294967295]"},
		{"token ids nil", []any{"BlockStored", []any{}, nil, nil, 16}, "token_ids: nil where an array is required"},
		{"hash nil", []any{"BlockRemoved", []any{nil}}, "block_hashes: code 0xc0 where a block hash is required"},
		{"hash string", []any{"BlockRemoved", []any{"ab"}}, "block_hashes: code 0xa2 where a block hash is required"},
		{"hash float", []any{"BlockRemoved", []any{1.5}}, "block_hashes: code 0xcb where a block hash is required"},
		{"parent hash string", []any{"BlockStored", []any{}, "p", []any{}, 16}, "parent_block_hash: code 0xa1 where a block hash is required"},
		{"lora_id negative", []any{"BlockStored", []any{}, nil, []any{}, 16, -1}, "lora_id: integer -1 out of range [0, 2147483647]"},
		{"medium not a string", []any{"BlockRemoved", []any{1}, 5}, "medium: code 0x5 where a string is required"},
		{"medium bin", []any{"BlockRemoved", []any{1}, []byte("GPU")}, "medium: code 0xc4 where a string is required"},
		{"group_idx negative", []any{"BlockRemoved", []any{1}, "GPU", -2}, "group_idx: integer -2 out of range [0, 2147483647]"},
		{"removed without hashes", om{"type", "BlockRemoved", "medium", "GPU"}, "BlockRemoved without block_hashes"},
	}
	for _, d := range drops {
		tests = append(tests, struct {
			name  string
			value any
			want  Batch
		}{"drop " + d.name, []any{1.0, []any{d.event, []any{"BlockRemoved", []any{5}}}, 0},
			Batch{TS: 1, DPRank: 0, Dropped: 1, Events: []Event{removed(5)},
				DropErr: errors.New("kvevents: malformed: event 0 dropped: " + d.msg)}})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeBatch(pack(t, tt.value))
			if err != nil {
				t.Fatal(err)
			}
			checkDropErr(t, &got, &tt.want)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("DecodeBatch =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

// checkDropErr checks that got.DropErr wraps ErrMalformed with want's
// message, then clears both so the batches compare with DeepEqual.
func checkDropErr(t *testing.T, got, want *Batch) {
	t.Helper()
	switch {
	case got.DropErr == nil && want.DropErr == nil:
	case got.DropErr == nil || want.DropErr == nil:
		t.Errorf("DropErr = %v, want %v", got.DropErr, want.DropErr)
	case !errors.Is(got.DropErr, ErrMalformed) || got.DropErr.Error() != want.DropErr.Error():
		t.Errorf("DropErr = %q, want %q wrapping ErrMalformed", got.DropErr, want.DropErr)
	}
	got.DropErr, want.DropErr = nil, nil
}

func TestDecodeBatchErrors(t *testing.T) {
	valid := pack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{5}}}, 0})
	deep := append(pack(t, 1.0), bytes.Repeat([]byte{0x91}, 100)...)
	deep = append([]byte{0x92}, append(deep[:9], append(bytes.Repeat([]byte{0x91}, 100), 0xc0)...)...)
	tests := []struct {
		name    string
		payload []byte
		want    error
		msg     string
	}{
		{"empty", nil, ErrMalformed, "unexpected EOF"},
		{"nil", []byte{0xc0}, ErrMalformed, "nil where an array is required"},
		{"string", pack(t, "batch"), ErrMalformed, "batch at byte 0: code 0xa5 where an array is required"},
		{"one element", pack(t, []any{1.0}), ErrMalformed, "array batch of 1 elements"},
		{"ts string", pack(t, []any{"x", []any{}}), ErrMalformed, "decoding float32"},
		{"events nil", pack(t, []any{1.0, nil}), ErrMalformed, "nil where an array is required"},
		{"events map", pack(t, []any{1.0, om{}}), ErrMalformed, "batch at byte 10: code 0x80 where an array is required"},
		{"negative rank", pack(t, []any{1.0, []any{}, -1}), ErrMalformed, "out of range"},
		{"rank string", pack(t, []any{1.0, []any{}, "0"}), ErrMalformed, "batch at byte 11: code 0xa1 where an integer is required"},
		{"map without events", pack(t, om{"ts", 1.0}), ErrMalformed, `without "ts" or "events"`},
		{"map without ts", pack(t, om{"events", []any{}}), ErrMalformed, `without "ts" or "events"`},
		{"truncated", valid[:len(valid)-1], ErrMalformed, "unexpected EOF"},
		{"trailing bytes", append(bytes.Clone(valid), 0), ErrMalformed, "1 trailing bytes"},
		{"huge declared events", append(pack(t, 1.0)[:0], 0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x90),
			ErrMalformed, "unexpected EOF"},
		{"huge declared string", []byte{0x92, 0x01, 0x91, 0xdb, 0xff, 0xff, 0xff, 0xff}, ErrMalformed, "unexpected EOF"},
		{"huge declared ext", []byte{0x92, 0x01, 0x91, 0xc9, 0xff, 0xff, 0xff, 0xff, 5}, ErrMalformed, "unexpected EOF"},
		{"never-used code", []byte{0x92, 0x01, 0x91, 0xc1}, ErrMalformed, "unknown code"},
		{"deep nesting", deep, ErrMalformed, "nesting too deep"},
		{"too large", make([]byte, MaxPayloadSize+1), ErrTooLarge, "67108865 bytes, cap 67108864"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeBatch(tt.payload)
			if !errors.Is(err, tt.want) {
				t.Fatalf("DecodeBatch error = %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not contain %q", err, tt.msg)
			}
			if !reflect.DeepEqual(got, Batch{}) {
				t.Errorf("DecodeBatch = %+v with an error, want the zero Batch", got)
			}
		})
	}
}

// TestDecodeBatchMemoryBounded decodes payloads built to allocate the most
// per byte (minimal events, one-byte hashes and tokens) and checks that the
// decoder allocates at most 24 times the payload's length.
func TestDecodeBatchMemoryBounded(t *testing.T) {
	const n = 1 << 16
	minimal := make([]any, n)
	for i := range minimal {
		minimal[i] = []any{"BlockRemoved", []any{}}
	}
	manyHashes := make([]any, n)
	for i := range manyHashes {
		manyHashes[i] = i % 128
	}
	tests := []struct {
		name  string
		value any
	}{
		{"minimal events", []any{1.0, minimal, 0}},
		{"one-byte hashes", []any{1.0, []any{[]any{"BlockRemoved", manyHashes}}, 0}},
		{"one-byte tokens", []any{1.0, []any{[]any{"BlockStored", manyHashes, nil, manyHashes, 1}}, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			payload := pack(t, tt.value)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			b, err := DecodeBatch(payload)
			runtime.ReadMemStats(&after)
			if err != nil || b.Dropped != 0 {
				t.Fatalf("DecodeBatch: %v, %d dropped", err, b.Dropped)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > 24*uint64(len(payload)) {
				t.Errorf("DecodeBatch of %d bytes allocated %d bytes (%.1fx), want at most 24x",
					len(payload), got, float64(got)/float64(len(payload)))
			} else {
				t.Logf("%d bytes allocated %d bytes (%.1fx)", len(payload), got, float64(got)/float64(len(payload)))
			}
		})
	}
}

// TestDecodeBatchJunkEvents checks that events dropped after the first cost
// no allocation for their reason: only the first drop's reason is built, so
// a payload of 65536 small junk events makes at most 100 allocations (a
// fixed number; -race and sync.Pool add some), not one error per event.
// What a dropped event decoded before failing, such as its hashes, is still
// allocated, within TestDecodeBatchMemoryBounded's bound.
func TestDecodeBatchJunkEvents(t *testing.T) {
	const n = 1 << 16
	for _, junk := range [][]byte{{0x01}, {0xc0}, {0xa0}, {0x90}, {0x91, 0x01}, {0x91, 0xa1, 'X'}, {0x80},
		{0x82, 0xa4, 't', 'y', 'p', 'e', 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd', 0x01, 0x01},
		{0x92, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0xa1, 'x'},
		{0x95, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x90, 0xc0, 0x90, 0xff}} {
		events := bytes.Repeat(junk, n)
		payload := binary.BigEndian.AppendUint32([]byte{0x92, 0x01, 0xdd}, n)
		payload = append(payload, events...)
		var b Batch
		var err error
		allocs := testing.AllocsPerRun(2, func() { b, err = DecodeBatch(payload) })
		if err != nil || b.Dropped+b.Unknown != n {
			t.Fatalf("junk % x: DecodeBatch: %v, %d dropped, %d unknown, want %d", junk, err, b.Dropped, b.Unknown, n)
		}
		if allocs > 100 {
			t.Errorf("junk % x: %v allocations for %d junk events (%v), want at most 100", junk, allocs, n, b.DropErr)
		}
	}
}
