package gateway

import (
	"encoding/json"
	"maps"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// TestObserveMessagesBody: a non-streaming Messages request observed (by
// continuation, on by default, or by server.observe_non_streaming with
// continuation off) goes to the engine with "stream": true and nothing
// else added, and its client gets the body the engine answers the same
// request without streaming: the same content blocks (text; thinking,
// whose signature is drawn anew for each response, aside), stop_reason
// and usage, with Content-Length and no null member; a TTFT sample, the
// slot released from decode. The gateway that observes nothing passes the
// engine's body through with no TTFT sample.
func TestObserveMessagesBody(t *testing.T) {
	_, rec, srv := recordedSim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 6})
	plainCfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	plainCfg.Migration.Limit = 0
	optCfg := plainCfg
	optCfg.ObserveNonStreaming = true
	plain := newHarness(t, plainCfg)
	for _, obs := range []struct {
		name string
		h    *harness
	}{
		{"by continuation", newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}}))},
		{"by observe_non_streaming", newHarness(t, optCfg)},
	} {
		for _, tc := range []struct{ name, body, fault string }{
			{"end_turn", `{"model":"m","max_tokens":100,"system":"be brief","messages":[{"role":"user","content":"hi there"}]}`, ""},
			{"max_tokens, stream false", `{"model":"m","stream":false,"max_tokens":3,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, ""},
			{"thinking", `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`, "reasoning=2"},
			{"no content", `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`, "no-content"},
			{"split reads", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`, "trickle=0s"},
		} {
			t.Run(obs.name+"/"+tc.name, func(t *testing.T) {
				var hdr []string
				if tc.fault != "" {
					hdr = []string{enginesim.FaultHeader, tc.fault}
				}
				before := obs.h.histCount(telemetry.TimeToFirstTokenName)
				status, h, got := obs.h.do(http.MethodPost, "/v1/messages", tc.body, hdr...)
				if status != http.StatusOK {
					t.Fatalf("status %d: %s", status, got)
				}
				sent := string(rec.last().body)
				if !strings.HasSuffix(sent, `,"stream":true}`) && !strings.Contains(sent, `"stream":true,`) || strings.Contains(sent, "stream_options") || strings.Contains(sent, "return_token_ids") {
					t.Errorf("engine body %s, want the client's with stream true and nothing else", sent)
				}
				if h.Get("Content-Type") != "application/json" || h.Get("Content-Length") != strconv.Itoa(len(got)) {
					t.Errorf("Content-Type %q, Content-Length %q for %d bytes", h.Get("Content-Type"), h.Get("Content-Length"), len(got))
				}
				pstatus, _, want := plain.do(http.MethodPost, "/v1/messages", tc.body, hdr...)
				if pstatus != http.StatusOK || strings.Contains(string(rec.last().body), `"stream":true`) {
					t.Fatalf("plain: %d %s, engine body %s", pstatus, want, rec.last().body)
				}
				got, want = signatureRe.ReplaceAll(got, []byte(`"signature":"S"`)), signatureRe.ReplaceAll(want, []byte(`"signature":"S"`))
				if diffs := diffAnswers(t, got, want); len(diffs) > 0 {
					t.Errorf("observed body differs from the engine's: %v\n got %s\nwant %s", diffs, got, want)
				}
				if strings.Contains(string(got), "null") {
					t.Errorf("a null member: %s", got)
				}
				if n := obs.h.histCount(telemetry.TimeToFirstTokenName) - before; tc.fault != "no-content" && n != 1 {
					t.Errorf("%d TTFT samples, want 1", n)
				}
				obs.h.waitIdle()
			})
		}
	}
	if n := plain.histCount(telemetry.TimeToFirstTokenName); n != 0 {
		t.Errorf("the gateway that observes nothing recorded %d TTFT samples", n)
	}
}

// signatureRe matches a thinking block's signature, which the simulator
// draws anew for each response.
var signatureRe = regexp.MustCompile(`"signature":"[0-9a-f]*"`)

