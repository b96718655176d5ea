package kvevents

import (
	"bytes"

	"github.com/vmihailenco/msgpack/v5"
)

// Encoding selects how [AppendBatch] writes events. The batch itself is an
// array [ts, events, data_parallel_rank] in both, as every vLLM so far
// publishes it.
type Encoding uint8

const (
	// EncodingArray writes each event as a positional array
	// ["BlockStored", block_hashes, parent_block_hash, ...] with trailing
	// nil fields omitted: msgspec array_like with omit_defaults, what
	// vLLM published before PR #42892 (merged 2026-06-09).
	EncodingArray Encoding = iota
	// EncodingMap writes each event as a map {"type": "BlockStored",
	// "block_hashes": ..., ...} with every field of its kind, nil ones
	// included, as vLLM 0.26.0 publishes it (since PR #42892).
	EncodingMap
)

// AppendBatch appends the msgpack encoding of b to dst and returns the
// extended slice: the payload frame of a vLLM KV-events message. For any b
// that [DecodeBatch] returned, decoding the result gives b again, less
// Dropped, DropErr and Unknown, which are not encoded (FuzzDecodeBatch checks this);
// an event that breaks the BlockStored invariant is written as it is and
// dropped by the decoder.
//
// Events of kind [Unknown], or of a Kind beyond the constants, are not
// written; fields a kind does not use are not written. Hashes are written as
// integers (vLLM's default VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), integers in
// their shortest msgpack form, TS as a float64, nil slices as empty arrays,
// and a negative DPRank, LoRAID, GroupIdx or SlidingWindow as nil. ExtraKeys
// is written as is and must be one msgpack value or empty. An unknown enc
// writes events as maps. It is safe for concurrent use.
func AppendBatch(dst []byte, b Batch, enc Encoding) []byte {
	w := bytes.NewBuffer(dst)
	e := msgpack.NewEncoder(w)
	// Writes to a bytes.Buffer cannot fail, so the encoder's errors are
	// ignored throughout.
	_ = e.EncodeArrayLen(3)
	_ = e.EncodeFloat64(b.TS)
	n := 0
	for i := range b.Events {
		if b.Events[i].Kind.known() {
			n++
		}
	}
	_ = e.EncodeArrayLen(n)
	for i := range b.Events {
		ev := &b.Events[i]
		if !ev.Kind.known() {
			continue
		}
		if enc == EncodingArray {
			appendArrayEvent(w, e, ev)
		} else {
			appendMapEvent(w, e, ev)
		}
	}
	optInt(e, b.DPRank)
	return w.Bytes()
}

func appendArrayEvent(w *bytes.Buffer, e *msgpack.Encoder, ev *Event) {
	pos := positions[ev.Kind]
	// Omit trailing nil fields; BlockStored's first four are required.
	n := len(pos)
	for n > 0 && isNilField(ev, pos[n-1]) && !(ev.Kind == BlockStored && n <= 4) {
		n--
	}
	_ = e.EncodeArrayLen(1 + n)
	_ = e.EncodeString(ev.Kind.String())
	for _, f := range pos[:n] {
		appendField(w, e, ev, f)
	}
}

func appendMapEvent(w *bytes.Buffer, e *msgpack.Encoder, ev *Event) {
	pos := positions[ev.Kind]
	_ = e.EncodeMapLen(1 + len(pos))
	_ = e.EncodeString("type")
	_ = e.EncodeString(ev.Kind.String())
	for _, f := range pos {
		_ = e.EncodeString(fieldNames[f])
		appendField(w, e, ev, f)
	}
}

// isNilField reports whether f is written as nil.
func isNilField(ev *Event, f field) bool {
	switch f {
	case fParentBlockHash:
		return !ev.HasParent
	case fLoRAID:
		return ev.LoRAID < 0
	case fMedium:
		return ev.Medium == ""
	case fLoRAName:
		return ev.LoRAName == ""
	case fExtraKeys:
		return len(ev.ExtraKeys) == 0
	case fGroupIdx:
		return ev.GroupIdx < 0
	case fSpecKind:
		return ev.SpecKind == ""
	case fSlidingWindow:
		return ev.SlidingWindow < 0
	}
	return false
}

// encodeUints writes vs as a msgpack array of unsigned integers.
func encodeUints[T ~uint64 | ~uint32](e *msgpack.Encoder, vs []T) {
	_ = e.EncodeArrayLen(len(vs))
	for _, v := range vs {
		_ = e.EncodeUint(uint64(v))
	}
}

func appendField(w *bytes.Buffer, e *msgpack.Encoder, ev *Event, f field) {
	if isNilField(ev, f) {
		_ = e.EncodeNil()
		return
	}
	switch f {
	case fBlockHashes:
		encodeUints(e, ev.BlockHashes)
	case fParentBlockHash:
		_ = e.EncodeUint(uint64(ev.ParentBlockHash))
	case fTokenIDs:
		encodeUints(e, ev.TokenIDs)
	case fBlockSize:
		_ = e.EncodeInt(int64(ev.BlockSize))
	case fLoRAID:
		_ = e.EncodeInt(int64(ev.LoRAID))
	case fMedium:
		_ = e.EncodeString(ev.Medium)
	case fLoRAName:
		_ = e.EncodeString(ev.LoRAName)
	case fExtraKeys:
		w.Write(ev.ExtraKeys)
	case fGroupIdx:
		_ = e.EncodeInt(int64(ev.GroupIdx))
	case fSpecKind:
		_ = e.EncodeString(ev.SpecKind)
	case fSlidingWindow:
		_ = e.EncodeInt(int64(ev.SlidingWindow))
	}
}

func optInt(e *msgpack.Encoder, v int) {
	if v < 0 {
		_ = e.EncodeNil()
		return
	}
	_ = e.EncodeInt(int64(v))
}
