// Package stablehash holds the hashes that must come out the same in every
// gateway process, on every machine and across versions: the session
// ring's points and keys (routing), the model seed of prompt block
// hashes (internal/oai) and the chained hashes of token-id blocks that
// key the KV-event prefix index (TokenBlocks). Two replicas that disagreed would send one session
// or one prefix to different engines. So there is no hash/maphash (seeded
// at random per process) and no hash.Hash interface (it would allocate on
// the request path); changing a function here remaps every session and
// every learned prefix, which TestGolden guards.
package stablehash

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// String returns Mix64 of the FNV-1a 64 hash of s's bytes: FNV-1a is
// cheap on short strings (names, session ids), and the finalizer spreads
// keys that differ in one byte far apart. It does not allocate.
func String(s string) uint64 {
	h := uint64(fnvOffset64)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime64
	}
	return Mix64(h)
}

// Mix64 is MurmurHash3's 64-bit finalizer (fmix64): a bijection on uint64
// with full avalanche, every input bit affecting every output bit.
func Mix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// TokenBlocks appends to dst the chained hashes of the full blocks of
// blockSize token ids in tokens and returns it: block i's hash is XXH64
// (the xxHash spec's 64-bit hash), seeded with block i-1's hash (with
// seed for block 0), of block i's token ids as little-endian uint32s. So
// block i's hash stands for every token up to the end of block i, and two
// sequences share their first k hashes exactly when they share their first
// k blocks (up to collisions). A partial last block is not hashed: vLLM
// caches full blocks only (vllm/v1/core/kv_cache_utils.py). seed is 0 for
// a base model, String(adapter name) for a LoRA adapter's blocks, which
// are its own. The KV-event index keys on these hashes rather than on
// vLLM's own, which no other process can reproduce (pickle, and a random
// per-process seed); Dynamo hashes blocks the same way (XXH3 over
// little-endian token ids). The chain rule is the one of internal/oai's
// prefix hasher over prompt text bytes (the approximate index), here over
// token ids, which an engine's events carry. The precise prefix index
// (routing.KVIndex) keys the engines' reported blocks on it, and the
// gateway the requests' token blocks. blockSize <= 0 hashes nothing. It
// does not allocate beyond dst's growth.
func TokenBlocks(dst []uint64, tokens []uint32, blockSize int, seed uint64) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	var d xxhash.Digest
	var buf [256]byte
	prev := seed
	for b := 0; b+blockSize <= len(tokens); b += blockSize {
		d.ResetWithSeed(prev)
		blk := tokens[b : b+blockSize]
		for len(blk) > 0 {
			n := min(len(blk), len(buf)/4)
			for i, t := range blk[:n] {
				binary.LittleEndian.PutUint32(buf[4*i:], t)
			}
			_, _ = d.Write(buf[:4*n])
			blk = blk[n:]
		}
		prev = d.Sum64()
		dst = append(dst, prev)
	}
	return dst
}
