package gateway

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// vllmContextLength400 is vLLM's answer to a prompt and completion over
// max_model_len: serving_engine.py's _validate_input raises "This model's
// maximum context length is {max_model_len} tokens. However, you
// requested {max_tokens + token_num} tokens ({token_num} in the messages,
// {max_tokens} in the completion). Please reduce the length of the
// messages or completion." (vllm-project/vllm, commit 7ded96b3), answered
// by create_error_response as a 400 BadRequestError with code 400.
const vllmContextLength400 = `{"error":{"message":"This model's maximum context length is 8192 tokens. However, you requested 9000 tokens (1000 in the messages, 8000 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}}`

// ctxEngine is a fake vLLM engine serving model, whose GET /v1/models
// card carries maxLen (none when 0), /health answering 503 while down is
// set, and every /v1/ request counted in n and answered by h (nil: a
// chat completion naming the model the request named).
type ctxEngine struct {
	srv  *httptest.Server
	n    atomic.Int64
	down atomic.Bool
}

func newCtxEngine(t *testing.T, model string, maxLen int64, h http.HandlerFunc) *ctxEngine {
	t.Helper()
	e := &ctxEngine{}
	if h == nil {
		h = func(w http.ResponseWriter, r *http.Request) {
			var req struct {
				Model string `json:"model"`
			}
			_ = json.NewDecoder(r.Body).Decode(&req)
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{"id": "chatcmpl-1", "object": "chat.completion", "model": req.Model,
				"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": "hi"}, "finish_reason": "stop"}}})
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		if e.down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		card := map[string]any{"id": model, "object": "model"}
		if maxLen > 0 {
			card["max_model_len"] = maxLen
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": []any{card}})
	})
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		e.n.Add(1)
		h(w, r)
	})
	e.srv = httptest.NewServer(mux)
	t.Cleanup(func() {
		e.srv.CloseClientConnections()
		e.srv.Close()
	})
	return e
}

// status503 answers every request 503.
func status503(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = io.WriteString(w, `{"error":{"message":"overloaded","type":"ServiceUnavailableError","param":null,"code":503}}`)
}

// fallbackCounts returns switchboard.request.fallbacks by
// "model>fallback:reason".
func (h *harness) fallbackCounts() map[string]int64 {
	h.t.Helper()
	out := map[string]int64{}
	m, ok := findMetric(h.collect(), telemetry.FallbacksName)
	if !ok {
		return out
	}
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		model, _ := dp.Attributes.Value(telemetry.AttrModel)
		fb, _ := dp.Attributes.Value(telemetry.AttrFallback)
		why, _ := dp.Attributes.Value(telemetry.AttrFallbackReason)
		out[model.AsString()+">"+fb.AsString()+":"+why.AsString()] += dp.Value
	}
	return out
}

// chatFor is a chat request for model with max_tokens n (none when 0).
func chatFor(model string, n int) string {
	b := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]`
	if n > 0 {
		b += `,"max_tokens":` + itoa(n)
	}
	return b + `}`
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// answered decodes a chat completion's model field.
func answered(t *testing.T, body []byte) string {
	t.Helper()
	var out struct {
		Model string `json:"model"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	return out.Model
}

