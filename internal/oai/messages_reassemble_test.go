package oai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/sse"
)

// reassembleMessagesSSE runs the SSE byte stream raw through the gateway's SSE scanner in
// reads of at most read bytes (0: one read) and feeds the data of every event that is not a
// comment to a MessagesReassembler. It returns the reassembler and the first error.
func reassembleMessagesSSE(t testing.TB, raw []byte, read int) (*MessagesReassembler, error) {
	t.Helper()
	var r MessagesReassembler
	var first error
	sc := sse.NewScanner(0)
	feed := func(ev sse.Event) {
		if ev.Comment || ev.Data == nil {
			return
		}
		if err := r.Add(ev.Data); err != nil && first == nil {
			first = err
		}
	}
	if read <= 0 {
		read = len(raw)
	}
	for p := raw; len(p) > 0; {
		n := min(read, len(p))
		sc.Push(p[:n], feed)
		p = p[n:]
	}
	return &r, first
}

// namedEvents frames each data payload as a named SSE event, the event line taken from the
// payload's type, as vLLM's wrap_data_with_event writes them.
func namedEvents(payloads ...string) []byte {
	var b bytes.Buffer
	for _, p := range payloads {
		var ev struct{ Type string }
		_ = json.Unmarshal([]byte(p), &ev)
		b.WriteString("event: " + ev.Type + "\ndata: " + p + "\n\n")
	}
	return b.Bytes()
}

// vllmMessagesStream is the stream vLLM's message_stream_converter (vllm/entrypoints/anthropic/serving.py) sends for an answer
// with reasoning, text and a tool call (AnthropicStreamEvent.model_dump_json with
// exclude_unset: members in the model's order, the message's defaults left out), and
// vllmMessagesBody the body its messages_full_converter answers for the same generation.
var (
	vllmMessagesStream = []string{
		`{"type":"message_start","message":{"id":"chatcmpl-1","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":0}}}`,
		`{"type":"content_block_start","content_block":{"type":"thinking","thinking":""},"index":0}`,
		`{"type":"content_block_delta","delta":{"type":"thinking_delta","thinking":"let me "},"index":0}`,
		`{"type":"content_block_delta","delta":{"type":"thinking_delta","thinking":"think"},"index":0}`,
		`{"type":"content_block_delta","delta":{"type":"signature_delta","signature":"0f3a"},"index":0}`,
		`{"type":"content_block_stop","index":0}`,
		`{"type":"content_block_start","content_block":{"type":"text","text":""},"index":1}`,
		`{"type":"content_block_delta","delta":{"type":"text_delta","text":"Hel"},"index":1}`,
		`{"type":"content_block_delta","delta":{"type":"text_delta","text":"lo \ud83d"},"index":1}`,
		`{"type":"content_block_delta","delta":{"type":"text_delta","text":"\ude00"},"index":1}`,
		`{"type":"content_block_stop","index":1}`,
		`{"type":"content_block_start","content_block":{"type":"tool_use","id":"call_a","name":"get_weather","input":{}},"index":2}`,
		`{"type":"content_block_delta","delta":{"type":"input_json_delta","partial_json":"{\"city\": "},"index":2}`,
		`{"type":"content_block_delta","delta":{"type":"input_json_delta","partial_json":"\"Paris\", \"days\": [1, 2]}"},"index":2}`,
		`{"type":"content_block_stop","index":2}`,
		`{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"input_tokens":3,"output_tokens":9}}`,
		`{"type":"message_stop"}`,
	}
	vllmMessagesBody = `{"id":"chatcmpl-1","type":"message","role":"assistant","content":[` +
		`{"type":"thinking","thinking":"let me think","signature":"0f3a"},` +
		`{"type":"text","text":"Hello \ud83d\ude00"},` +
		`{"type":"tool_use","id":"call_a","name":"get_weather","input":{"city":"Paris","days":[1,2]}}],` +
		`"model":"m","stop_reason":"tool_use","usage":{"input_tokens":3,"output_tokens":9}}`
)

// TestMessagesReassembleVLLM: vLLM's Messages stream, framed as it sends it (named events)
// and split anywhere across reads, with pings and keep-alive comments between events,
// reassembles into its non-streaming body byte for byte: blocks in order, the thinking
// block's signature, the text rebuilt across a split surrogate pair, the tool call's
// partial_json joined into a compact input object, the stop reason and the usage of
// message_delta, and no null member.
func TestMessagesReassembleVLLM(t *testing.T) {
	plain := namedEvents(vllmMessagesStream...)
	withPings := namedEvents(append([]string{vllmMessagesStream[0], `{"type":"ping"}`}, vllmMessagesStream[1:]...)...)
	withPings = append([]byte(": keep-alive\n\n"), withPings...)
	for _, tc := range []struct {
		name string
		raw  []byte
		read int
	}{
		{"one read", plain, 0},
		{"one byte per read", plain, 1},
		{"CRLF, 5 bytes per read", bytes.ReplaceAll(plain, []byte("\n"), []byte("\r\n")), 5},
		{"pings and comments", withPings, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := reassembleMessagesSSE(t, tc.raw, tc.read)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Finished() {
				t.Error("not finished")
			}
			if got := string(r.Body()); got != vllmMessagesBody {
				t.Errorf("body\n%s\nwant\n%s", got, vllmMessagesBody)
			}
		})
	}
}

