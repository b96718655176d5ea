// Package stablehash holds the hashes that must come out the same in every
// gateway process, on every machine and across versions: the session
// ring's points and keys (routing) and the model seed of prompt block
// hashes (internal/oai). Two replicas that disagreed would send one session
// or one prefix to different engines. So there is no hash/maphash (seeded
// at random per process) and no hash.Hash interface (it would allocate on
// the request path); changing a function here remaps every session and
// every learned prefix, which TestGolden guards.
package stablehash

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