// TestFallbackWhenAllEnginesFail: both engines of model a answer 503 (a
// retry condition): the request is retried on the second, then, a's legs
// over, sent to its fallback b, whose answer the client gets with the
// fallback named; one slot per leg, each released.
func TestFallbackWhenAllEnginesFail(t *testing.T) {
	a1 := newCtxEngine(t, "a", 0, status503)
	a2 := newCtxEngine(t, "a", 0, status503)
	b := newCtxEngine(t, "b", 0, nil)
	cfg := testConfig(fleet.EngineConfig{Name: "a1", URL: a1.srv.URL}, fleet.EngineConfig{Name: "a2", URL: a2.srv.URL},
		fleet.EngineConfig{Name: "b1", URL: b.srv.URL})
	cfg.Models.Fallbacks = map[string][]string{"a": {"b"}}
	h := newHarness(t, cfg)
	code, hdr, body := h.do(http.MethodPost, "/v1/chat/completions", chatFor("a", 0))
	if code != http.StatusOK || answered(t, body) != "b" || hdr.Get(FallbackHeader) != "b" {
		t.Fatalf("status %d, model %q, %s %q; want 200 from b, header b: %s", code, answered(t, body), FallbackHeader, hdr.Get(FallbackHeader), body)
	}
	if n1, n2, nb := a1.n.Load(), a2.n.Load(), b.n.Load(); n1 != 1 || n2 != 1 || nb != 1 {
		t.Errorf("requests a1=%d a2=%d b1=%d, want 1 each", n1, n2, nb)
	}
	if got := h.fallbackCounts(); len(got) != 1 || got["a>b:failed"] != 1 {
		t.Errorf("fallbacks %v, want a>b:failed = 1", got)
	}
	if n := h.counter(telemetry.RetriesName); n != 1 {
		t.Errorf("retries = %d, want 1 (a1 -> a2; the fallback is not a retry)", n)
	}
	// Without a fallback that can take it, the last leg's 503 is the answer.
	b.down.Store(true)
	h.gw.fleet.ProbeNow(t.Context())
	code, hdr, body = h.do(http.MethodPost, "/v1/chat/completions", chatFor("a", 0))
	if code != http.StatusServiceUnavailable || hdr.Get(FallbackHeader) != "" || !strings.Contains(string(body), "overloaded") {
		t.Errorf("b down: status %d, %s %q, body %s; want a's own 503, no fallback", code, FallbackHeader, hdr.Get(FallbackHeader), body)
	}
	h.waitIdle()
}

