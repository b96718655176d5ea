package stablehash

import (
	"encoding/binary"
	"testing"

	"github.com/cespare/xxhash/v2"
)

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

// TestTokenBlocksGolden pins TokenBlocks' values, computed apart from this
// code from the definitions (XXH64 written out in Python from the xxHash
// spec, checked against its test vectors, chained as documented): gateway
// replicas of different versions must key the KV-event index alike.
func TestTokenBlocksGolden(t *testing.T) {
	seq := func(from, to uint32) []uint32 {
		var s []uint32
		for i := from; i < to; i++ {
			s = append(s, i)
		}
		return s
	}
	same := func(v uint32, n int) []uint32 {
		s := make([]uint32, n)
		for i := range s {
			s[i] = v
		}
		return s
	}
	for _, tt := range []struct {
		name      string
		tokens    []uint32
		blockSize int
		seed      uint64
		want      []uint64
	}{
		{"partial last block left out", seq(1, 11), 4, 0, []uint64{0x27f0147e6ec514a6, 0x3fb870baf8e0e765}},
		{"two blocks of 16", append(same(7, 16), same(9, 16)...), 16, 0, []uint64{0xbfe2bdd493768614, 0x82606b87a7ab38bd}},
		{"seeded", seq(100, 164), 16, 0x1234, []uint64{0xcb04138bd61662fc, 0xbdd4942095e51cfa, 0xe2383d8c57b73314, 0x3a635ec5a006656c}},
		{"shorter than a block", seq(1, 4), 4, 0, nil},
		{"no block size", seq(1, 9), 0, 0, nil},
	} {
		got := TokenBlocks(nil, tt.tokens, tt.blockSize, tt.seed)
		if len(got) != len(tt.want) {
			t.Errorf("%s: %#x, want %#x", tt.name, got, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("%s: %#x, want %#x", tt.name, got, tt.want)
				break
			}
		}
	}
}

// TestTokenBlocksChain checks the prefix property: sequences that share
// their first k blocks share their first k hashes and no later one, and a
// block larger than the encoding buffer hashes as the spec says (the same
// as hashing its bytes at once).
func TestTokenBlocksChain(t *testing.T) {
	a := make([]uint32, 64)
	for i := range a {
		a[i] = uint32(i)
	}
	b := append([]uint32(nil), a...)
	b[40] = 999 // in block 2 of 16
	ha, hb := TokenBlocks(nil, a, 16, 0), TokenBlocks(nil, b, 16, 0)
	for i := range ha {
		if (ha[i] == hb[i]) != (i < 2) {
			t.Errorf("block %d: %#x vs %#x; want equal only before block 2", i, ha[i], hb[i])
		}
	}
	if TokenBlocks(nil, a, 16, 1)[0] == ha[0] {
		t.Error("a seed (a LoRA adapter) does not change the hashes")
	}
	big := make([]uint32, 300) // over the 64-token buffer of one write
	raw := make([]byte, 0, 4*len(big))
	for i := range big {
		big[i] = uint32(i * 7)
		raw = binary.LittleEndian.AppendUint32(raw, big[i])
	}
	d := xxhash.NewWithSeed(5)
	_, _ = d.Write(raw)
	if got := TokenBlocks(nil, big, 300, 5); len(got) != 1 || got[0] != d.Sum64() {
		t.Errorf("one 300-token block: %#x, want %#x", got, d.Sum64())
	}
	if n := testing.AllocsPerRun(100, func() { _ = TokenBlocks(ha[:0], a, 16, 0) }); n != 0 {
		t.Errorf("TokenBlocks allocates %v times with room in dst", n)
	}
}

// BenchmarkTokenBlocks hashes a 10,000-token prompt in blocks of 16.
func BenchmarkTokenBlocks(b *testing.B) {
	tokens := make([]uint32, 10000)
	for i := range tokens {
		tokens[i] = uint32(i * 31)
	}
	dst := make([]uint64, 0, len(tokens)/16)
	b.ReportAllocs()
	b.SetBytes(int64(4 * len(tokens)))
	for b.Loop() {
		dst = TokenBlocks(dst[:0], tokens, 16, 0)
	}
}