// TestMessagesReassembleShapes covers the other shapes: Anthropic's own usage (output only
// in message_delta, input from message_start, cache counts), a stop sequence, an empty text
// block left out, a redacted thinking block, a tool call without fragments, an answer with
// no block, and vLLM's null stop reason (an aborted request) left out.
func TestMessagesReassembleShapes(t *testing.T) {
	const start = `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":1}}}`
	for _, tc := range []struct {
		name   string
		stream []string
		want   string
	}{
		{
			name: "anthropic usage and stop sequence",
			stream: []string{start,
				`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a\nb"}}`,
				`{"type":"content_block_stop","index":0}`,
				`{"type":"message_delta","delta":{"stop_reason":"stop_sequence","stop_sequence":"END"},"usage":{"output_tokens":2,"cache_read_input_tokens":4,"cache_creation_input_tokens":null}}`,
				`{"type":"message_stop"}`},
			want: `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"a\nb"}],"model":"m","stop_reason":"stop_sequence","stop_sequence":"END","usage":{"input_tokens":5,"output_tokens":2,"cache_read_input_tokens":4}}`,
		},
		{
			name: "empty text left out, redacted thinking, tool call without fragments",
			stream: []string{start,
				`{"type":"content_block_start","index":0,"content_block":{"type":"redacted_thinking","data":"EmwK"}}`,
				`{"type":"content_block_stop","index":0}`,
				`{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`,
				`{"type":"content_block_stop","index":1}`,
				`{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"t","name":"f","input":{ "a" : 1 }}}`,
				`{"type":"content_block_stop","index":2}`,
				`{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":3}}`,
				`{"type":"message_stop"}`},
			want: `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"redacted_thinking","data":"EmwK"},{"type":"tool_use","id":"t","name":"f","input":{"a":1}}],"model":"m","stop_reason":"tool_use","usage":{"input_tokens":5,"output_tokens":3}}`,
		},
		{
			name:   "no block, null stop reason",
			stream: []string{start, `{"type":"message_delta","delta":{"stop_reason":null},"usage":{"input_tokens":5,"output_tokens":0}}`, `{"type":"message_stop"}`},
			want:   `{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","usage":{"input_tokens":5,"output_tokens":0}}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r MessagesReassembler
			for _, ev := range tc.stream {
				if err := r.Add([]byte(ev)); err != nil {
					t.Fatalf("%s: %v", ev, err)
				}
			}
			if got := string(r.Body()); got != tc.want {
				t.Errorf("body\n%s\nwant\n%s", got, tc.want)
			}
			if !json.Valid(r.Body()) || !r.Finished() {
				t.Errorf("valid %v finished %v", json.Valid(r.Body()), r.Finished())
			}
		})
	}
}

// TestMessagesReassembleCut: a stream without message_delta or message_stop is not
// finished, and its body is valid JSON of what came.
func TestMessagesReassembleCut(t *testing.T) {
	for n := range len(vllmMessagesStream) {
		var r MessagesReassembler
		for _, ev := range vllmMessagesStream[:n] {
			if err := r.Add([]byte(ev)); err != nil {
				t.Fatal(err)
			}
		}
		if r.Finished() {
			t.Errorf("%d events: finished", n)
		}
		if b := r.Body(); !json.Valid(b) {
			t.Errorf("%d events: body %s", n, b)
		}
	}
}

// TestMessagesReassembleErrors: an error event is a *StreamError with its message and the
// HTTP status of its type (Anthropic's, vLLM's, or an OpenAI error's code), returned again by
// every later Add; malformed events are ErrMalformedChunk, and data that is not a JSON object
// leaves the reassembler usable.
func TestMessagesReassembleErrors(t *testing.T) {
	for _, tc := range []struct {
		data, msg string
		code      int
	}{
		{`{"type":"error","error":{"type":"api_error","message":"Internal server error"}}`, "Internal server error", 500},
		{`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, "Overloaded", 529},
		{`{"type":"error","error":{"type":"internal_error","message":"Invalid data format received"}}`, "Invalid data format received", 500},
		{`{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}`, "bad", 400},
		{`{"type":"error","error":{"type":"something_new","message":"?"}}`, "?", 0},
		{`{"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}`, "Internal server error", 500},
		{`{"type":"error","error":"flat"}`, "flat", 0},
		{`{"type":"error"}`, "", 0},
	} {
		var r MessagesReassembler
		_ = r.Add([]byte(vllmMessagesStream[0]))
		err := r.Add([]byte(tc.data))
		var se *StreamError
		if !errors.As(err, &se) || se.Message != tc.msg || se.Code != tc.code || string(se.Body) != tc.data {
			t.Errorf("%s: %v (%+v), want message %q code %d", tc.data, err, se, tc.msg, tc.code)
			continue
		}
		if again := r.Add([]byte(vllmMessagesStream[1])); again != err {
			t.Errorf("%s: later Add returned %v", tc.data, again)
		}
	}
	for _, tc := range []struct{ name, data string }{
		{"delta before start", `{"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"x"}}`},
		{"stop before start", `{"type":"content_block_stop","index":3}`},
		{"negative index", `{"type":"content_block_start","index":-1,"content_block":{"type":"text","text":""}}`},
		{"text not a string", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":1}}`},
		{"block without type", `{"type":"content_block_start","index":0,"content_block":{"text":""}}`},
		{"type not a string", `{"type":7}`},
		{"usage count not a number", `{"type":"message_delta","delta":{},"usage":{"output_tokens":"3"}}`},
		{"message not an object", `{"type":"message_start","message":[]}`},
	} {
		var r MessagesReassembler
		if err := r.Add([]byte(`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)); err != nil {
			t.Fatal(err)
		}
		if err := r.Add([]byte(tc.data)); !errors.Is(err, ErrMalformedChunk) {
			t.Errorf("%s: %v, want ErrMalformedChunk", tc.name, err)
		}
		if !json.Valid(r.Body()) {
			t.Errorf("%s: body %s", tc.name, r.Body())
		}
	}
	// A tool call whose fragments do not make an object fails at its stop.
	var r MessagesReassembler
	for _, ev := range []string{
		`{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}`,
	} {
		if err := r.Add([]byte(ev)); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Add([]byte(`{"type":"content_block_stop","index":0}`)); !errors.Is(err, ErrMalformedChunk) {
		t.Errorf("an unfinished tool input: %v", err)
	}
	if b := r.Body(); !bytes.Contains(b, []byte(`"input":{}`)) || !json.Valid(b) {
		t.Errorf("body after the failure %s", b)
	}
	// Data that is not an object merges nothing and leaves r usable.
	var ok MessagesReassembler
	for _, bad := range []string{`[1]`, `{"type":`, `"x"`} {
		if err := ok.Add([]byte(bad)); !errors.Is(err, ErrMalformedChunk) {
			t.Errorf("%s: %v", bad, err)
		}
	}
	for _, ev := range vllmMessagesStream {
		if err := ok.Add([]byte(ev)); err != nil {
			t.Fatalf("after non-objects: %v", err)
		}
	}
	if string(ok.Body()) != vllmMessagesBody {
		t.Errorf("body %s", ok.Body())
	}
	ok.Reset()
	if ok.Finished() || string(ok.Body()) != `{"id":"","type":"message","role":"assistant","content":[],"model":"","usage":{"input_tokens":0,"output_tokens":0}}` {
		t.Errorf("after Reset: %s", ok.Body())
	}
}

// TestMessagesReassembleSetModel: the body names the model SetModel gives, before or after
// message_start.
func TestMessagesReassembleSetModel(t *testing.T) {
	for _, early := range []bool{true, false} {
		var r MessagesReassembler
		if early {
			r.SetModel([]byte(`"fallback"`))
		}
		for _, ev := range vllmMessagesStream {
			if err := r.Add([]byte(ev)); err != nil {
				t.Fatal(err)
			}
		}
		if !early {
			r.SetModel([]byte(`"fallback"`))
		}
		if want := strings.Replace(vllmMessagesBody, `"model":"m"`, `"model":"fallback"`, 1); string(r.Body()) != want {
			t.Errorf("early %v: body %s", early, r.Body())
		}
	}
}

// TestMessagesReassembleLimits: at most 128 blocks are opened; the 129th is an error.
func TestMessagesReassembleLimits(t *testing.T) {
	var r MessagesReassembler
	var err error
	for i := 0; i <= maxMessagesBlocks && err == nil; i++ {
		err = r.Add(fmt.Appendf(nil, `{"type":"content_block_start","index":%d,"content_block":{"type":"text","text":"x"}}`, i*7%(maxMessagesBlocks+1)))
	}
	if !errors.Is(err, ErrMalformedChunk) || len(r.blocks) != maxMessagesBlocks {
		t.Errorf("err %v with %d blocks", err, len(r.blocks))
	}
}

// signatureRe matches a thinking block's signature, which the simulator draws anew for
// each response.
var signatureRe = regexp.MustCompile(`"signature":"[0-9a-f]*"`)

// TestMessagesReassembleMatchesEngineNonStreaming is the differential test against the
// simulated engine: its Messages stream reassembled equals its non-streaming body for the
// same request (the id and the thinking signature, random per response, aside; the
// simulator writes stop_sequence null, which vLLM's body leaves out).
func TestMessagesReassembleMatchesEngineNonStreaming(t *testing.T) {
	srv := simServer(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 5})
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	const prompt = `{"model":"m","system":"be brief","messages":[{"role":"user","content":"say hello please"}]`
	for _, tc := range []struct{ name, body, fault string }{
		{"end_turn", prompt + `,"max_tokens":100`, ""},
		{"max_tokens", prompt + `,"max_tokens":3`, ""},
		{"thinking", prompt + `,"max_tokens":100`, "reasoning=2"},
		{"thinking only", prompt + `,"max_tokens":2`, "reasoning=2"},
		{"no content", prompt + `,"max_tokens":100`, "no-content"},
		{"split reads", prompt + `,"max_tokens":4`, "keepalive,trickle=0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			post := func(stream string) []byte {
				t.Helper()
				req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", strings.NewReader(tc.body+stream+"}"))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				if tc.fault != "" {
					req.Header.Set(enginesim.FaultHeader, tc.fault)
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d, %v: %s", resp.StatusCode, err, b)
				}
				return b
			}
			unary := post(`,"stream":false`)
			r, err := reassembleMessagesSSE(t, post(`,"stream":true`), 0)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Finished() {
				t.Error("not finished")
			}
			got := r.Body()
			unary = signatureRe.ReplaceAll(unary, []byte(`"signature":"S"`))
			got = signatureRe.ReplaceAll(got, []byte(`"signature":"S"`))
			if !bytes.Contains(unary, []byte(`"stop_sequence":null`)) {
				t.Fatalf("the simulator's body changed: %s", unary)
			}
			if diffs := diffJSON(unary, got, "id", "stop_sequence"); len(diffs) > 0 {
				t.Errorf("reassembled body differs:\n%s\nnon-stream:  %s\nreassembled: %s", strings.Join(diffs, "\n"), unary, got)
			}
			if bytes.Contains(got, []byte("null")) {
				t.Errorf("a null member: %s", got)
			}
		})
	}
}

// FuzzMessagesReassembler feeds arbitrary events (the input's lines): it must never panic,
// and the body must be valid JSON, the same on every call, whether or not Add failed.
func FuzzMessagesReassembler(f *testing.F) {
	f.Add([]byte(strings.Join(vllmMessagesStream, "\n")))
	f.Add([]byte(`{"type":"error","error":{"type":"api_error","message":"x"}}`))
	f.Add([]byte(`{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","input":{"a":[1, {"b":"\" }"}]}}}` + "\n" +
		`{"type":"content_block_delta","index":2,"delta":{"partial_json":"{\"x\" :\n \"\\u00e9 \\\" \"}"}}` + "\n" + `{"type":"content_block_stop","index":2}`))
	f.Add([]byte(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":1e3,"output_tokens":-0}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var r MessagesReassembler
		for line := range bytes.SplitSeq(data, []byte("\n")) {
			_ = r.Add(line)
		}
		b := r.Body()
		if !json.Valid(b) {
			t.Fatalf("body is not JSON: %s", b)
		}
		if again := r.Body(); !bytes.Equal(b, again) {
			t.Fatalf("body changed: %s then %s", b, again)
		}
		_ = r.Finished()
	})
}

// TestMessagesReassembleAllocs: a delta into an open block allocates only to grow the block's
// text (amortized: less than one allocation per event), and message_stop, ping and a
// usage-only message_delta none.
func TestMessagesReassembleAllocs(t *testing.T) {
	var r MessagesReassembler
	for _, ev := range vllmMessagesStream[:7] { // up to the text block's start
		if err := r.Add([]byte(ev)); err != nil {
			t.Fatal(err)
		}
	}
	delta := []byte(`{"type":"content_block_delta","delta":{"type":"text_delta","text":"tok "},"index":1}`)
	if a := testing.AllocsPerRun(200, func() { _ = r.Add(delta) }); a >= 1 {
		t.Errorf("a text delta: %v allocations", a)
	}
	for _, s := range []string{`{"type":"ping"}`, `{"type":"message_delta","delta":{},"usage":{"output_tokens":12}}`, `{"type":"message_stop"}`} {
		ev := []byte(s)
		if a := testing.AllocsPerRun(50, func() { _ = r.Add(ev) }); a != 0 {
			t.Errorf("%s: %v allocations", ev, a)
		}
	}
}
