package oai

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// kvp is the kv_transfer_params member PrefillBody adds.
const kvp = `"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false}`

// nixlParams is a prefill reply's kv_transfer_params as vLLM's
// NixlConnector writes it.
const nixlParams = `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2,3],"remote_engine_id":"e1","remote_host":"10.0.0.1","remote_port":5600,"tp_size":1}`

// decodeMap decodes a JSON object with numbers as json.Number, so that
// bodies compare exactly.
func decodeMap(t testing.TB, b []byte) map[string]any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	return m
}

// refPrefill applies PrefillBody's edits to a decoded body.
func refPrefill(m map[string]any) map[string]any {
	for _, k := range []string{"stream", "stream_options", "min_tokens", "kv_transfer_params"} {
		delete(m, k)
	}
	hasMax := false
	for _, k := range []string{"max_tokens", "max_completion_tokens"} {
		if _, ok := m[k]; ok {
			m[k], hasMax = json.Number("1"), true
		}
	}
	if !hasMax {
		m["max_tokens"] = json.Number("1")
	}
	m["stream"] = false
	m["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false}
	return m
}

// isObject reports whether data is valid JSON whose value is an object.
func isObject(data []byte) bool {
	return json.Valid(data) && bytes.HasPrefix(bytes.TrimLeft(data, " \t\r\n"), []byte("{"))
}

func TestPrefillBody(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"chat stream",
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":100}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"stream":false,` + kvp + `}`},
		{"completions stream false",
			`{"model":"m","prompt":"hi","stream":false,"max_tokens":16}`,
			`{"model":"m","prompt":"hi","max_tokens":1,"stream":false,` + kvp + `}`},
		{"stream absent, no limit",
			`{"model":"m","prompt":"hi"}`,
			`{"model":"m","prompt":"hi","stream":false,"max_tokens":1,` + kvp + `}`},
		{"stream_options null",
			`{"model":"m","stream_options":null,"prompt":"x"}`,
			`{"model":"m","prompt":"x","stream":false,"max_tokens":1,` + kvp + `}`},
		{"max_completion_tokens only",
			`{"model":"m","max_completion_tokens":512,"messages":[]}`,
			`{"model":"m","max_completion_tokens":1,"messages":[],"stream":false,` + kvp + `}`},
		{"both limits",
			`{"max_tokens":5,"max_completion_tokens":7}`,
			`{"max_tokens":1,"max_completion_tokens":1,"stream":false,` + kvp + `}`},
		{"null limit",
			`{"max_tokens":null}`,
			`{"max_tokens":1,"stream":false,` + kvp + `}`},
		{"limit of another type",
			`{"max_tokens":"many","max_completion_tokens":1.5e3}`,
			`{"max_tokens":1,"max_completion_tokens":1,"stream":false,` + kvp + `}`},
		{"min_tokens",
			`{"model":"m","min_tokens":10,"max_tokens":20}`,
			`{"model":"m","max_tokens":1,"stream":false,` + kvp + `}`},
		{"client kv_transfer_params",
			`{"kv_transfer_params":{"do_remote_prefill":true},"model":"m"}`,
			`{"model":"m","stream":false,"max_tokens":1,` + kvp + `}`},
		{"newlines",
			"{\n  \"model\": \"m\",\n  \"stream\": true,\n  \"max_tokens\": 64,\n  \"prompt\": \"x\"\n}\n",
			"{\n  \"model\": \"m\",\n  \"max_tokens\": 1,\n  \"prompt\": \"x\",\"stream\":false," + kvp + "\n}\n"},
		{"spaces around a leading removed member",
			`{ "stream" : true , "model" : "m" }`,
			`{ "model" : "m","stream":false,"max_tokens":1,` + kvp + ` }`},
		{"nested keys untouched",
			`{"model":"m","messages":[{"role":"user","content":"hi","stream":true,"max_tokens":3}],"metadata":{"stream":true,"max_tokens":9,"kv_transfer_params":{}},"response_format":{"min_tokens":1}}`,
			`{"model":"m","messages":[{"role":"user","content":"hi","stream":true,"max_tokens":3}],"metadata":{"stream":true,"max_tokens":9,"kv_transfer_params":{}},"response_format":{"min_tokens":1},"stream":false,"max_tokens":1,` + kvp + `}`},
		{"keys in string values untouched",
			`{"prompt":"\"stream\":true,\"max_tokens\":9"}`,
			`{"prompt":"\"stream\":true,\"max_tokens\":9","stream":false,"max_tokens":1,` + kvp + `}`},
		{"escaped keys",
			`{"str\u0065am":true,"max\u005ftokens":9,"model":"m"}`,
			`{"max\u005ftokens":1,"model":"m","stream":false,` + kvp + `}`},
		{"case differs",
			`{"Stream":true,"MAX_TOKENS":9}`,
			`{"Stream":true,"MAX_TOKENS":9,"stream":false,"max_tokens":1,` + kvp + `}`},
		{"only member removed",
			`{"stream":true}`,
			`{"stream":false,"max_tokens":1,` + kvp + `}`},
		{"all members removed",
			`{"stream":true, "stream_options":{}, "min_tokens":2}`,
			`{"stream":false,"max_tokens":1,` + kvp + `}`},
		{"last member removed",
			`{"model":"m","stream":true}`,
			`{"model":"m","stream":false,"max_tokens":1,` + kvp + `}`},
		{"removed between kept",
			`{"a":1, "stream":true, "b":2}`,
			`{"a":1, "b":2,"stream":false,"max_tokens":1,` + kvp + `}`},
		{"duplicates",
			`{"stream":true,"stream":false,"model":"m","max_tokens":3,"max_tokens":4,"stream":true}`,
			`{"model":"m","max_tokens":1,"max_tokens":1,"stream":false,` + kvp + `}`},
		{"empty object", `{}`, `{"stream":false,"max_tokens":1,` + kvp + `}`},
		{"empty object with spaces", " { } \n", ` { "stream":false,"max_tokens":1,` + kvp + "} \n"},
		{"numbers kept as written",
			`{"temperature":1.0E0,"seed":-0,"max_tokens":1e2}`,
			`{"temperature":1.0E0,"seed":-0,"max_tokens":1,"stream":false,` + kvp + `}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PrefillBody([]byte(tc.body))
			if err != nil || string(got) != tc.want {
				t.Fatalf("PrefillBody(%q) =\n%s, %v; want\n%s", tc.body, got, err, tc.want)
			}
			if !json.Valid(got) {
				t.Fatalf("PrefillBody(%q) = %q: invalid JSON", tc.body, got)
			}
			if want := refPrefill(decodeMap(t, []byte(tc.body))); !reflect.DeepEqual(decodeMap(t, got), want) {
				t.Fatalf("PrefillBody(%q) decodes to %v; want %v", tc.body, decodeMap(t, got), want)
			}
		})
	}
}

// notObjects are inputs that PrefillBody, DecodeBody (as body or params),
// ParsePrefill and SetCachedTokens reject.
var notObjects = []string{
	``, ` `, `null`, `[]`, `"s"`, `1`, `true`, `{`, `}`, `{"a":1`, `{"a":1}x`, `{"a":1,}`,
	`{"stream":tru}`, `[{"stream":true}]`, `{"a":1}{"b":2}`, `{"a" 1}`, `{,"a":1}`, `{"a":1,,"b":2}`,
	`{"max_tokens":}`, `{"cached_tokens":"\x01"}`, "\xff",
}

func TestPrefillBodyNotObject(t *testing.T) {
	for _, body := range notObjects {
		got, err := PrefillBody([]byte(body))
		if !errors.Is(err, ErrNotObject) || got != nil {
			t.Errorf("PrefillBody(%q) = %q, %v; want nil, ErrNotObject", body, got, err)
		}
	}
}

func TestDecodeBody(t *testing.T) {
	tests := []struct {
		name, body, params, want string
	}{
		{"appended",
			`{"model":"m","prompt":"x","stream":true}`, nixlParams,
			`{"model":"m","prompt":"x","stream":true,"kv_transfer_params":` + nixlParams + `}`},
		{"client params replaced",
			`{"kv_transfer_params":{"x":1},"model":"m"}`, nixlParams,
			`{"model":"m","kv_transfer_params":` + nixlParams + `}`},
		{"duplicates removed",
			`{"kv_transfer_params":null,"model":"m","kv_transfer_params":{"x":1}}`, `{"a":1}`,
			`{"model":"m","kv_transfer_params":{"a":1}}`},
		{"params copied byte for byte",
			`{"model":"m"}`, " { \"b\" : 1.50 ,\"a\":[ ] }\n",
			`{"model":"m","kv_transfer_params": { "b" : 1.50 ,"a":[ ] }` + "\n}"},
		{"nested untouched",
			`{"metadata":{"kv_transfer_params":{"x":1}}}`, `{}`,
			`{"metadata":{"kv_transfer_params":{"x":1}},"kv_transfer_params":{}}`},
		{"newlines",
			"{\n  \"model\": \"m\",\n  \"kv_transfer_params\": {}\n}", `{"a":1}`,
			"{\n  \"model\": \"m\",\"kv_transfer_params\":{\"a\":1}\n}"},
		{"empty object", `{}`, `{}`, `{"kv_transfer_params":{}}`},
		{"only member removed", `{"kv_transfer_params":1}`, `{"a":1}`, `{"kv_transfer_params":{"a":1}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeBody([]byte(tc.body), []byte(tc.params))
			if err != nil || string(got) != tc.want {
				t.Fatalf("DecodeBody(%q, %q) =\n%s, %v; want\n%s", tc.body, tc.params, got, err, tc.want)
			}
			if !json.Valid(got) {
				t.Fatalf("DecodeBody(%q, %q) = %q: invalid JSON", tc.body, tc.params, got)
			}
		})
	}
	for _, bad := range notObjects {
		if got, err := DecodeBody([]byte(bad), []byte(`{}`)); !errors.Is(err, ErrNotObject) || got != nil {
			t.Errorf("DecodeBody(%q, {}) = %q, %v; want nil, ErrNotObject", bad, got, err)
		}
		if got, err := DecodeBody([]byte(`{"model":"m"}`), []byte(bad)); !errors.Is(err, ErrNotObject) || got != nil {
			t.Errorf("DecodeBody(body, %q) = %q, %v; want nil, ErrNotObject", bad, got, err)
		}
	}
}

// prefillReply is a vLLM prefill leg's chat completion.
const prefillReply = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"The"},"finish_reason":"length"}],"usage":{"prompt_tokens":900,"total_tokens":901,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":512}},"kv_transfer_params":` + nixlParams + `}`

func TestParsePrefill(t *testing.T) {
	tests := []struct {
		name, body string
		want       Prefill
	}{
		{"vllm reply", prefillReply, Prefill{Params: []byte(nixlParams), PromptTokens: 900, CachedTokens: 512, HasCached: true}},
		{"details null",
			`{"usage":{"prompt_tokens":7,"prompt_tokens_details":null},"kv_transfer_params":{"a":1}}`,
			Prefill{Params: []byte(`{"a":1}`), PromptTokens: 7}},
		{"details absent", `{"usage":{"prompt_tokens":7}}`, Prefill{PromptTokens: 7}},
		{"cached zero", `{"usage":{"prompt_tokens_details":{"cached_tokens":0}}}`, Prefill{HasCached: true}},
		{"cached not a number", `{"usage":{"prompt_tokens_details":{"cached_tokens":"5"}}}`, Prefill{}},
		{"cached fraction", `{"usage":{"prompt_tokens":9.9,"prompt_tokens_details":{"cached_tokens":5.5}}}`, Prefill{PromptTokens: 9, CachedTokens: 5, HasCached: true}},
		{"usage null", `{"usage":null,"kv_transfer_params":{}}`, Prefill{Params: []byte(`{}`)}},
		{"params null", `{"kv_transfer_params":null}`, Prefill{}},
		{"params not an object", `{"kv_transfer_params":"x"}`, Prefill{}},
		{"params last wins", `{"kv_transfer_params":{"a":1},"kv_transfer_params":null}`, Prefill{}},
		{"usage last wins",
			`{"usage":{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":1}},"usage":{"prompt_tokens":2}}`,
			Prefill{PromptTokens: 2}},
		{"nested ignored",
			`{"choices":[{"kv_transfer_params":{"a":1},"usage":{"prompt_tokens":3}}]}`, Prefill{}},
		{"params with spaces", `{ "kv_transfer_params" : { "a" : [1, 2] } }`, Prefill{Params: []byte(`{ "a" : [1, 2] }`)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParsePrefill([]byte(tc.body))
			if !ok || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParsePrefill(%q) = %+v, %v; want %+v, true", tc.body, got, ok, tc.want)
			}
		})
	}
	for _, bad := range notObjects {
		if got, ok := ParsePrefill([]byte(bad)); ok || !reflect.DeepEqual(got, Prefill{}) {
			t.Errorf("ParsePrefill(%q) = %+v, %v; want zero, false", bad, got, ok)
		}
	}
}

