package oai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/enginetest"
	"github.com/switchboard-gw/switchboard/internal/sse"
)

// reassembleSSE runs the SSE byte stream raw through the gateway's SSE scanner (internal/sse)
// in reads of at most read bytes (0: one read), as the gateway would, and feeds the data of every event
// that is neither a comment nor [DONE] to a reassembler. It returns the reassembler and
// the first error add returned.
func reassembleSSE(t testing.TB, completions bool, raw []byte, read int) (*Reassembler, error) {
	t.Helper()
	r := NewReassembler(completions)
	var first error
	sc := sse.NewScanner(0)
	feed := func(ev sse.Event) {
		if ev.Comment || ev.Data == nil || sse.IsDone(ev.Data) {
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
	return r, first
}

// simServer serves a simulated vLLM engine (enginetest.Fast's timings
// unless cfg sets its own), closed when the test ends.
func simServer(t testing.TB, cfg enginesim.Config) *httptest.Server {
	t.Helper()
	_, srv := enginetest.Start(t, enginetest.Fast(cfg))
	return srv
}

// sseOf frames each data payload as an SSE event; a payload starting with ':' is written as
// a comment line instead.
func sseOf(payloads ...string) []byte {
	var b bytes.Buffer
	for _, p := range payloads {
		if strings.HasPrefix(p, ":") {
			b.WriteString(p + "\n\n")
			continue
		}
		b.WriteString("data: " + p + "\n\n")
	}
	return b.Bytes()
}

const (
	chatHead = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[`
	cmplHead = `{"id":"cmpl-1","object":"text_completion","created":7,"model":"m","choices":[`
)

// chatChunk returns a vLLM 0.10.1 chat chunk of choice 0 with the given delta; finish is the
// finish_reason ("" for none).
func chatChunk(delta, finish string) string {
	if finish == "" {
		return chatHead + `{"index":0,"delta":` + delta + `,"logprobs":null,"finish_reason":null}]}`
	}
	return chatHead + `{"index":0,"delta":` + delta + `,"logprobs":null,"finish_reason":"` + finish + `","stop_reason":null}]}`
}

const (
	chatRoleChunk  = chatHead + `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`
	chatUsageChunk = chatHead + `],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}`
	// chatTail is a chat body's end after the choices with chatUsageChunk's usage.
	chatTail = `],"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null}`
	// chatBodyHead is a chat body's start, before its choices.
	chatBodyHead = `{"id":"chatcmpl-1","object":"chat.completion","created":7,"model":"m","choices":[`
	// plainMessage is the message fields after content with no refusal, tool call or reasoning.
	plainMessage = `,"refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":null}`
)

// helloStream is vLLM's stream of a two-token answer with keep-alives, and helloBody the
// non-stream body vLLM sends for it.
var (
	helloStream = []string{
		": keep-alive",
		chatRoleChunk,
		": keep-alive",
		chatChunk(`{"content":"Hel"}`, ""),
		chatChunk(`{"content":"lo"}`, ""),
		chatChunk(`{}`, "stop"),
		chatUsageChunk,
		"[DONE]",
	}
	helloBody = chatBodyHead + `{"index":0,"message":{"role":"assistant","content":"Hello"` + plainMessage +
		`,"logprobs":null,"finish_reason":"stop","stop_reason":null}` + chatTail
)

// TestReassembleFraming feeds the same stream framed in the ways SSE allows (split
// anywhere across reads, CRLF line ends, data without a space after the colon, one
// event's data spread over two data lines, keep-alive comments, event and id fields):
// the scanner hands the reassembler the same payloads, and the body is the same.
func TestReassembleFraming(t *testing.T) {
	plain := sseOf(helloStream...)
	multiLine := bytes.Replace(plain, []byte(`data: `+chatChunk(`{"content":"lo"}`, "")),
		[]byte(`data: `+strings.Replace(chatChunk(`{"content":"lo"}`, ""), `"delta":`, "\"delta\":\ndata: ", 1)), 1)
	tests := []struct {
		name string
		raw  []byte
		read int
	}{
		{"one read", plain, 0},
		{"one byte per read", plain, 1},
		{"seven bytes per read", plain, 7},
		{"CRLF", bytes.ReplaceAll(plain, []byte("\n"), []byte("\r\n")), 3},
		{"CR", bytes.ReplaceAll(plain, []byte("\n"), []byte("\r")), 0},
		{"no space after data:", bytes.ReplaceAll(plain, []byte("data: "), []byte("data:")), 5},
		{"event, id and retry fields", bytes.ReplaceAll(plain, []byte("data: "), []byte("event: chunk\nid: 1\nretry: 10\ndata: ")), 0},
		{"multi-line data", multiLine, 2},
		{"comments only between events", append([]byte(": ping\n\n: PROCESSING\n\n"), plain...), 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := reassembleSSE(t, false, tc.raw, tc.read)
			if err != nil {
				t.Fatal(err)
			}
			if got := string(r.Body()); got != helloBody {
				t.Errorf("body\n%s\nwant\n%s", got, helloBody)
			}
			if !r.Finished() {
				t.Error("not finished")
			}
		})
	}
}

