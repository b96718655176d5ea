package kvevents

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// maxDepth is the deepest nesting of arrays and maps the decoder follows
// when it skips a value (an unknown field, extra_keys). vLLM's deepest value,
// extra_keys, nests about four levels; the bound keeps a payload of nested
// one-byte arrays from recursing without limit.
const maxDepth = 32

// minEventSize is the length in bytes of the smallest valid event,
// ["BlockRemoved", []].
const minEventSize = 15

// field identifies an event field, in vLLM's declaration order for
// BlockStored.
type field uint8

const (
	fNone field = iota
	fBlockHashes
	fParentBlockHash
	fTokenIDs
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSlidingWindow
)

// fieldNames maps a field to its wire name in map-encoded events.
var fieldNames = [...]string{
	fBlockHashes:     "block_hashes",
	fParentBlockHash: "parent_block_hash",
	fTokenIDs:        "token_ids",
	fBlockSize:       "block_size",
	fLoRAID:          "lora_id",
	fMedium:          "medium",
	fLoRAName:        "lora_name",
	fExtraKeys:       "extra_keys",
	fGroupIdx:        "group_idx",
	fSpecKind:        "kv_cache_spec_kind",
	fSlidingWindow:   "kv_cache_spec_sliding_window",
}

// positions lists, per kind, the fields of an array-encoded event in wire
// order after the tag (msgspec array_like: declaration order).
var positions = [...][]field{
	BlockStored: {fBlockHashes, fParentBlockHash, fTokenIDs, fBlockSize, fLoRAID, fMedium,
		fLoRAName, fExtraKeys, fGroupIdx, fSpecKind, fSlidingWindow},
	BlockRemoved:     {fBlockHashes, fMedium, fGroupIdx},
	AllBlocksCleared: {},
}

func fieldByName(name []byte) field {
	for f := fBlockHashes; f <= fSlidingWindow; f++ {
		if string(name) == fieldNames[f] {
			return f
		}
	}
	return fNone
}

// reader is a msgpack decoder over an in-memory buffer. Because the
// decoder reads straight from the bytes.Reader (it is an io.ByteScanner, so
// msgpack adds no buffering), the reader's position is exact and strings
// and bins can be sliced out of buf without copying.
type reader struct {
	buf []byte
	br  bytes.Reader
	d   *msgpack.Decoder
	// quiet makes the event decoders return errQuiet instead of building
	// an error message: only the first dropped event's reason is kept,
	// and a payload of junk events must not cost an allocation per byte.
	quiet bool
}

// The decoder's fixed errors, allocated once.
var (
	errQuiet       = errors.New("event dropped")
	errNilArray    = errors.New("nil where an array is required")
	errNilInt      = errors.New("nil where an integer is required")
	errTooDeep     = errors.New("nesting too deep")
	errEmptyEvent  = errors.New("empty event")
	errNoType      = errors.New(`event without "type"`)
	errStoredNeeds = errors.New("BlockStored without block_hashes, token_ids or block_size")
	errRemovedNeed = errors.New("BlockRemoved without block_hashes")
)

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}
func isMap(c byte) bool { return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32 }
func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64)
}

func newReader() *reader {
	r := &reader{}
	r.d = msgpack.NewDecoder(&r.br)
	return r
}

func (r *reader) reset(b []byte) {
	r.buf = b
	r.br.Reset(b)
	r.d.ResetReader(&r.br)
}

func (r *reader) pos() int { return len(r.buf) - r.br.Len() }

// take returns the next n bytes of buf and moves past them, refusing a
// length beyond what remains.
func (r *reader) take(n int) ([]byte, error) {
	if n < 0 || n > r.br.Len() {
		return nil, io.ErrUnexpectedEOF
	}
	p := r.pos()
	if _, err := r.br.Seek(int64(n), io.SeekCurrent); err != nil {
		return nil, err
	}
	return r.buf[p : p+n : p+n], nil
}

func (r *reader) peek() (byte, error) { return r.d.PeekCode() }

func (r *reader) isNil() (bool, error) {
	c, err := r.peek()
	if err != nil {
		return false, err
	}
	if c == msgpcode.Nil {
		_, err = r.br.ReadByte()
		return true, err
	}
	return false, nil
}

