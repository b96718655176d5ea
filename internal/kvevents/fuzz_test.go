package kvevents

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecodeBatch checks that DecodeBatch never panics, that what it
// returns meets the BlockStored invariant and gives a DropErr exactly when
// it dropped an event, and that whatever decodes
// re-encodes, in both encodings, to a payload that decodes to the same
// batch. It is seeded with the golden payloads in testdata/.
func FuzzDecodeBatch(f *testing.F) {
	paths, err := filepath.Glob(filepath.Join("testdata", "*.msgpack"))
	if err != nil || len(paths) == 0 {
		f.Fatalf("no golden payloads: %v", err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(AppendBatch(nil, richBatch(), EncodingArray))
	f.Add(AppendBatch(nil, richBatch(), EncodingMap))
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := DecodeBatch(payload)
		if err != nil {
			return
		}
		if (b.Dropped == 0) != (b.DropErr == nil) || (b.DropErr != nil && !errors.Is(b.DropErr, ErrMalformed)) {
			t.Fatalf("Dropped %d with DropErr %v", b.Dropped, b.DropErr)
		}
		for _, ev := range b.Events {
			if ev.Kind == Unknown {
				t.Fatalf("decoded an event of kind Unknown: %+v", ev)
			}
			if ev.Kind == BlockStored && (ev.BlockSize < 1 || len(ev.TokenIDs) != ev.BlockSize*len(ev.BlockHashes)) {
				t.Fatalf("decoded a BlockStored that breaks the invariant: %+v", ev)
			}
		}
		for _, enc := range []Encoding{EncodingArray, EncodingMap} {
			again, err := DecodeBatch(AppendBatch(nil, b, enc))
			if err != nil {
				t.Fatalf("encoding %d: re-encoded batch does not decode: %v\n%+v", enc, err, b)
			}
			if again.Dropped != 0 || again.Unknown != 0 || !equalDecoded(again, b) {
				t.Fatalf("encoding %d: decode(encode(x)) =\n%+v\nwant\n%+v", enc, again, b)
			}
		}
	})
}