// TestFallbackWhenNoneRoutable: no engine of a can take the request (its
// only engine unhealthy; then, healthy, at its max_in_flight): it goes to
// b at once, without a leg on a.
func TestFallbackWhenNoneRoutable(t *testing.T) {
	hold := make(chan struct{})
	held := make(chan struct{}, 1)
	a := newCtxEngine(t, "a", 0, func(w http.ResponseWriter, r *http.Request) {
		held <- struct{}{}
		<-hold
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"model":"a","choices":[]}`)
	})
	b := newCtxEngine(t, "b", 0, nil)
	cfg := testConfig(fleet.EngineConfig{Name: "a1", URL: a.srv.URL, MaxInFlight: 1}, fleet.EngineConfig{Name: "b1", URL: b.srv.URL})
	cfg.Models.Fallbacks = map[string][]string{"a": {"b"}}
	h := newHarness(t, cfg)
	a.down.Store(true)
	h.gw.fleet.ProbeNow(t.Context())
	code, hdr, body := h.do(http.MethodPost, "/v1/chat/completions", chatFor("a", 0))
	if code != http.StatusOK || answered(t, body) != "b" || hdr.Get(FallbackHeader) != "b" || a.n.Load() != 0 {
		t.Fatalf("a unhealthy: status %d, model %q, header %q, a got %d; want 200 from b and nothing on a", code, answered(t, body), hdr.Get(FallbackHeader), a.n.Load())
	}
	// a healthy again, its one slot taken by a request it holds.
	a.down.Store(false)
	h.gw.fleet.ProbeNow(t.Context())
	done := make(chan int, 1)
	go func() {
		code, _, _ := h.do(http.MethodPost, "/v1/chat/completions", chatFor("a", 0))
		done <- code
	}()
	<-held
	code, hdr, body = h.do(http.MethodPost, "/v1/chat/completions", chatFor("a", 0))
	if code != http.StatusOK || answered(t, body) != "b" || hdr.Get(FallbackHeader) != "b" {
		t.Errorf("a at max_in_flight: status %d, model %q, header %q; want 200 from b", code, answered(t, body), hdr.Get(FallbackHeader))
	}
	close(hold)
	if code := <-done; code != http.StatusOK {
		t.Errorf("the held request: %d, want 200", code)
	}
	if got := h.fallbackCounts(); len(got) != 1 || got["a>b:unavailable"] != 2 {
		t.Errorf("fallbacks %v, want a>b:unavailable = 2", got)
	}
	if n := a.n.Load(); n != 1 {
		t.Errorf("a got %d requests, want 1 (the held one)", n)
	}
	h.waitIdle()
}

// TestFallbackModelNamesItself: a client naming the alias "pub" (for a,
// whose engine fails) is answered by b: the body's model field names b
// (the engine was sent model b and answered as b; the alias does not
// hide it), streamed or not, and X-Switchboard-Fallback says b.
func TestFallbackModelNamesItself(t *testing.T) {
	a := newCtxEngine(t, "a", 0, status503)
	be, bs := sim(t, enginesim.Config{Models: []string{"b"}})
	cfg := testConfig(fleet.EngineConfig{Name: "a1", URL: a.srv.URL}, fleet.EngineConfig{Name: "b1", URL: bs.URL})
	cfg.Models.Aliases = map[string]string{"pub": "a"}
	cfg.Models.Fallbacks = map[string][]string{"pub": {"b"}}
	cfg.Retry.Backoff = time.Millisecond
	h := newHarness(t, cfg)
	code, hdr, body := h.do(http.MethodPost, "/v1/chat/completions", chatFor("pub", 4))
	if code != http.StatusOK || answered(t, body) != "b" || hdr.Get(FallbackHeader) != "b" {
		t.Fatalf("status %d, model %q, header %q; want 200, model b, header b: %s", code, answered(t, body), hdr.Get(FallbackHeader), body)
	}
	code, hdr, body = h.do(http.MethodPost, "/v1/chat/completions", `{"model":"pub","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
	if code != http.StatusOK || hdr.Get(FallbackHeader) != "b" || strings.Contains(string(body), `"model":"pub"`) || strings.Contains(string(body), `"model":"a"`) ||
		!strings.Contains(string(body), `"model":"b"`) || !strings.HasSuffix(strings.TrimSpace(string(body)), "data: [DONE]") {
		t.Errorf("stream: status %d, header %q; want every chunk naming b: %s", code, hdr.Get(FallbackHeader), body)
	}
	if n := be.Stats().Received; n != 2 {
		t.Errorf("b received %d requests, want 2", n)
	}
	if got := h.fallbackCounts(); got["pub>b:failed"] != 2 {
		t.Errorf("fallbacks %v, want pub>b:failed = 2", got)
	}
	// The server span says so.
	var events int
	for _, sp := range h.spans.Ended() {
		for _, ev := range sp.Events() {
			if ev.Name == telemetry.EventFallback {
				events++
			}
		}
	}
	if events != 2 {
		t.Errorf("%d fallback span events, want 2", events)
	}
	// Without the fallback, a's 503 reaches the client with no header.
	code, hdr, _ = h.do(http.MethodPost, "/v1/chat/completions", chatFor("a", 4))
	if code != http.StatusServiceUnavailable || hdr.Get(FallbackHeader) != "" {
		t.Errorf("a named (no fallback configured for it): status %d, header %q; want 503, none", code, hdr.Get(FallbackHeader))
	}
	h.waitIdle()
}

// TestFallbackOutageSkipsDeadPrimary: a's only engine stops (connections
// refused). A request that finds out spends its attempts on it (the fleet
// keeps a model's last engine until a health probe says it is down), then
// goes to b; once the next health probe has marked it down, every request
// goes straight to b: no leg, no retry, no back-off on a.
func TestFallbackOutageSkipsDeadPrimary(t *testing.T) {
	a := newCtxEngine(t, "a", 0, nil)
	b := newCtxEngine(t, "b", 0, nil)
	cfg := testConfig(fleet.EngineConfig{Name: "a1", URL: a.srv.URL}, fleet.EngineConfig{Name: "b1", URL: b.srv.URL})
	cfg.Models.Fallbacks = map[string][]string{"a": {"b"}}
	h := newHarness(t, cfg)
	a.srv.Close()
	code, hdr, body := h.do(http.MethodPost, "/v1/chat/completions", chatFor("a", 0))
	if code != http.StatusOK || answered(t, body) != "b" || hdr.Get(FallbackHeader) != "b" {
		t.Fatalf("first request: status %d, model %q, header %q; want 200 from b", code, answered(t, body), hdr.Get(FallbackHeader))
	}
	if got := h.fallbackCounts(); got["a>b:failed"] != 1 {
		t.Errorf("fallbacks %v, want a>b:failed = 1", got)
	}
	h.gw.fleet.ProbeNow(t.Context()) // the periodic health probe
	if _, err := h.gw.fleet.Lookup("a"); err == nil {
		t.Fatal("a still routable after a failed health probe")
	}
	retries := h.counter(telemetry.RetriesName)
	attempts := h.histCount(telemetry.RequestDurationName)
	for i := range 5 {
		code, hdr, body := h.do(http.MethodPost, "/v1/chat/completions", chatFor("a", 0))
		if code != http.StatusOK || answered(t, body) != "b" || hdr.Get(FallbackHeader) != "b" {
			t.Fatalf("request %d: status %d, model %q, header %q; want 200 from b", i, code, answered(t, body), hdr.Get(FallbackHeader))
		}
	}
	if n := h.counter(telemetry.RetriesName); n != retries {
		t.Errorf("retries went from %d to %d during the outage, want no change", retries, n)
	}
	if n := h.histCount(telemetry.RequestDurationName); n != attempts+5 {
		t.Errorf("attempts went from %d to %d, want +5 (one on b per request, none on a)", attempts, n)
	}
	if got := h.fallbackCounts(); got["a>b:unavailable"] != 5 {
		t.Errorf("fallbacks %v, want a>b:unavailable = 5", got)
	}
	h.waitIdle()
}

// TestFallbackPrimaryBackAfterRecovery: while a's engine is unhealthy its
// requests go to b; once it recovers, the gateway's own health probes (the
// default interval, 5 s) bring it back, and a serves its requests again
// well within 30 s, without any call to the fleet from the test.
func TestFallbackPrimaryBackAfterRecovery(t *testing.T) {
	a := newCtxEngine(t, "a", 0, nil)
	b := newCtxEngine(t, "b", 0, nil)
	cfg := testConfig(fleet.EngineConfig{Name: "a1", URL: a.srv.URL}, fleet.EngineConfig{Name: "b1", URL: b.srv.URL})
	cfg.Health.Interval = fleet.DefaultHealthConfig().Interval
	cfg.Models.Fallbacks = map[string][]string{"a": {"b"}}
	a.down.Store(true)
	h := newHarness(t, cfg) // the first probe round finds a down
	code, hdr, body := h.do(http.MethodPost, "/v1/chat/completions", chatFor("a", 0))
	if code != http.StatusOK || answered(t, body) != "b" || hdr.Get(FallbackHeader) != "b" {
		t.Fatalf("a down: status %d, model %q, header %q; want b", code, answered(t, body), hdr.Get(FallbackHeader))
	}
	recovered := time.Now()
	a.down.Store(false)
	var back time.Duration
	testutil.Eventually(t, 30*time.Second, func() bool {
		code, hdr, body := h.do(http.MethodPost, "/v1/chat/completions", chatFor("a", 0))
		if code == http.StatusOK && answered(t, body) == "a" && hdr.Get(FallbackHeader) == "" {
			back = time.Since(recovered)
			return true
		}
		return false
	}, "a not used again within 30 s of its recovery")
	if back > cfg.Health.Interval+2*time.Second {
		t.Errorf("a back after %s, want within one probe interval (%s)", back, cfg.Health.Interval)
	}
	h.waitIdle()
}

// TestMaxTokensOverContextRejected: a request whose max_tokens alone is
// over the model's max_model_len (8192, from /v1/models) is answered 400
// at once in the route's envelope, naming the field, without an engine
// slot; one that fits goes through, and a model whose max_model_len is
// unknown is not checked.
func TestMaxTokensOverContextRejected(t *testing.T) {
	a := newCtxEngine(t, "a", 8192, nil)
	u := newCtxEngine(t, "u", 0, nil)
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "a1", URL: a.srv.URL}, fleet.EngineConfig{Name: "u1", URL: u.srv.URL}))
	for _, tc := range []struct {
		path, body, param string
	}{
		{"/v1/chat/completions", chatFor("a", 9000), "max_tokens"},
		{"/v1/chat/completions", `{"model":"a","max_completion_tokens":8193,"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, "max_completion_tokens"},
		{"/v1/responses", `{"model":"a","input":"hi","max_output_tokens":9000}`, "max_output_tokens"},
	} {
		resp := h.post(tc.path, tc.body)
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s: status %d, want 400", tc.body, resp.StatusCode)
		}
		e := decodeErr(t, resp)
		if e.Error.Type != TypeInvalidRequest || e.code() != "context_length_exceeded" || e.Error.Param == nil || *e.Error.Param != tc.param ||
			!strings.Contains(e.Error.Message, "This model's maximum context length is 8192 tokens.") || !strings.HasPrefix(e.Error.Message, "'"+tc.param+"' is too large: ") {
			t.Errorf("%s: error %+v, want invalid_request_error context_length_exceeded, param %s, vLLM's message", tc.body, e.Error, tc.param)
		}
	}
	// Anthropic's envelope on /v1/messages.
	code, _, body := h.do(http.MethodPost, "/v1/messages", `{"model":"a","max_tokens":10000,"messages":[{"role":"user","content":"hi"}]}`)
	var ae struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &ae); err != nil || code != http.StatusBadRequest || ae.Type != "error" || ae.Error.Type != "invalid_request_error" ||
		ae.Error.Message != "'max_tokens' is too large: 10000. This model's maximum context length is 8192 tokens." {
		t.Errorf("/v1/messages: %d %s, want 400 in Anthropic's envelope", code, body)
	}
	if n := a.n.Load(); n != 0 {
		t.Errorf("the engine got %d requests, want 0", n)
	}
	if n := h.histCount(telemetry.RequestDurationName); n != 0 {
		t.Errorf("%d attempts recorded, want 0 (no engine slot taken)", n)
	}
	if code, _, _ := h.do(http.MethodPost, "/v1/chat/completions", chatFor("a", 8192)); code != http.StatusOK || a.n.Load() != 1 {
		t.Errorf("max_tokens = max_model_len: status %d, engine got %d; want 200, 1", code, a.n.Load())
	}
	if code, _, _ := h.do(http.MethodPost, "/v1/chat/completions", chatFor("u", 1<<20)); code != http.StatusOK || u.n.Load() != 1 {
		t.Errorf("unknown max_model_len: status %d, engine got %d; want 200, 1 (no check)", code, u.n.Load())
	}
	h.waitIdle()
}

// TestContextLength400NotRetried: an engine's context-length 400 reaches
// the client byte for byte, on the first engine asked, even with every
// retry condition on and another engine left: it would fail there too.
func TestContextLength400NotRetried(t *testing.T) {
	handler := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, vllmContextLength400)
	}
	a1 := newCtxEngine(t, "a", 8192, handler)
	a2 := newCtxEngine(t, "a", 8192, handler)
	cfg := testConfig(fleet.EngineConfig{Name: "a1", URL: a1.srv.URL}, fleet.EngineConfig{Name: "a2", URL: a2.srv.URL})
	cfg.MaxAttempts = 3
	cfg.Retry.On = []string{"connect-failure", "reset", "429", "500", "502", "503", "504"}
	cfg.Models.Fallbacks = map[string][]string{"a": {"b"}} // a failure fallback: not for a 400
	h := newHarness(t, cfg)
	code, hdr, body := h.do(http.MethodPost, "/v1/chat/completions", chatFor("a", 8000))
	if code != http.StatusBadRequest || string(body) != vllmContextLength400 || hdr.Get(FallbackHeader) != "" {
		t.Errorf("status %d, body %s, header %q; want vLLM's 400 unchanged", code, body, hdr.Get(FallbackHeader))
	}
	if n := a1.n.Load() + a2.n.Load(); n != 1 {
		t.Errorf("engines asked %d times, want 1", n)
	}
	if n := h.counter(telemetry.RetriesName); n != 0 {
		t.Errorf("retries = %d, want 0", n)
	}
	h.waitIdle()
}

// TestContextFallback: a request too long for a (max_model_len 8192) goes
// to the first model of a's context_fallbacks that is longer: a max_tokens
// over 8192 before any leg (a-mid, 4096, passed over; a-long, 32768,
// taken), and an engine's context-length 400 after a's leg; the answer
// names a-long. A request that fits stays on a.
func TestContextFallback(t *testing.T) {
	a := newCtxEngine(t, "a", 8192, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, vllmContextLength400)
	})
	mid := newCtxEngine(t, "a-mid", 4096, nil)
	long := newCtxEngine(t, "a-long", 32768, nil)
	cfg := testConfig(fleet.EngineConfig{Name: "a1", URL: a.srv.URL}, fleet.EngineConfig{Name: "mid1", URL: mid.srv.URL},
		fleet.EngineConfig{Name: "long1", URL: long.srv.URL})
	cfg.Models.ContextFallbacks = map[string][]string{"a": {"a-mid", "a-long"}}
	h := newHarness(t, cfg)
	code, hdr, body := h.do(http.MethodPost, "/v1/chat/completions", chatFor("a", 9000))
	if code != http.StatusOK || answered(t, body) != "a-long" || hdr.Get(FallbackHeader) != "a-long" || a.n.Load() != 0 {
		t.Fatalf("max_tokens 9000: status %d, model %q, header %q, a asked %d times; want a-long at once", code, answered(t, body), hdr.Get(FallbackHeader), a.n.Load())
	}
	// The engine's 400 (a prompt too long: max_tokens alone fits), to the
	// first model longer than a: a-mid is shorter.
	code, hdr, body = h.do(http.MethodPost, "/v1/chat/completions", chatFor("a", 100))
	if code != http.StatusOK || answered(t, body) != "a-long" || hdr.Get(FallbackHeader) != "a-long" || a.n.Load() != 1 {
		t.Errorf("engine 400: status %d, model %q, header %q, a asked %d times; want a-long after one leg on a", code, answered(t, body), hdr.Get(FallbackHeader), a.n.Load())
	}
	if n := mid.n.Load(); n != 0 {
		t.Errorf("a-mid got %d requests, want 0 (shorter than asked)", n)
	}
	if got := h.fallbackCounts(); len(got) != 1 || got["a>a-long:context"] != 2 {
		t.Errorf("fallbacks %v, want a>a-long:context = 2", got)
	}
	// No longer model left: the engine's 400 reaches the client as it is.
	long.down.Store(true)
	h.gw.fleet.ProbeNow(t.Context())
	code, _, body = h.do(http.MethodPost, "/v1/chat/completions", chatFor("a", 100))
	if code != http.StatusBadRequest || string(body) != vllmContextLength400 {
		t.Errorf("a-long down: status %d, body %s; want vLLM's 400 unchanged", code, body)
	}
	h.waitIdle()
}

// TestAccessLogFallback: the access-log line of a request answered by a
// fallback names it (fallback=b) beside the model the client asked for.
func TestAccessLogFallback(t *testing.T) {
	a := newCtxEngine(t, "a", 0, nil)
	b := newCtxEngine(t, "b", 0, nil)
	var buf testutil.LockedBuffer
	cfg := testConfig(fleet.EngineConfig{Name: "a1", URL: a.srv.URL}, fleet.EngineConfig{Name: "b1", URL: b.srv.URL})
	cfg.Models.Fallbacks = map[string][]string{"a": {"b"}}
	h := newHarnessWith(t, cfg, []Option{WithLogger(slog.New(slog.NewJSONHandler(&buf, nil)))})
	a.down.Store(true)
	h.gw.fleet.ProbeNow(t.Context())
	if code, _, _ := h.do(http.MethodPost, "/v1/chat/completions", chatFor("a", 0), "X-Request-Id", "r-fb"); code != http.StatusOK {
		t.Fatalf("status %d, want 200", code)
	}
	h.waitIdle()
	line := accessLine(&buf, "r-fb")
	if line == nil || line["model"] != "a" || line["fallback"] != "b" || line["engines"] != "b1" {
		t.Errorf("access-log line %v, want model a, fallback b, engines b1", line)
	}
}

// TestFallbacksConfigValidate: each problem of a fallback list is refused
// by name; cycles between lists are allowed (only the requested model's
// list is followed), and so is a model no engine serves.
func TestFallbacksConfigValidate(t *testing.T) {
	ok := ModelsConfig{Fallbacks: map[string][]string{"a": {"b"}, "b": {"a"}}, ContextFallbacks: map[string][]string{"a": {"nowhere"}}}
	if err := ok.Validate(); err != nil {
		t.Errorf("a cycle and an unserved model: %v, want nil", err)
	}
	for _, tc := range []struct {
		m    ModelsConfig
		want string
	}{
		{ModelsConfig{Fallbacks: map[string][]string{"a": {"a"}}}, `models.fallbacks: "a" lists itself`},
		{ModelsConfig{Fallbacks: map[string][]string{"a": {}}}, `models.fallbacks: "a": the list is empty`},
		{ModelsConfig{ContextFallbacks: map[string][]string{"a": {"b", "b"}}}, `models.context_fallbacks: "a" lists "b" twice`},
		{ModelsConfig{ContextFallbacks: map[string][]string{"a": {""}}}, `models.context_fallbacks: "a"[0]: "" is empty or has a control character`},
		{ModelsConfig{Fallbacks: map[string][]string{"a\n": {"b"}}}, `models.fallbacks: model "a\n": empty or has a control character`},
	} {
		err := tc.m.Validate()
		if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %s", tc.m, err, tc.want)
		}
	}
}
