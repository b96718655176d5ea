package oai

import (
	"math"

	"github.com/cespare/xxhash/v2"

	"github.com/switchboard-gw/switchboard/internal/stablehash"
)

// This file computes Request.PrefixHashes: the chained hashes of the fixed-
// size blocks of a prompt's canonical byte stream (see Parser).
//
// The decoder walks the prompt field once. Every piece of the stream is a
// sub-slice of the body (or a separator byte) that prefixHasher hashes in
// place, so nothing is copied and nothing is parsed twice. A chat message's
// role, content and tool_calls are collected as the message's members are
// read and hashed when the message ends, because the stream's order must not
// depend on the key order in the message and the last duplicate key wins.

// Separator bytes of the canonical stream. JSON strings cannot hold raw
// control characters, so these never occur inside a role, content string or
// token id, and the stream is unambiguous.
const (
	sepField  = 0x00 // after a chat role, before tool_calls; after a string of a prompt array
	sepRecord = 0x01 // after a chat message; after an array of token ids in a prompt array
	sepToken  = 0x02 // after a token id of a prompt array
)

// prefixHasher hashes the canonical stream block by block as it is
// written. Block i's chain value is c_i = XXH64 of the block's bytes with
// seed c_{i-1}, with c_{-1} = 0; finish mixes in the model. XXH64 (Yann
// Collet's xxHash, github.com/cespare/xxhash/v2) hashes 32 bytes per round,
// about 4x faster than FNV-1a's one multiply per byte, and is the same on
// every machine. The hasher lives on the caller's stack (the digest's
// assembly does not let it escape); only out is allocated, once, when the
// first block completes.
type prefixHasher struct {
	size int           // block size in bytes, > 0
	max  int           // most blocks to hash, > 0
	hint int           // capacity to allocate out with: an upper bound of the blocks
	n    int           // bytes of the current block written so far
	d    xxhash.Digest // the current block's digest, seeded with the previous chain value
	out  []uint64      // chain values of the full blocks so far
}

// newPrefixHasher returns a hasher for p, with p.BlockBytes > 0, on a body
// of bodyLen bytes.
func newPrefixHasher(p Parser, bodyLen int) prefixHasher {
	h := prefixHasher{size: p.BlockBytes, max: p.MaxBlocks}
	h.d.ResetWithSeed(0)
	if h.max <= 0 {
		h.max = math.MaxInt
	}
	// The canonical stream is never longer than the body (each separator
	// stands for at least one byte of JSON syntax), so this bounds the
	// number of full blocks and out never grows.
	h.hint = min(bodyLen/h.size, h.max)
	return h
}

// full reports whether max blocks have been hashed, after which writes are
// ignored. A nil hasher (hashing off) is always full, so every write to it
// is a no-op.
func (h *prefixHasher) full() bool { return h == nil || len(h.out) >= h.max }

// write appends b to the stream.
func (h *prefixHasher) write(b []byte) {
	for len(b) > 0 && !h.full() {
		k := min(h.size-h.n, len(b))
		_, _ = h.d.Write(b[:k])
		b = b[k:]
		h.n += k
		if h.n == h.size {
			h.block()
		}
	}
}

// writeByte appends c to the stream.
func (h *prefixHasher) writeByte(c byte) {
	if h.full() {
		return
	}
	one := [1]byte{c}
	_, _ = h.d.Write(one[:])
	h.n++
	if h.n == h.size {
		h.block()
	}
}

// block ends the current, full block and starts the next, chained to it.
func (h *prefixHasher) block() {
	c := h.d.Sum64()
	if h.out == nil {
		h.out = make([]uint64, 0, h.hint)
	}
	h.out = append(h.out, c)
	h.d.ResetWithSeed(c)
	h.n = 0
}

