package routing

// Hashes here must be identical in every process and on every machine: two
// gateway replicas given the same engine names must map a session to the
// same engine. So no hash/maphash (randomly seeded per process), and no
// hash.Hash interface (it would allocate on the request path).

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// hashString returns FNV-1a 64 of s, finished with mix64 so that keys that
// differ in one byte land far apart on the ring.
func hashString(s string) uint64 {
	h := uint64(fnvOffset64)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime64
	}
	return mix64(h)
}

// mix64 is the finalizer of MurmurHash3 (fmix64): a bijection on uint64
// with full avalanche.
func mix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}
