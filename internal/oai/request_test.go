package oai

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

// L15 bodies.
const (
	l15Malformed = `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true, x}`
	l15Valid     = `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`
	l15NoModel   = `{"messages":[{"role":"user","content":"hi"}],"stream":true}`
)

const chatMsgs = `"messages":[{"role":"user","content":"hi"}]`

func TestParseRequestErrors(t *testing.T) {
	tests := []struct {
		name         string
		s            *Schema
		body         string
		param, error string
	}{
		{"empty body", SchemaChat, "", "", "request body is empty"},
		{"white space body", SchemaChat, " \r\n\t", "", "request body is empty"},
		{"l15 malformed", SchemaChat, l15Malformed, "", "invalid json: invalid character 'x' looking for beginning of object key string"},
		{"truncated", SchemaChat, `{"model":"m"`, "", "invalid json: unexpected end of JSON input"},
		{"trailing data", SchemaChat, `{"model":"m",` + chatMsgs + `} {}`, "", "invalid json: invalid character '{' after top-level value"},
		{"trailing comma", SchemaChat, `{"model":"m",` + chatMsgs + `,}`, "", "invalid json: invalid character '}' looking for beginning of object key string"},
		{"single quotes", SchemaChat, `{'model':'m'}`, "", "invalid json: invalid character '\\'' looking for beginning of object key string"},
		{"form feed is not json space", SchemaChat, "\f{}", "", "invalid json: invalid character '\\f' looking for beginning of value"},
		{"invalid json that is not an object", SchemaChat, `[1,]`, "", "invalid json: invalid character ']' looking for beginning of value"},
		{"array body", SchemaChat, `[{"model":"m"}]`, "", "request body must be a json object"},
		{"string body", SchemaChat, `"hi"`, "", "request body must be a json object"},
		{"null body", SchemaChat, `null`, "", "request body must be a json object"},
		{"number body", SchemaCompletion, ` 42 `, "", "request body must be a json object"},
		{"l15 no model", SchemaChat, l15NoModel, "model", "model is required"},
		{"model null", SchemaChat, `{"model":null,` + chatMsgs + `}`, "model", "model is required"},
		{"model empty", SchemaChat, `{"model":"",` + chatMsgs + `}`, "model", "model must not be empty"},
		{"model number", SchemaChat, `{"model":7,` + chatMsgs + `}`, "model", "model must be a string"},
		{"model array", SchemaEmbeddings, `{"model":["m"],"input":"x"}`, "model", "model must be a string"},
		{"model key is case sensitive", SchemaChat, `{"Model":"m",` + chatMsgs + `}`, "model", "model is required"},
		{"model checked before messages", SchemaChat, `{"stream":1}`, "model", "model is required"},
		{"stream string", SchemaChat, `{"model":"m",` + chatMsgs + `,"stream":"true"}`, "stream", "stream must be a boolean"},
		{"stream number", SchemaCompletion, `{"model":"m","prompt":"p","stream":1}`, "stream", "stream must be a boolean"},
		{"stream_options string", SchemaChat, `{"model":"m",` + chatMsgs + `,"stream":true,"stream_options":"x"}`, "stream_options", "stream_options must be an object"},
		{"stream_options array", SchemaChat, `{"model":"m",` + chatMsgs + `,"stream_options":[]}`, "stream_options", "stream_options must be an object"},
		{"include_usage string", SchemaChat, `{"model":"m",` + chatMsgs + `,"stream_options":{"include_usage":"yes"}}`, "stream_options.include_usage", "stream_options.include_usage must be a boolean"},
		{"max_tokens negative", SchemaChat, `{"model":"m",` + chatMsgs + `,"max_tokens":-1}`, "max_tokens", "max_tokens must be a non-negative integer"},
		{"max_tokens fraction", SchemaChat, `{"model":"m",` + chatMsgs + `,"max_tokens":1.5}`, "max_tokens", "max_tokens must be a non-negative integer"},
		{"max_tokens string", SchemaCompletion, `{"model":"m","prompt":"p","max_tokens":"10"}`, "max_tokens", "max_tokens must be a non-negative integer"},
		{"max_tokens bool", SchemaChat, `{"model":"m",` + chatMsgs + `,"max_tokens":true}`, "max_tokens", "max_tokens must be a non-negative integer"},
		{"max_tokens -infinity", SchemaChat, `{"model":"m",` + chatMsgs + `,"max_tokens":-1e400}`, "max_tokens", "max_tokens must be a non-negative integer"},
		{"max_tokens negative fraction", SchemaChat, `{"model":"m",` + chatMsgs + `,"max_tokens":-0.5}`, "max_tokens", "max_tokens must be a non-negative integer"},
		{"max_completion_tokens negative", SchemaChat, `{"model":"m",` + chatMsgs + `,"max_completion_tokens":-5}`, "max_completion_tokens", "max_completion_tokens must be a non-negative integer"},
		{"messages missing", SchemaChat, `{"model":"m"}`, "messages", "messages is required"},
		{"messages null", SchemaChat, `{"model":"m","messages":null}`, "messages", "messages is required"},
		{"messages empty", SchemaChat, `{"model":"m","messages":[ ]}`, "messages", "messages must be a non-empty array"},
		{"messages string", SchemaChat, `{"model":"m","messages":"hi"}`, "messages", "messages must be a non-empty array"},
		{"messages object", SchemaChat, `{"model":"m","messages":{"role":"user"}}`, "messages", "messages must be a non-empty array"},
		{"prompt missing", SchemaCompletion, `{"model":"m","messages":[{"content":"hi"}]}`, "prompt", "prompt is required"},
		{"prompt null", SchemaCompletion, `{"model":"m","prompt":null}`, "prompt", "prompt is required"},
		{"input missing", SchemaEmbeddings, `{"model":"m","prompt":"x"}`, "input", "input is required"},
		{"user number", SchemaChat, `{"model":"m",` + chatMsgs + `,"user":42}`, "user", "user must be a string"},
		{"user checked for embeddings", SchemaEmbeddings, `{"model":"m","input":"x","user":{}}`, "user", "user must be a string"},
		{"unsupported operation", nil, l15Valid, "", "unsupported operation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRequest(tt.s, []byte(tt.body))
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("ParseRequest() = %+v, %v; want *RequestError", r, err)
			}
			if re.Param != tt.param || re.Message != tt.error {
				t.Errorf("error = {Param:%q Message:%q}, want {Param:%q Message:%q}", re.Param, re.Message, tt.param, tt.error)
			}
			if re.Error() != tt.error {
				t.Errorf("Error() = %q, want %q", re.Error(), tt.error)
			}
			if !reflect.DeepEqual(r, Request{}) {
				t.Errorf("request = %+v, want zero on error", r)
			}
		})
	}
}

