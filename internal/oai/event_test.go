package oai

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"
)

// Responses API stream events as vLLM emits them (abridged where the
// gateway reads nothing).
const (
	respCreated   = `{"response":{"id":"resp_8f2c","created_at":1735689600,"model":"m","object":"response","output":[],"status":"in_progress","usage":null},"sequence_number":0,"type":"response.created"}`
	respProgress  = `{"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_8f2c","status":"in_progress","usage":null}}`
	respItemAdded = `{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","role":"assistant","content":[],"status":"in_progress"}}`
	respTextDelta = `{"content_index":0,"delta":" token","item_id":"msg_1","output_index":0,"sequence_number":4,"type":"response.output_text.delta","logprobs":[]}`
	respCompleted = `{"type":"response.completed","sequence_number":9,"response":{"id":"resp_8f2c","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"Hi"}]}],` +
		`"usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":0},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":19}}}`
	respFailed = `{"type":"response.failed","sequence_number":5,"response":{"id":"resp_8f2c","status":"failed","error":{"code":"server_error","message":"engine died"},"usage":{"input_tokens":12,"output_tokens":3}}}`
	respError  = `{"type":"error","code":"ERR_SOMETHING","message":"Something went wrong","param":null,"sequence_number":1}`
)

func TestInspectResponsesEvent(t *testing.T) {
	id := []byte("resp_8f2c")
	tests := []struct {
		name string
		data string
		want Event
	}{
		{"created", respCreated, Event{Type: []byte("response.created"), ID: id, InputTokens: -1, OutputTokens: -1}},
		{"in progress", respProgress, Event{Type: []byte("response.in_progress"), ID: id, InputTokens: -1, OutputTokens: -1}},
		{"output item added", respItemAdded, Event{Type: []byte("response.output_item.added"), InputTokens: -1, OutputTokens: -1}},
		{"output text delta", respTextDelta, Event{Type: []byte("response.output_text.delta"), Content: true, InputTokens: -1, OutputTokens: -1}},
		{"empty delta", `{"type":"response.output_text.delta","delta":""}`, Event{Type: []byte("response.output_text.delta"), InputTokens: -1, OutputTokens: -1}},
		{"null delta", `{"type":"response.output_text.delta","delta":null}`, Event{Type: []byte("response.output_text.delta"), InputTokens: -1, OutputTokens: -1}},
		{"object delta", `{"type":"response.reasoning.delta","delta":{"content":"We"}}`, Event{Type: []byte("response.reasoning.delta"), InputTokens: -1, OutputTokens: -1}},
		{"reasoning text delta", `{"type":"response.reasoning_text.delta","delta":"Let me think"}`, Event{Type: []byte("response.reasoning_text.delta"), Content: true, InputTokens: -1, OutputTokens: -1}},
		{"reasoning summary delta", `{"type":"response.reasoning_summary_text.delta","delta":"x"}`, Event{Type: []byte("response.reasoning_summary_text.delta"), Content: true, InputTokens: -1, OutputTokens: -1}},
		{"refusal delta", `{"type":"response.refusal.delta","delta":"No"}`, Event{Type: []byte("response.refusal.delta"), Content: true, InputTokens: -1, OutputTokens: -1}},
		{"function call arguments delta", `{"type":"response.function_call_arguments.delta","item_id":"fc_1","delta":"{\"q\""}`, Event{Type: []byte("response.function_call_arguments.delta"), Content: true, InputTokens: -1, OutputTokens: -1}},
		{"audio delta", `{"type":"response.audio.delta","delta":"UklGRg=="}`, Event{Type: []byte("response.audio.delta"), Content: true, InputTokens: -1, OutputTokens: -1}},
		{"audio transcript delta", `{"type":"response.audio.transcript.delta","delta":"hi"}`, Event{Type: []byte("response.audio.transcript.delta"), Content: true, InputTokens: -1, OutputTokens: -1}},
		{"delta before type", `{"delta":"a","type":"response.output_text.delta"}`, Event{Type: []byte("response.output_text.delta"), Content: true, InputTokens: -1, OutputTokens: -1}},
		{"done is not a delta", `{"type":"response.output_text.done","text":"Hi","delta":"x"}`, Event{Type: []byte("response.output_text.done"), InputTokens: -1, OutputTokens: -1}},
		{"completed", respCompleted, Event{Type: []byte("response.completed"), Terminal: true, ID: id, InputTokens: 12, OutputTokens: 7}},
		{"incomplete", `{"type":"response.incomplete","response":{"id":"r","usage":{"input_tokens":5,"output_tokens":16}}}`, Event{Type: []byte("response.incomplete"), Terminal: true, ID: []byte("r"), InputTokens: 5, OutputTokens: 16}},
		{"cached tokens", `{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":32},"output_tokens":2}}}`,
			Event{Type: []byte("response.completed"), Terminal: true, ID: []byte("r"), InputTokens: 50, OutputTokens: 2, CachedTokens: 32}},
		{"failed", respFailed, Event{Type: []byte("response.failed"), Terminal: true, Error: true, ID: id, InputTokens: 12, OutputTokens: 3}},
		{"error event", respError, Event{Type: []byte("error"), Error: true, InputTokens: -1, OutputTokens: -1}},
		{"vllm error object", `{"error":{"message":"boom","type":"InternalServerError","code":500}}`, Event{Error: true, InputTokens: -1, OutputTokens: -1}},
		{"null error", `{"type":"response.created","error":null}`, Event{Type: []byte("response.created"), InputTokens: -1, OutputTokens: -1}},
		{"usage odd values", `{"type":"response.completed","response":{"usage":{"input_tokens":1.9,"output_tokens":"2"}}}`, Event{Type: []byte("response.completed"), Terminal: true, InputTokens: 1, OutputTokens: -1}},
		{"usage saturates, negative is none", `{"type":"response.completed","response":{"usage":{"input_tokens":1e30,"output_tokens":-3}}}`, Event{Type: []byte("response.completed"), Terminal: true, InputTokens: math.MaxInt64, OutputTokens: -1}},
		{"usage not an object", `{"response":{"usage":5,"id":7}}`, Event{InputTokens: -1, OutputTokens: -1}},
		{"response not an object", `{"type":"response.completed","response":"x"}`, Event{Type: []byte("response.completed"), Terminal: true, InputTokens: -1, OutputTokens: -1}},
		{"escaped type decoded", `{"type":"response.c\u006fmpleted","delta":"x"}`, Event{Type: []byte(`response.c\u006fmpleted`), Terminal: true, InputTokens: -1, OutputTokens: -1}},
		{"type not a string", `{"type":1,"delta":"x"}`, Event{InputTokens: -1, OutputTokens: -1}},
		{"empty type", `{"type":""}`, Event{Type: []byte{}, InputTokens: -1, OutputTokens: -1}},
		{"last duplicate wins", `{"type":"response.completed","type":"response.created","response":{"id":"a","id":"b"},"delta":"x","delta":""}`, Event{Type: []byte("response.created"), ID: []byte("b"), InputTokens: -1, OutputTokens: -1}},
		{"case variant keys ignored", `{"Type":"error","TYPE":"response.completed"}`, Event{InputTokens: -1, OutputTokens: -1}},
		{"empty object", ` {} `, Event{InputTokens: -1, OutputTokens: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := InspectResponsesEvent([]byte(tt.data))
			if err != nil {
				t.Fatalf("InspectResponsesEvent() error = %v", err)
			}
			if !eventEqual(got, absentCache(tt.want, tt.data)) {
				t.Errorf("InspectResponsesEvent() = %s\nwant %s", fmtEvent(got), fmtEvent(absentCache(tt.want, tt.data)))
			}
			if ref, ok := refInspectResponsesEvent([]byte(tt.data)); !ok || !eventEqual(ref, got) {
				t.Errorf("reference = %s, %v", fmtEvent(ref), ok)
			}
		})
	}
}

