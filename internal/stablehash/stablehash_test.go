package stablehash

import "testing"

// TestGolden pins the values: gateway replicas of different versions must
// map sessions and prefixes alike during a rolling upgrade. If this fails,
// every session moves. The values were computed apart from this code, from
// the definitions (FNV-1a 64, then MurmurHash3's fmix64), in Python.
func TestGolden(t *testing.T) {
	for s, want := range map[string]uint64{"": 0xefd01f60ba992926, "gpu-a#0": 0x92508c0cd9865efc, "session-1": 0xf267abb32d450b1f} {
		if got := String(s); got != want {
			t.Errorf("String(%q) = %#x, want %#x", s, got, want)
		}
	}
	if got := Mix64(0); got != 0 {
		t.Errorf("Mix64(0) = %#x, want 0 (fmix64 fixes 0)", got)
	}
}