func TestParseRequest(t *testing.T) {
	tests := []struct {
		name string
		s    *Schema
		body string
		want Request
	}{
		{"l15 valid", SchemaChat, l15Valid, Request{Model: "m", Stream: true, PromptBytes: 2}},
		{"chat with every routing field", SchemaChat, `{
			"model": "meta-llama/Llama-3.1-8B-Instruct",
			"messages": [
				{"role": "system", "content": "be brief"},
				{"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "image_url", "image_url": {"url": "data:x"}}]},
				{"role": "assistant", "content": null, "tool_calls": [{"id": "c"}]}
			],
			"stream": true, "stream_options": {"include_usage": true},
			"max_tokens": 100, "temperature": 0.2, "user": "session-7"
		}`, Request{Model: "meta-llama/Llama-3.1-8B-Instruct", Stream: true, IncludeUsage: true, HasStreamOptions: true, User: "session-7", MaxTokens: 100, PromptBytes: 13}},
		{"stream false", SchemaChat, `{"model":"m",` + chatMsgs + `,"stream":false,"stream_options":{"include_usage":false}}`, Request{Model: "m", HasStreamOptions: true, PromptBytes: 2}},
		{"nulls are absent", SchemaChat, `{"model":"m",` + chatMsgs + `,"stream":null,"stream_options":null,"max_tokens":null,"user":null}`, Request{Model: "m", PromptBytes: 2}},
		{"include_usage null", SchemaChat, `{"model":"m",` + chatMsgs + `,"stream_options":{"include_usage":null,"x":[1]}}`, Request{Model: "m", HasStreamOptions: true, PromptBytes: 2}},
		{"max_completion_tokens wins", SchemaChat, `{"model":"m",` + chatMsgs + `,"max_tokens":10,"max_completion_tokens":20}`, Request{Model: "m", MaxTokens: 20, PromptBytes: 2}},
		{"zero max_completion_tokens falls back", SchemaChat, `{"model":"m",` + chatMsgs + `,"max_tokens":10,"max_completion_tokens":0}`, Request{Model: "m", MaxTokens: 10, PromptBytes: 2}},
		{"max_tokens zero fraction", SchemaChat, `{"model":"m",` + chatMsgs + `,"max_tokens":100.0}`, Request{Model: "m", MaxTokens: 100, PromptBytes: 2}},
		{"max_tokens exponent", SchemaChat, `{"model":"m",` + chatMsgs + `,"max_tokens":1e3}`, Request{Model: "m", MaxTokens: 1000, PromptBytes: 2}},
		{"max_tokens negative zero", SchemaChat, `{"model":"m",` + chatMsgs + `,"max_tokens":-0}`, Request{Model: "m", PromptBytes: 2}},
		{"max_tokens saturates", SchemaChat, `{"model":"m",` + chatMsgs + `,"max_tokens":99999999999999999999}`, Request{Model: "m", MaxTokens: math.MaxInt64, PromptBytes: 2}},
		{"max_tokens max int64", SchemaChat, `{"model":"m",` + chatMsgs + `,"max_tokens":9223372036854775807}`, Request{Model: "m", MaxTokens: math.MaxInt64, PromptBytes: 2}},
		{"last duplicate wins", SchemaChat, `{"model":"a","model":"b",` + chatMsgs + `,"stream":true,"stream":false}`, Request{Model: "b", PromptBytes: 2}},
		{"case variant keys ignored", SchemaChat, `{"model":"a","Model":"b","MODEL":"c",` + chatMsgs + `,"Stream":"x"}`, Request{Model: "a", PromptBytes: 2}},
		{"escaped key", SchemaChat, `{"mod\u0065l":"a",` + chatMsgs + `}`, Request{Model: "a", PromptBytes: 2}},
		{"escaped model", SchemaChat, `{"model":"caf\u00e9\/v1",` + chatMsgs + `}`, Request{Model: "caf\u00e9/v1", PromptBytes: 2}},
		{"utf8 model", SchemaChat, `{"model":"模型",` + chatMsgs + `}`, Request{Model: "模型", PromptBytes: 2}},
		{"duplicate content counts last", SchemaChat, `{"model":"m","messages":[{"content":"long text","content":"hi"},{"content":[{"text":"abc","text":"z"}]}]}`, Request{Model: "m", PromptBytes: 3}},
		{"odd messages elements counted as zero", SchemaChat, `{"model":"m","messages":[1,"x",{"content":5},{"content":[1,{"text":2}]}]}`, Request{Model: "m"}},
		{"completion string prompt", SchemaCompletion, `{"model":"m","prompt":"Once upon","stream":true,"max_tokens":16}`, Request{Model: "m", Stream: true, MaxTokens: 16, PromptBytes: 9}},
		{"completion prompt array", SchemaCompletion, `{"model":"m","prompt":["ab","cd"]}`, Request{Model: "m", PromptBytes: 4, PromptBatch: true}},
		{"completion token ids", SchemaCompletion, `{"model":"m","prompt":[1,2,3]}`, Request{Model: "m", PromptBytes: 12}},
		{"completion token id batches", SchemaCompletion, `{"model":"m","prompt":[[1,2],[3]]}`, Request{Model: "m", PromptBytes: 12, PromptBatch: true}},
		{"completion echo with logprobs", SchemaCompletion, `{"model":"m","prompt":"p","echo":true,"logprobs":0}`, Request{Model: "m", PromptBytes: 1, EchoLogprobs: true}},
		{"completion echo without logprobs", SchemaCompletion, `{"model":"m","prompt":"p","echo":true,"logprobs":null}`, Request{Model: "m", PromptBytes: 1}},
		{"completion empty prompt", SchemaCompletion, `{"model":"m","prompt":""}`, Request{Model: "m"}},
		{"completion ignores messages", SchemaCompletion, `{"model":"m","prompt":"p","messages":"x"}`, Request{Model: "m", PromptBytes: 1}},
		{"embeddings", SchemaEmbeddings, `{"model":"e","input":"hello","user":"u"}`, Request{Model: "e", User: "u", PromptBytes: 5}},
		{"embeddings ignore generation fields", SchemaEmbeddings, `{"model":"e","input":["a","bc"],"stream":"x","stream_options":1,"max_tokens":-1}`, Request{Model: "e", PromptBytes: 3}},
		{"embeddings token ids", SchemaEmbeddings, `{"model":"e","input":[[1,2]]}`, Request{Model: "e", PromptBytes: 8}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRequest(tt.s, []byte(tt.body))
			if err != nil {
				t.Fatalf("ParseRequest() error = %v", err)
			}
			if got.HasStreamOptions {
				// The offset is checked against the reference below, and
				// by TestStreamOptionsEnd.
				tt.want.StreamOptionsEnd, tt.want.StreamOptionsEmpty = got.StreamOptionsEnd, got.StreamOptionsEmpty
			}
			// Every body here has a model: its span is checked against
			// the reference below, and by TestModelSpan.
			if span := tt.body[got.ModelStart:got.ModelEnd]; len(span) < 2 || span[0] != '"' || unescape([]byte(span)) != got.Model {
				t.Errorf("model span [%d:%d] = %q, want the model string", got.ModelStart, got.ModelEnd, span)
			}
			tt.want.ModelStart, tt.want.ModelEnd = got.ModelStart, got.ModelEnd
			// The stream value's span: checked against the reference
			// below and by TestStreamSpanAndStreamable.
			tt.want.StreamStart, tt.want.StreamEnd = got.StreamStart, got.StreamEnd
			tt.want.Streamable = tt.s.Generative        // none of these set prompt_logprobs or kv_transfer_params
			tt.want.Sampling = got.Sampling             // checked against the reference below
			tt.want.MaxTokensParam = got.MaxTokensParam // checked against the reference below and by TestMaxTokens
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseRequest() = %+v\nwant %+v", got, tt.want)
			}
			ref, err := refParseRequest(tt.s, []byte(tt.body))
			if err != nil || !reflect.DeepEqual(ref, got) {
				t.Errorf("reference = %+v, %v", ref, err)
			}
		})
	}
}

