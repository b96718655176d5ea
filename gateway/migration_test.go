package gateway

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/switchboard-gw/switchboard/internal/oai"
)

func TestAppendIDs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int32
		ok   bool
	}{
		{`[]`, nil, true},
		{`[1]`, []int32{1}, true},
		{`[ 1, 22 ,333 ]`, []int32{1, 22, 333}, true},
		{`null`, nil, true},
		{`[1,]`, []int32{1}, false},
		{`[-1]`, nil, false},
		{`[1.5]`, []int32{1}, false},
		{`[2147483648]`, nil, false},
		{`[2147483647]`, []int32{2147483647}, true},
		{`"x"`, nil, false},
		{`[1`, []int32{1}, false},
		{``, nil, false},
	} {
		got, ok := appendIDs(nil, []byte(tc.in))
		if ok != tc.ok || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("appendIDs(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// take inspects a chunk and gives it to c.take, as the relay does.
func take(t *testing.T, c *carry, chunk string) []byte {
	t.Helper()
	ch, err := oai.InspectChunk([]byte(chunk))
	if err != nil {
		t.Fatalf("%s: %v", chunk, err)
	}
	return c.take([]byte(chunk), &ch)
}

func testCarry(kind migrateKind, body string) *carry {
	cfg := DefaultMigrationConfig()
	return &carry{kind: kind, cfg: &cfg, body: []byte(body)}
}

// TestCarryTakeCutsTokenIDs: the first leg's chunks lose the token id
// fields the gateway asked for, and the ids are kept; a client that asked
// for them gets them.
func TestCarryTakeCutsTokenIDs(t *testing.T) {
	role := `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[5,6,7]}`
	tok := `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"tok0 "},"logprobs":null,"finish_reason":null,"token_ids":[32000]}]}`
	tok2 := `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"token_ids":[32001,32002],"delta":{"content":"tok1 tok2 "},"logprobs":null,"finish_reason":null}]}`
	c := testCarry(migrateChat, `{}`)
	got := string(take(t, c, role))
	if want := `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`; got != want {
		t.Errorf("role chunk:\n got %s\nwant %s", got, want)
	}
	got = string(take(t, c, tok))
	if want := `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"tok0 "},"logprobs":null,"finish_reason":null}]}`; got != want {
		t.Errorf("token chunk:\n got %s\nwant %s", got, want)
	}
	got = string(take(t, c, tok2))
	if want := `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"tok1 tok2 "},"logprobs":null,"finish_reason":null}]}`; got != want {
		t.Errorf("token chunk, ids first:\n got %s\nwant %s", got, want)
	}
	if !reflect.DeepEqual(c.prompt, []int32{5, 6, 7}) || !reflect.DeepEqual(c.gen, []int32{32000, 32001, 32002}) {
		t.Errorf("ids: prompt %v gen %v", c.prompt, c.gen)
	}
	if string(c.id) != `"chatcmpl-1"` || string(c.created) != `7` || string(c.model) != `"m"` || c.ready() != "" {
		t.Errorf("head %s %s %s ready %q", c.id, c.created, c.model, c.ready())
	}

	// An engine that writes ", " between members: the cut keeps the
	// JSON valid.
	c = testCarry(migrateChat, `{}`)
	take(t, c, `{"id": "x", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant"}}], "prompt_token_ids": [1, 2]}`)
	spaced := take(t, c, `{"id": "x", "choices": [{"token_ids": [32000],
	"delta": {"content": "a"}, "finish_reason": null}]}`)
	if want := `{"id": "x", "choices": [{"delta": {"content": "a"}, "finish_reason": null}]}`; string(spaced) != want {
		t.Errorf("spaced JSON:\n got %s\nwant %s", spaced, want)
	}
	if !reflect.DeepEqual(c.prompt, []int32{1, 2}) || !reflect.DeepEqual(c.gen, []int32{32000}) {
		t.Errorf("spaced JSON ids: prompt %v gen %v", c.prompt, c.gen)
	}

	c = testCarry(migrateChat, `{}`)
	c.clientIDs = true
	if got := string(take(t, c, tok)); got != tok {
		t.Errorf("a client that asked for token ids lost them: %s", got)
	}
	if !reflect.DeepEqual(c.gen, []int32{32000}) {
		t.Errorf("gen %v", c.gen)
	}
}

// TestCarryExcludedMidStream: content without ids, tool calls, reasoning
// and too many ids each end the request's continuability, and drop its
// ids.
func TestCarryExcludedMidStream(t *testing.T) {
	for _, tc := range []struct {
		name, chunk, want string
		max               int
	}{
		{"no ids", `{"id":"x","choices":[{"delta":{"content":"a"}}]}`, exclNoTokenIDs, 100},
		{"null ids", `{"id":"x","choices":[{"delta":{"content":"a"},"token_ids":null}]}`, exclNoTokenIDs, 100},
		{"tool calls", `{"id":"x","choices":[{"delta":{"tool_calls":[{"index":0}]},"token_ids":[1]}]}`, exclTools, 100},
		{"reasoning", `{"id":"x","choices":[{"delta":{"reasoning_content":"hm"},"token_ids":[1]}]}`, exclReasoning, 100},
		{"reasoning (later vLLM)", `{"id":"x","choices":[{"delta":{"reasoning":"hm"},"token_ids":[1]}]}`, exclReasoning, 100},
		{"too many", `{"id":"x","prompt_token_ids":[1,2],"choices":[{"delta":{"content":"a"},"token_ids":[3]}]}`, exclMaxTokens, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testCarry(migrateChat, `{}`)
			c.cfg.MaxTokens = tc.max
			take(t, c, tc.chunk)
			if c.ready() != tc.want || c.gen != nil || c.prompt != nil {
				t.Errorf("ready %q (want %q), ids %v %v", c.ready(), tc.want, c.prompt, c.gen)
			}
		})
	}
}

func TestExcludedBy(t *testing.T) {
	for _, tc := range []struct {
		kind migrateKind
		body string
		want string
	}{
		{migrateChat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, ""},
		{migrateChat, `{"model":"m","messages":[{"role":"user","content":"say \"n\""}],"n":1}`, ""},
		{migrateChat, `{"model":"m","messages":[],"n":2}`, exclN},
		{migrateCompletion, `{"model":"m","prompt":"a","best_of":3}`, exclN},
		{migrateChat, `{"model":"m","messages":[],"logprobs":true}`, exclLogprobs},
		{migrateChat, `{"model":"m","messages":[],"logprobs":false}`, ""},
		{migrateCompletion, `{"model":"m","prompt":"a","logprobs":2}`, exclLogprobs},
		{migrateCompletion, `{"model":"m","prompt":"a","echo":true}`, exclEcho},
		{migrateChat, `{"model":"m","messages":[],"response_format":{"type":"json_schema","json_schema":{}}}`, exclStructured},
		{migrateChat, `{"model":"m","messages":[],"response_format":{"type":"json_object"}}`, exclStructured},
		{migrateChat, `{"model":"m","messages":[],"response_format":{"type":"text"}}`, ""},
		{migrateChat, `{"model":"m","messages":[],"guided_regex":"a+"}`, exclStructured},
		{migrateChat, `{"model":"m","messages":[],"guided_json":null}`, ""},
		{migrateChat, `{"model":"m","messages":[],"structured_outputs":{"choice":["a"]}}`, exclStructured},
		{migrateChat, `{"model":"m","messages":[],"tools":[{"type":"function"}]}`, exclTools},
		{migrateChat, `{"model":"m","messages":[],"tools":[{"type":"function"}],"tool_choice":"none"}`, ""},
		{migrateChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]}`, exclMultimodal},
		{migrateChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`, ""},
		{migrateCompletion, `{"model":"m","prompt":"a","prompt_embeds":"AAAA"}`, exclMultimodal},
		{migrateCompletion, `{"model":"m","prompt":["a","b"]}`, exclN},
		{migrateCompletion, `{"model":"m","prompt":[[1,2],[3]]}`, exclN},
		{migrateCompletion, `{"model":"m","prompt":[1,2,3]}`, ""},
		{migrateCompletion, `{"model":"m","prompt":["a"]}`, ""},
		{migrateChat, `{"model":"m","messages":[],"top_logprobs":0}`, ""},
		{migrateChat, `{"model":"m","messages":[],"tools":[]}`, ""},
		{migrateChat, `{"model":"m","messages":[],"n":1.0}`, ""},
		{migrateChat, `{"model":"m","messages":[],"n":2.0}`, exclN},
		{migrateChat, `{"model":"m","messages":[],"stop":["\n\n"]}`, exclStop},
		{migrateCompletion, `{"model":"m","prompt":"a","stop":"x"}`, exclStop},
		{migrateChat, `{"model":"m","messages":[],"stop":[]}`, ""},
		{migrateChat, `{"model":"m","messages":[],"stop":null,"stop_token_ids":[2]}`, ""},
	} {
		if got := excludedBy(tc.kind, []byte(tc.body), false); got != tc.want {
			t.Errorf("excludedBy(%s) = %q, want %q", tc.body, got, tc.want)
		}
	}
}