// Anthropic Messages API stream events.
const (
	antStart      = `{"type":"message_start","message":{"id":"msg_01XFD","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1}}}`
	antBlockStart = `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`
	antPing       = `{"type": "ping"}`
	antTextDelta  = `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`
	antBlockStop  = `{"type":"content_block_stop","index":0}`
	antMsgDelta   = `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}`
	antStop       = `{"type":"message_stop"}`
	antError      = `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`
)

func TestInspectAnthropicEvent(t *testing.T) {
	none := func(typ string) Event { return Event{Type: []byte(typ), InputTokens: -1, OutputTokens: -1} }
	content := func(typ string) Event { e := none(typ); e.Content = true; return e }
	tests := []struct {
		name string
		data string
		want Event
	}{
		{"message start", antStart, Event{Type: []byte("message_start"), ID: []byte("msg_01XFD"), InputTokens: 25, OutputTokens: 1}},
		{"content block start", antBlockStart, none("content_block_start")},
		{"ping", antPing, none("ping")},
		{"text delta", antTextDelta, content("content_block_delta")},
		{"empty text delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":""}}`, none("content_block_delta")},
		{"thinking delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me"}}`, content("content_block_delta")},
		{"signature delta", `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQB"}}`, none("content_block_delta")},
		{"input json delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"location\": \"San Fra"}}`, content("content_block_delta")},
		{"empty input json delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}`, none("content_block_delta")},
		{"delta before type", `{"delta":{"text":"a"},"type":"content_block_delta"}`, content("content_block_delta")},
		{"text in another type", `{"type":"message_delta","delta":{"text":"a"}}`, none("message_delta")},
		{"block stop", antBlockStop, none("content_block_stop")},
		{"message delta", antMsgDelta, Event{Type: []byte("message_delta"), InputTokens: -1, OutputTokens: 15}},
		{"message delta with input tokens", `{"type":"message_delta","delta":{},"usage":{"input_tokens":30,"output_tokens":15,"cache_read_input_tokens":4}}`, Event{Type: []byte("message_delta"), InputTokens: 30, OutputTokens: 15, CachedTokens: 4}},
		{"message start with cache counts", `{"type":"message_start","message":{"id":"m","usage":{"input_tokens":3,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":1}}}`,
			Event{Type: []byte("message_start"), ID: []byte("m"), InputTokens: 3, OutputTokens: 1, CachedTokens: 2000, CacheWriteTokens: 100}},
		{"top-level cache counts win per field", `{"type":"message_delta","usage":{"cache_read_input_tokens":7},"message":{"usage":{"cache_read_input_tokens":1,"cache_creation_input_tokens":5}}}`,
			Event{Type: []byte("message_delta"), InputTokens: -1, OutputTokens: -1, CachedTokens: 7, CacheWriteTokens: 5}},
		{"top-level usage wins per field", `{"type":"x","usage":{"output_tokens":9},"message":{"usage":{"input_tokens":2,"output_tokens":1}}}`, Event{Type: []byte("x"), InputTokens: 2, OutputTokens: 9}},
		{"message stop", antStop, Event{Type: []byte("message_stop"), Terminal: true, InputTokens: -1, OutputTokens: -1}},
		{"error", antError, Event{Type: []byte("error"), Error: true, InputTokens: -1, OutputTokens: -1}},
		{"error object without type", `{"error":{"message":"boom"}}`, Event{Error: true, InputTokens: -1, OutputTokens: -1}},
		{"message not an object", `{"type":"message_start","message":[1]}`, none("message_start")},
		{"id not a string", `{"type":"message_start","message":{"id":5}}`, none("message_start")},
		{"escaped type", `{"type":"message_st\u006fp"}`, Event{Type: []byte(`message_st\u006fp`), Terminal: true, InputTokens: -1, OutputTokens: -1}},
		{"last duplicate wins", `{"type":"message_stop","type":"ping","delta":{"text":"a"},"delta":null}`, none("ping")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := InspectAnthropicEvent([]byte(tt.data))
			if err != nil {
				t.Fatalf("InspectAnthropicEvent() error = %v", err)
			}
			if !eventEqual(got, absentCache(tt.want, tt.data)) {
				t.Errorf("InspectAnthropicEvent() = %s\nwant %s", fmtEvent(got), fmtEvent(absentCache(tt.want, tt.data)))
			}
			if ref, ok := refInspectAnthropicEvent([]byte(tt.data)); !ok || !eventEqual(ref, got) {
				t.Errorf("reference = %s, %v", fmtEvent(ref), ok)
			}
		})
	}
}

