package kvevents

import "errors"

// MaxPayloadSize is the largest payload, in bytes, that [DecodeBatch]
// accepts: 64 MiB. vLLM publishes one batch per engine step, typically a few
// KiB; the cap only stops a hostile or broken peer from making the decoder
// work through an arbitrarily large buffer.
const MaxPayloadSize = 64 << 20

// ErrMalformed is wrapped by every error returned for bytes that are not a
// KV-cache event batch or not a well-formed ZMQ message of the protocol:
// invalid or truncated msgpack, a value of the wrong type where the batch or
// the framing needs one, nesting deeper than the decoder follows, or trailing
// bytes after the batch. A single bad event inside a good batch is not an
// error: it is dropped and counted in [Batch.Dropped], and [Batch.DropErr],
// which wraps ErrMalformed, says why.
var ErrMalformed = errors.New("kvevents: malformed")

// ErrTooLarge is returned, wrapped, by [DecodeBatch] for a payload longer than
// [MaxPayloadSize].
var ErrTooLarge = errors.New("kvevents: payload too large")

// Hash is an engine's block hash as vLLM publishes it, reduced to 64 bits.
//
// vLLM's ExternalBlockHash is bytes | int. With VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1
// (the default) each 32-byte digest is published as
// int.from_bytes(digest, "big") & (2**64-1), a msgpack uint64 (older peers
// may send the same bits as a negative int64; the bits are kept). With 0 the
// full digest is published as msgpack bin; the decoder then applies the same
// reduction, reading the last 8 bytes big-endian (fewer bytes are
// zero-extended on the left), so both forms of one block give the same Hash.
// See the package documentation, section Hashes, for the sources.
type Hash uint64

// Kind is the type of a KV-cache event: the "type" tag on the wire.
type Kind uint8

// The event kinds. Unknown is the zero value; the decoder never returns an
// event of kind Unknown: it skips such events and counts them in
// [Batch.Unknown].
const (
	Unknown Kind = iota
	BlockStored
	BlockRemoved
	AllBlocksCleared
)

// String returns the wire tag of k ("BlockStored", "BlockRemoved",
// "AllBlocksCleared"), or "Unknown".
func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "Unknown"
}

// known reports whether k is one of BlockStored, BlockRemoved and
// AllBlocksCleared.
func (k Kind) known() bool { return k >= BlockStored && k <= AllBlocksCleared }

func kindOf(tag []byte) Kind {
	switch string(tag) {
	case "BlockStored":
		return BlockStored
	case "BlockRemoved":
		return BlockRemoved
	case "AllBlocksCleared":
		return AllBlocksCleared
	}
	return Unknown
}

// Batch is one published KV-cache event batch, vLLM's KVEventBatch.
type Batch struct {
	// TS is the engine's wall-clock time of the batch, in seconds since
	// the Unix epoch (Python time.time()).
	TS float64
	// Events are the batch's events of a known kind that passed
	// validation, in wire order.
	Events []Event
	// DPRank is the data-parallel rank of the publishing engine, or -1
	// when the batch carries none (nil or absent).
	DPRank int
	// Dropped counts events of a known kind that failed validation (a
	// field of the wrong type, a negative id, a BlockStored whose
	// token_ids do not cover exactly block_size tokens per block hash, a
	// missing required field). It is set by the decoder and not encoded.
	Dropped int
	// DropErr says why the first dropped event was dropped, for a log
	// line: it wraps [ErrMalformed] and names the event's index in the
	// events array. It is nil when Dropped is 0, set by the decoder and
	// not encoded.
	DropErr error
	// Unknown counts events whose "type" the decoder does not know,
	// skipped whole. It is set by the decoder and not encoded.
	Unknown int
}

// Event is one KV-cache event. Which fields are meaningful depends on Kind:
//
//   - BlockStored: every field.
//   - BlockRemoved: BlockHashes, Medium and GroupIdx.
//   - AllBlocksCleared: none.
//
// The decoder sets the fields a kind does not use to their nil values
// (nil slices, "", HasParent false, -1 for LoRAID, GroupIdx and
// SlidingWindow), and the encoder ignores them.
type Event struct {
	Kind Kind
	// BlockHashes are the engine's hashes of the blocks in chain order,
	// each block the parent of the next.
	// A BlockStored event carries one hash per BlockSize tokens.
	BlockHashes []Hash
	// ParentBlockHash is the hash of the block before BlockHashes[0];
	// it is meaningful only when HasParent is true (the wire value is
	// not nil).
	ParentBlockHash Hash
	HasParent       bool
	// TokenIDs are the tokens of the stored blocks, len(BlockHashes) *
	// BlockSize of them.
	TokenIDs []uint32
	// BlockSize is the number of tokens per block, at least 1.
	BlockSize int
	// LoRAID is the adapter's integer id (deprecated by vLLM in favour
	// of LoRAName), or -1 for none.
	LoRAID int
	// LoRAName is the adapter's name, or "" for none.
	LoRAName string
	// Medium is the storage tier, such as "GPU" or "CPU", or "" when the
	// wire value is nil or absent.
	Medium string
	// ExtraKeys is the raw msgpack of extra_keys (one entry per block: a
	// tuple of LoRA name, multimodal identifiers, cache salt... or nil),
	// copied out of the payload, or nil when the wire value is nil or
	// absent. The encoder writes it back unchanged, so it must hold
	// exactly one msgpack value.
	ExtraKeys []byte
	// GroupIdx is the KV-cache group (hybrid models have several), or -1
	// when absent.
	GroupIdx int
	// SpecKind is kv_cache_spec_kind, such as "full_attention" or
	// "sliding_window", or "" when absent.
	SpecKind string
	// SlidingWindow is kv_cache_spec_sliding_window in tokens, or -1
	// when absent.
	SlidingWindow int
}

// normalize clears the fields that e's kind does not use.
func (e *Event) normalize() {
	switch e.Kind {
	case BlockStored:
		return
	case BlockRemoved:
		*e = Event{Kind: e.Kind, BlockHashes: e.BlockHashes, Medium: e.Medium, GroupIdx: e.GroupIdx,
			LoRAID: -1, SlidingWindow: -1}
	default:
		*e = Event{Kind: e.Kind, LoRAID: -1, GroupIdx: -1, SlidingWindow: -1}
	}
}
