package oai

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"
)

// FuzzParseRequest checks that ParseRequest never panics, that a parsed
// request has a model, that every error is a *RequestError, and that it
// agrees exactly with the encoding/json reference implementation. It also
// checks Parse with hashing on (checkParse).
func FuzzParseRequest(f *testing.F) {
	seeds := []string{
		l15Malformed, l15Valid, l15NoModel, "", " ", "null", "[]", `{"model":"m"}`,
		chatBody,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hello"}]}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":100,"user":"u"}`,
		`{"model":"a","Model":"b","mod\u0065l":"c",` + chatMsgs + `}`,
		`{"model":"m",` + chatMsgs + `,"max_tokens":1e3,"max_completion_tokens":-0}`,
		`{"model":"m","prompt":[[1,2],[3]],"stream":false}`, `{"model":"m","prompt":["ab","cd"]}`,
		`{"model":"e","input":"hello","stream":"x"}`, `{"model":"e","input":[1,2]}`,
	}
	for i, s := range seeds {
		f.Add(uint8(i%4), []byte(s))
	}
	f.Add(uint8(OpChat), []byte(`{"messages":[{"content":"You are a helpful assistant.","role":"system"},{"role":"assistant","content":null,"tool_calls":[{"id":"c"}]}],"model":"m"}`))
	f.Add(uint8(OpChat), []byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a long enough prompt"}],"role":"tool"},7,{}]}`))
	f.Add(uint8(OpCompletion), []byte(`{"model":"m","prompt":["Once upon a time",[101,2023,-1],7,null]}`))
	f.Add(uint8(OpCompletion), []byte(`{"model":"m","prompt":"Once upon a time, in a land far away, there lived a gateway"}`))
	f.Fuzz(func(t *testing.T, op uint8, body []byte) {
		r, err := ParseRequest(Operation(op), body)
		checkParse(t, Operation(op), body, r, err)
		ref, referr := refParseRequest(Operation(op), body)
		if err == nil {
			if r.Model == "" {
				t.Fatalf("ParseRequest(%d, %q) = %+v with an empty model", op, body, r)
			}
			if referr != nil || !reflect.DeepEqual(r, ref) {
				t.Fatalf("ParseRequest(%d, %q) = %+v; reference %+v, %v", op, body, r, ref, referr)
			}
			return
		}
		var re, rre *RequestError
		if !errors.As(err, &re) {
			t.Fatalf("ParseRequest(%d, %q) error %T %v is not a *RequestError", op, body, err, err)
		}
		if !errors.As(referr, &rre) || *re != *rre {
			t.Fatalf("ParseRequest(%d, %q) error %+v; reference %+v, %v", op, body, re, ref, referr)
		}
	})
}

// checkParse checks Parser{BlockBytes: 16, MaxBlocks: 8}.Parse against
// ParseRequest's result r, err on the same input: the same error, or the
// same fields and at most 8 hashes, the same on a second call, and the
// encoding/json reference's. With 1-byte blocks and no cap there is one
// hash per stream byte, and they must fit the capacity allocated from the
// body's length (the slice must not grow).
func checkParse(t *testing.T, op Operation, body []byte, r Request, err error) {
	t.Helper()
	p := Parser{BlockBytes: 16, MaxBlocks: 8}
	hr, herr := p.Parse(op, body)
	if err != nil {
		if !reflect.DeepEqual(herr, err) || !reflect.DeepEqual(hr, Request{}) {
			t.Fatalf("Parse(%d, %q) = %+v, %v; ParseRequest error %v", op, body, hr, herr, err)
		}
		return
	}
	if herr != nil {
		t.Fatalf("Parse(%d, %q) error %v; ParseRequest %+v", op, body, herr, r)
	}
	hashes := hr.PrefixHashes
	if len(hashes) > p.MaxBlocks || hashes != nil && len(hashes) == 0 || op == OpEmbeddings && hashes != nil {
		t.Fatalf("Parse(%d, %q) = %d hashes (nil %v), want at most %d", op, body, len(hashes), hashes == nil, p.MaxBlocks)
	}
	hr.PrefixHashes = nil
	if !reflect.DeepEqual(hr, r) {
		t.Fatalf("Parse(%d, %q) = %+v; ParseRequest %+v", op, body, hr, r)
	}
	if again, _ := p.Parse(op, body); !slices.Equal(again.PrefixHashes, hashes) {
		t.Fatalf("Parse(%d, %q) hashes %x, then %x", op, body, hashes, again.PrefixHashes)
	}
	if ref, _ := refParse(p, op, body); !slices.Equal(ref.PrefixHashes, hashes) {
		t.Fatalf("Parse(%d, %q) hashes %x; reference %x (stream %q)", op, body, hashes, ref.PrefixHashes, refStream(op, mustObject(body)[requiredField(op)]))
	}
	one, _ := Parser{BlockBytes: 1}.Parse(op, body)
	if cap(one.PrefixHashes) > len(body) {
		t.Fatalf("Parse(%d, %q) with 1-byte blocks: %d hashes, capacity %d; want capacity %d", op, body, len(one.PrefixHashes), cap(one.PrefixHashes), len(body))
	}
	if n := min(len(one.PrefixHashes)/16, p.MaxBlocks); n != len(hashes) {
		t.Fatalf("Parse(%d, %q): %d hashes, stream of %d bytes", op, body, len(hashes), len(one.PrefixHashes))
	}
}

func mustObject(body []byte) map[string]json.RawMessage {
	m, _ := refObject(body)
	return m
}

// FuzzInspectChunk checks that InspectChunk and ParseResponse never panic,
// that InspectChunk fails exactly on input that is not a JSON object, and
// that both agree with the encoding/json reference implementations. It also
// checks the decoder against json.Valid on arbitrary input.
func FuzzInspectChunk(f *testing.F) {
	for _, s := range []string{
		roleChunk, contentChunk, reasoningChunk, toolChunk, finishChunk, usageChunk, vllmContentChunk, l07Data,
		l07Data[:30], "[DONE]", ": ping", "", "null", `[{"id":1}]`,
		`{"error":{"message":"boom","code":500}}`, `{"object":"error","message":"bad"}`,
		`{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" Hi","finish_reason":null}]}`,
		`{"choices":[{"delta":{"content":"a"}}],"choices":[],"id":"a","id":"b","usage":{"prompt_tokens":1.5e3}}`,
		`{"choice\u0073":[{"delta":{"content":"\n"}}],"ID":"x"}`, `{"a":"\uD83D\uDE00\u00e9\/"}`,
		`{"object":"list","data":[{"embedding":[0.1,-2e-3]}],"usage":{"prompt_tokens":5,"total_tokens":5}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, want := decoderValid(data), json.Valid(data); got != want {
			t.Fatalf("decoder valid(%q) = %v, json.Valid = %v", data, got, want)
		}
		c, err := InspectChunk(data)
		ref, ok := refInspectChunk(data)
		if (err == nil) != ok {
			t.Fatalf("InspectChunk(%q) error = %v; reference ok = %v", data, err, ok)
		}
		if ok && !chunkEqual(c, ref) {
			t.Fatalf("InspectChunk(%q) = %s; reference %s", data, fmtChunk(c), fmtChunk(ref))
		}
		id, u, ok := ParseResponse(data)
		rid, ru, rok := refParseResponse(data)
		if id != rid || u != ru || ok != rok {
			t.Fatalf("ParseResponse(%q) = %q, %+v, %v; reference %q, %+v, %v", data, id, u, ok, rid, ru, rok)
		}
	})
}
