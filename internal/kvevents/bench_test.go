package kvevents

import "testing"

// BenchmarkDecodeBatch decodes a batch of one BlockStored event of 16
// blocks of 16 tokens, as a vLLM engine publishes after a 256-token prefill,
// in each encoding.
func BenchmarkDecodeBatch(b *testing.B) {
	hashes := make([]Hash, 16)
	for i := range hashes {
		hashes[i] = Hash(0x9e3779b97f4a7c15 * uint64(i+1))
	}
	batch := Batch{TS: 1789095808.83, DPRank: 0, Events: []Event{{
		Kind: BlockStored, BlockHashes: hashes, ParentBlockHash: 0xdab89baa7b5857c0, HasParent: true,
		TokenIDs: seqU32(151644, 256), BlockSize: 16, LoRAID: -1, Medium: "GPU",
		ExtraKeys: pack(nil, make([]any, 16)), GroupIdx: 0, SpecKind: "full_attention", SlidingWindow: -1,
	}}}
	for _, enc := range []struct {
		name string
		enc  Encoding
	}{{"array", EncodingArray}, {"map", EncodingMap}} {
		payload := AppendBatch(nil, batch, enc.enc)
		b.Run(enc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			for b.Loop() {
				if _, err := DecodeBatch(payload); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
