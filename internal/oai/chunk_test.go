package oai

import (
	"bytes"
	"math"
	"testing"
)

// L10 chunks as vLLM streams them.
const (
	roleChunk      = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`
	contentChunk   = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}`
	reasoningChunk = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":"Let me think"},"logprobs":null,"finish_reason":null}]}`
	toolChunk      = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null}]}`
	finishChunk    = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}`
	usageChunk     = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":9,"total_tokens":15,"completion_tokens":6}}`
	// vllmContentChunk is a typical ~220-byte vLLM content chunk.
	vllmContentChunk = `{"id":"chatcmpl-4f3b2a1c9e8d7f6a","object":"chat.completion.chunk","created":1735689600,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}`
	l07Data          = `{"id":"c1","choices":[{"index":0,"delta":{"content":"hello"}}]}`
)

func TestInspectChunk(t *testing.T) {
	id := []byte("chatcmpl-1")
	tests := []struct {
		name string
		data string
		want Chunk
	}{
		{"role-only prelude", roleChunk, Chunk{ID: id}},
		{"content", contentChunk, Chunk{ID: id, Content: true}},
		{"typical vllm content", vllmContentChunk, Chunk{ID: []byte("chatcmpl-4f3b2a1c9e8d7f6a"), Content: true}},
		{"l07 event data", l07Data, Chunk{ID: []byte("c1"), Content: true}},
		{"reasoning_content first", reasoningChunk, Chunk{ID: id, Content: true, Reasoning: true}},
		{"reasoning", `{"choices":[{"delta":{"reasoning":"hmm"}}]}`, Chunk{Content: true, Reasoning: true}},
		{"spaced tool_calls after content", `{"choices":[{"delta":{"content":"a", "tool_calls" : [ {"index":0} ]}}]}`, Chunk{Content: true, ToolCalls: true}},
		{"reasoning in the second choice", `{"choices":[{"delta":{"content":"a"}},{"delta":{"reasoning_content":"b"}}]}`, Chunk{Content: true, Reasoning: true}},
		{"reasoning as text, not a key", `{"choices":[{"delta":{"content":"\"reasoning\":\"x"}}]}`, Chunk{Content: true}},
		{"empty reasoning", `{"choices":[{"delta":{"reasoning_content":"","reasoning":null}}]}`, Chunk{}},
		{"tool_calls first", toolChunk, Chunk{ID: id, Content: true, ToolCalls: true}},
		{"empty tool_calls", `{"choices":[{"delta":{"tool_calls":[]}}]}`, Chunk{}},
		{"null tool_calls", `{"choices":[{"delta":{"tool_calls":null,"content":null}}]}`, Chunk{}},
		{"finish with empty delta", finishChunk, Chunk{ID: id, Finish: true}},
		{"finish with null content", `{"id":"x","choices":[{"index":0,"delta":{"content":null},"finish_reason":"length"}]}`, Chunk{ID: []byte("x"), Finish: true}},
		{"finish with content", `{"choices":[{"delta":{"content":"."},"finish_reason":"stop"}]}`, Chunk{Content: true, Finish: true}},
		{"usage-only", usageChunk, Chunk{ID: id, HasUsage: true, Usage: Usage{PromptTokens: 9, CompletionTokens: 6, TotalTokens: 15}}},
		{"usage null", `{"choices":[{"delta":{"content":"a"}}],"usage":null}`, Chunk{Content: true}},
		{"usage with details", `{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":{"cached_tokens":1}}}`, Chunk{HasUsage: true, Usage: Usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3, CachedTokens: 1, HasCached: true}}},
		{"usage odd values", `{"usage":{"prompt_tokens":1.9,"completion_tokens":"2","total_tokens":1e30}}`, Chunk{HasUsage: true, Usage: Usage{PromptTokens: 1, TotalTokens: math.MaxInt64}}},
		{"usage not an object", `{"usage":5}`, Chunk{}},
		{"usage names of other apis not read", `{"usage":{"input_tokens":5,"output_tokens":6}}`, Chunk{HasUsage: true}},
		{"completions text", `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" Hi","logprobs":null,"finish_reason":null}]}`, Chunk{ID: []byte("cmpl-1"), Content: true}},
		{"completions empty text", `{"choices":[{"index":0,"text":"","finish_reason":"stop"}]}`, Chunk{Finish: true}},
		{"second choice has content", `{"choices":[{"index":0,"delta":{}},{"index":1,"delta":{"content":"x"}}]}`, Chunk{Content: true}},
		{"escaped content", `{"choices":[{"delta":{"content":"\n"}}]}`, Chunk{Content: true}},
		{"escaped id kept raw", `{"id":"a\"b"}`, Chunk{ID: []byte(`a\"b`)}},
		{"empty id", `{"id":""}`, Chunk{ID: []byte{}}},
		{"null id", `{"id":null}`, Chunk{}},
		{"number id", `{"id":1}`, Chunk{}},
		{"error event", `{"error":{"object":"error","message":"boom","type":"InternalServerError","code":500}}`, Chunk{Error: true}},
		{"error response", `{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}`, Chunk{Error: true}},
		{"null error", `{"error":null,"choices":[]}`, Chunk{}},
		{"last duplicate wins", `{"choices":[{"delta":{"content":"a"}}],"choices":[],"id":"a","id":"b"}`, Chunk{ID: []byte("b")}},
		{"duplicate finish_reason", `{"choices":[{"finish_reason":"stop","finish_reason":null}]}`, Chunk{}},
		{"case variant keys ignored", `{"Choices":[{"delta":{"content":"a"}}],"ID":"x"}`, Chunk{}},
		{"escaped key", `{"choice\u0073":[{"delta":{"content":"a"}}]}`, Chunk{Content: true}},
		{"odd shapes", `{"choices":[1,null,{"delta":"x"},{"delta":{"content":5,"tool_calls":{}}}]}`, Chunk{}},
		{"empty object", ` {} `, Chunk{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := InspectChunk([]byte(tt.data))
			if err != nil {
				t.Fatalf("InspectChunk() error = %v", err)
			}
			if !chunkEqual(got, tt.want) {
				t.Errorf("InspectChunk() = %s\nwant %s", fmtChunk(got), fmtChunk(tt.want))
			}
			if ref, ok := refInspectChunk([]byte(tt.data)); !ok || !chunkEqual(ref, got) {
				t.Errorf("reference = %s, %v", fmtChunk(ref), ok)
			}
		})
	}
}

