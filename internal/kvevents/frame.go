package kvevents

import (
	"encoding/binary"
	"fmt"
	"math"
)

// ReplayEndSeq is the sequence number of the end marker of a replay reply:
// -1 as a signed 8-byte big-endian integer, all bits set.
const ReplayEndSeq uint64 = math.MaxUint64

// ParseMessage splits one message of vLLM's KV-events PUB socket, the three
// frames [topic, seq, payload]: seq is 8 bytes, a big-endian uint64 that
// starts at 0 per publisher and grows by one per batch; payload is the
// msgpack batch for [DecodeBatch]. topic and payload alias frames. The error
// wraps [ErrMalformed] when there are not exactly three frames or seq is not
// 8 bytes.
func ParseMessage(frames [][]byte) (topic []byte, seq uint64, payload []byte, err error) {
	if len(frames) != 3 {
		return nil, 0, nil, fmt.Errorf("%w: message of %d frames, want [topic, seq, payload]", ErrMalformed, len(frames))
	}
	if len(frames[1]) != 8 {
		return nil, 0, nil, fmt.Errorf("%w: seq frame of %d bytes, want 8", ErrMalformed, len(frames[1]))
	}
	return frames[0], binary.BigEndian.Uint64(frames[1]), frames[2], nil
}

// AppendSeq appends seq as the 8-byte big-endian frame vLLM publishes and
// returns the extended slice.
func AppendSeq(dst []byte, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(dst, seq)
}

// ReplayRequest returns the frame that asks a vLLM replay socket (a ZMQ
// ROUTER at replay_endpoint) to re-send every buffered batch with seq >=
// start: the 8-byte big-endian start. The server expects [identity, "",
// start]: a REQ socket sends this one frame (REQ adds the empty
// delimiter), a DEALER socket must send an empty frame before it.
func ReplayRequest(start uint64) []byte {
	return AppendSeq(make([]byte, 0, 8), start)
}

// ParseReplayReply splits one reply of a vLLM replay socket, as received
// by a REQ or DEALER client once the empty delimiter is removed: the two
// frames [seq, payload] of one buffered batch, or the end marker [-1 as a
// signed 8-byte big-endian integer, ""] after the last, for which end is
// true and seq is [ReplayEndSeq]. payload aliases frames. The error wraps
// [ErrMalformed] when there are not exactly two frames, seq is not 8 bytes,
// or the end marker carries a payload.
func ParseReplayReply(frames [][]byte) (seq uint64, payload []byte, end bool, err error) {
	if len(frames) != 2 {
		return 0, nil, false, fmt.Errorf("%w: replay reply of %d frames, want [seq, payload]", ErrMalformed, len(frames))
	}
	if len(frames[0]) != 8 {
		return 0, nil, false, fmt.Errorf("%w: seq frame of %d bytes, want 8", ErrMalformed, len(frames[0]))
	}
	seq = binary.BigEndian.Uint64(frames[0])
	if seq == ReplayEndSeq {
		if len(frames[1]) != 0 {
			return 0, nil, false, fmt.Errorf("%w: replay end marker with a %d-byte payload", ErrMalformed, len(frames[1]))
		}
		return seq, nil, true, nil
	}
	return seq, frames[1], false, nil
}