func TestInspectEventErrors(t *testing.T) {
	for _, data := range []string{
		"", "[DONE]", ": ping", `{"type":"response.output_text.delta","delta":"hel`, `[1]`, `null`, `"x"`,
		`{"a":1,}`, `{"a":1}}`, `{"type":"\x"}`, `{"type":"\u12g4"}`, "{\"type\":\"\x01\"}",
	} {
		for name, inspect := range map[string]func([]byte) (Event, error){
			"InspectResponsesEvent": InspectResponsesEvent, "InspectAnthropicEvent": InspectAnthropicEvent,
		} {
			e, err := inspect([]byte(data))
			if err == nil {
				t.Errorf("%s(%q) = %s, nil; want an error", name, data, fmtEvent(e))
			}
			if !eventEqual(e, noEvent) {
				t.Errorf("%s(%q) = %s with the error; want %s", name, data, fmtEvent(e), fmtEvent(noEvent))
			}
		}
	}
}

func TestInspectEventAllocs(t *testing.T) {
	for _, data := range []string{respCreated, respTextDelta, respCompleted, respFailed, respError} {
		b := []byte(data)
		if a := testing.AllocsPerRun(100, func() { _, _ = InspectResponsesEvent(b) }); a != 0 {
			t.Errorf("InspectResponsesEvent(%.40q...) allocations = %v, want 0", data, a)
		}
	}
	for _, data := range []string{antStart, antTextDelta, antMsgDelta, antStop, antError} {
		b := []byte(data)
		if a := testing.AllocsPerRun(100, func() { _, _ = InspectAnthropicEvent(b) }); a != 0 {
			t.Errorf("InspectAnthropicEvent(%.40q...) allocations = %v, want 0", data, a)
		}
	}
}