// arrayLen reads an array header; nil is refused. The length is refused
// when the remaining bytes cannot hold that many elements (each takes at
// least one byte).
func (r *reader) arrayLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Nil {
		return 0, errNilArray
	}
	if !isArray(c) {
		if r.quiet {
			return 0, errQuiet
		}
		return 0, fmt.Errorf("code %#x where an array is required", c)
	}
	n, err := r.d.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	if n > r.br.Len() {
		return 0, io.ErrUnexpectedEOF
	}
	return n, nil
}

// mapLen is arrayLen for a map header (each entry takes at least two bytes).
func (r *reader) mapLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if !isMap(c) {
		if r.quiet {
			return 0, errQuiet
		}
		return 0, fmt.Errorf("code %#x where a map is required", c)
	}
	n, err := r.d.DecodeMapLen()
	if err != nil {
		return 0, err
	}
	if n > r.br.Len()/2 {
		return 0, io.ErrUnexpectedEOF
	}
	return n, nil
}

// str reads a msgpack str (not bin) and returns its bytes, aliasing buf.
func (r *reader) str() ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	if !msgpcode.IsString(c) {
		if r.quiet {
			return nil, errQuiet
		}
		return nil, fmt.Errorf("code %#x where a string is required", c)
	}
	n, err := r.d.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	return r.take(n)
}

// optStr reads a str or nil ("").
func (r *reader) optStr() (string, error) {
	if isNil, err := r.isNil(); err != nil || isNil {
		return "", err
	}
	b, err := r.str()
	return string(b), err
}

// fastUint reads a positive fixint or a uint 8/16/32/64 straight from buf,
// the forms of almost every integer vLLM sends; ok is false for any other
// value, and the reader has then not moved.
func (r *reader) fastUint() (v uint64, ok bool) {
	p := r.pos()
	if p >= len(r.buf) {
		return 0, false
	}
	c := r.buf[p]
	var n int
	switch c {
	case msgpcode.Uint8:
		n = 1
	case msgpcode.Uint16:
		n = 2
	case msgpcode.Uint32:
		n = 4
	case msgpcode.Uint64:
		n = 8
	default:
		if c > msgpcode.PosFixedNumHigh {
			return 0, false
		}
		_, _ = r.br.ReadByte()
		return uint64(c), true
	}
	if n > len(r.buf)-p-1 {
		return 0, false
	}
	for _, x := range r.buf[p+1 : p+1+n] {
		v = v<<8 | uint64(x)
	}
	_, _ = r.br.Seek(int64(1+n), io.SeekCurrent)
	return v, true
}

// uint reads a non-negative integer no larger than limit.
func (r *reader) uint(limit int64) (int64, error) {
	if v, ok := r.fastUint(); ok {
		if v > uint64(limit) {
			return 0, r.outOfRange(int64(v), limit)
		}
		return int64(v), nil
	}
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Nil {
		return 0, errNilInt
	}
	if !isInt(c) {
		if r.quiet {
			return 0, errQuiet
		}
		return 0, fmt.Errorf("code %#x where an integer is required", c)
	}
	v, err := r.d.DecodeInt64()
	if err != nil {
		return 0, err
	}
	if v < 0 || v > limit {
		return 0, r.outOfRange(v, limit)
	}
	return v, nil
}

// outOfRange is the error for an integer v outside [0, limit]; v above
// MaxInt64 shows as negative.
func (r *reader) outOfRange(v, limit int64) error {
	if r.quiet {
		return errQuiet
	}
	return fmt.Errorf("integer %d out of range [0, %d]", v, limit)
}

// optUint reads a non-negative integer or nil (-1).
func (r *reader) optUint() (int, error) {
	if isNil, err := r.isNil(); err != nil || isNil {
		return -1, err
	}
	v, err := r.uint(math.MaxInt32)
	return int(v), err
}