func TestParseRequestAllocs(t *testing.T) {
	body := []byte(chatBody)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := ParseRequest(SchemaChat, body); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 2 { // the Model and User strings
		t.Errorf("ParseRequest allocations = %v, want <= 2", allocs)
	}
}

// TestContinuousUsage: vLLM's continuous_usage_stats is read (true only).
func TestContinuousUsage(t *testing.T) {
	for body, want := range map[string]bool{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream_options":{"continuous_usage_stats":true}}`:                               true,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream_options":{"continuous_usage_stats":false,"include_usage":true}}`:         false,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream_options":{"continuous_usage_stats":"yes"}}`:                              false,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream_options":{"continuous_usage_stats":true,"continuous_usage_stats":null}}`: false,
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`:                                                                                false,
	} {
		r, err := ParseRequest(SchemaChat, []byte(body))
		if err != nil || r.ContinuousUsage != want {
			t.Errorf("%s: ContinuousUsage %v (%v), want %v", body, r.ContinuousUsage, err, want)
		}
	}
}

// TestStreamOptionsEnd: the offset of stream_options' closing brace, so the
// gateway can add include_usage to it without re-encoding the body.
func TestStreamOptionsEnd(t *testing.T) {
	for _, tc := range []struct {
		body  string
		empty bool
	}{
		{`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":false}}`, false},
		{`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream_options":{ },"stream":true}`, true},
		{`{"model":"m","stream_options":{"x":{"y":"}"}},"messages":[{"role":"user","content":"hi"}]}`, false},
		{`{"model":"m","stream_options":{},"messages":[{"role":"user","content":"hi"}],"stream_options":{"a":1}}`, false},
		{`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream_o\u0070tions":{}}`, true},
	} {
		r, err := ParseRequest(SchemaChat, []byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		if !r.HasStreamOptions || tc.body[r.StreamOptionsEnd] != '}' || r.StreamOptionsEmpty != tc.empty {
			t.Errorf("%s: end %d (%q), empty %v; want a '}' and empty %v", tc.body, r.StreamOptionsEnd, tc.body[r.StreamOptionsEnd:], r.StreamOptionsEmpty, tc.empty)
		}
		if want := refStreamOptionsEnd([]byte(tc.body)); r.StreamOptionsEnd != want {
			t.Errorf("%s: end %d, encoding/json says %d", tc.body, r.StreamOptionsEnd, want)
		}
	}
	r, _ := ParseRequest(SchemaChat, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream_options":null}`))
	if r.HasStreamOptions || r.StreamOptionsEnd != 0 {
		t.Errorf("null stream_options: %+v", r)
	}
}

// TestParseRequestSchemas: the routes' schemas beyond the first three, and
// literals that combine the fields as no route does.
func TestParseRequestSchemas(t *testing.T) {
	tests := []struct {
		name string
		s    *Schema
		body string
		want Request
	}{
		{"responses string input", SchemaResponses, `{"model":"m","input":"Tell me a story","instructions":"Be brief.","stream":true,"max_output_tokens":50}`,
			Request{Model: "m", Stream: true, MaxTokens: 50, PromptBytes: 15 + 9}},
		{"responses items", SchemaResponses, responsesBody,
			Request{Model: "meta-llama/Llama-3.1-8B-Instruct", Stream: true, MaxTokens: 512, User: "session-42",
				PromptBytes: len("You are the support assistant for Switchboard. Answer concisely.") + len("What does the gateway do when an engine dies mid-stream?")}},
		{"responses without input", SchemaResponses, `{"model":"m","previous_response_id":"resp_1"}`, Request{Model: "m"}},
		{"responses stream_options", SchemaResponses, `{"model":"m","input":"x","stream_options":{"include_usage":true}}`, Request{Model: "m", IncludeUsage: true, HasStreamOptions: true, PromptBytes: 1}},
		{"messages", SchemaMessages, messagesBody,
			Request{Model: "claude-like", Stream: true, MaxTokens: 1024, User: "session-42",
				PromptBytes: len("You are the support assistant for Switchboard. Answer concisely.") + len("What does the gateway do when an engine dies mid-stream?") + len("Let me check.")}},
		{"messages string system", SchemaMessages, `{"model":"m","system":"Be terse.","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`,
			Request{Model: "m", MaxTokens: 5, PromptBytes: 9 + 2}},
		{"messages system after the messages, null system", SchemaMessages, `{"model":"m","messages":[{"role":"user","content":"hi"}],"system":null}`,
			Request{Model: "m", PromptBytes: 2}},
		{"count tokens", SchemaCountTokens, `{"model":"m","system":"s","messages":[{"role":"user","content":"hi"}],"stream":"not read","max_tokens":-1}`, Request{Model: "m"}},
		{"rerank", SchemaRerank, `{"model":"r","query":"q","documents":["a","b"],"top_n":1}`, Request{Model: "r"}},
		{"rerank without a model", SchemaRerank, `{"query":"q","documents":[]}`, Request{}},
		{"score text_1 text_2", SchemaScore, `{"model":"s","text_1":"a","text_2":["b","c"]}`, Request{Model: "s"}},
		{"score empty", SchemaScore, `{}`, Request{}},
		{"pooling", SchemaPooling, `{"model":"p","input":["ab",[1,2]]}`, Request{Model: "p", PromptBytes: 2 + 8}},
		{"classify null model", SchemaClassify, `{"model":null,"input":"text"}`, Request{PromptBytes: 4}},
		{"tokenize prompt", SchemaTokenize, `{"prompt":"hello"}`, Request{}},
		{"tokenize messages", SchemaTokenize, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, Request{Model: "m"}},
		{"detokenize", SchemaDetokenize, `{"tokens":[1,2,3]}`, Request{}},
		{"speech", SchemaSpeech, `{"model":"tts","input":"Say hi","voice":"alloy","stream_format":"sse"}`, Request{Model: "tts"}},
		{"images", SchemaImages, `{"prompt":"a cat","n":1,"stream":true}`, Request{}},
		{"optional model may be empty", SchemaImages, `{"model":"","prompt":"a cat"}`, Request{}},
		{"required prompt also in Require", &Schema{Prompt: "input", PromptKind: PromptText, PromptRequired: true, Require: []string{"input"}}, `{"input":"ab"}`, Request{PromptBytes: 2}},
		{"prompt that is the preamble too", &Schema{Prompt: "messages", PromptKind: PromptMessages, Preamble: "messages"}, `{"messages":[{"content":"abc"}]}`, Request{PromptBytes: 3}},
		{"preamble without a prompt", &Schema{Preamble: "system"}, `{"system":[{"type":"text","text":"abcd"}]}`, Request{PromptBytes: 4}},
		{"non-empty prompt that is optional", &Schema{Prompt: "messages", PromptKind: PromptMessages, PromptNonEmpty: true}, `{"messages":null}`, Request{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRequest(tt.s, []byte(tt.body))
			if err != nil {
				t.Fatalf("ParseRequest() error = %v", err)
			}
			tt.want.StreamOptionsEnd, tt.want.StreamOptionsEmpty = got.StreamOptionsEnd, got.StreamOptionsEmpty
			if got.ModelEnd > 0 {
				if span := tt.body[got.ModelStart:got.ModelEnd]; unescape([]byte(span)) != got.Model {
					t.Errorf("model span [%d:%d] = %q, want the model string", got.ModelStart, got.ModelEnd, span)
				}
			}
			tt.want.ModelStart, tt.want.ModelEnd = got.ModelStart, got.ModelEnd
			// The stream value's span: checked against the reference
			// below and by TestStreamSpanAndStreamable.
			tt.want.StreamStart, tt.want.StreamEnd = got.StreamStart, got.StreamEnd
			tt.want.Streamable = tt.s.Generative        // none of these set prompt_logprobs or kv_transfer_params
			tt.want.Sampling = got.Sampling             // checked against the reference below
			tt.want.MaxTokensParam = got.MaxTokensParam // checked against the reference below and by TestMaxTokens
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseRequest() = %+v\nwant %+v", got, tt.want)
			}
			ref, err := refParseRequest(tt.s, []byte(tt.body))
			if err != nil || !reflect.DeepEqual(ref, got) {
				t.Errorf("reference = %+v, %v", ref, err)
			}
		})
	}
}