// message appends a chat message to the stream from the raw values of its
// role, content and tool_calls members (nil when absent): the role string's
// bytes, sepField, the content, then sepField and tool_calls' raw bytes if
// it is an array, then sepRecord. A content string contributes its bytes
// between the quotes, escapes as written; an array of content parts its raw
// bytes; anything else nothing.
func (h *prefixHasher) message(role, content, toolCalls []byte) {
	if h.full() {
		return
	}
	h.write(stringContents(role))
	h.writeByte(sepField)
	if len(content) > 0 && content[0] == '[' {
		h.write(content)
	} else {
		h.write(stringContents(content))
	}
	if len(toolCalls) > 0 && toolCalls[0] == '[' {
		h.writeByte(sepField)
		h.write(toolCalls)
	}
	h.writeByte(sepRecord)
}

// finish mixes the model's seed and the preamble's, pre (0 for none), into
// the chain values and returns them, nil when no block was full.
func (h *prefixHasher) finish(model string, pre uint64) []uint64 {
	if len(h.out) == 0 {
		return nil
	}
	m := stablehash.String(model) ^ pre
	for i, c := range h.out {
		h.out[i] = stablehash.Mix64(c ^ m)
	}
	return h.out
}

// preambleSeed returns P of the Parser doc from the raw value of the
// preamble field: 0 when it is absent or null, else XXH64 of a string's
// bytes between the quotes or of any other value's raw bytes.
func preambleSeed(raw []byte) uint64 {
	if nullOrAbsent(raw) {
		return 0
	}
	if raw[0] == '"' {
		raw = raw[1 : len(raw)-1]
	}
	return xxhash.Sum64(raw)
}

// stringContents returns the bytes between the quotes of the raw JSON
// string raw, or nil if raw is not a string.
func stringContents(raw []byte) []byte {
	if len(raw) < 2 || raw[0] != '"' {
		return nil
	}
	return raw[1 : len(raw)-1]
}

// prompt reads a prompt field of kind (PromptMessages, PromptText or
// PromptInput) and returns its approximate text bytes, writing the
// prompt's canonical stream to h (nil: hashing off, which costs only the
// nil checks).
func (d *decoder) prompt(kind PromptKind, h *prefixHasher) int {
	switch d.peek() {
	case '"':
		s, _ := d.str()
		h.write(s)
		return len(s)
	case '[':
	default:
		d.skip()
		return 0
	}
	if kind == PromptMessages {
		if h == nil {
			return d.messages()
		}
		return d.hashMessages(h)
	}
	// An array of strings, token ids or arrays of token ids.
	n := 0
	d.open('[')
	for i := 0; d.more(']', &i); {
		switch c := d.peek(); {
		case c == '"':
			s, _ := d.str()
			h.write(s)
			h.writeByte(sepField)
			n += len(s)
		case c == '[':
			d.open('[')
			for j := 0; d.more(']', &j); {
				d.tokenID(h)
				n += tokenBytes
			}
			h.writeByte(sepRecord)
		case c == '-' || isDigit(c):
			d.tokenID(h)
			n += tokenBytes
		default:
			d.skip()
		}
	}
	return n
}

// tokenID reads any value and, if it is a number, writes its text and
// sepToken to h.
func (d *decoder) tokenID(h *prefixHasher) {
	if c := d.peek(); c != '-' && !isDigit(c) || h == nil {
		d.skip()
		return
	}
	text, _ := d.num()
	h.write(text)
	h.writeByte(sepToken)
}

// hashMessages is messages that also writes each object element's role,
// content and tool_calls (the last of each, when a key repeats) to h; other
// elements and other members are not part of the stream.
func (d *decoder) hashMessages(h *prefixHasher) int {
	n := 0
	d.open('[')
	for i := 0; d.more(']', &i); {
		if d.peek() != '{' {
			d.skip()
			continue
		}
		var role, content, toolCalls []byte
		last := 0
		d.open('{')
		for j := 0; d.more('}', &j); {
			switch string(d.key()) {
			case "content":
				d.peek()
				start := d.i
				last = d.contentBytes()
				content = d.b[start:d.i]
			case "role":
				role = d.value()
			case "tool_calls":
				toolCalls = d.value()
			default:
				d.skip()
			}
		}
		n += last
		if !d.bad {
			h.message(role, content, toolCalls)
		}
	}
	return n
}
