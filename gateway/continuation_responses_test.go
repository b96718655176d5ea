package gateway

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// responsesStream is what a Responses API streaming client got.
type responsesStream struct {
	types   []string // event types, in order
	seqs    []int64  // sequence numbers, in order
	text    string   // output_text deltas, concatenated
	items   map[string]int
	ids     map[string]int // response ids in response.* lifecycle events
	final   map[string]json.RawMessage
	errors  int
	badData []string
}

// readResponsesStream reads a Responses API SSE body to its end.
func readResponsesStream(t *testing.T, resp *http.Response) responsesStream {
	t.Helper()
	defer resp.Body.Close()
	rs := responsesStream{items: map[string]int{}, ids: map[string]int{}}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type     string                     `json:"type"`
			Seq      *int64                     `json:"sequence_number"`
			Delta    string                     `json:"delta"`
			ItemID   string                     `json:"item_id"`
			Response map[string]json.RawMessage `json:"response"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			rs.badData = append(rs.badData, data)
			continue
		}
		rs.types = append(rs.types, ev.Type)
		if ev.Seq != nil {
			rs.seqs = append(rs.seqs, *ev.Seq)
		}
		switch ev.Type {
		case "error":
			rs.errors++
		case "response.output_text.delta":
			rs.text += ev.Delta
		}
		if ev.ItemID != "" {
			rs.items[ev.ItemID]++
		}
		if ev.Response != nil {
			var id string
			_ = json.Unmarshal(ev.Response["id"], &id)
			rs.ids[id]++
			if ev.Type == "response.completed" {
				rs.final = ev.Response
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	return rs
}

// responsesBody is a streamed Responses request of 8 output tokens with a
// 6-token prompt (instructions and input).
const responsesBody = `{"model":"m","instructions":"be brief","input":"a b c d","max_output_tokens":8,"stream":true,"store":false}`

// TestContinuationResponsesStream: a Responses API stream broken by its
// engine is continued from the text the client got (tokenized by the new
// engine): the client gets the same events an unbroken stream has, in the
// same order, with consecutive sequence numbers, one response id, one
// output item, the whole canonical text, and a response.completed whose
// response equals the unbroken one's but for its ids and time (status
// incomplete, max_output_tokens, the whole answer's usage).
func TestContinuationResponsesStream(t *testing.T) {
	whole := newRetryHarness(t, "", "", nil)
	want := readResponsesStream(t, whole.post("/v1/responses", responsesBody))
	if want.text != canonical(8) || want.final == nil {
		t.Fatalf("the unbroken stream: text %q, final %v", want.text, want.final)
	}
	for _, fault := range []string{"close-after=3", "reset-after=2", "stall-after=4", "close-after=7", "error-after=3", "drain-after=3"} {
		t.Run(fault, func(t *testing.T) {
			rh := newRetryHarness(t, fault, "", func(c *Config) { c.Timeouts.Idle = 100 * time.Millisecond })
			resp := rh.post("/v1/responses", responsesBody)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			got := readResponsesStream(t, resp)
			if got.text != canonical(8) || got.errors != 0 || len(got.badData) != 0 {
				t.Errorf("text %q errors %d unreadable %q, want %q", got.text, got.errors, got.badData, canonical(8))
			}
			if !reflect.DeepEqual(got.types, want.types) {
				t.Errorf("events\n%v\nwant\n%v", got.types, want.types)
			}
			for i, s := range got.seqs {
				if s != int64(i) {
					t.Errorf("sequence numbers %v, want 0..%d", got.seqs, len(got.types)-1)
					break
				}
			}
			if len(got.ids) != 1 || len(got.items) != 1 {
				t.Errorf("response ids %v, item ids %v: want one of each", got.ids, got.items)
			}
			for _, k := range []string{"status", "incomplete_details", "usage", "model", "object", "max_output_tokens", "instructions"} {
				if string(got.final[k]) != string(want.final[k]) {
					t.Errorf("response.completed %s = %s, want %s", k, got.final[k], want.final[k])
				}
			}
			var out []struct {
				ID      string
				Content []struct{ Type, Text string }
			}
			if err := json.Unmarshal(got.final["output"], &out); err != nil || len(out) != 1 || len(out[0].Content) != 1 || out[0].Content[0].Text != canonical(8) {
				t.Errorf("output %s", got.final["output"])
			}
			rh.waitIdle()
			if got := rh.migrations(); len(got) != 1 {
				t.Errorf("migrations %v, want one rescued", got)
			}
			rh.checkHandOver(t, "e1", "e2")
		})
	}
}

// TestOpenAIClientResponsesContinuation: openai-go reads a continued
// Responses stream as one answer: its events parse, and the final
// response has the whole text and usage.
func TestOpenAIClientResponsesContinuation(t *testing.T) {
	rh := newRetryHarness(t, "close-after=3", "", nil)
	client := openAIClient(rh.harness)
	stream := client.Responses.NewStreaming(clientCtx(t), responses.ResponseNewParams{
		Model:           "m",
		Instructions:    openai.String("be brief"),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("a b c d")},
		MaxOutputTokens: openai.Int(8),
		Store:           openai.Bool(false),
	})
	defer stream.Close()
	var text string
	var final *responses.Response
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "response.output_text.delta":
			text += ev.Delta
		case "response.completed":
			r := ev.Response
			final = &r
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream error: %v", err)
	}
	if text != canonical(8) || final == nil {
		t.Fatalf("text %q, final %v", text, final)
	}
	if final.OutputText() != canonical(8) || final.Usage.InputTokens != 6 || final.Usage.OutputTokens != 8 || final.Usage.TotalTokens != 14 {
		t.Errorf("final text %q usage %+v", final.OutputText(), final.Usage)
	}
	rh.waitIdle()
	if got := rh.migrations(); got["engine_disconnect/rescued"] != 1 {
		t.Errorf("migrations %v", got)
	}
}

// TestContinuationResponsesExclusions: Responses requests a continuation
// cannot reproduce (previous_response_id: TestExcludedResponses) end, at a break, with the error event, counted by
// reason, and the other engine gets nothing.
func TestContinuationResponsesExclusions(t *testing.T) {
	for _, tc := range []struct{ name, body, fault, want string }{
		{"store", `"store":true,"input":"a"`, "", exclStored},
		{"reasoning asked", `"store":false,"reasoning":{"effort":"low"},"input":"a"`, "", exclReasoning},
		{"json schema", `"store":false,"text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"}}},"input":"a"`, "", exclStructured},
		{"tools", `"store":false,"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"input":"a"`, "", exclTools},
		{"function call output", `"store":false,"input":[{"role":"user","content":"a"},{"type":"function_call_output","call_id":"c","output":"x"}]`, "", exclTools},
		{"image", `"store":false,"input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AA=="}]}]`, "", exclMultimodal},
		{"logprobs", `"store":false,"include":["message.output_text.logprobs"],"input":"a"`, "", exclLogprobs},
		{"reasoning streamed", `"store":false,"input":"a"`, "reasoning=2,", exclReasoning},
		{"the engine's error event", `"store":true,"input":"a"`, "error-after=2,", exclStored},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rh := newRetryHarness(t, tc.fault+"close-after=3", "", nil)
			got := readResponsesStream(t, rh.post("/v1/responses", `{"model":"m","max_output_tokens":8,"stream":true,`+tc.body+`}`))
			if got.errors != 1 || got.final != nil {
				t.Errorf("events %v: want the error event and no response.completed", got.types)
			}
			rh.waitIdle()
			if got := rh.exclusions(); got[tc.want] != 1 || len(got) != 1 {
				t.Errorf("exclusions %v, want %s 1", got, tc.want)
			}
			if n := rh.e2.Stats().Received; n != 0 {
				t.Errorf("e2 got %d requests", n)
			}
		})
	}
}