// TestReassembleChatShapes covers the chat stream shapes: vLLM 0.10.1's (the default), the
// role-only and usage-only chunks, reasoning, tool-call deltas, several choices, and the
// fields of later vLLM versions.
func TestReassembleChatShapes(t *testing.T) {
	choice := func(message, rest string) string {
		return `{"index":0,"message":{"role":"assistant",` + message + `},"logprobs":null,` + rest + `}`
	}
	tests := []struct {
		name   string
		stream []string
		want   string
	}{
		{
			name:   "role chunk and finish only",
			stream: []string{chatRoleChunk, chatChunk(`{}`, "stop"), chatUsageChunk},
			want:   chatBodyHead + choice(`"content":""`+plainMessage[:len(plainMessage)-1], `"finish_reason":"stop","stop_reason":null`) + chatTail,
		},
		{
			name:   "no usage chunk",
			stream: []string{chatRoleChunk, chatChunk(`{"content":"a"}`, "length")},
			want: chatBodyHead + choice(`"content":"a"`+plainMessage[:len(plainMessage)-1], `"finish_reason":"length","stop_reason":null`) +
				`],"service_tier":null,"system_fingerprint":null,"usage":null,"prompt_logprobs":null,"kv_transfer_params":null}`,
		},
		{
			name: "reasoning then content",
			stream: []string{chatRoleChunk, chatChunk(`{"reasoning_content":"think "}`, ""), chatChunk(`{"reasoning_content":"more"}`, ""),
				chatChunk(`{"content":"answer"}`, ""), chatChunk(`{}`, "stop"), chatUsageChunk},
			want: chatBodyHead + choice(`"content":"answer","refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":"think more"`,
				`"finish_reason":"stop","stop_reason":null`) + chatTail,
		},
		{
			name:   "reasoning only: content null",
			stream: []string{chatRoleChunk, chatChunk(`{"reasoning_content":"hmm"}`, ""), chatChunk(`{}`, "length"), chatUsageChunk},
			want: chatBodyHead + choice(`"content":null,"refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":"hmm"`,
				`"finish_reason":"length","stop_reason":null`) + chatTail,
		},
		{
			name: "tool-call deltas merged by index",
			stream: []string{
				chatRoleChunk,
				chatChunk(`{"tool_calls":[{"id":"call_a","type":"function","index":0,"function":{"name":"get_weather"}}]}`, ""),
				chatChunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": "}}]}`, ""),
				chatChunk(`{"tool_calls":[{"id":"call_b","type":"function","index":1,"function":{"name":"get_time","arguments":""}}]}`, ""),
				chatChunk(`{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}`, ""),
				chatChunk(`{"tool_calls":[{"index":1,"function":{"arguments":"{}"}}]}`, "tool_calls"),
				chatUsageChunk,
			},
			want: chatBodyHead + choice(`"content":null,"refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[`+
				`{"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},`+
				`{"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{}"}}],"reasoning_content":null`,
				`"finish_reason":"tool_calls","stop_reason":null`) + chatTail,
		},
		{
			name: "content and a tool call, finish chunk with the rest of the arguments",
			stream: []string{chatRoleChunk, chatChunk(`{"content":"ok "}`, ""),
				chatChunk(`{"tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"f","arguments":""}}]}`, ""),
				chatChunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}`, "stop"), chatUsageChunk},
			want: chatBodyHead + choice(`"content":"ok ","refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[`+
				`{"id":"call_0","type":"function","function":{"name":"f","arguments":"{}"}}],"reasoning_content":null`,
				`"finish_reason":"stop","stop_reason":null`) + chatTail,
		},
		{
			name: "two choices interleaved, index 1 first, stop reasons",
			stream: []string{
				chatHead + `{"index":1,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
				chatRoleChunk,
				chatHead + `{"index":1,"delta":{"content":"B"},"logprobs":null,"finish_reason":null}]}`,
				chatChunk(`{"content":"A"}`, ""),
				chatHead + `{"index":1,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":"\n\n"}]}`,
				chatHead + `{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":128009}]}`,
				chatUsageChunk,
			},
			want: chatBodyHead + choice(`"content":"A"`+plainMessage[:len(plainMessage)-1], `"finish_reason":"stop","stop_reason":128009`) + `,` +
				strings.Replace(choice(`"content":"B"`+plainMessage[:len(plainMessage)-1], `"finish_reason":"stop","stop_reason":"\n\n"`), `"index":0`, `"index":1`, 1) +
				chatTail,
		},
		{
			name: "logprobs concatenated",
			stream: []string{chatRoleChunk,
				chatHead + `{"index":0,"delta":{"content":"a"},"logprobs":{"content":[{"token":"a","logprob":-0.5,"bytes":[97],"top_logprobs":[]}]},"finish_reason":null}]}`,
				chatHead + `{"index":0,"delta":{"content":"b"},"logprobs":{"content":[{"token":"b","logprob":-9999.0,"bytes":[98],"top_logprobs":[]}]},"finish_reason":null}]}`,
				chatHead + `{"index":0,"delta":{},"logprobs":{"content":[]},"finish_reason":"stop","stop_reason":null}]}`,
				chatUsageChunk},
			want: chatBodyHead + `{"index":0,"message":{"role":"assistant","content":"ab"` + plainMessage + `,"logprobs":{"content":[` +
				`{"token":"a","logprob":-0.5,"bytes":[97],"top_logprobs":[]},{"token":"b","logprob":-9999.0,"bytes":[98],"top_logprobs":[]}]},` +
				`"finish_reason":"stop","stop_reason":null}` + chatTail,
		},
		{
			name: "later vLLM: token_ids and prompt_token_ids carried",
			stream: []string{
				chatHead + `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,2,3]}`,
				chatHead + `{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null,"token_ids":[10]}]}`,
				chatHead + `{"index":0,"delta":{"content":"b"},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[11,2]}]}`,
				chatUsageChunk},
			want: chatBodyHead + `{"index":0,"message":{"role":"assistant","content":"ab"` + plainMessage +
				`,"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[10,11,2]}` +
				strings.Replace(chatTail, `"prompt_logprobs":null`, `"prompt_logprobs":null,"prompt_token_ids":[1,2,3]`, 1),
		},
		{
			name: "later vLLM without return_token_ids: nulls carried",
			stream: []string{
				chatHead + `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null}`,
				chatHead + `{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null,"token_ids":null}]}`,
				chatHead + `{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null}]}`,
				chatUsageChunk},
			want: chatBodyHead + `{"index":0,"message":{"role":"assistant","content":"a"` + plainMessage +
				`,"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null}` +
				strings.Replace(chatTail, `"prompt_logprobs":null`, `"prompt_logprobs":null,"prompt_token_ids":null`, 1),
		},
		{
			name: "newer vLLM: reasoning, fingerprint on the usage chunk, usage details",
			stream: []string{chatRoleChunk, chatChunk(`{"reasoning":"r"}`, ""), chatChunk(`{"content":"c"}`, ""), chatChunk(`{}`, "stop"),
				chatHead + `],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,"completion_tokens_details":{"reasoning_tokens":1}},"system_fingerprint":"fp"}`},
			want: chatBodyHead + choice(`"content":"c","refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning":"r","reasoning_content":null`,
				`"finish_reason":"stop","stop_reason":null`) +
				`],"service_tier":null,"system_fingerprint":"fp","usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,"prompt_tokens_details":null,"completion_tokens_details":{"reasoning_tokens":1}},"prompt_logprobs":null,"kv_transfer_params":null}`,
		},
		{
			name: "escapes and a surrogate pair split across chunks",
			stream: []string{chatRoleChunk, chatChunk(`{"content":"line\n\"q\" \ud83d"}`, ""), chatChunk(`{"content":"\ude00 é"}`, ""),
				chatChunk(`{"refusal":"no"}`, ""), chatChunk(`{}`, "stop"), chatUsageChunk},
			want: chatBodyHead + choice(`"content":"line\n\"q\" \ud83d\ude00 é","refusal":"no","annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":null`,
				`"finish_reason":"stop","stop_reason":null`) + chatTail,
		},
		{
			name: "last duplicate key wins, keys match exactly",
			stream: []string{chatRoleChunk, chatHead + `{"index":0,"delta":{"content":"x","content":"y","Content":"z","c\u006fntent2":"w"},"logprobs":null,"finish_reason":null}]}`,
				chatChunk(`{}`, "stop"), chatUsageChunk},
			want: chatBodyHead + choice(`"content":"y"`+plainMessage[:len(plainMessage)-1], `"finish_reason":"stop","stop_reason":null`) + chatTail,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := reassembleSSE(t, false, sseOf(tc.stream...), 0)
			if err != nil {
				t.Fatal(err)
			}
			got := r.Body()
			if string(got) != tc.want {
				t.Errorf("body\n%s\nwant\n%s", got, tc.want)
			}
			if !json.Valid(got) {
				t.Errorf("invalid JSON %s", got)
			}
		})
	}
}