// TestCarryReshape: a continuation's completions chunks in the client's
// framing, with the first leg's id, created and model, and the whole
// answer's usage.
func TestCarryReshape(t *testing.T) {
	c := testCarry(migrateChat, `{}`)
	c.id, c.created, c.model = []byte(`"chatcmpl-1"`), []byte(`7`), []byte(`"m"`)
	c.prompt, c.gen, c.legGen, c.promptLen = []int32{1, 2, 3}, []int32{32000, 32001}, 2, 3
	c.usage = true
	for _, tc := range []struct{ in, want string }{
		{`{"id":"cmpl-9","object":"text_completion","created":9,"model":"m","choices":[{"index":0,"text":"tok2 ","logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":[32002]}]}`,
			`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"tok2 "},"logprobs":null,"finish_reason":null}]}`},
		{`{"id":"cmpl-9","object":"text_completion","created":9,"model":"m","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length","stop_reason":null}]}`,
			`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length","stop_reason":null}]}`},
		{`{"id":"cmpl-9","object":"text_completion","created":9,"model":"m","choices":[],"usage":{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1}}`,
			`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[],"usage":{"prompt_tokens":3,"total_tokens":6,"completion_tokens":3}}`},
	} {
		got, drop := c.reshape(nil, []byte(tc.in))
		if drop || string(got) != tc.want {
			t.Errorf("reshape(%s)\n got %s (drop %v)\nwant %s", tc.in, got, drop, tc.want)
		}
	}
	if !reflect.DeepEqual(c.gen, []int32{32000, 32001, 32002}) {
		t.Errorf("gen %v", c.gen)
	}
	c.usage = false
	if _, drop := c.reshape(nil, []byte(`{"choices":[],"usage":{"completion_tokens":1}}`)); !drop {
		t.Error("the usage chunk went to a client that did not ask for it")
	}
	c.kind = migrateCompletion
	c.created, c.model, c.id = []byte(`8`), []byte(`"m"`), []byte(`"cmpl-1"`)
	got, _ := c.reshape(nil, []byte(`{"id":"cmpl-9","object":"text_completion","created":9,"model":"m","choices":[{"index":0,"text":"tok3 ","logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":[32003]}]}`))
	if want := `{"id":"cmpl-1","object":"text_completion","created":8,"model":"m","choices":[{"index":0,"text":"tok3 ","logprobs":null,"finish_reason":null,"stop_reason":null}]}`; string(got) != want {
		t.Errorf("completions:\n got %s\nwant %s", got, want)
	}
}