// TestExcludedResponses: the arrival exclusions of Responses bodies, and
// the bodies that are continued.
func TestExcludedResponses(t *testing.T) {
	for body, want := range map[string]string{
		`{"input":"a"}`: "",
		`{"input":"a","store":false,"previous_response_id":null}`:                                                      "",
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"a"}]}]}`:                                     "",
		`{"input":[{"type":"message","role":"user","content":"a"}]}`:                                                   "",
		`{"input":"a","previous_response_id":"resp_1"}`:                                                                exclStored,
		`{"input":"a","store":true}`:                                                                                   exclStored,
		`{"input":"a","background":true}`:                                                                              exclStored,
		`{"input":"a","stop":["x"]}`:                                                                                   exclStop,
		`{"input":"a","top_logprobs":2}`:                                                                               exclLogprobs,
		`{"input":"a","text":{"format":{"type":"json_object"}}}`:                                                       exclStructured,
		`{"input":"a","text":{"format":{"type":"text"}}}`:                                                              "",
		`{"input":"a","tools":[{"type":"function"}],"tool_choice":"none"}`:                                             exclTools,
		`{"input":[{"role":"assistant","content":[{"type":"output_text","text":"x"}]},{"role":"user","content":"a"}]}`: "",
		`{"input":[{"type":"reasoning","summary":[]}]}`:                                                                exclTools,
	} {
		if got := excludedBy(migrateResponses, []byte(body), false); got != want {
			t.Errorf("%s: %q, want %q", body, got, want)
		}
	} // migration.responses_store: the engines store what is not store false.
	for body, want := range map[string]string{
		`{"input":"a"}`:               exclStored,
		`{"input":"a","store":false}`: "",
		`{"input":"a","store":true}`:  exclStored,
	} {
		if got := excludedBy(migrateResponses, []byte(body), true); got != want {
			t.Errorf("responses_store, %s: %q, want %q", body, got, want)
		}
	}
}

// TestContinuationResponsesAfterHeldError: an engine that sends, in one
// write, its error event and then more output: nothing after the held
// error counts (no text kept, no sequence number taken), so the client
// gets the canonical answer once, with consecutive sequence numbers, from
// the continuation.
func TestContinuationResponsesAfterHeldError(t *testing.T) {
	e1 := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		sw := newSSE(w)
		ev := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
		sw.raw(ev("response.created", `{"response":{"id":"resp_1","object":"response","created_at":1,"model":"m","status":"in_progress","output":[],"usage":null},"sequence_number":0,"type":"response.created"}`))
		sw.raw(ev("response.output_item.added", `{"item":{"id":"msg_1","content":[],"role":"assistant","status":"in_progress","type":"message"},"output_index":0,"sequence_number":1,"type":"response.output_item.added"}`))
		sw.raw(ev("response.content_part.added", `{"content_index":0,"item_id":"msg_1","output_index":0,"part":{"annotations":[],"text":"","type":"output_text","logprobs":[]},"sequence_number":2,"type":"response.content_part.added"}`))
		sw.raw(ev("response.output_text.delta", `{"content_index":0,"delta":"tok0 ","item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":3,"type":"response.output_text.delta"}`))
		sw.raw(ev("response.output_text.delta", `{"content_index":0,"delta":"tok1 ","item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":4,"type":"response.output_text.delta"}`))
		sw.raw(ev("error", `{"type":"error","code":"InternalServerError","message":"Internal server error","param":null,"sequence_number":5}`) +
			ev("response.output_text.delta", `{"content_index":0,"delta":"tok2 ","item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":6,"type":"response.output_text.delta"}`))
	})
	_, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: e1.URL, Models: []string{"m"}}, fleet.EngineConfig{Name: "e2", URL: s2.URL, Models: []string{"m"}})
	h := newHarness(t, cfg, withPolicy(firstPolicy{}))
	got := readResponsesStream(t, h.post("/v1/responses", strings.Replace(responsesBody, `"instructions":"be brief",`, "", 1)))
	if got.text != canonical(8) || got.errors != 0 || got.final == nil {
		t.Fatalf("text %q errors %d final %v", got.text, got.errors, got.final != nil)
	}
	for i, s := range got.seqs {
		if s != int64(i) {
			t.Fatalf("sequence numbers %v", got.seqs)
		}
	}
	var out []struct {
		Content []struct{ Text string }
	}
	if err := json.Unmarshal(got.final["output"], &out); err != nil || len(out) != 1 || out[0].Content[0].Text != canonical(8) {
		t.Errorf("response.completed output %s", got.final["output"])
	}
	h.waitIdle()
}

// TestContinuationGarbageOnContinuationLeg: a continuation engine's
// unreadable chunk is not in the client's framing and is dropped (counted
// as a parse error): openai-go reads the continued Responses stream to
// its end.
func TestContinuationGarbageOnContinuationLeg(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}, Fault: "close-after=2"})
	e2 := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		sw := newSSE(w)
		sw.data(`{"not json`)
		sw.data(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"tok2 ","logprobs":null,"finish_reason":"length","stop_reason":null}]}`)
		sw.data(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}`)
		sw.data(`[DONE]`)
	})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /tokenize", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, `{"count":2,"max_model_len":8192,"tokens":[1,2],"token_strs":null}`)
	})
	mux.Handle("/", httputil.NewSingleHostReverseProxy(mustURL(t, e2.URL)))
	front := httptest.NewServer(mux)
	t.Cleanup(front.Close)
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}, fleet.EngineConfig{Name: "e2", URL: front.URL, Models: []string{"m"}})
	h := newHarness(t, cfg, withPolicy(firstPolicy{}))
	client := openAIClient(h)
	stream := client.Responses.NewStreaming(clientCtx(t), responses.ResponseNewParams{
		Model:           "m",
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("a b")},
		MaxOutputTokens: openai.Int(3),
		Store:           openai.Bool(false),
	})
	defer stream.Close()
	var text string
	for stream.Next() {
		if ev := stream.Current(); ev.Type == "response.output_text.delta" {
			text += ev.Delta
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream error: %v", err)
	}
	if text != canonical(3) {
		t.Errorf("text %q, want %q", text, canonical(3))
	}
	h.waitIdle()
	if n := h.counter(telemetry.ParseErrorsName); n != 1 {
		t.Errorf("%d parse errors, want the garbage chunk", n)
	}
}