// TestReassembleCompletions covers completions streams: text, vLLM's usage null on every
// chunk, logprobs whose text_offset is already relative to the whole text, and later vLLM
// releases' token ids.
func TestReassembleCompletions(t *testing.T) {
	chunk := func(text, lp, finish, extra string) string {
		return cmplHead + `{"index":0,"text":"` + text + `","logprobs":` + lp + `,"finish_reason":` + finish + `,"stop_reason":null` + extra + `}],"usage":null}`
	}
	usage := cmplHead + `],"usage":{"prompt_tokens":2,"total_tokens":4,"completion_tokens":2}}`
	head := `{"id":"cmpl-1","object":"text_completion","created":7,"model":"m","choices":[`
	tail := `],"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":2,"total_tokens":4,"completion_tokens":2,"prompt_tokens_details":null},"kv_transfer_params":null}`
	tests := []struct {
		name   string
		stream []string
		want   string
	}{
		{
			name:   "text",
			stream: []string{chunk("a ", "null", "null", ""), chunk("b", "null", "null", ""), chunk("", "null", `"length"`, ""), usage},
			want:   head + `{"index":0,"text":"a b","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_logprobs":null}` + tail,
		},
		{
			name: "logprobs",
			stream: []string{
				chunk("a ", `{"text_offset":[0],"token_logprobs":[-0.25],"tokens":["a "],"top_logprobs":[{"a ":-0.25,"b":-1.5}]}`, "null", ""),
				chunk("b", `{"text_offset":[2],"token_logprobs":[null],"tokens":["b"],"top_logprobs":[null]}`, "null", ""),
				chunk("", `{"text_offset":[],"token_logprobs":[],"tokens":[],"top_logprobs":[]}`, `"stop"`, ""),
				usage,
			},
			want: head + `{"index":0,"text":"a b","logprobs":{"text_offset":[0,2],"token_logprobs":[-0.25,null],"tokens":["a ","b"],` +
				`"top_logprobs":[{"a ":-0.25,"b":-1.5},null]},"finish_reason":"stop","stop_reason":null,"prompt_logprobs":null}` + tail,
		},
		{
			name: "later vLLM token ids",
			stream: []string{
				chunk("a ", "null", "null", `,"prompt_token_ids":[5,6],"token_ids":[1]`),
				chunk("b", "null", `"stop"`, `,"prompt_token_ids":null,"token_ids":[2]`),
				usage,
			},
			want: head + `{"index":0,"text":"a b","logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[1,2],"prompt_logprobs":null,"prompt_token_ids":[5,6]}` + tail,
		},
		{
			name: "two choices",
			stream: []string{
				strings.Replace(chunk("B", "null", "null", ""), `"index":0`, `"index":1`, 1),
				chunk("A", "null", `"stop"`, ""),
				strings.Replace(chunk("", "null", `"length"`, ""), `"index":0`, `"index":1`, 1),
				usage,
			},
			want: head + `{"index":0,"text":"A","logprobs":null,"finish_reason":"stop","stop_reason":null,"prompt_logprobs":null},` +
				`{"index":1,"text":"B","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_logprobs":null}` + tail,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := reassembleSSE(t, true, sseOf(tc.stream...), 3)
			if err != nil {
				t.Fatal(err)
			}
			if got := string(r.Body()); got != tc.want {
				t.Errorf("body\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

// TestReassembleErrors covers the events add rejects: vLLM's in-band error events (the
// caller answers 502 with the error object) and malformed chunks. After an error add
// returns the same error, except after data that is not a JSON object (nothing was merged),
// and body is still valid JSON.
func TestReassembleErrors(t *testing.T) {
	const vllmError = `{"error":{"message":"The engine died.","type":"InternalServerError","param":null,"code":500}}`
	tests := []struct {
		name      string
		data      string
		wantBody  string // the StreamError's Body; "" for a malformed chunk
		wantMsg   string
		wantCode  int
		wantWrong string // part of the malformed chunk's error text
		recover   bool   // add goes on after the error: nothing was merged
	}{
		{name: "vLLM error event", data: vllmError, wantBody: vllmError, wantMsg: "The engine died.", wantCode: 500},
		{name: "legacy flat error", data: `{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}`,
			wantBody: `{"error":{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}}`, wantMsg: "bad", wantCode: 400},
		{name: "error string", data: `{"error":"boom"}`, wantBody: `{"error":"boom"}`, wantMsg: "boom"},
		{name: "error code not a status", data: `{"error":{"message":"x","code":"oops"}}`, wantBody: `{"error":{"message":"x","code":"oops"}}`, wantMsg: "x"},
		{name: "invalid JSON", data: `{"id":"bad", "choices": [`, wantWrong: "not valid JSON", recover: true},
		{name: "not an object", data: `[1,2]`, wantWrong: "not a JSON object", recover: true},
		{name: "choices not an array", data: `{"choices":{}}`, wantWrong: "wrong type"},
		{name: "negative index", data: `{"choices":[{"index":-1,"delta":{}}]}`, wantWrong: "index"},
		{name: "fractional index", data: `{"choices":[{"index":1.5,"delta":{}}]}`, wantWrong: "index"},
		{name: "content not a string", data: `{"choices":[{"index":0,"delta":{"content":1}}]}`, wantWrong: "wrong type"},
		{name: "tool call not an object", data: `{"choices":[{"index":0,"delta":{"tool_calls":[1]}}]}`, wantWrong: "tool call"},
		{name: "stop_reason a boolean", data: `{"choices":[{"index":0,"delta":{},"stop_reason":true}]}`, wantWrong: "stop_reason"},
		{name: "logprobs content not an array", data: `{"choices":[{"index":0,"delta":{},"logprobs":{"content":"x"}}]}`, wantWrong: "logprobs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReassembler(false)
			if err := r.Add([]byte(chatRoleChunk)); err != nil {
				t.Fatal(err)
			}
			err := r.Add([]byte(tc.data))
			var se *StreamError
			switch {
			case tc.wantBody != "":
				if !errors.As(err, &se) {
					t.Fatalf("err = %v, want an StreamError", err)
				}
				if string(se.Body) != tc.wantBody || se.Message != tc.wantMsg || se.Code != tc.wantCode {
					t.Errorf("error %s %q %d, want %s %q %d", se.Body, se.Message, se.Code, tc.wantBody, tc.wantMsg, tc.wantCode)
				}
			case !errors.Is(err, ErrMalformedChunk) || !strings.Contains(err.Error(), tc.wantWrong):
				t.Fatalf("err = %v, want a malformed chunk error about %q", err, tc.wantWrong)
			}
			again := r.Add([]byte(chatChunk(`{"content":"x"}`, "stop")))
			switch {
			case tc.recover && (again != nil || !r.Finished() || string(r.choices[0].content.b) != "x"):
				t.Errorf("add after the error = %v, finished %v, content %q", again, r.Finished(), r.choices[0].content.b)
			case !tc.recover && again != err:
				t.Errorf("add after the error = %v, want the same error", again)
			}
			if b := r.Body(); !json.Valid(b) {
				t.Errorf("body after the error is not JSON: %s", b)
			}
		})
	}
}

// TestReassembleIgnores checks what add skips without error: empty data, [DONE], chunks
// without choices, unknown fields, a chat field in a completions stream.
func TestReassembleIgnores(t *testing.T) {
	r := NewReassembler(true)
	for _, d := range []string{"", "  ", "[DONE]", " [DONE] ", `{}`, `{"choices":null,"usage":null}`, `{"unknown":[1,{"a":"}"}],"choices":[]}`,
		`{"choices":[{"index":0,"delta":{"content":"chat only"},"text":"t"}]}`} {
		if err := r.Add([]byte(d)); err != nil {
			t.Fatalf("add(%q) = %v", d, err)
		}
	}
	want := `{"id":"","object":"text_completion","created":0,"model":"","choices":[{"index":0,"text":"t","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_logprobs":null}],"service_tier":null,"system_fingerprint":null,"usage":null,"kv_transfer_params":null}`
	if got := string(r.Body()); got != want {
		t.Errorf("body\n%s\nwant\n%s", got, want)
	}
	if r.Finished() {
		t.Error("finished without a finish_reason")
	}
	if NewReassembler(false).Finished() {
		t.Error("finished without choices")
	}
}

// TestReassembleLimits checks that the number of choices and tool calls a stream opens is
// bounded, and that reset starts over.
func TestReassembleLimits(t *testing.T) {
	r := NewReassembler(false)
	var err error
	for i := 0; i <= maxReassembleChoices && err == nil; i++ {
		err = r.Add(fmt.Appendf(nil, `{"choices":[{"index":%d,"delta":{"content":"x"}}]}`, maxReassembleChoices-i))
	}
	if !errors.Is(err, ErrMalformedChunk) || len(r.choices) != maxReassembleChoices {
		t.Errorf("err %v with %d choices", err, len(r.choices))
	}
	for i := 1; i < len(r.choices); i++ {
		if r.choices[i-1].index >= r.choices[i].index {
			t.Fatalf("choices not sorted at %d", i)
		}
	}
	r.Reset(false)
	err = nil
	for i := 0; i <= maxReassembleToolCalls && err == nil; i++ {
		err = r.Add(fmt.Appendf(nil, `{"choices":[{"index":0,"delta":{"tool_calls":[{"index":%d}]}}]}`, i*7%(maxReassembleToolCalls+1)))
	}
	if !errors.Is(err, ErrMalformedChunk) || len(r.choices[0].tools) != maxReassembleToolCalls {
		t.Errorf("err %v with %d tool calls", err, len(r.choices[0].tools))
	}
	r.Reset(false)
	if err := r.Add([]byte(chatRoleChunk)); err != nil || len(r.choices) != 1 || r.choices[0].tools != nil {
		t.Errorf("after reset: %v, %+v", err, r.choices)
	}
}

// FuzzReassembler feeds arbitrary events (the input's lines) to a reassembler: it must never
// panic, and body must be valid JSON (the same on every call), whether or not add failed;
// when add never failed, body decodes to a response object.
func FuzzReassembler(f *testing.F) {
	for _, s := range [][]string{helloStream, {chatRoleChunk, chatChunk(`{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":"{"}}]}`, ""),
		chatChunk(`{"tool_calls":[{"index":0,"function":{"arguments":"}"}}]}`, "tool_calls")}} {
		f.Add([]byte(strings.Join(s, "\n")), false)
	}
	f.Add([]byte(cmplHead+`{"index":0,"text":"a","logprobs":{"text_offset":[0],"token_logprobs":[-1.0],"tokens":["a"],"top_logprobs":[{"a":-1.0}]},"finish_reason":"stop","stop_reason":null,"token_ids":[1]}],"usage":null}`), true)
	f.Add([]byte(`{"error":{"message":"x","code":500}}`), false)
	f.Add([]byte(`{"choices":[{"index":3,"delta":{"content":"\ud83d","reasoning":"a\\\"b"}},{"index":1}],"usage":{"x":1,"prompt_tokens":2}}`), false)
	f.Fuzz(func(t *testing.T, data []byte, completions bool) {
		r := NewReassembler(completions)
		failed := false
		for line := range bytes.SplitSeq(data, []byte("\n")) {
			if r.Add(line) != nil {
				failed = true
			}
		}
		b := r.Body()
		if !json.Valid(b) {
			t.Fatalf("body is not JSON: %s", b)
		}
		if again := r.Body(); !bytes.Equal(b, again) {
			t.Fatalf("body changed: %s then %s", b, again)
		}
		if !failed {
			var v struct {
				Object  string `json:"object"`
				Choices []any  `json:"choices"`
			}
			if err := json.Unmarshal(b, &v); err != nil || v.Object == "" {
				t.Fatalf("body %s: %v", b, err)
			}
		}
		_ = r.Finished()
	})
}

// BenchmarkReassembler reassembles a 256-token vLLM chat stream with logprobs.
func BenchmarkReassembler(b *testing.B) {
	events := [][]byte{[]byte(chatRoleChunk)}
	for i := range 256 {
		events = append(events, fmt.Appendf(nil, chatHead+`{"index":0,"delta":{"content":"tok%d "},"logprobs":{"content":[{"token":"tok%d ","logprob":-0.%04d,"bytes":[116,111,107,32],"top_logprobs":[]}]},"finish_reason":null}]}`, i, i, i+1))
	}
	events = append(events, []byte(chatChunk(`{}`, "stop")), []byte(chatUsageChunk))
	n := 0
	for _, e := range events {
		n += len(e)
	}
	b.SetBytes(int64(n))
	b.ReportAllocs()
	r := NewReassembler(false)
	for b.Loop() {
		r.Reset(false)
		for _, e := range events {
			if err := r.Add(e); err != nil {
				b.Fatal(err)
			}
		}
		_ = r.Body()
	}
}

// BenchmarkReassemble reassembles a realistic vLLM 0.10.1 chat stream: the role chunk,
// 200 content chunks of one token each, the finish chunk and the usage chunk, then builds
// the body, as a gateway does for each observed non-streaming request.
func BenchmarkReassemble(b *testing.B) {
	events := [][]byte{[]byte(chatRoleChunk)}
	for i := range 200 {
		events = append(events, []byte(chatChunk(fmt.Sprintf(`{"content":" tok%d"}`, i), "")))
	}
	events = append(events, []byte(chatChunk(`{}`, "stop")),
		[]byte(chatHead+`],"usage":{"prompt_tokens":31,"total_tokens":231,"completion_tokens":200}}`))
	n := 0
	for _, e := range events {
		n += len(e)
	}
	b.SetBytes(int64(n))
	b.ReportAllocs()
	r := NewReassembler(false)
	for b.Loop() {
		r.Reset(false)
		for _, e := range events {
			if err := r.Add(e); err != nil {
				b.Fatal(err)
			}
		}
		if len(r.Body()) == 0 {
			b.Fatal("empty body")
		}
	}
}

// TestReassembleMatchesEngineNonStreaming is the differential test: for each request, the
// simulated vLLM engine answers once without streaming and once streaming with the usage
// chunk, under the same X-Request-Id, and the stream reassembled must equal the
// non-streaming body field by field, in the same key order.
func TestReassembleMatchesEngineNonStreaming(t *testing.T) {
	srv := simServer(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 5})
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)

	const (
		chatPrompt = `{"model":"m","messages":[{"role":"user","content":"say hello please"}]`
		cmplPrompt = `{"model":"m","prompt":"say hello please"`
	)
	tests := []struct {
		name, path, body, fault string
		bodyID                  bool // the id comes from the body's request_id, not the header
		// malformed: the stream has one invalid event (the malformed fault), which add
		// reports and which a caller that skips it can go on past.
		malformed bool
	}{
		{name: "chat", path: "/v1/chat/completions", body: chatPrompt},
		{name: "chat max_tokens", path: "/v1/chat/completions", body: chatPrompt + `,"max_tokens":3`},
		{name: "chat max_completion_tokens", path: "/v1/chat/completions", body: chatPrompt + `,"max_completion_tokens":2`},
		{name: "chat reasoning", path: "/v1/chat/completions", body: chatPrompt, fault: "reasoning=2"},
		{name: "chat all reasoning", path: "/v1/chat/completions", body: chatPrompt + `,"max_tokens":2`, fault: "reasoning=2"},
		{name: "chat tool call", path: "/v1/chat/completions", body: chatPrompt, fault: "tool-call"},
		{name: "chat tool call only", path: "/v1/chat/completions", body: chatPrompt, fault: "tool-call,no-content"},
		{name: "chat reasoning and tool call", path: "/v1/chat/completions", body: chatPrompt, fault: "reasoning=1,tool-call"},
		{name: "chat no content", path: "/v1/chat/completions", body: chatPrompt, fault: "no-content"},
		{name: "chat logprobs", path: "/v1/chat/completions", body: chatPrompt + `,"logprobs":true`},
		{name: "chat top_logprobs 0", path: "/v1/chat/completions", body: chatPrompt + `,"logprobs":true,"top_logprobs":0`},
		{name: "chat top_logprobs 3 with reasoning", path: "/v1/chat/completions", body: chatPrompt + `,"logprobs":true,"top_logprobs":3`, fault: "reasoning=2"},
		{name: "chat top_logprobs 20 and a tool call", path: "/v1/chat/completions", body: chatPrompt + `,"logprobs":true,"top_logprobs":20,"max_tokens":2`, fault: "tool-call"},
		{name: "chat keep-alives, split reads", path: "/v1/chat/completions", body: chatPrompt + `,"max_tokens":2`, fault: "keepalive,trickle=0s"},
		{name: "chat n=1", path: "/v1/chat/completions", body: chatPrompt + `,"n":1`},
		{name: "chat malformed event skipped", path: "/v1/chat/completions", body: chatPrompt, fault: "malformed", malformed: true},
		{name: "chat body request_id", path: "/v1/chat/completions", body: chatPrompt + `,"request_id":"from-body"`, bodyID: true},
		{name: "completions", path: "/v1/completions", body: cmplPrompt},
		{name: "completions max_tokens", path: "/v1/completions", body: cmplPrompt + `,"max_tokens":2`},
		{name: "completions logprobs 2", path: "/v1/completions", body: cmplPrompt + `,"logprobs":2`},
		{name: "completions logprobs 0", path: "/v1/completions", body: cmplPrompt + `,"logprobs":0,"max_tokens":12`},
		{name: "completions no content with logprobs", path: "/v1/completions", body: cmplPrompt + `,"logprobs":1`, fault: "no-content"},
		{name: "completions token prompt", path: "/v1/completions", body: `{"model":"m","prompt":[1,2,3],"max_tokens":1`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reqID := "req-" + strings.ReplaceAll(tc.name, " ", "-")
			post := func(streamPart string) []byte {
				t.Helper()
				req, err := http.NewRequest(http.MethodPost, srv.URL+tc.path, strings.NewReader(tc.body+streamPart+"}"))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				if !tc.bodyID {
					req.Header.Set("X-Request-Id", reqID)
				}
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
			completions := tc.path == "/v1/completions"
			r, err := reassembleSSE(t, completions, post(`,"stream":true,"stream_options":{"include_usage":true}`), 0)
			if tc.malformed != errors.Is(err, ErrMalformedChunk) || (!tc.malformed && err != nil) {
				t.Fatalf("err = %v", err)
			}
			if tc.malformed {
				// The malformed fault's non-stream body is the invalid JSON itself.
				unary = post(`,"stream":false`)
				if json.Valid(unary) {
					t.Fatalf("non-stream body under malformed: %s", unary)
				}
				f := tc.fault
				tc.fault = ""
				unary = post(`,"stream":false`)
				tc.fault = f
			}
			if !r.Finished() {
				t.Error("stream not finished")
			}
			got := r.Body()

			wantID := map[bool]string{false: "chatcmpl-", true: "cmpl-"}[completions] + reqID
			if tc.bodyID {
				wantID = "chatcmpl-from-body"
			}
			if id := jsonField(t, unary, "id"); id != wantID {
				t.Errorf("non-stream id %q, want %q", id, wantID)
			}
			// created is each generation's arrival second, and these are two generations:
			// they differ when the requests straddle a second boundary. Everything else must
			// match, the id included (both come from the same X-Request-Id).
			t.Logf("non-stream:  %s\nreassembled: %s", unary, got)
			if diffs := diffJSON(unary, got, "created"); len(diffs) > 0 {
				t.Errorf("reassembled body differs from the non-stream body:\n%s\nnon-stream:  %s\nreassembled: %s", strings.Join(diffs, "\n"), unary, got)
			}
			if want, have := keyOrder(t, unary), keyOrder(t, got); !slices.Equal(want, have) {
				t.Errorf("key order\n%v\nwant\n%v", have, want)
			}
			// Both are the simulator's encoding/json bytes, so they are equal byte for byte too.
			if a, b := createdRe.ReplaceAll(unary, nil), createdRe.ReplaceAll(got, nil); !bytes.Equal(a, b) {
				t.Errorf("bytes differ:\n%s\n%s", a, b)
			}
		})
	}
}

// TestReassembleDiffHelpers checks that the differential test's comparisons see what they
// must: null against absent, a value's type and a number's spelling, and key order.
func TestReassembleDiffHelpers(t *testing.T) {
	for _, tc := range []struct{ a, b string }{
		{`{"a":null}`, `{}`},
		{`{"a":{"b":[1,2]}}`, `{"a":{"b":[1,2,3]}}`},
		{`{"a":"1"}`, `{"a":1}`},
		{`{"a":1.0}`, `{"a":1}`},
		{`{"created":1,"x":[{"y":null}]}`, `{"created":2,"x":[{"y":false}]}`},
	} {
		if len(diffJSON([]byte(tc.a), []byte(tc.b), "created")) == 0 {
			t.Errorf("diffJSON(%s, %s) found no difference", tc.a, tc.b)
		}
	}
	if d := diffJSON([]byte(`{"created":1,"a":[{"b":1}]}`), []byte(`{"a":[{"b":1}],"created":2}`), "created"); len(d) > 0 {
		t.Errorf("diffJSON of equal documents: %v", d)
	}
	got := keyOrder(t, []byte(`{"a":1,"b":[{"c":null,"d":{"e":[]}},{"f":"x"}],"g":{}}`))
	want := []string{".a", ".b", ".b.0.c", ".b.0.d", ".b.0.d.e", ".b.1.f", ".g"}
	if !slices.Equal(got, want) {
		t.Errorf("keyOrder = %v, want %v", got, want)
	}
}

// createdRe matches a body's created field.
var createdRe = regexp.MustCompile(`"created":[0-9]+`)

// jsonField returns the top-level string field key of the JSON object b.
func jsonField(t *testing.T, b []byte, key string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	s, _ := m[key].(string)
	return s
}

// diffJSON decodes a and b (numbers as their text) and lists the paths where they differ,
// skipping the top-level keys in ignore.
func diffJSON(a, b []byte, ignore ...string) []string {
	decode := func(p []byte) (any, error) {
		d := json.NewDecoder(bytes.NewReader(p))
		d.UseNumber()
		var v any
		return v, d.Decode(&v)
	}
	va, err := decode(a)
	if err != nil {
		return []string{"first: " + err.Error()}
	}
	vb, err := decode(b)
	if err != nil {
		return []string{"second: " + err.Error()}
	}
	if ma, ok := va.(map[string]any); ok {
		if mb, ok := vb.(map[string]any); ok {
			for _, k := range ignore {
				delete(ma, k)
				delete(mb, k)
			}
		}
	}
	var diffs []string
	var walk func(path string, x, y any)
	walk = func(path string, x, y any) {
		switch xv := x.(type) {
		case map[string]any:
			yv, ok := y.(map[string]any)
			if !ok {
				diffs = append(diffs, fmt.Sprintf("%s: %v vs %v", path, x, y))
				return
			}
			for k, v := range xv {
				w, ok := yv[k]
				if !ok {
					diffs = append(diffs, fmt.Sprintf("%s.%s: missing in the second", path, k))
					continue
				}
				walk(path+"."+k, v, w)
			}
			for k := range yv {
				if _, ok := xv[k]; !ok {
					diffs = append(diffs, fmt.Sprintf("%s.%s: missing in the first", path, k))
				}
			}
		case []any:
			yv, ok := y.([]any)
			if !ok || len(xv) != len(yv) {
				diffs = append(diffs, fmt.Sprintf("%s: %v vs %v", path, x, y))
				return
			}
			for i := range xv {
				walk(path+"."+strconv.Itoa(i), xv[i], yv[i])
			}
		default:
			if !reflect.DeepEqual(x, y) {
				diffs = append(diffs, fmt.Sprintf("%s: %v vs %v", path, x, y))
			}
		}
	}
	walk("", va, vb)
	slices.Sort(diffs)
	return diffs
}

// keyOrder lists the object keys of the JSON document b, each with its path, in the order
// they appear.
func keyOrder(t *testing.T, b []byte) []string {
	t.Helper()
	type frame struct {
		path      string
		object    bool
		expectKey bool   // object: the next string is a key
		key       string // object: the key of the value being read
		n         int    // array: the index of the next element
	}
	var (
		keys  []string
		stack []frame
	)
	// child returns the path of a value starting in the innermost container, and moves past it.
	child := func() string {
		if len(stack) == 0 {
			return ""
		}
		f := &stack[len(stack)-1]
		if f.object {
			f.expectKey = true
			return f.path + "." + f.key
		}
		f.n++
		return f.path + "." + strconv.Itoa(f.n-1)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return keys
		}
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if s, ok := tok.(string); ok && len(stack) > 0 && stack[len(stack)-1].object && stack[len(stack)-1].expectKey {
			f := &stack[len(stack)-1]
			f.key, f.expectKey = s, false
			keys = append(keys, f.path+"."+s)
			continue
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			stack = append(stack, frame{path: child(), object: tok == json.Delim('{'), expectKey: true})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		default:
			child()
		}
	}
}