func TestInspectChunkErrors(t *testing.T) {
	for _, data := range []string{
		"", "[DONE]", " [DONE]", ": ping", `{"id":"c1","choices":[{"index":0,"delta":{"content":"hel`,
		`[1]`, `null`, `"x"`, `{"a":1,}`, `{"a":1}}`, `{"a":01}`, `{"a":"\x"}`, "{\"a\":\"\x01\"}",
		`{"a":tru}`, `{"a":1.}`, `{"a":-}`, `{"a":1e}`, `{"a":"\u12g4"}`,
	} {
		if c, err := InspectChunk([]byte(data)); err == nil {
			t.Errorf("InspectChunk(%q) = %s, nil; want an error", data, fmtChunk(c))
		}
	}
}

func TestParseResponse(t *testing.T) {
	tests := []struct {
		name  string
		body  string
		id    string
		usage Usage
		ok    bool
	}{
		{"chat", `{"id":"chatcmpl-9","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"total_tokens":10,"completion_tokens":1}}`,
			"chatcmpl-9", Usage{PromptTokens: 9, CompletionTokens: 1, TotalTokens: 10}, true},
		{"completion", `{"id":"cmpl-2","object":"text_completion","choices":[{"text":"x"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`,
			"cmpl-2", Usage{PromptTokens: 3, CompletionTokens: 1, TotalTokens: 4}, true},
		{"vllm cached tokens", `{"id":"cmpl-3","object":"text_completion","choices":[{"text":"x"}],"usage":{"prompt_tokens":40,"total_tokens":41,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":32}}}`,
			"cmpl-3", Usage{PromptTokens: 40, CompletionTokens: 1, TotalTokens: 41, CachedTokens: 32, HasCached: true}, true},
		{"null details", `{"id":"cmpl-4","usage":{"prompt_tokens":4,"prompt_tokens_details":null}}`,
			"cmpl-4", Usage{PromptTokens: 4}, true},
		{"embeddings", `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,-0.2,3e-5]}],"model":"e","usage":{"prompt_tokens":5,"total_tokens":5}}`,
			"", Usage{PromptTokens: 5, TotalTokens: 5}, true},
		{"responses api", `{"id":"resp_8f2c","object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"Hi"}]}],"usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":4},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":19}}`,
			"resp_8f2c", Usage{PromptTokens: 12, CompletionTokens: 7, TotalTokens: 19, CachedTokens: 4, HasCached: true}, true},
		{"anthropic", `{"id":"msg_01XFD","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":25,"cache_read_input_tokens":0,"output_tokens":15}}`,
			"msg_01XFD", Usage{PromptTokens: 25, CompletionTokens: 15, HasCached: true}, true},
		{"anthropic cache", `{"id":"m","type":"message","usage":{"input_tokens":3,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":15}}`,
			"m", Usage{PromptTokens: 2103, CompletionTokens: 15, CachedTokens: 2000, HasCached: true}, true},
		{"anthropic cache saturates", `{"usage":{"input_tokens":1e30,"cache_read_input_tokens":5}}`,
			"", Usage{PromptTokens: math.MaxInt64, CachedTokens: 5, HasCached: true}, true},
		{"openai names win", `{"usage":{"input_tokens":1,"prompt_tokens":2,"output_tokens":3,"completion_tokens":4}}`, "", Usage{PromptTokens: 2, CompletionTokens: 4}, true},
		{"openai names not numbers", `{"usage":{"input_tokens":1,"prompt_tokens":null,"output_tokens":3,"completion_tokens":"4"}}`, "", Usage{PromptTokens: 1, CompletionTokens: 3}, true},
		{"escaped id", `{"id":"a\u00e9"}`, "a\u00e9", Usage{}, true},
		{"no usage", `{"id":"x","usage":null}`, "x", Usage{}, true},
		{"invalid", `{"id":"x"`, "", Usage{}, false},
		{"array", `[{"id":"x"}]`, "", Usage{}, false},
		{"empty", ``, "", Usage{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, u, ok := ParseResponse([]byte(tt.body))
			if id != tt.id || u != tt.usage || ok != tt.ok {
				t.Errorf("ParseResponse() = %q, %+v, %v; want %q, %+v, %v", id, u, ok, tt.id, tt.usage, tt.ok)
			}
			rid, ru, rok := refParseResponse([]byte(tt.body))
			if rid != id || ru != u || rok != ok {
				t.Errorf("reference = %q, %+v, %v", rid, ru, rok)
			}
		})
	}
}

func TestInspectChunkAllocs(t *testing.T) {
	for _, data := range []string{vllmContentChunk, roleChunk, usageChunk, finishChunk, toolChunk} {
		b := []byte(data)
		if a := testing.AllocsPerRun(100, func() { _, _ = InspectChunk(b) }); a != 0 {
			t.Errorf("InspectChunk(%.40q...) allocations = %v, want 0", data, a)
		}
	}
}

func chunkEqual(a, b Chunk) bool {
	return bytes.Equal(a.ID, b.ID) && (a.ID == nil) == (b.ID == nil) &&
		a.Content == b.Content && a.Finish == b.Finish && a.HasUsage == b.HasUsage &&
		a.Usage == b.Usage && a.Error == b.Error
}

func fmtChunk(c Chunk) string {
	id := "<nil>"
	if c.ID != nil {
		id = `"` + string(c.ID) + `"`
	}
	type plain struct {
		Content, Finish, HasUsage bool
		Usage                     Usage
		Error                     bool
	}
	return "{ID:" + id + " " + sprint(plain{c.Content, c.Finish, c.HasUsage, c.Usage, c.Error}) + "}"
}