// TestObserveNotExcluded: a non-streaming request is observed only when it
// may be continued, or with server.observe_non_streaming: a continuable
// chat or Messages request reaches the engine as a stream; one excluded at
// arrival (logprobs, tools) goes as it came (no "stream": true), as every
// request does with continuation off or max_response_buffer_bytes 0; all
// answer 200.
func TestObserveNotExcluded(t *testing.T) {
	_, rec, srv := recordedSim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 3})
	const (
		chat     = `{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"hi"}]`
		messages = `{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"hi"}]`
		tools    = `,"tools":[{"name":"f","input_schema":{"type":"object"}}]`
	)
	for _, tc := range []struct {
		name, path, body string
		tune             func(*Config)
		observed         bool
	}{
		{"chat continuable", "/v1/chat/completions", chat + `}`, nil, true},
		{"chat logprobs", "/v1/chat/completions", chat + `,"logprobs":true}`, nil, false},
		{"chat tools", "/v1/chat/completions", chat + `,"tools":[{"type":"function","function":{"name":"f"}}]}`, nil, false},
		{"chat n 2", "/v1/chat/completions", chat + `,"n":2}`, nil, false},
		{"completions stop", "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":3,"stop":["x"]}`, nil, false},
		{"messages continuable", "/v1/messages", messages + `}`, nil, true},
		{"messages tools", "/v1/messages", messages + tools + `}`, nil, false},
		{"messages stop sequences", "/v1/messages", messages + `,"stop_sequences":["x"]}`, nil, false},
		{"chat logprobs, observe_non_streaming", "/v1/chat/completions", chat + `,"logprobs":true}`, func(c *Config) { c.ObserveNonStreaming = true }, true},
		{"messages tools, observe_non_streaming", "/v1/messages", messages + tools + `}`, func(c *Config) { c.ObserveNonStreaming = true }, true},
		{"continuation off", "/v1/chat/completions", chat + `}`, func(c *Config) { c.Migration.Limit = 0 }, false},
		{"messages, continuation off", "/v1/messages", messages + `}`, func(c *Config) { c.Migration.Limit = 0 }, false},
		{"no response buffer", "/v1/chat/completions", chat + `}`, func(c *Config) { c.MaxResponseBufferBytes = 0 }, false},
		{"migration.non_streaming false", "/v1/chat/completions", chat + `}`, func(c *Config) { c.Migration.NonStreaming = false }, false},
		{"stream_options without stream", "/v1/chat/completions", chat + `,"stream_options":{"include_usage":true}}`, nil, false},
		{"responses continuable", "/v1/responses", `{"model":"m","input":"hi","max_output_tokens":3}`, nil, true},
		{"responses store", "/v1/responses", `{"model":"m","input":"hi","max_output_tokens":3,"store":true}`, nil, false},
		{"responses background", "/v1/responses", `{"model":"m","input":"hi","max_output_tokens":3,"background":true}`, nil, false},
		{"responses background, observe_non_streaming", "/v1/responses", `{"model":"m","input":"hi","max_output_tokens":3,"background":true}`, func(c *Config) { c.ObserveNonStreaming = true }, false},
		{"responses store, observe_non_streaming", "/v1/responses", `{"model":"m","input":"hi","max_output_tokens":3,"store":true}`, func(c *Config) { c.ObserveNonStreaming = true }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
			if tc.tune != nil {
				tc.tune(&cfg)
			}
			h := newHarness(t, cfg)
			status, _, b := h.do(http.MethodPost, tc.path, tc.body)
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, b)
			}
			sent := string(rec.last().body)
			if streamed := strings.Contains(sent, `"stream":true`); streamed != tc.observed {
				t.Errorf("engine body %s: streamed %v, want %v", sent, streamed, tc.observed)
			}
			if !tc.observed && sent != tc.body {
				t.Errorf("engine body %s, want the client's %s", sent, tc.body)
			}
			if n := h.histCount(telemetry.TimeToFirstTokenName); (n == 1) != tc.observed {
				t.Errorf("%d TTFT samples, observed %v", n, tc.observed)
			}
			h.waitIdle()
		})
	}
}

// TestObserveMessagesErrors: an observed non-streaming Messages request
// that fails gets the error in Anthropic's envelope, as one JSON body: the
// engine's own error event (not continued: continuation off) with its
// status (api_error: 500) and message; a break whose continuation fails
// too (it breaks, its engine ends it with an error event or an abort, its
// engine's /tokenize fails), the gateway's 502 (api_error), counted.
func TestObserveMessagesErrors(t *testing.T) {
	body := `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"a b c d"}]}`
	t.Run("engine error event", func(t *testing.T) {
		rh := newRetryHarness(t, "error-after=3", "", func(c *Config) {
			c.Migration.Limit = 0
			c.ObserveNonStreaming = true
		})
		status, _, raw := rh.do(http.MethodPost, "/v1/messages", body)
		var e anthropicErr
		if err := json.Unmarshal(raw, &e); err != nil || status != http.StatusInternalServerError || e.Type != "error" ||
			e.Error.Type != "api_error" || e.Error.Message != "Internal server error" {
			t.Errorf("%d %s, want 500 with the engine's api_error in Anthropic's envelope", status, raw)
		}
		rh.waitIdle()
		if got := rh.migrations(); len(got) != 0 {
			t.Errorf("migrations %v, want none", got)
		}
		if et := rh.errorTypes(); et[ErrTypeStreamError] != 1 {
			t.Errorf("error types %v, want one stream_error", et)
		}
	})
	// A continuation that fails in each way, at migration.limit: the
	// client gets one Anthropic error object with the gateway's status,
	// never an event stream.
	for _, tc := range []struct {
		name       string
		tok        func(w http.ResponseWriter, r *http.Request)
		events     []string // the continuation engine's events (then it closes)
		migrations map[string]int64
	}{
		{name: "breaks too", events: []string{msgChunkOf(`"tok3 "`, "null")},
			migrations: map[string]int64{"engine_disconnect/failed": 1, "engine_disconnect/limit": 1}},
		{name: "its engine's error event", events: []string{msgChunkOf(`"tok3 "`, "null"), `{"error":{"message":"boom","type":"InternalServerError","code":500}}`, "[DONE]"},
			migrations: map[string]int64{"engine_disconnect/failed": 1, "stream_error/limit": 1}},
		{name: "its engine's abort", events: []string{msgChunkOf(`"tok3 "`, "null"), msgChunkOf(`""`, `"abort"`), "[DONE]"},
			migrations: map[string]int64{"engine_disconnect/failed": 1, "engine_abort/limit": 1}},
		{name: "tokenize fails", tok: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusInternalServerError) },
			migrations: map[string]int64{"engine_disconnect/failed": 1, "engine_disconnect/no_engine": 1}},
	} {
		t.Run("continuation "+tc.name, func(t *testing.T) {
			_, s1 := sim(t, enginesim.Config{Models: []string{"m"}, Fault: "close-after=3"})
			e2 := msgEngine(t, tc.tok, func(w http.ResponseWriter, r *http.Request) {
				sw := newSSE(w)
				for _, ev := range tc.events {
					sw.data(ev)
				}
			})
			h := msgHarness(t, nil, s1.URL, e2.URL)
			status, hdr, raw := h.do(http.MethodPost, "/v1/messages", body)
			var e anthropicErr
			if err := json.Unmarshal(raw, &e); err != nil || status != http.StatusBadGateway || hdr.Get("Content-Type") != "application/json" ||
				e.Type != "error" || e.Error.Type != "api_error" || e.Error.Message == "" {
				t.Errorf("%d %s %s, want a 502 in Anthropic's envelope", status, hdr.Get("Content-Type"), raw)
			}
			h.waitIdle()
			if got := h.migrations(); !maps.Equal(got, tc.migrations) {
				t.Errorf("migrations %v, want %v", got, tc.migrations)
			}
		})
	}
}

// TestAnthropicClientWholeContinuation: anthropic-sdk-go's non-streaming
// Messages.New gets the whole continued message as one: the canonical text,
// max_tokens, the whole usage.
func TestAnthropicClientWholeContinuation(t *testing.T) {
	rh := newRetryHarness(t, "reset-after=3", "", nil)
	client := anthropicClient(rh.harness)
	msg, err := client.Messages.New(clientCtx(t), messageParams("m", 8))
	if err != nil {
		t.Fatal(err)
	}
	if got := messageText(msg); got != canonical(8) || msg.StopReason != anthropic.StopReasonMaxTokens || len(msg.Content) != 1 {
		t.Errorf("text %q stop %q blocks %d, want %q max_tokens in one block", got, msg.StopReason, len(msg.Content), canonical(8))
	}
	if msg.Usage.InputTokens != 3 || msg.Usage.OutputTokens != 8 {
		t.Errorf("usage %d in / %d out, want 3 / 8", msg.Usage.InputTokens, msg.Usage.OutputTokens)
	}
	rh.waitIdle()
	if got := rh.migrations(); got["engine_disconnect/rescued"] != 1 || len(got) != 1 {
		t.Errorf("migrations %v, want engine_disconnect/rescued 1", got)
	}
}