func TestSetCachedTokens(t *testing.T) {
	const finalChunk = `{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":900,"total_tokens":910,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":896}}}`
	tests := []struct {
		name, data string
		cached     int64
		want       string // "" when ok is false
		was        int64
	}{
		{"final stream chunk", finalChunk, 0,
			`{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":900,"total_tokens":910,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":0}}}`, 896},
		{"non-stream body with spaces",
			`{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}], "usage": { "prompt_tokens": 9, "prompt_tokens_details": { "cached_tokens" : 0 } } }`, 512,
			`{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}], "usage": { "prompt_tokens": 9, "prompt_tokens_details": { "cached_tokens" : 512 } } }`, 0},
		{"negative and fraction", `{"usage":{"prompt_tokens_details":{"cached_tokens":12.7}}}`, -1,
			`{"usage":{"prompt_tokens_details":{"cached_tokens":-1}}}`, 12},
		{"last usage edited",
			`{"usage":{"prompt_tokens_details":{"cached_tokens":1}},"usage":{"prompt_tokens_details":{"cached_tokens":2}}}`, 7,
			`{"usage":{"prompt_tokens_details":{"cached_tokens":1}},"usage":{"prompt_tokens_details":{"cached_tokens":7}}}`, 2},
		{"last cached_tokens edited",
			`{"usage":{"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":2}}}`, 7,
			`{"usage":{"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":7}}}`, 2},
		{"details null", `{"usage":{"prompt_tokens":9,"prompt_tokens_details":null},"x":"cached_tokens"}`, 0, "", 0},
		{"no usage", `{"id":"c","choices":[{"index":0,"delta":{"content":"cached_tokens"}}]}`, 0, "", 0},
		{"no cached_tokens at all", `{"id":"c","choices":[],"usage":{"prompt_tokens":9}}`, 0, "", 0},
		{"usage null", `{"usage":null,"cached_tokens":1}`, 0, "", 0},
		{"cached not a number", `{"usage":{"prompt_tokens_details":{"cached_tokens":"1"}}}`, 0, "", 0},
		{"last usage has none",
			`{"usage":{"prompt_tokens_details":{"cached_tokens":1}},"usage":{"prompt_tokens":2}}`, 0, "", 0},
		{"last details null",
			`{"usage":{"prompt_tokens_details":{"cached_tokens":1},"prompt_tokens_details":null}}`, 0, "", 0},
		{"last cached_tokens null",
			`{"usage":{"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":null}}}`, 0, "", 0},
		{"nested usage", `{"choices":[{"usage":{"prompt_tokens_details":{"cached_tokens":1}}}]}`, 0, "", 0},
		{"invalid JSON", `{"usage":{"prompt_tokens_details":{"cached_tokens":1}}`, 0, "", 0},
		{"not an object", `[{"usage":{"prompt_tokens_details":{"cached_tokens":1}}}]`, 0, "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := []byte("data: ")
			got, was, ok := SetCachedTokens(dst, []byte(tc.data), tc.cached)
			if tc.want == "" {
				if ok || was != 0 || string(got) != "data: " {
					t.Fatalf("SetCachedTokens(%q) = %q, %d, %v; want dst, 0, false", tc.data, got, was, ok)
				}
				return
			}
			if !ok || was != tc.was || string(got) != "data: "+tc.want {
				t.Fatalf("SetCachedTokens(%q, %d) =\n%s, %d, %v; want\ndata: %s, %d, true", tc.data, tc.cached, got, was, ok, tc.want, tc.was)
			}
			if got, was, ok := SetCachedTokens(nil, []byte(tc.data), tc.cached); !ok || was != tc.was || string(got) != tc.want {
				t.Fatalf("SetCachedTokens(nil, %q) = %q, %d, %v", tc.data, got, was, ok)
			}
		})
	}
}