// TestEventStreams walks whole streams as the gateway does: one first
// token, one terminal event, the id and the final usage.
func TestEventStreams(t *testing.T) {
	for _, tc := range []struct {
		name    string
		inspect func([]byte) (Event, error)
		events  []string
		first   int // index of the first Content event
		id      string
		in, out int64
	}{
		{"responses", InspectResponsesEvent, []string{respCreated, respProgress, respItemAdded, respTextDelta, respTextDelta, respCompleted}, 3, "resp_8f2c", 12, 7},
		{"anthropic", InspectAnthropicEvent, []string{antStart, antBlockStart, antPing, antTextDelta, antBlockStop, antMsgDelta, antStop}, 3, "msg_01XFD", 25, 15},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, terminals := -1, 0
			var id []byte
			in, out := int64(-1), int64(-1)
			for i, data := range tc.events {
				e, err := tc.inspect([]byte(data))
				if err != nil {
					t.Fatal(err)
				}
				if e.Content && first < 0 {
					first = i
				}
				if e.Terminal {
					terminals++
					if i != len(tc.events)-1 {
						t.Errorf("event %d is terminal", i)
					}
				}
				if e.ID != nil {
					id = e.ID
				}
				if e.InputTokens >= 0 {
					in = e.InputTokens
				}
				if e.OutputTokens >= 0 {
					out = e.OutputTokens
				}
			}
			if first != tc.first || terminals != 1 || string(id) != tc.id || in != tc.in || out != tc.out {
				t.Errorf("first token %d, %d terminal, id %q, usage %d/%d; want %d, 1, %q, %d/%d", first, terminals, id, in, out, tc.first, tc.id, tc.in, tc.out)
			}
		})
	}
}

// FuzzInspectEvent checks that both event inspectors never panic, fail
// exactly on input that is not a JSON object, and agree with their
// encoding/json references.
func FuzzInspectEvent(f *testing.F) {
	for _, s := range []string{
		respCreated, respProgress, respItemAdded, respTextDelta, respCompleted, respFailed, respError,
		antStart, antBlockStart, antPing, antTextDelta, antBlockStop, antMsgDelta, antStop, antError,
		"", "[DONE]", "null", `{"type":"response.c\u006fmpleted"}`, `{"error":null,"usage":{"input_tokens":-0.5}}`,
		`{"type":"content_block_delta","delta":{"thinking":"a","text":""},"delta":{"partial_json":"x"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := InspectResponsesEvent(data)
		ref, ok := refInspectResponsesEvent(data)
		if (err == nil) != ok || ok && !eventEqual(e, ref) {
			t.Fatalf("InspectResponsesEvent(%q) = %s, %v; reference %s, %v", data, fmtEvent(e), err, fmtEvent(ref), ok)
		}
		e, err = InspectAnthropicEvent(data)
		ref, ok = refInspectAnthropicEvent(data)
		if (err == nil) != ok || ok && !eventEqual(e, ref) {
			t.Fatalf("InspectAnthropicEvent(%q) = %s, %v; reference %s, %v", data, fmtEvent(e), err, fmtEvent(ref), ok)
		}
	})
}

// absentCache returns want with its cache counts -1 (absent) when the
// event data has no such member: cases name only the counts an event
// carries.
func absentCache(want Event, data string) Event {
	if !strings.Contains(data, `"cached_tokens"`) && !strings.Contains(data, `"cache_read_input_tokens"`) {
		want.CachedTokens = -1
	}
	if !strings.Contains(data, `"cache_creation_input_tokens"`) {
		want.CacheWriteTokens = -1
	}
	return want
}

func eventEqual(a, b Event) bool {
	return bytes.Equal(a.Type, b.Type) && (a.Type == nil) == (b.Type == nil) &&
		bytes.Equal(a.ID, b.ID) && (a.ID == nil) == (b.ID == nil) &&
		a.Content == b.Content && a.Terminal == b.Terminal && a.Error == b.Error &&
		a.InputTokens == b.InputTokens && a.OutputTokens == b.OutputTokens &&
		a.CachedTokens == b.CachedTokens && a.CacheWriteTokens == b.CacheWriteTokens
}

func fmtEvent(e Event) string {
	q := func(b []byte) string {
		if b == nil {
			return "<nil>"
		}
		return fmt.Sprintf("%q", b)
	}
	return fmt.Sprintf("{Type:%s Content:%v Terminal:%v Error:%v ID:%s In:%d Out:%d Cached:%d Write:%d}", q(e.Type), e.Content, e.Terminal, e.Error, q(e.ID), e.InputTokens, e.OutputTokens, e.CachedTokens, e.CacheWriteTokens)
}