// hash reads an int hash (its 64 bits, whatever the sign) or a bin digest
// (its last 8 bytes, big-endian).
func (r *reader) hash() (Hash, error) {
	if v, ok := r.fastUint(); ok {
		return Hash(v), nil
	}
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32:
		n, err := r.d.DecodeBytesLen()
		if err != nil {
			return 0, err
		}
		b, err := r.take(n)
		if err != nil {
			return 0, err
		}
		if len(b) > 8 {
			b = b[len(b)-8:]
		}
		var h Hash
		for _, x := range b {
			h = h<<8 | Hash(x)
		}
		return h, nil
	case isInt(c):
		v, err := r.d.DecodeUint64()
		return Hash(v), err
	}
	if r.quiet {
		return 0, errQuiet
	}
	return 0, fmt.Errorf("code %#x where a block hash is required", c)
}

// skip moves past one value of any type, following at most maxDepth levels
// of nesting.
func (r *reader) skip(depth int) error {
	c, err := r.peek()
	if err != nil {
		return err
	}
	switch {
	case isArray(c):
		if depth >= maxDepth {
			return errTooDeep
		}
		n, err := r.arrayLen()
		if err != nil {
			return err
		}
		for range n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case isMap(c):
		if depth >= maxDepth {
			return errTooDeep
		}
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		n, err := r.d.DecodeBytesLen()
		if err != nil {
			return err
		}
		_, err = r.take(max(n, 0))
		return err
	case msgpcode.IsExt(c):
		// Skipped here rather than by the msgpack decoder, which would
		// read the data into a buffer it keeps (and the pool with it).
		_, _ = r.br.ReadByte()
		var n int
		switch c {
		case msgpcode.FixExt1, msgpcode.FixExt2, msgpcode.FixExt4, msgpcode.FixExt8, msgpcode.FixExt16:
			n = 1 << (c - msgpcode.FixExt1)
		default:
			l, err := r.take(1 << (c - msgpcode.Ext8))
			if err != nil {
				return err
			}
			for _, x := range l {
				n = n<<8 | int(x)
			}
		}
		_, err = r.take(n + 1) // the type byte and the data
		return err
	}
	// Scalars: nil, booleans, numbers, of fixed size.
	return r.d.Skip()
}

// readerPool holds the readers of DecodeBatch.
var readerPool = sync.Pool{New: func() any { return newReader() }}

// DecodeBatch decodes one KV-cache event batch, the third frame of a vLLM
// KV-events message.
//
// The batch may be an array [ts, events, data_parallel_rank] (every vLLM so
// far; the rank may be absent, extra elements are ignored) or a map with the
// keys "ts", "events" and "data_parallel_rank" (unknown keys ignored). Each
// event may be a positional array ["BlockStored", block_hashes, ...] with
// trailing fields omitted (vLLM before PR #42892) or a map with a "type" key
// and field names (since); unknown keys and extra positions are ignored, so
// vLLM adding a field never breaks decoding.
//
// An event of an unknown type is skipped and counted in [Batch.Unknown]; an
// event that fails validation is dropped and counted in [Batch.Dropped],
// the first one's reason kept in [Batch.DropErr]; neither is an error. The error, wrapping [ErrMalformed], is for a payload
// that is not a batch: invalid or truncated msgpack, ts or events missing or
// of the wrong type, a negative rank, trailing bytes. A payload over
// [MaxPayloadSize] gets an error wrapping [ErrTooLarge].
//
// The result does not alias payload. Its memory is bounded by the payload's
// length: no length prefix is trusted beyond the bytes that remain, and
// decoding allocates at most about 20 times the payload's length (an Event
// takes 176 bytes and the smallest valid event 15 on the wire; a Hash takes
// 8 and the smallest integer 1), 12 times for a payload of minimal events
// (TestDecodeBatchMemoryBounded). It is safe for concurrent use.
func DecodeBatch(payload []byte) (Batch, error) {
	if len(payload) > MaxPayloadSize {
		return Batch{}, fmt.Errorf("%w: %d bytes, cap %d", ErrTooLarge, len(payload), MaxPayloadSize)
	}
	r := readerPool.Get().(*reader)
	defer func() {
		r.reset(nil)
		readerPool.Put(r)
	}()
	r.reset(payload)
	b, err := r.decodeBatch()
	if err == nil && r.br.Len() != 0 {
		err = fmt.Errorf("%d trailing bytes", r.br.Len())
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Batch{}, fmt.Errorf("%w: batch at byte %d: %w", ErrMalformed, r.pos(), err)
	}
	return b, nil
}

