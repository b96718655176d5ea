package kvevents

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
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

// FuzzZMTPParser checks that the bounded transport's parser never panics
// on any byte stream, that how the stream is cut into reads does not
// change its verdict, and that a stream it accepts has no frame over the
// bounds it enforces.
func FuzzZMTPParser(f *testing.F) {
	greeting := make([]byte, greetingLen)
	ready := []byte{flagCommand, 26, 5, 'R', 'E', 'A', 'D', 'Y', 11, 'S', 'o', 'c', 'k', 'e', 't', '-', 'T', 'y', 'p', 'e', 0, 0, 0, 3, 'P', 'U', 'B'}
	f.Add(append(append(slices.Clone(greeting), ready...), flagMore, 1, 'k', 0, 2, 'h', 'i'), uint8(1))
	f.Add(append(append(slices.Clone(greeting), ready...), flagLong, 0, 0, 1, 0, 0, 0, 0, 0), uint8(7))
	f.Add(append(slices.Clone(greeting), flagCommand, 9, 5, 'R', 'E', 'A', 'D', 'Y', 3, 'a', 'b'), uint8(3))
	f.Fuzz(func(t *testing.T, stream []byte, step uint8) {
		var whole, pieces zmtpParser
		errWhole := whole.feed(stream)
		n := int(step%64) + 1
		var errPieces error
		for i := 0; i < len(stream) && errPieces == nil; i += n {
			errPieces = pieces.feed(stream[i:min(i+n, len(stream))])
		}
		if (errWhole == nil) != (errPieces == nil) {
			t.Fatalf("whole: %v; in pieces of %d: %v", errWhole, n, errPieces)
		}
		if errWhole != nil {
			var pe *peerError
			if !errors.As(errWhole, &pe) {
				t.Fatalf("error %v is not a peerError", errWhole)
			}
			return
		}
		if whole.msgSize > maxMessageSize || whole.frames > maxMessageFrames || len(whole.cmd) > maxCommandSize {
			t.Fatalf("accepted past the bounds: message %d bytes, %d frames, command %d bytes", whole.msgSize, whole.frames, len(whole.cmd))
		}
	})
}