func TestParseRequestSchemaErrors(t *testing.T) {
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	tests := []struct {
		name         string
		s            *Schema
		body         string
		param, error string
	}{
		{"responses model required", SchemaResponses, `{"input":"x"}`, "model", "model is required"},
		{"responses max_output_tokens", SchemaResponses, `{"model":"m","max_output_tokens":-1}`, "max_output_tokens", "max_output_tokens must be a non-negative integer"},
		{"responses max_output_tokens string", SchemaResponses, `{"model":"m","max_output_tokens":"9"}`, "max_output_tokens", "max_output_tokens must be a non-negative integer"},
		{"responses stream", SchemaResponses, `{"model":"m","stream":"yes"}`, "stream", "stream must be a boolean"},
		{"messages required", SchemaMessages, `{"model":"m","system":"s"}`, "messages", "messages is required"},
		{"messages empty", SchemaMessages, `{"model":"m","messages":[]}`, "messages", "messages must be a non-empty array"},
		{"messages model empty", SchemaMessages, `{"model":"",` + msgs + `}`, "model", "model must not be empty"},
		{"messages user_id number", SchemaMessages, `{"model":"m",` + msgs + `,"metadata":{"user_id":42}}`, "metadata.user_id", "metadata.user_id must be a string"},
		{"user_id checked when user is set", SchemaChat, `{"model":"m",` + msgs + `,"user":"u","metadata":{"user_id":{}}}`, "metadata.user_id", "metadata.user_id must be a string"},
		{"user checked before user_id", SchemaMessages, `{"model":"m",` + msgs + `,"user":1,"metadata":{"user_id":1}}`, "user", "user must be a string"},
		{"count tokens model", SchemaCountTokens, `{` + msgs + `}`, "model", "model is required"},
		{"count tokens messages", SchemaCountTokens, `{"model":"m","messages":null}`, "messages", "messages is required"},
		{"rerank query", SchemaRerank, `{"model":"r","documents":["a"]}`, "query", "query is required"},
		{"rerank documents null", SchemaRerank, `{"query":"q","documents":null}`, "documents", "documents is required"},
		{"rerank query before documents", SchemaRerank, `{}`, "query", "query is required"},
		{"rerank last duplicate wins", SchemaRerank, `{"query":"q","documents":["a"],"query":null}`, "query", "query is required"},
		{"rerank model must be a string", SchemaRerank, `{"model":1,"query":"q","documents":["a"]}`, "model", "model must be a string"},
		{"pooling input", SchemaPooling, `{"model":"p"}`, "input", "input is required"},
		{"classify input null", SchemaClassify, `{"input":null}`, "input", "input is required"},
		{"detokenize tokens", SchemaDetokenize, `{"model":"m"}`, "tokens", "tokens is required"},
		{"speech input", SchemaSpeech, `{"model":"tts","voice":"alloy"}`, "input", "input is required"},
		{"images prompt", SchemaImages, `{"n":1}`, "prompt", "prompt is required"},
		{"tokenize user", SchemaTokenize, `{"user":[]}`, "user", "user must be a string"},
		{"prompt checked before Require", &Schema{Prompt: "input", PromptRequired: true, Require: []string{"model"}}, `{}`, "input", "input is required"},
		{"many required, one past the tracked ones", &Schema{Require: manyRequired}, manyRequiredBody("prompt"), "prompt", "prompt is required"},
		{"many required, null past the tracked ones", &Schema{Require: manyRequired}, manyRequiredBody("") + `,"prompt":null}`, "prompt", "prompt is required"},
		{"nil schema", nil, `{}`, "", "unsupported operation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRequest(tt.s, []byte(tt.body))
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("ParseRequest() = %+v, %v; want *RequestError", r, err)
			}
			if re.Param != tt.param || re.Message != tt.error || re.Status != 0 || re.HTTPStatus() != 400 {
				t.Errorf("error = %+v, want {Param:%q Message:%q}, status 400", *re, tt.param, tt.error)
			}
			if !reflect.DeepEqual(r, Request{}) {
				t.Errorf("request = %+v, want zero on error", r)
			}
			if _, referr := refParseRequest(tt.s, []byte(tt.body)); !reflect.DeepEqual(referr, err) {
				t.Errorf("reference error = %v", referr)
			}
		})
	}
	// All of manyRequired present: no error.
	body := manyRequiredBody("") + `,"prompt":"p"}`
	if _, err := ParseRequest(&Schema{Require: manyRequired}, []byte(body)); err != nil {
		t.Errorf("all %d required fields present: %v", len(manyRequired), err)
	}
}

