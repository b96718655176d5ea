// Package kvevents reads and writes the wire format of vLLM's KV-cache
// events: the batches of BlockStored, BlockRemoved and AllBlocksCleared
// events an engine publishes over ZMQ when it stores, evicts or clears
// prefix-cache blocks, and follows one engine's stream of them.
// [ParseMessage] and [ParseReplayReply] take the frames a ZMQ socket
// received, [DecodeBatch] turns a payload into a [Batch], and [AppendBatch]
// writes one (for the simulated engines and for tests). A [Subscriber]
// does the networking: it subscribes to an engine's PUB socket and hands
// its batches, in seq order, to a [Handler].
//
// It is the first piece of routing on engines' KV-cache events (the
// precise prefix index keyed by stablehash.TokenBlocks, the precise-prefix
// policy and the simulator's publisher build on it, and are not written
// yet): nothing outside its tests imports it so far.
//
// # The wire
//
// An engine started with --kv-events-config
// '{"enable_kv_cache_events":true,"publisher":"zmq",...}' publishes on a ZMQ
// PUB socket (tcp://*:5557 by default; vllm/config/kv_events.py@00634b8a).
// Each message is three frames: the configured topic, the sequence number as
// 8 bytes big-endian (from 0 per publisher, one per batch) and the msgpack
// payload. PUB delivery is at most once (high-water mark, slow joiner), so a
// gap in seq means the engine's cache state is unknown from then on.
//
// With replay_endpoint set, a ROUTER socket answers a request [start] (8
// bytes big-endian; see [ReplayRequest]) with one message [seq, payload] per
// buffered batch with seq >= start, then the end marker [-1 as signed 8-byte
// big-endian, ""] (see [ParseReplayReply]). Source: the ZMQ publisher in
// vllm/distributed/kv_events.py, which also gives each data-parallel rank its
// own publisher, on the port plus the rank (@0181ea31).
//
// The payload is vLLM's KVEventBatch, {ts: float, events: [...],
// data_parallel_rank: int | nil}, and each event a tagged union:
//
//	BlockStored      block_hashes, parent_block_hash, token_ids, block_size,
//	                 lora_id, medium, lora_name, extra_keys, group_idx,
//	                 kv_cache_spec_kind, kv_cache_spec_sliding_window
//	BlockRemoved     block_hashes, medium, group_idx
//	AllBlocksCleared (no fields)
//
// The fields are listed in declaration order, which is also their position
// in array-encoded events. Each of lora_name, extra_keys, group_idx and the
// spec kind was added by a later vLLM PR, and a v0.28.0 capture shows one more
// ("locality"), so the decoder ignores keys and positions it does not know.
//
// # Subscribing
//
// [NewSubscriber] takes one engine's endpoints and a [Handler];
// [Subscriber.Run] dials the PUB socket (the engine binds, the gateway
// connects: vLLM's default endpoint is tcp://*:5557), subscribes to the
// topic prefix, and for each message parses the frames, decodes the
// payload and checks its seq against the last batch handed over, calling
// the handler from one goroutine:
//
//   - seq is the next one: Batch.
//   - seq skipped ahead (the PUB dropped batches at its high-water mark, or
//     the connection was down): with a replay endpoint, the missing batches
//     are asked for and handed over first; if the replay fails, times out
//     or no longer reaches back to the gap (vLLM keeps its last
//     buffer_steps batches), Lost(LostReplayFailed), followed by what the
//     replay did return after the hole. Without one, Lost(LostGap). Then
//     Batch for the live one.
//   - seq went back: the engine restarted (seq starts at 0 per process) and
//     its cache is empty, Lost(LostRestart), then Batch.
//   - the first batch after a redial (a new connection) is not the next
//     one: Lost(LostRestart) too, then Batch, as on a first connection.
//
// A ZMQ SUB does not see its publisher restart, which is why seq is the
// signal. It is not enough on its own: an engine that restarts quickly
// may have published past the last seq seen by the time the subscriber
// has redialled, and that would look like a gap, filled from the new
// process's buffer while the old process's blocks stayed in the handler.
// So a new connection's first batch must follow exactly or counts as a
// restart; if the engine did not restart, the cost is a state rebuilt
// from the catch-up (or from nothing, without a replay endpoint) instead
// of a gap filled. The first batch, and the first after a restart, is
// taken as it is; with a replay endpoint the batches the engine still
// buffers from seq 0 are replayed before it, so that blocks stored before
// the subscription are known too. A message or payload that does not
// parse is counted and skipped; if it carried a seq, that batch is
// missing and the next one is a gap. Messages wait in a bounded queue
// while the handler or a replay is busy: 1024 messages and 64 MiB of
// frames (a message always enters an empty queue). vLLM's batches are one
// engine step's events, typically a few KB and a few hundred KB for a
// prompt of 100k tokens, so the byte bound is far from normal traffic but
// stops 1024 messages of up to 64 MiB each from holding gigabytes per
// engine. A message that finds the queue full, by count or by bytes, is
// dropped and shows as a gap at the next batch, so memory stays bounded
// and nothing is lost silently.
//
// The replay request is sent from a DEALER socket, since one request gets
// many replies, which a REQ socket would not take; each replay is one
// short-lived connection bounded by SubscriberConfig.ReplayTimeout.
// Replies are taken with or without the empty delimiter vLLM sends after
// the identity, and with a topic frame before seq, as some ports of vLLM's
// publisher send them.
//
// When the connection fails Run dials again, after a pause that starts at
// 100ms and doubles up to 5s, until its context is done; then it closes
// its sockets and returns once its goroutines have ended, also when a
// dial is in the middle of a handshake with a peer that never answers.
// Both sockets dial "tcp://host:port" through a zmq4 transport of the
// package's own, which bounds the peer (see Bounds).
// [Subscriber.Stats] counts batches, events by kind, decode errors, gaps,
// replays, restarts and connections dropped for breaking the bounds.
//
// # Encodings
//
// vLLM encodes with msgspec, and the layout changed once:
//
//   - Before vLLM PR #42892 (merged 2026-06-09), array_like=True: the batch is
//     [ts, [events...], rank] and each event a positional array
//     ["BlockStored", block_hashes, ...] with trailing default fields omitted.
//     [AppendBatch] writes this with [EncodingArray].
//   - Since PR #42892 the events are maps {"type": "BlockStored",
//     "block_hashes": ..., ...} while the batch stays an array, as in a vLLM
//     0.26.0 capture (kthena #1535, reproduced in testdata). [AppendBatch]
//     writes this with [EncodingMap].
//   - A later main snapshot (vllm/distributed/kv_events.py@0181ea31) also
//     drops array_like from the batch, which would make it a map {"ts",
//     "events", "data_parallel_rank"}.
//
// [DecodeBatch] therefore accepts an array or a map at both levels, in any
// combination.
//
// # Hashes
//
// vLLM's ExternalBlockHash is bytes | int. With the default
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 each 32-byte block digest is published
// as int.from_bytes(digest, "big") & (2**64-1), a msgpack uint64; with 0 the
// digest itself is published as msgpack bin (vllm/distributed/kv_events.py,
// vllm/v1/core/kv_cache_utils.py@001cabc1). The decoder turns a bin into a
// [Hash] the same way vLLM turns it into an int, its last 8 bytes read
// big-endian, so one block has one Hash whichever form its engine publishes.
// Older peers were seen sending the int as a signed int64 (Dynamo PR #3180);
// its 64 bits are taken as they are.
//
// The hashes are the engine's own: they chain over pickled tuples with a
// per-process seed and cannot be recomputed outside it. An index keys blocks
// by its own hash of the token ids and keeps the engine's hash only to apply
// BlockRemoved.
//
// # Validation
//
// A BlockStored event must satisfy the invariant llm-d checks
// (llm-d-router pkg/kvevents/pool.go@ebab6879): block_size >= 1, and
// token_ids holds exactly block_size tokens per block hash. An event that
// breaks it, lacks a required field or has a field of the wrong type or a
// negative id is dropped and counted in [Batch.Dropped] (the first one's
// reason in [Batch.DropErr]); an event of an unknown type is counted in
// [Batch.Unknown]. Neither fails the batch: the other events of a step are
// still true.
//
// # Bounds
//
// Payloads come from the network and their length prefixes are not trusted.
// [DecodeBatch] refuses a payload over [MaxPayloadSize] (64 MiB), never sizes
// an allocation from a declared length beyond what the remaining bytes can
// hold, follows at most 32 levels of nesting when it skips a value, and never
// panics on any input (FuzzDecodeBatch). It allocates at most about 20 times
// the payload's length; see [DecodeBatch]. Only the first dropped event's
// reason is built, so a flood of junk events costs no allocation per event
// for its errors.
//
// Frames come from the network too, and zmq4 v0.17.0 allocates each at the
// size its header declares before the body arrives (a size near 2^63
// panics), reads a READY command's metadata without bounds checks, and puts
// no deadline on the ZMTP handshake. The subscriber's sockets therefore
// dial through a transport that reads the ZMTP 3.x stream as zmq4 receives
// it (RFC 23/ZMTP: a 64-byte greeting, then frames of a flags byte, a
// 1-byte or 8-byte big-endian size and a body) and fails the read, which
// drops the connection, as soon as a frame header takes one message over
// MaxPayloadSize plus 64 KiB (the topic and seq frames, a replay reply's
// identity) or over 64 frames, or a command over 64 KiB, and before the
// last byte of a READY whose metadata runs past its end. zmq4 never sees
// such a header complete; the subscriber counts the connection in
// SubscriberStats.PeerErrors and redials. A connection's handshake must end
// (the peer's first complete frame, its READY) within 10s of the TCP
// connect, and the connection is closed when the dial's socket is closed
// or the subscriber's context is done, so a peer that accepts and never
// answers holds nothing. What a hostile peer can still make zmq4 allocate
// without sending it is one message's frames up to that cap, on each of
// the subscriber's connections (the PUB one, and a replay while one runs).
package kvevents
