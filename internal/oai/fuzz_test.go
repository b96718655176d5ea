package oai

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strconv"
	"testing"
)

// fuzzSchemas are the schemas FuzzParseRequest picks from by its first
// argument (modulo the length). The first four keep the meaning the
// argument had when it was an Operation (0 invalid, then chat, completion,
// embeddings); the literals at the end combine the fields in ways no route
// does: a prompt that is also required, model and prompt the same field,
// prompt and preamble the same field, a preamble without a prompt, and more
// required fields than the single pass tracks.
var fuzzSchemas = []*Schema{
	nil, SchemaChat, SchemaCompletion, SchemaEmbeddings,
	SchemaResponses, SchemaMessages, SchemaCountTokens, SchemaRerank, SchemaScore,
	SchemaPooling, SchemaClassify, SchemaTokenize, SchemaDetokenize, SchemaSpeech, SchemaImages,
	{Prompt: "input", PromptKind: PromptText, PromptNonEmpty: true, Preamble: "system", Require: []string{"input", "model"}, Generative: true},
	{Prompt: "model", PromptKind: PromptText, ModelRequired: true},
	{Prompt: "messages", PromptKind: PromptMessages, Preamble: "messages", Generative: true},
	{Prompt: "messages", PromptKind: PromptNone, Preamble: "messages", PromptNonEmpty: true},
	{Preamble: "system", Generative: true},
	{Require: manyRequired},
}

// manyRequired has more names than the single pass tracks, with "model"
// and "prompt" after the first 64.
var manyRequired = func() []string {
	var names []string
	for i := range maxRequireBits + 2 {
		names = append(names, "f"+strconv.Itoa(i))
	}
	return append(names, "model", "prompt")
}()

// FuzzParseRequest checks that ParseRequest never panics, that a parsed
// request has a model when the schema requires one, that every error is a
// *RequestError, and that it agrees exactly with the encoding/json
// reference implementation. It also checks Parse with hashing on
// (checkParse).
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
	f.Add(uint8(1), []byte(`{"messages":[{"content":"You are a helpful assistant.","role":"system"},{"role":"assistant","content":null,"tool_calls":[{"id":"c"}]}],"model":"m"}`))
	f.Add(uint8(1), []byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a long enough prompt"}],"role":"tool"},7,{}]}`))
	f.Add(uint8(2), []byte(`{"model":"m","prompt":["Once upon a time",[101,2023,-1],7,null]}`))
	f.Add(uint8(2), []byte(`{"model":"m","prompt":"Once upon a time, in a land far away, there lived a gateway"}`))
	for i, s := range []string{
		responsesBody, messagesBody,
		`{"model":"m","input":"Tell me a three sentence bedtime story about a unicorn.","instructions":"Be brief.","max_output_tokens":50,"stream":true}`,
		`{"model":"m","system":[{"type":"text","text":"You are terse.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"hi"}],"metadata":{"user_id":"u-1"},"max_tokens":9}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":{"user_id":7}}`,
		`{"model":"r","query":"q","documents":["a","b"]}`, `{"query":"q","documents":null}`,
		`{"text_1":"a","text_2":["b"]}`, `{"input":["a",[1,2]]}`, `{"prompt":"p","messages":[]}`,
		`{"tokens":[1,2,3]}`, `{"input":"say hi","voice":"alloy"}`, `{"prompt":"a cat","n":1}`,
		`{"model":"m","input":[1],"system":"s","f0":1}`, `{"model":"m","system":"s"}`,
	} {
		f.Add(uint8(4+i%(len(fuzzSchemas)-4)), []byte(s))
	}
	f.Fuzz(func(t *testing.T, op uint8, body []byte) {
		s := fuzzSchemas[int(op)%len(fuzzSchemas)]
		r, err := ParseRequest(s, body)
		checkParse(t, s, body, r, err)
		ref, referr := refParseRequest(s, body)
		if err == nil {
			if r.Model == "" && s.ModelRequired {
				t.Fatalf("ParseRequest(%d, %q) = %+v with an empty model", op, body, r)
			}
			if referr != nil || !reflect.DeepEqual(r, ref) {
				t.Fatalf("ParseRequest(%d, %q) = %+v; reference %+v, %v", op, body, r, ref, referr)
			}
			if r.ModelEnd > 0 && unescape(body[r.ModelStart:r.ModelEnd]) != r.Model {
				t.Fatalf("ParseRequest(%d, %q): body[%d:%d] = %q, model %q", op, body, r.ModelStart, r.ModelEnd, body[r.ModelStart:r.ModelEnd], r.Model)
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
func checkParse(t *testing.T, s *Schema, body []byte, r Request, err error) {
	t.Helper()
	p := Parser{BlockBytes: 16, MaxBlocks: 8}
	hr, herr := p.Parse(s, body)
	if err != nil {
		if !reflect.DeepEqual(herr, err) || !reflect.DeepEqual(hr, Request{}) {
			t.Fatalf("Parse(%q) = %+v, %v; ParseRequest error %v", body, hr, herr, err)
		}
		return
	}
	if herr != nil {
		t.Fatalf("Parse(%q) error %v; ParseRequest %+v", body, herr, r)
	}
	hashes := hr.PrefixHashes
	unhashed := s.PromptKind == PromptInput || s.PromptKind == PromptNone || s.Prompt == ""
	if len(hashes) > p.MaxBlocks || hashes != nil && len(hashes) == 0 || unhashed && hashes != nil {
		t.Fatalf("Parse(%q) = %d hashes (nil %v), want at most %d", body, len(hashes), hashes == nil, p.MaxBlocks)
	}
	hr.PrefixHashes = nil
	if !reflect.DeepEqual(hr, r) {
		t.Fatalf("Parse(%q) = %+v; ParseRequest %+v", body, hr, r)
	}
	if again, _ := p.Parse(s, body); !slices.Equal(again.PrefixHashes, hashes) {
		t.Fatalf("Parse(%q) hashes %x, then %x", body, hashes, again.PrefixHashes)
	}
	if ref, _ := refParse(p, s, body); !slices.Equal(ref.PrefixHashes, hashes) {
		t.Fatalf("Parse(%q) hashes %x; reference %x (stream %q)", body, hashes, ref.PrefixHashes, refStream(s.PromptKind, mustObject(body)[s.Prompt]))
	}
	one, _ := Parser{BlockBytes: 1}.Parse(s, body)
	if cap(one.PrefixHashes) > len(body) {
		t.Fatalf("Parse(%q) with 1-byte blocks: %d hashes, capacity %d; want capacity %d", body, len(one.PrefixHashes), cap(one.PrefixHashes), len(body))
	}
	if n := min(len(one.PrefixHashes)/16, p.MaxBlocks); n != len(hashes) {
		t.Fatalf("Parse(%q): %d hashes, stream of %d bytes", body, len(hashes), len(one.PrefixHashes))
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
		`{"id":"resp_1","object":"response","usage":{"input_tokens":12,"output_tokens":7,"total_tokens":19}}`,
		`{"id":"msg_1","type":"message","usage":{"input_tokens":25,"output_tokens":15,"prompt_tokens":"x"}}`,
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