// FuzzPrefillBody checks that PrefillBody, DecodeBody, ParsePrefill and
// SetCachedTokens never panic; that for a JSON object PrefillBody's and
// DecodeBody's results are valid JSON that decode to the input with the
// edits applied (refPrefill), and for anything else are ErrNotObject; and
// that SetCachedTokens agrees with ParsePrefill.
func FuzzPrefillBody(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"stream":true}`, prefillReply, chatBody,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":100,"min_tokens":5}`,
		`{ "str\u0065am" : true , "max_completion_tokens":null, "kv_transfer_params":{"a":1}, "stream":false }`,
		`{"id":"c","choices":[],"usage":{"prompt_tokens":900,"prompt_tokens_details":{"cached_tokens":896}}}`,
		"{\n\"a\":1,\n\"stream\":1\n}\n", `[]`, `null`, `{"a":`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		obj := isObject(data)
		got, err := PrefillBody(data)
		if !obj {
			if !errors.Is(err, ErrNotObject) || got != nil {
				t.Fatalf("PrefillBody(%q) = %q, %v; want ErrNotObject", data, got, err)
			}
		} else {
			if err != nil || !json.Valid(got) {
				t.Fatalf("PrefillBody(%q) = %q, %v: invalid", data, got, err)
			}
			if want := refPrefill(decodeMap(t, data)); !reflect.DeepEqual(decodeMap(t, got), want) {
				t.Fatalf("PrefillBody(%q) = %q; want %v", data, got, want)
			}
		}
		dec, err := DecodeBody(data, []byte(nixlParams))
		if obj {
			want := decodeMap(t, data)
			want["kv_transfer_params"] = decodeMap(t, []byte(nixlParams))
			if err != nil || !json.Valid(dec) || !reflect.DeepEqual(decodeMap(t, dec), want) {
				t.Fatalf("DecodeBody(%q) = %q, %v", data, dec, err)
			}
		} else if !errors.Is(err, ErrNotObject) {
			t.Fatalf("DecodeBody(%q) = %q, %v; want ErrNotObject", data, dec, err)
		}
		p, pok := ParsePrefill(data)
		if pok != obj {
			t.Fatalf("ParsePrefill(%q) ok = %v", data, pok)
		}
		out, was, ok := SetCachedTokens(nil, data, 7)
		if ok {
			if !p.HasCached || was != p.CachedTokens || !json.Valid(out) {
				t.Fatalf("SetCachedTokens(%q) = %q, %d; ParsePrefill %+v", data, out, was, p)
			}
			if q, _ := ParsePrefill(out); !q.HasCached || q.CachedTokens != 7 {
				t.Fatalf("SetCachedTokens(%q) = %q, which reads %+v", data, out, q)
			}
		} else if out != nil || p.HasCached && bytes.Contains(data, cachedTokensKey) && !strings.Contains(string(data), `\u`) {
			t.Fatalf("SetCachedTokens(%q) = %q, false; ParsePrefill %+v", data, out, p)
		}
	})
}

// BenchmarkSetCachedTokens measures the rewrite of a final usage chunk
// into a reused buffer, and a content chunk that the precheck passes over.
func BenchmarkSetCachedTokens(b *testing.B) {
	for _, bc := range []struct{ name, data string }{
		{"usage", `{"id":"chatcmpl-9f3c","object":"chat.completion.chunk","created":1733390000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[],"usage":{"prompt_tokens":900,"total_tokens":910,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":896}}}`},
		{"content", `{"id":"chatcmpl-9f3c","object":"chat.completion.chunk","created":1733390000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" the"},"logprobs":null,"finish_reason":null}]}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			data := []byte(bc.data)
			dst := make([]byte, 0, 512)
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				dst, _, _ = SetCachedTokens(dst[:0], data, 0)
			}
		})
	}
}
