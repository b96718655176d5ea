package kvevents

import (
	"bytes"
	"errors"
	"testing"
)

func TestParseMessage(t *testing.T) {
	tests := []struct {
		name    string
		frames  [][]byte
		topic   string
		seq     uint64
		payload string
		err     string
	}{
		{"message", [][]byte{[]byte("kv@10.0.0.1@m"), {0, 0, 0, 0, 0, 0, 1, 2}, []byte("p")}, "kv@10.0.0.1@m", 258, "p", ""},
		{"empty topic", [][]byte{{}, {0xff, 0, 0, 0, 0, 0, 0, 0}, {}}, "", 0xff00000000000000, "", ""},
		{"two frames", [][]byte{{}, {0, 0, 0, 0, 0, 0, 0, 0}}, "", 0, "", "message of 2 frames, want [topic, seq, payload]"},
		{"four frames", [][]byte{{}, {0, 0, 0, 0, 0, 0, 0, 0}, {}, {}}, "", 0, "", "message of 4 frames, want [topic, seq, payload]"},
		{"short seq", [][]byte{{}, {0, 0, 0, 1}, {}}, "", 0, "", "seq frame of 4 bytes, want 8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topic, seq, payload, err := ParseMessage(tt.frames)
			if tt.err != "" {
				if !errors.Is(err, ErrMalformed) || err.Error() != "kvevents: malformed: "+tt.err {
					t.Fatalf("ParseMessage error = %v, want ErrMalformed: %s", err, tt.err)
				}
				return
			}
			if err != nil || string(topic) != tt.topic || seq != tt.seq || string(payload) != tt.payload {
				t.Errorf("ParseMessage = %q, %d, %q, %v; want %q, %d, %q", topic, seq, payload, err, tt.topic, tt.seq, tt.payload)
			}
		})
	}
}

func TestAppendSeq(t *testing.T) {
	if got, want := AppendSeq([]byte("t"), 0x0102030405060708), []byte{'t', 1, 2, 3, 4, 5, 6, 7, 8}; !bytes.Equal(got, want) {
		t.Errorf("AppendSeq = % x, want % x", got, want)
	}
	if got, want := ReplayRequest(5), []byte{0, 0, 0, 0, 0, 0, 0, 5}; !bytes.Equal(got, want) {
		t.Errorf("ReplayRequest(5) = % x, want % x", got, want)
	}
	frames := [][]byte{[]byte("topic"), AppendSeq(nil, 1<<40+3), AppendBatch(nil, Batch{TS: 1, DPRank: 0}, EncodingMap)}
	_, seq, payload, err := ParseMessage(frames)
	if err != nil || seq != 1<<40+3 {
		t.Fatalf("ParseMessage = %d, %v", seq, err)
	}
	if b, err := DecodeBatch(payload); err != nil || b.TS != 1 {
		t.Errorf("DecodeBatch = %+v, %v", b, err)
	}
}

func TestParseReplayReply(t *testing.T) {
	minusOne := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	tests := []struct {
		name    string
		frames  [][]byte
		seq     uint64
		payload string
		end     bool
		err     string
	}{
		{"batch", [][]byte{{0, 0, 0, 0, 0, 0, 0, 9}, []byte("p")}, 9, "p", false, ""},
		{"end marker", [][]byte{minusOne, {}}, ReplayEndSeq, "", true, ""},
		{"end marker with payload", [][]byte{minusOne, []byte("p")}, 0, "", false, "replay end marker with a 1-byte payload"},
		{"one frame", [][]byte{minusOne}, 0, "", false, "replay reply of 1 frames, want [seq, payload]"},
		{"with delimiter", [][]byte{{}, minusOne, {}}, 0, "", false, "replay reply of 3 frames, want [seq, payload]"},
		{"long seq", [][]byte{append(minusOne, 0), {}}, 0, "", false, "seq frame of 9 bytes, want 8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seq, payload, end, err := ParseReplayReply(tt.frames)
			if tt.err != "" {
				if !errors.Is(err, ErrMalformed) || err.Error() != "kvevents: malformed: "+tt.err {
					t.Fatalf("ParseReplayReply error = %v, want ErrMalformed: %s", err, tt.err)
				}
				return
			}
			if err != nil || seq != tt.seq || string(payload) != tt.payload || end != tt.end {
				t.Errorf("ParseReplayReply = %d, %q, %v, %v; want %d, %q, %v", seq, payload, end, err, tt.seq, tt.payload, tt.end)
			}
		})
	}
}