// manyRequiredBody is a body with every field of manyRequired but omit;
// with omit "" it lacks the closing brace, for a caller to add fields.
func manyRequiredBody(omit string) string {
	var b strings.Builder
	b.WriteString(`{"x":0`)
	for _, f := range manyRequired {
		if f != omit && f != "prompt" || f == omit && omit != "prompt" {
			b.WriteString(`,"` + f + `":"1"`)
		}
	}
	if omit == "" {
		return b.String()
	}
	return b.String() + `}`
}

// TestModelSpan: the offsets of the model value, quotes included, so that
// the gateway can swap a model alias in place.
func TestModelSpan(t *testing.T) {
	for _, tc := range []struct {
		s          *Schema
		body       string
		start, end int
	}{
		{SchemaChat, `{"model":"m",` + chatMsgs + `}`, 9, 12},
		{SchemaChat, `{ "model" : "llama" ,` + chatMsgs + `}`, 12, 19},
		{SchemaChat, `{` + chatMsgs + `,"model":"caf\u00e9"}`, 53, 64},
		{SchemaChat, `{"model":"a",` + chatMsgs + `,"model":"bb"}`, 65, 69},
		{SchemaChat, `{"mod\u0065l":"m",` + chatMsgs + `}`, 14, 17},
		{SchemaRerank, `{"query":"q","documents":[]}`, 0, 0},
		{SchemaRerank, `{"model":null,"query":"q","documents":[]}`, 0, 0},
		{SchemaRerank, `{"model":"","query":"q","documents":[]}`, 9, 11},
		{SchemaRerank, `{"model":"x","query":"q","documents":[],"model":null}`, 0, 0},
	} {
		r, err := ParseRequest(tc.s, []byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		if r.ModelStart != tc.start || r.ModelEnd != tc.end {
			t.Errorf("%s: span [%d:%d] (%q), want [%d:%d]", tc.body, r.ModelStart, r.ModelEnd, tc.body[r.ModelStart:r.ModelEnd], tc.start, tc.end)
		}
		if s, e := refMemberSpan([]byte(tc.body), "model"); tc.end > 0 && (s != tc.start || e != tc.end) {
			t.Errorf("%s: encoding/json says [%d:%d]", tc.body, s, e)
		}
	}
}

// TestUser: the top-level user, else Anthropic's metadata.user_id.
func TestUser(t *testing.T) {
	for _, tc := range []struct{ extra, want string }{
		{``, ""},
		{`,"user":"u"`, "u"},
		{`,"metadata":{"user_id":"a"}`, "a"},
		{`,"metadata":{"user_id":"a\u00e9"}`, "a\u00e9"},
		{`,"user":"u","metadata":{"user_id":"a"}`, "u"},
		{`,"user":"","metadata":{"user_id":"a"}`, "a"},
		{`,"user":null,"metadata":{"user_id":"a"}`, "a"},
		{`,"metadata":{"user_id":null}`, ""},
		{`,"metadata":{"user_id":"a","user_id":"b"}`, "b"},
		{`,"metadata":{"user_id":"a"},"metadata":{}`, ""},
		{`,"metadata":"not an object"`, ""},
		{`,"metadata":[{"user_id":"a"}]`, ""},
		{`,"metadata":{"other":1}`, ""},
	} {
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}]` + tc.extra + `}`
		for _, s := range []*Schema{SchemaChat, SchemaMessages} {
			r, err := ParseRequest(s, []byte(body))
			if err != nil || r.User != tc.want {
				t.Errorf("%s: user %q, %v; want %q", body, r.User, err, tc.want)
			}
		}
	}
}

// TestMaxTokens: max_completion_tokens, then max_tokens, then
// max_output_tokens; all are checked whichever wins; none is read for a
// schema that is not generative.
func TestMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		extra string
		want  int64
		param string
	}{
		{``, 0, ""},
		{`,"max_output_tokens":7`, 7, "max_output_tokens"},
		{`,"max_tokens":5,"max_output_tokens":7`, 5, "max_tokens"},
		{`,"max_tokens":0,"max_output_tokens":7`, 7, "max_output_tokens"},
		{`,"max_completion_tokens":3,"max_tokens":5,"max_output_tokens":7`, 3, "max_completion_tokens"},
		{`,"max_completion_tokens":0,"max_tokens":0,"max_output_tokens":0`, 0, ""},
		{`,"max_output_tokens":1e3`, 1000, "max_output_tokens"},
	} {
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}]` + tc.extra + `}`
		for _, s := range []*Schema{SchemaChat, SchemaMessages, SchemaResponses} {
			r, err := ParseRequest(s, []byte(body))
			if err != nil || r.MaxTokens != tc.want || r.MaxTokensParam != tc.param {
				t.Errorf("%s: max tokens %d (%q), %v; want %d (%q)", body, r.MaxTokens, r.MaxTokensParam, err, tc.want, tc.param)
			}
		}
		if r, err := ParseRequest(SchemaCountTokens, []byte(body)); err != nil || r.MaxTokens != 0 {
			t.Errorf("%s: count tokens: max tokens %d, %v; want 0", body, r.MaxTokens, err)
		}
	}
	if _, err := ParseRequest(SchemaChat, []byte(`{"model":"m","messages":[{"content":"hi"}],"max_completion_tokens":4,"max_output_tokens":-4}`)); err == nil {
		t.Error("negative max_output_tokens accepted when max_completion_tokens wins")
	}
}

