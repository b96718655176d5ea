package oai

import (
	"errors"
	"math"
	"reflect"
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
		op           Operation
		body         string
		param, error string
	}{
		{"empty body", OpChat, "", "", "request body is empty"},
		{"white space body", OpChat, " \r\n\t", "", "request body is empty"},
		{"l15 malformed", OpChat, l15Malformed, "", "invalid json: invalid character 'x' looking for beginning of object key string"},
		{"truncated", OpChat, `{"model":"m"`, "", "invalid json: unexpected end of JSON input"},
		{"trailing data", OpChat, `{"model":"m",` + chatMsgs + `} {}`, "", "invalid json: invalid character '{' after top-level value"},
		{"trailing comma", OpChat, `{"model":"m",` + chatMsgs + `,}`, "", "invalid json: invalid character '}' looking for beginning of object key string"},
		{"single quotes", OpChat, `{'model':'m'}`, "", "invalid json: invalid character '\\'' looking for beginning of object key string"},
		{"form feed is not json space", OpChat, "\f{}", "", "invalid json: invalid character '\\f' looking for beginning of value"},
		{"invalid json that is not an object", OpChat, `[1,]`, "", "invalid json: invalid character ']' looking for beginning of value"},
		{"array body", OpChat, `[{"model":"m"}]`, "", "request body must be a json object"},
		{"string body", OpChat, `"hi"`, "", "request body must be a json object"},
		{"null body", OpChat, `null`, "", "request body must be a json object"},
		{"number body", OpCompletion, ` 42 `, "", "request body must be a json object"},
		{"l15 no model", OpChat, l15NoModel, "model", "model is required"},
		{"model null", OpChat, `{"model":null,` + chatMsgs + `}`, "model", "model is required"},
		{"model empty", OpChat, `{"model":"",` + chatMsgs + `}`, "model", "model must not be empty"},
		{"model number", OpChat, `{"model":7,` + chatMsgs + `}`, "model", "model must be a string"},
		{"model array", OpEmbeddings, `{"model":["m"],"input":"x"}`, "model", "model must be a string"},
		{"model key is case sensitive", OpChat, `{"Model":"m",` + chatMsgs + `}`, "model", "model is required"},
		{"model checked before messages", OpChat, `{"stream":1}`, "model", "model is required"},
		{"stream string", OpChat, `{"model":"m",` + chatMsgs + `,"stream":"true"}`, "stream", "stream must be a boolean"},
		{"stream number", OpCompletion, `{"model":"m","prompt":"p","stream":1}`, "stream", "stream must be a boolean"},
		{"stream_options string", OpChat, `{"model":"m",` + chatMsgs + `,"stream":true,"stream_options":"x"}`, "stream_options", "stream_options must be an object"},
		{"stream_options array", OpChat, `{"model":"m",` + chatMsgs + `,"stream_options":[]}`, "stream_options", "stream_options must be an object"},
		{"include_usage string", OpChat, `{"model":"m",` + chatMsgs + `,"stream_options":{"include_usage":"yes"}}`, "stream_options.include_usage", "stream_options.include_usage must be a boolean"},
		{"max_tokens negative", OpChat, `{"model":"m",` + chatMsgs + `,"max_tokens":-1}`, "max_tokens", "max_tokens must be a non-negative integer"},
		{"max_tokens fraction", OpChat, `{"model":"m",` + chatMsgs + `,"max_tokens":1.5}`, "max_tokens", "max_tokens must be a non-negative integer"},
		{"max_tokens string", OpCompletion, `{"model":"m","prompt":"p","max_tokens":"10"}`, "max_tokens", "max_tokens must be a non-negative integer"},
		{"max_tokens bool", OpChat, `{"model":"m",` + chatMsgs + `,"max_tokens":true}`, "max_tokens", "max_tokens must be a non-negative integer"},
		{"max_tokens -infinity", OpChat, `{"model":"m",` + chatMsgs + `,"max_tokens":-1e400}`, "max_tokens", "max_tokens must be a non-negative integer"},
		{"max_tokens negative fraction", OpChat, `{"model":"m",` + chatMsgs + `,"max_tokens":-0.5}`, "max_tokens", "max_tokens must be a non-negative integer"},
		{"max_completion_tokens negative", OpChat, `{"model":"m",` + chatMsgs + `,"max_completion_tokens":-5}`, "max_completion_tokens", "max_completion_tokens must be a non-negative integer"},
		{"messages missing", OpChat, `{"model":"m"}`, "messages", "messages is required"},
		{"messages null", OpChat, `{"model":"m","messages":null}`, "messages", "messages is required"},
		{"messages empty", OpChat, `{"model":"m","messages":[ ]}`, "messages", "messages must be a non-empty array"},
		{"messages string", OpChat, `{"model":"m","messages":"hi"}`, "messages", "messages must be a non-empty array"},
		{"messages object", OpChat, `{"model":"m","messages":{"role":"user"}}`, "messages", "messages must be a non-empty array"},
		{"prompt missing", OpCompletion, `{"model":"m","messages":[{"content":"hi"}]}`, "prompt", "prompt is required"},
		{"prompt null", OpCompletion, `{"model":"m","prompt":null}`, "prompt", "prompt is required"},
		{"input missing", OpEmbeddings, `{"model":"m","prompt":"x"}`, "input", "input is required"},
		{"user number", OpChat, `{"model":"m",` + chatMsgs + `,"user":42}`, "user", "user must be a string"},
		{"user checked for embeddings", OpEmbeddings, `{"model":"m","input":"x","user":{}}`, "user", "user must be a string"},
		{"unsupported operation", Operation(0), l15Valid, "", "unsupported operation"},
		{"unsupported operation 4", Operation(4), l15Valid, "", "unsupported operation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRequest(tt.op, []byte(tt.body))
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
		op   Operation
		body string
		want Request
	}{
		{"l15 valid", OpChat, l15Valid, Request{Model: "m", Stream: true, PromptBytes: 2}},
		{"chat with every routing field", OpChat, `{
			"model": "meta-llama/Llama-3.1-8B-Instruct",
			"messages": [
				{"role": "system", "content": "be brief"},
				{"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "image_url", "image_url": {"url": "data:x"}}]},
				{"role": "assistant", "content": null, "tool_calls": [{"id": "c"}]}
			],
			"stream": true, "stream_options": {"include_usage": true},
			"max_tokens": 100, "temperature": 0.2, "user": "session-7"
		}`, Request{Model: "meta-llama/Llama-3.1-8B-Instruct", Stream: true, IncludeUsage: true, HasStreamOptions: true, User: "session-7", MaxTokens: 100, PromptBytes: 13}},
		{"stream false", OpChat, `{"model":"m",` + chatMsgs + `,"stream":false,"stream_options":{"include_usage":false}}`, Request{Model: "m", HasStreamOptions: true, PromptBytes: 2}},
		{"nulls are absent", OpChat, `{"model":"m",` + chatMsgs + `,"stream":null,"stream_options":null,"max_tokens":null,"user":null}`, Request{Model: "m", PromptBytes: 2}},
		{"include_usage null", OpChat, `{"model":"m",` + chatMsgs + `,"stream_options":{"include_usage":null,"x":[1]}}`, Request{Model: "m", HasStreamOptions: true, PromptBytes: 2}},
		{"max_completion_tokens wins", OpChat, `{"model":"m",` + chatMsgs + `,"max_tokens":10,"max_completion_tokens":20}`, Request{Model: "m", MaxTokens: 20, PromptBytes: 2}},
		{"zero max_completion_tokens falls back", OpChat, `{"model":"m",` + chatMsgs + `,"max_tokens":10,"max_completion_tokens":0}`, Request{Model: "m", MaxTokens: 10, PromptBytes: 2}},
		{"max_tokens zero fraction", OpChat, `{"model":"m",` + chatMsgs + `,"max_tokens":100.0}`, Request{Model: "m", MaxTokens: 100, PromptBytes: 2}},
		{"max_tokens exponent", OpChat, `{"model":"m",` + chatMsgs + `,"max_tokens":1e3}`, Request{Model: "m", MaxTokens: 1000, PromptBytes: 2}},
		{"max_tokens negative zero", OpChat, `{"model":"m",` + chatMsgs + `,"max_tokens":-0}`, Request{Model: "m", PromptBytes: 2}},
		{"max_tokens saturates", OpChat, `{"model":"m",` + chatMsgs + `,"max_tokens":99999999999999999999}`, Request{Model: "m", MaxTokens: math.MaxInt64, PromptBytes: 2}},
		{"max_tokens max int64", OpChat, `{"model":"m",` + chatMsgs + `,"max_tokens":9223372036854775807}`, Request{Model: "m", MaxTokens: math.MaxInt64, PromptBytes: 2}},
		{"last duplicate wins", OpChat, `{"model":"a","model":"b",` + chatMsgs + `,"stream":true,"stream":false}`, Request{Model: "b", PromptBytes: 2}},
		{"case variant keys ignored", OpChat, `{"model":"a","Model":"b","MODEL":"c",` + chatMsgs + `,"Stream":"x"}`, Request{Model: "a", PromptBytes: 2}},
		{"escaped key", OpChat, `{"mod\u0065l":"a",` + chatMsgs + `}`, Request{Model: "a", PromptBytes: 2}},
		{"escaped model", OpChat, `{"model":"caf\u00e9\/v1",` + chatMsgs + `}`, Request{Model: "caf\u00e9/v1", PromptBytes: 2}},
		{"utf8 model", OpChat, `{"model":"模型",` + chatMsgs + `}`, Request{Model: "模型", PromptBytes: 2}},
		{"duplicate content counts last", OpChat, `{"model":"m","messages":[{"content":"long text","content":"hi"},{"content":[{"text":"abc","text":"z"}]}]}`, Request{Model: "m", PromptBytes: 3}},
		{"odd messages elements counted as zero", OpChat, `{"model":"m","messages":[1,"x",{"content":5},{"content":[1,{"text":2}]}]}`, Request{Model: "m"}},
		{"completion string prompt", OpCompletion, `{"model":"m","prompt":"Once upon","stream":true,"max_tokens":16}`, Request{Model: "m", Stream: true, MaxTokens: 16, PromptBytes: 9}},
		{"completion prompt array", OpCompletion, `{"model":"m","prompt":["ab","cd"]}`, Request{Model: "m", PromptBytes: 4}},
		{"completion token ids", OpCompletion, `{"model":"m","prompt":[1,2,3]}`, Request{Model: "m", PromptBytes: 12}},
		{"completion token id batches", OpCompletion, `{"model":"m","prompt":[[1,2],[3]]}`, Request{Model: "m", PromptBytes: 12}},
		{"completion empty prompt", OpCompletion, `{"model":"m","prompt":""}`, Request{Model: "m"}},
		{"completion ignores messages", OpCompletion, `{"model":"m","prompt":"p","messages":"x"}`, Request{Model: "m", PromptBytes: 1}},
		{"embeddings", OpEmbeddings, `{"model":"e","input":"hello","user":"u"}`, Request{Model: "e", User: "u", PromptBytes: 5}},
		{"embeddings ignore generation fields", OpEmbeddings, `{"model":"e","input":["a","bc"],"stream":"x","stream_options":1,"max_tokens":-1}`, Request{Model: "e", PromptBytes: 3}},
		{"embeddings token ids", OpEmbeddings, `{"model":"e","input":[[1,2]]}`, Request{Model: "e", PromptBytes: 8}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRequest(tt.op, []byte(tt.body))
			if err != nil {
				t.Fatalf("ParseRequest() error = %v", err)
			}
			if got.HasStreamOptions {
				// The offset is checked against the reference below, and
				// by TestStreamOptionsEnd.
				tt.want.StreamOptionsEnd, tt.want.StreamOptionsEmpty = got.StreamOptionsEnd, got.StreamOptionsEmpty
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseRequest() = %+v\nwant %+v", got, tt.want)
			}
			ref, err := refParseRequest(tt.op, []byte(tt.body))
			if err != nil || !reflect.DeepEqual(ref, got) {
				t.Errorf("reference = %+v, %v", ref, err)
			}
		})
	}
}

func TestOperationString(t *testing.T) {
	for op, want := range map[Operation]string{
		OpChat: "chat", OpCompletion: "text_completion", OpEmbeddings: "embeddings",
		0: "Operation(0)", 9: "Operation(9)",
	} {
		if got := op.String(); got != want {
			t.Errorf("Operation(%d).String() = %q, want %q", uint8(op), got, want)
		}
	}
}

func TestParseRequestAllocs(t *testing.T) {
	body := []byte(chatBody)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := ParseRequest(OpChat, body); err != nil {
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
		r, err := ParseRequest(OpChat, []byte(body))
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
		r, err := ParseRequest(OpChat, []byte(tc.body))
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
	r, _ := ParseRequest(OpChat, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream_options":null}`))
	if r.HasStreamOptions || r.StreamOptionsEnd != 0 {
		t.Errorf("null stream_options: %+v", r)
	}
}