// TestCarryRequest: the continuation's body: one token prompt, the
// remaining budget, the sampling parameters and nothing of the chat.
func TestCarryRequest(t *testing.T) {
	c := testCarry(migrateChat, `{"model":"alias","messages":[{"role":"user","content":"hi"}],"temperature":0.5,"seed":7,"stop_token_ids":[2],"min_tokens":5,"max_tokens":10,"tools":null,"stream":true}`)
	c.prompt, c.gen = []int32{1, 2}, []int32{32000, 32001, 32002}
	body, done := c.request("served", 10)
	if done {
		t.Fatal("done with 7 tokens left")
	}
	var got map[string]any
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	want := map[string]any{"model": "served", "prompt": []any{1.0, 2.0, 32000.0, 32001.0, 32002.0}, "stream": true,
		"stream_options": map[string]any{"include_usage": true}, "return_token_ids": true, "max_tokens": 7.0, "min_tokens": 2.0,
		"temperature": 0.5, "seed": 7.0, "stop_token_ids": []any{2.0}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("body %s", body)
	}
	if _, done := c.request("served", 3); !done {
		t.Error("a budget already spent still asks for tokens")
	}
	// No max_tokens: a chat answer runs to the context's end (null on
	// /v1/completions, whose default is 16); a completions answer has
	// vLLM's 16.
	body, _ = c.request("served", 0)
	if !strings.Contains(string(body), `"max_tokens":null`) {
		t.Errorf("chat without max_tokens: %s", body)
	}
	c.kind = migrateCompletion
	body, _ = c.request("served", 0)
	if !strings.Contains(string(body), `"max_tokens":13`) {
		t.Errorf("completions without max_tokens, 3 generated: %s", body)
	}
}

// TestCarryKeptTextHasNoHole: the text kept for a crossing to a fallback
// model is let go of, for good, once a continuation's chunk would take it
// past migration.max_tokens x 16 bytes: a later, shorter chunk is not
// appended after the one that was skipped.
func TestCarryKeptTextHasNoHole(t *testing.T) {
	c := testCarry(migrateChat, `{}`)
	c.cfg.MaxTokens = 1 // 16 bytes of text
	c.keepText = true
	c.id, c.created, c.model = []byte(`"chatcmpl-1"`), []byte(`7`), []byte(`"m"`)
	chunk := func(text string) string {
		return `{"id":"cmpl-9","object":"text_completion","created":9,"model":"m","choices":[{"index":0,"text":"` + text + `","logprobs":null,"finish_reason":null,"token_ids":[32002]}]}`
	}
	for _, text := range []string{"0123456789", "abcdefghij", "xy"} {
		c.reshape(nil, []byte(chunk(text)))
	}
	if c.keepText || c.text != nil {
		t.Errorf("kept text %q (keepText %v), want none: %q was skipped", c.text, c.keepText, "abcdefghij")
	}
}