// TestParseAllocsSchemas: the new schemas allocate what chat does: the
// model, the user and, with hashing on, the hashes.
func TestParseAllocsSchemas(t *testing.T) {
	p := Parser{BlockBytes: 64, MaxBlocks: 256}
	for _, tc := range []struct {
		name string
		s    *Schema
		body string
	}{
		{"messages", SchemaMessages, messagesBody},
		{"responses", SchemaResponses, responsesBody},
	} {
		body := []byte(tc.body)
		r, err := p.Parse(tc.s, body)
		if err != nil || len(r.PrefixHashes) == 0 || r.User == "" {
			t.Fatalf("%s: Parse() = %+v, %v", tc.name, r, err)
		}
		if a := testing.AllocsPerRun(100, func() { _, _ = p.Parse(tc.s, body) }); a > 3 {
			t.Errorf("%s: Parse allocations = %v, want <= 3", tc.name, a)
		}
		if a := testing.AllocsPerRun(100, func() { _, _ = ParseRequest(tc.s, body) }); a > 2 {
			t.Errorf("%s: ParseRequest allocations = %v, want <= 2", tc.name, a)
		}
	}
}

// TestStreamSpanAndStreamable checks the offsets of the stream value (the
// last one) and the requests that may not be turned into streams.
func TestStreamSpanAndStreamable(t *testing.T) {
	tests := []struct {
		body       string
		span       string // body[StreamStart:StreamEnd]; "" when absent
		streamable bool
	}{
		{`{"model":"m","prompt":"p"}`, "", true},
		{`{"model":"m","prompt":"p","stream":false}`, "false", true},
		{`{"model":"m","stream":true,"prompt":"p","stream" : null }`, "null", true},
		{`{"model":"m","prompt":"p","prompt_logprobs":1}`, "", false},
		{`{"model":"m","prompt":"p","prompt_logprobs":null,"kv_transfer_params":null}`, "", true},
		{`{"model":"m","prompt":"p","kv_transfer_params":{"do_remote_decode":true}}`, "", false},
	}
	for _, tt := range tests {
		r, err := ParseRequest(SchemaCompletion, []byte(tt.body))
		if err != nil {
			t.Fatalf("%s: %v", tt.body, err)
		}
		if got := tt.body[r.StreamStart:r.StreamEnd]; got != tt.span || r.Streamable != tt.streamable {
			t.Errorf("%s: stream span %q, streamable %v; want %q, %v", tt.body, got, r.Streamable, tt.span, tt.streamable)
		}
		if want := strings.Contains(tt.body, `"kv_transfer_params":{`); r.KVTransfer != want {
			t.Errorf("%s: KVTransfer %v, want %v", tt.body, r.KVTransfer, want)
		}
	}
}
