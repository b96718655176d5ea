package gateway

// Regression tests of the Anthropic Messages continuation (a review found
// each case failing): ends, block events, the prompt given to /tokenize,
// bounds and the seam.

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// msgEngine: an engine with /health, /v1/models, POST /tokenize (fixed ids,
// body recorded) and the given handler on /v1/.
func msgEngine(t *testing.T, tok func(w http.ResponseWriter, r *http.Request), h http.HandlerFunc) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
	})
	if tok == nil {
		tok = func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, `{"count":2,"max_model_len":8192,"tokens":[1,2]}`)
		}
	}
	mux.HandleFunc("POST /tokenize", tok)
	mux.HandleFunc("/v1/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	return srv
}

// msgChunk is a /v1/completions chunk of text %s and finish_reason %s
// (raw JSON values): msgChunkOf.
const msgChunk = `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":%s,"logprobs":null,"finish_reason":%s,"stop_reason":null}]}`

// msgChunkOf is msgChunk with text and finish (raw JSON values).
func msgChunkOf(text, finish string) string { return fmt.Sprintf(msgChunk, text, finish) }

func msgHarness(t *testing.T, tune func(*Config), urls ...string) *harness {
	var ecs []fleet.EngineConfig
	for i, u := range urls {
		ecs = append(ecs, fleet.EngineConfig{Name: "e" + string(rune('1'+i)), URL: u, Models: []string{"m"}})
	}
	cfg := testConfig(ecs...)
	if tune != nil {
		tune(&cfg)
	}
	return newHarness(t, cfg, withPolicy(firstPolicy{}))
}

const msgBody = `{"model":"m","max_tokens":6,"stream":true,"messages":[{"role":"user","content":"a b"}]}`

// The continuation engine's own end (an error event then [DONE], as vLLM
// sends it; or finish_reason "abort", usage, [DONE]) must end the
// message with an error event, not a clean message_stop.
func TestContinuationMessagesEngineEndIsError(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  []string
	}{
		{"error event", []string{`{"error":{"object":"error","message":"boom","type":"InternalServerError","code":500}}`}},
		{"abort", []string{msgChunkOf(`""`, `"abort"`),
			`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, s1 := sim(t, enginesim.Config{Models: []string{"m"}, Fault: "close-after=2"})
			e2 := msgEngine(t, nil, func(w http.ResponseWriter, r *http.Request) {
				sw := newSSE(w)
				sw.data(msgChunkOf(`"tok2 "`, "null"))
				for _, ev := range tc.end {
					sw.data(ev)
				}
				sw.data(`[DONE]`)
			})
			h := msgHarness(t, nil, s1.URL, e2.URL)
			as := readAnthropicStream(t, h.post("/v1/messages", msgBody))
			if as.errors != 1 || as.events["message_stop"] != 0 {
				t.Errorf("want an error event and no message_stop; got %v stop %v", as.events, as.stop)
			}
			h.waitIdle()
		})
	}
}

// limit 2: leg 2 aborts ([DONE] only) and is continued on e3: the
// client must still get the end of the message.
func TestContinuationMessagesSecondContinuationEnds(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}, Fault: "close-after=2"})
	e2 := msgEngine(t, nil, func(w http.ResponseWriter, r *http.Request) {
		sw := newSSE(w)
		sw.data(msgChunkOf(`"tok2 "`, "null"))
		sw.data(msgChunkOf(`""`, `"abort"`))
		sw.data(`[DONE]`)
	})
	_, s3 := sim(t, enginesim.Config{Models: []string{"m"}})
	h := msgHarness(t, func(c *Config) { c.Migration.Limit = 2 }, s1.URL, e2.URL, s3.URL)
	as := readAnthropicStream(t, h.post("/v1/messages", msgBody))
	t.Logf("events %v stop %v text %q last %q", as.events, as.stop, as.text, as.lastType)
	if as.events["message_stop"] != 1 || as.lastType != "message_stop" {
		t.Errorf("second continuation: want message_stop last; got %v last %q", as.events, as.lastType)
	}
	h.waitIdle()
}

// anthropicFirst: a Messages engine that sends the given events then closes.
func anthropicFirst(t *testing.T, events ...string) *httptest.Server {
	return msgEngine(t, nil, func(w http.ResponseWriter, r *http.Request) {
		sw := newSSE(w)
		for _, e := range events {
			typ := e[len(`{"type":"`):]
			typ = typ[:strings.IndexByte(typ, '"')]
			sw.raw("event: " + typ + "\ndata: " + e + "\n\n")
		}
		// close: EOF before message_stop
	})
}