func (r *reader) decodeBatch() (Batch, error) {
	b := Batch{DPRank: -1}
	c, err := r.peek()
	if err != nil {
		return b, err
	}
	if isMap(c) {
		n, err := r.mapLen()
		if err != nil {
			return b, err
		}
		var haveTS, haveEvents bool
		for range n {
			key, err := r.str()
			if err != nil {
				// A non-string key: skip it and its value.
				if err := r.skip(0); err != nil {
					return b, err
				}
				if err := r.skip(0); err != nil {
					return b, err
				}
				continue
			}
			switch string(key) {
			case "ts":
				haveTS = true
				b.TS, err = r.d.DecodeFloat64()
			case "events":
				haveEvents = true
				err = r.decodeEvents(&b)
			case "data_parallel_rank":
				b.DPRank, err = r.optUint()
			default:
				err = r.skip(0)
			}
			if err != nil {
				return b, err
			}
		}
		if !haveTS || !haveEvents {
			return b, errors.New(`map batch without "ts" or "events"`)
		}
		return b, nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return b, err
	}
	if n < 2 {
		return b, fmt.Errorf("array batch of %d elements, want [ts, events, rank]", n)
	}
	if b.TS, err = r.d.DecodeFloat64(); err != nil {
		return b, err
	}
	if err := r.decodeEvents(&b); err != nil {
		return b, err
	}
	if n >= 3 {
		if b.DPRank, err = r.optUint(); err != nil {
			return b, err
		}
	}
	for i := 3; i < n; i++ {
		if err := r.skip(0); err != nil {
			return b, err
		}
	}
	return b, nil
}

// decodeEvents decodes the events array. An event is decoded in place;
// when it must be dropped, or is of an unknown type, the reader goes back
// to its start and skips it whole, so one bad event never costs the batch
// (an error while skipping is the batch's).
func (r *reader) decodeEvents(b *Batch) error {
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	// Size Events once, from the declared length capped by what the
	// remaining bytes can hold: a valid event takes at least
	// minEventSize bytes. Growing it by append instead would allocate
	// several times its final size on a payload of many small events.
	b.Events = make([]Event, 0, min(n, r.br.Len()/minEventSize))
	for i := range n {
		start := r.pos()
		r.quiet = b.DropErr != nil
		ev, evErr := r.decodeEvent()
		r.quiet = false
		if evErr == nil && ev.Kind != Unknown {
			b.Events = append(b.Events, ev)
			continue
		}
		if _, err := r.br.Seek(int64(start), io.SeekStart); err != nil {
			return err
		}
		if err := r.skip(1); err != nil {
			return err
		}
		if evErr == nil {
			b.Unknown++
			continue
		}
		b.Dropped++
		if b.DropErr == nil {
			b.DropErr = fmt.Errorf("%w: event %d dropped: %w", ErrMalformed, i, evErr)
		}
	}
	return nil
}

// decodeEvent decodes the next event. It returns an event of kind Unknown
// for a tag it does not know, and an error for an event it must drop; in
// both cases it may stop anywhere inside the event.
func (r *reader) decodeEvent() (Event, error) {
	ev := Event{LoRAID: -1, GroupIdx: -1, SlidingWindow: -1}
	var seen uint32
	c, err := r.peek()
	if err != nil {
		return ev, err
	}
	if isMap(c) {
		n, err := r.mapLen()
		if err != nil {
			return ev, err
		}
		for range n {
			key, err := r.str()
			if err != nil {
				return ev, r.wrap("key", err)
			}
			if string(key) == "type" {
				tag, err := r.str()
				if err != nil {
					return ev, r.wrap("type", err)
				}
				if ev.Kind = kindOf(tag); ev.Kind == Unknown {
					return ev, nil
				}
				continue
			}
			f := fieldByName(key)
			if err := r.decodeField(&ev, f); err != nil {
				return ev, err
			}
			seen |= 1 << f
		}
	} else {
		n, err := r.arrayLen()
		if err != nil {
			return ev, err
		}
		if n < 1 {
			return ev, errEmptyEvent
		}
		tag, err := r.str()
		if err != nil {
			return ev, r.wrap("type", err)
		}
		if ev.Kind = kindOf(tag); ev.Kind == Unknown {
			return ev, nil
		}
		pos := positions[ev.Kind]
		for i := 1; i < n; i++ {
			f := fNone
			if i-1 < len(pos) {
				f = pos[i-1]
			}
			if err := r.decodeField(&ev, f); err != nil {
				return ev, err
			}
			seen |= 1 << f
		}
	}
	return ev, r.validate(&ev, seen)
}

