package oai

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzParseRequest checks that ParseRequest never panics, that a parsed
// request has a model, that every error is a *RequestError, and that it
// agrees exactly with the encoding/json reference implementation.
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
	f.Fuzz(func(t *testing.T, op uint8, body []byte) {
		r, err := ParseRequest(Operation(op), body)
		ref, referr := refParseRequest(Operation(op), body)
		if err == nil {
			if r.Model == "" {
				t.Fatalf("ParseRequest(%d, %q) = %+v with an empty model", op, body, r)
			}
			if referr != nil || r != ref {
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