const (
	evStart      = `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":2,"output_tokens":0}}}`
	evBlockStart = `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`
	evDelta      = `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"tok0 "}}`
	evBlockStop  = `{"type":"content_block_stop","index":0}`
)

// A break after message_start and before content_block_start (vLLM
// sends message_start on its role chunk, before prefill ends): the
// continuation's deltas come without a content_block_start.
func TestContinuationMessagesBreakBeforeBlockStart(t *testing.T) {
	e1 := anthropicFirst(t, evStart)
	_, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
	h := msgHarness(t, nil, e1.URL, s2.URL)
	client := anthropicClient(h)
	stream := client.Messages.NewStreaming(clientCtx(t), messageParams("m", 4))
	defer stream.Close()
	var acc anthropic.Message
	var accErr error
	var types []string
	for stream.Next() {
		types = append(types, string(stream.Current().Type))
		if err := acc.Accumulate(stream.Current()); err != nil && accErr == nil {
			accErr = err
		}
	}
	t.Logf("types %v stream err %v", types, stream.Err())
	if accErr != nil {
		t.Errorf("anthropic-sdk-go Accumulate: %v", accErr)
	}
	h.waitIdle()
}

// A break after content_block_stop (vLLM writes it, then message_delta):
// a delta after the block's stop and a second content_block_stop.
func TestContinuationMessagesBreakAfterBlockStop(t *testing.T) {
	e1 := anthropicFirst(t, evStart, evBlockStart, evDelta, evBlockStop)
	_, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
	h := msgHarness(t, nil, e1.URL, s2.URL)
	as := readAnthropicStream(t, h.post("/v1/messages", `{"model":"m","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"a b"}]}`))
	t.Logf("events %v text %q", as.events, as.text)
	if as.events["content_block_stop"] != 1 {
		t.Errorf("content_block_stop %d times (delta after a stopped block): %v", as.events["content_block_stop"], as.events)
	}
	h.waitIdle()
}