// validate checks ev against its kind's required fields and, for
// BlockStored, llm-d's invariant (pkg/kvevents/pool.go@ebab6879): the
// tokens fill exactly one block of block_size per block hash.
func (r *reader) validate(ev *Event, seen uint32) error {
	switch ev.Kind {
	case Unknown:
		return errNoType
	case BlockStored:
		const need = 1<<fBlockHashes | 1<<fTokenIDs | 1<<fBlockSize
		if seen&need != need {
			return errStoredNeeds
		}
		if ev.BlockSize < 1 {
			if r.quiet {
				return errQuiet
			}
			return fmt.Errorf("block_size %d, want at least 1", ev.BlockSize)
		}
		if len(ev.TokenIDs)%ev.BlockSize != 0 || len(ev.TokenIDs)/ev.BlockSize != len(ev.BlockHashes) {
			if r.quiet {
				return errQuiet
			}
			return fmt.Errorf("%d tokens for %d blocks of %d", len(ev.TokenIDs), len(ev.BlockHashes), ev.BlockSize)
		}
	case BlockRemoved:
		if seen&(1<<fBlockHashes) == 0 {
			return errRemovedNeed
		}
	}
	ev.normalize()
	return nil
}

// decodeField decodes the value of field f into ev; fNone skips it.
func (r *reader) decodeField(ev *Event, f field) error {
	var err error
	switch f {
	case fBlockHashes:
		ev.BlockHashes, err = r.hashes()
	case fParentBlockHash:
		var isNil bool
		if isNil, err = r.isNil(); err == nil && !isNil {
			ev.ParentBlockHash, err = r.hash()
			ev.HasParent = true
		}
	case fTokenIDs:
		ev.TokenIDs, err = r.tokens()
	case fBlockSize:
		var v int64
		v, err = r.uint(math.MaxInt32)
		ev.BlockSize = int(v)
	case fLoRAID:
		ev.LoRAID, err = r.optUint()
	case fMedium:
		ev.Medium, err = r.optStr()
	case fLoRAName:
		ev.LoRAName, err = r.optStr()
	case fExtraKeys:
		var isNil bool
		if isNil, err = r.isNil(); err == nil && !isNil {
			start := r.pos()
			if err = r.skip(1); err == nil {
				ev.ExtraKeys = bytes.Clone(r.buf[start:r.pos()])
			}
		}
	case fGroupIdx:
		ev.GroupIdx, err = r.optUint()
	case fSpecKind:
		ev.SpecKind, err = r.optStr()
	case fSlidingWindow:
		ev.SlidingWindow, err = r.optUint()
	default:
		err = r.skip(1)
	}
	if err != nil && f != fNone {
		return r.wrap(fieldNames[f], err)
	}
	return err
}

// wrap prefixes err with the name of what was being read.
func (r *reader) wrap(what string, err error) error {
	if r.quiet {
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (r *reader) hashes() ([]Hash, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	hs := make([]Hash, n)
	for i := range hs {
		if hs[i], err = r.hash(); err != nil {
			return nil, err
		}
	}
	return hs, nil
}

func (r *reader) tokens() ([]uint32, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	ts := make([]uint32, n)
	for i := range ts {
		v, err := r.uint(math.MaxUint32)
		if err != nil {
			return nil, err
		}
		ts[i] = uint32(v)
	}
	return ts, nil
}