// Text blocks of one message are joined with "" for /tokenize; vLLM's
// /v1/messages passes them as content parts, which its chat template
// preprocessing joins with "\n" (string content format).
func TestContinuationMessagesTokenizeAsVLLM(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	e1 := anthropicFirst(t, evStart, evBlockStart, evDelta)
	e2 := msgEngine(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		_, _ = io.WriteString(w, `{"count":2,"max_model_len":8192,"tokens":[1,2]}`)
	}, func(w http.ResponseWriter, r *http.Request) {
		sw := newSSE(w)
		sw.data(msgChunkOf(`"tok1 "`, `"length"`))
		sw.data(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}`)
		sw.data(`[DONE]`)
	})
	h := msgHarness(t, nil, e1.URL, e2.URL)
	readAnthropicStream(t, h.post("/v1/messages", `{"model":"m","max_tokens":4,"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"first part"},{"type":"text","text":"second part","cache_control":{"type":"ephemeral"}}]}]}`))
	h.waitIdle()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("tokenize bodies: %q", bodies)
	if len(bodies) > 0 && strings.Contains(bodies[0], "first partsecond part") {
		t.Errorf("the two text blocks are glued together: %s", bodies[0])
	}
}

// A hostile continuation engine's non-string text goes out raw as the
// delta's text.
func TestContinuationMessagesNonStringText(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}, Fault: "close-after=2"})
	e2 := msgEngine(t, nil, func(w http.ResponseWriter, r *http.Request) {
		sw := newSSE(w)
		sw.data(msgChunkOf(`{"x":1}`, "null"))
		sw.data(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}`)
		sw.data(`[DONE]`)
	})
	h := msgHarness(t, nil, s1.URL, e2.URL)
	client := anthropicClient(h)
	stream := client.Messages.NewStreaming(clientCtx(t), messageParams("m", 6))
	defer stream.Close()
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Errorf("accumulate: %v (%s)", err, stream.Current().RawJSON())
		}
	}
	if err := stream.Err(); err != nil {
		t.Errorf("stream err: %v", err)
	}
	if got := messageText(&acc); got != canonical(2) {
		t.Errorf("text %q, want the first leg's %q and nothing of the non-string text", got, canonical(2))
	}
	h.waitIdle()
}

// A hung /tokenize is bounded by timeouts.response_header: the gateway
// gives up on it (the engine sees its request cancelled), counts the
// continuation failed and ends the message with the error event, long
// before the request timeout.
func TestContinuationMessagesTokenizeHang(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}, Fault: "close-after=2"})
	cancelled, release := make(chan struct{}, 2), make(chan struct{})
	e2 := msgEngine(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // read, as an engine does: net/http then sees the client leave
		select {
		case <-r.Context().Done():
			cancelled <- struct{}{}
		case <-release:
		}
	}, func(w http.ResponseWriter, r *http.Request) {})
	t.Cleanup(func() { close(release) }) // before the engine closes (cleanups run last first)
	h := msgHarness(t, func(c *Config) { c.Timeouts.ResponseHeader = 200 * time.Millisecond; c.Timeouts.Request = time.Minute }, s1.URL, e2.URL)
	as := readAnthropicStream(t, h.post("/v1/messages", msgBody))
	if as.errors != 1 || as.events["message_stop"] != 0 {
		t.Errorf("events %v: want the error event and no message_stop", as.events)
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second): // a deadline, not a wait: it comes at once
		t.Error("the hung /tokenize was not cancelled")
	}
	h.waitIdle()
	if got := h.migrations(); got["engine_disconnect/failed"] != 1 {
		t.Errorf("migrations %v, want engine_disconnect/failed 1", got)
	}
}

// The seam of a Messages continuation is recorded as a second TTFT,
// not as migration_gap (the first leg's cut.last is never set).
func TestContinuationMessagesSeamNotTTFT(t *testing.T) {
	rh := newRetryHarness(t, "close-after=3", "", nil)
	readAnthropicStream(t, rh.post("/v1/messages", `{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"a b c d"}]}`))
	rh.waitIdle()
	ttft := rh.histCount(telemetry.TimeToFirstTokenName)
	gap := rh.histCount(telemetry.MigrationGapName)
	t.Logf("ttft samples %d, migration_gap samples %d", ttft, gap)
	if ttft != 1 || gap != 1 {
		t.Errorf("want 1 TTFT and 1 migration_gap sample, got %d and %d", ttft, gap)
	}
}

// migration.max_tokens bounds "the token ids held for one request,
// prompt and generated"; a Messages continuation never checks it.
func TestContinuationMessagesPromptBounded(t *testing.T) {
	rh := newRetryHarness(t, "close-after=3", "", func(c *Config) { c.Migration.MaxTokens = 10 })
	prompt := strings.Repeat("w ", 200)
	as := readAnthropicStream(t, rh.post("/v1/messages", `{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"`+prompt+`"}]}`))
	rh.waitIdle()
	t.Logf("events %v migrations %v exclusions %v", as.events, rh.migrations(), rh.exclusions())
	if rh.exclusions()[exclMaxTokens] != 1 {
		t.Errorf("a 200-token prompt with migration.max_tokens 10 was continued: %v", rh.migrations())
	}
}
