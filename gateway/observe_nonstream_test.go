package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// TestObserveNonStreamingBody: with server.observe_non_streaming, a
// non-streaming chat or completions request goes to the engine as a
// stream and the client gets the body the engine would have sent for the
// same request without it (compared field by field with the same
// X-Request-Id, the request id being the simulator's seed of ids; created
// is a clock reading and is ignored), with Content-Length; every one of
// them records a TTFT sample and releases its slot from decode; the
// gateway without the option and without continuation (which observes
// continuable requests itself) records none.
func TestObserveNonStreamingBody(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}, TTFT: 5 * time.Millisecond, ITL: time.Millisecond, OutputTokens: 6})
	plainCfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	obsCfg := plainCfg
	plainCfg.Migration.Limit = 0
	obsCfg.ObserveNonStreaming = true
	plain, obs := newHarness(t, plainCfg), newHarness(t, obsCfg)

	cases := []struct{ name, path, body, fault string }{
		{"chat", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi there"}]}`, ""},
		{"chat stream false, max_tokens cut", "/v1/chat/completions", `{"model":"m","stream":false,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, ""},
		{"chat logprobs", "/v1/chat/completions", `{"model":"m","logprobs":true,"top_logprobs":2,"messages":[{"role":"user","content":"hi"}]}`, ""},
		{"chat reasoning", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "reasoning=2"},
		{"chat tool call", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "tool-call"},
		{"completions", "/v1/completions", `{"model":"m","prompt":"once upon","logprobs":2}`, ""},
		{"completions split reads", "/v1/completions", `{"model":"m","prompt":"once upon","max_tokens":4}`, "trickle=0s"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := "obs-" + strings.ReplaceAll(tc.name, " ", "-")
			hdr := []string{"X-Request-Id", id}
			if tc.fault != "" {
				hdr = append(hdr, "X-Enginesim-Fault", tc.fault)
			}
			get := func(h *harness) (map[string]any, *http.Response) {
				resp := h.post(tc.path, tc.body, hdr...)
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("status %d: %s", resp.StatusCode, b)
				}
				if resp.Header.Get("Content-Type") != "application/json" || resp.ContentLength != int64(len(b)) {
					t.Errorf("Content-Type %q, Content-Length %d for %d bytes", resp.Header.Get("Content-Type"), resp.ContentLength, len(b))
				}
				var m map[string]any
				if err := json.Unmarshal(b, &m); err != nil {
					t.Fatalf("%v: %s", err, b)
				}
				delete(m, "created")
				return m, resp
			}
			want, _ := get(plain)
			got, _ := get(obs)
			if !reflect.DeepEqual(got, want) {
				gb, _ := json.Marshal(got)
				wb, _ := json.Marshal(want)
				t.Errorf("reassembled body differs from the engine's:\n got %s\nwant %s", gb, wb)
			}
			if n := obs.histCount(telemetry.TimeToFirstTokenName); n != uint64(i+1) {
				t.Errorf("observing gateway: %d TTFT samples after %d requests", n, i+1)
			}
			if n := plain.histCount(telemetry.TimeToFirstTokenName); n != 0 {
				t.Errorf("plain gateway recorded %d TTFT samples for non-streaming requests", n)
			}
			obs.assertIdle()
		})
	}
	// Every observed attempt ended in decode (it had a first token) and
	// recorded its token usage.
	for _, sp := range obs.spans.Ended() {
		if !strings.HasPrefix(sp.Name(), "chat ") && !strings.HasPrefix(sp.Name(), "text_completion ") {
			continue
		}
		attrs := map[string]string{}
		for _, kv := range sp.Attributes() {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		if attrs["switchboard.released_phase"] != "decode" || attrs["gen_ai.request.stream"] != "true" || attrs["gen_ai.usage.output_tokens"] == "" {
			t.Errorf("observed span %s: %v", sp.Name(), attrs)
		}
	}
}

// TestObserveNonStreamingFailures: an observed request that fails gets a
// real status and releases its slot: the engine's in-band error event
// becomes its error object with its code; a stream cut before its end is a
// 502; a request with prompt_logprobs (which vLLM refuses on a stream) or
// with stream_options is sent as it came.
func TestObserveNonStreamingFailures(t *testing.T) {
	var seen atomic.Value
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seen.Store(string(b))
		switch {
		case strings.Contains(string(b), `"cut"`):
			s := newSSE(w)
			s.data(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"a"},"finish_reason":null}]}`)
			panic(http.ErrAbortHandler)
		case strings.Contains(string(b), `"slow"`):
			// vLLM's silence while the request waits in its queue and
			// prefills: longer than the idle timeout, within first_token.
			s := newSSE(w)
			s.data(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`)
			time.Sleep(400 * time.Millisecond)
			s.data(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"late"},"finish_reason":"stop"}]}`)
			s.data(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":1,"total_tokens":2,"completion_tokens":1}}`)
			s.data(`[DONE]`)
		case strings.Contains(string(b), `"huge"`):
			// One event over the scanner's 1 MiB event limit: skipped by
			// the scanner, so the body would lose it.
			s := newSSE(w)
			s.data(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 1<<20+10) + `"},"finish_reason":null}]}`)
			s.data(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" end"},"finish_reason":"stop"}]}`)
			s.data(`[DONE]`)
		case strings.Contains(string(b), `"boom"`):
			s := newSSE(w)
			s.data(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}`)
			s.data(`{"error":{"message":"engine overloaded","type":"ServiceUnavailableError","param":null,"code":503}}`)
			s.data(`[DONE]`)
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"plain"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
		}
	})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL, Models: []string{"m"}})
	cfg.ObserveNonStreaming = true
	cfg.Timeouts.Idle = 150 * time.Millisecond
	cfg.MaxResponseBufferBytes = 4 << 20
	h := newHarness(t, cfg)

	resp0 := h.post("/v1/chat/completions", `{"model":"m","user":"slow","messages":[{"role":"user","content":"x"}]}`)
	b0, _ := io.ReadAll(resp0.Body)
	resp0.Body.Close()
	if resp0.StatusCode != 200 || !strings.Contains(string(b0), `"late"`) {
		t.Errorf("silence before the first token: status %d %s; want 200 (first_token bounds it, not idle)", resp0.StatusCode, b0)
	}
	resp0 = h.post("/v1/chat/completions", `{"model":"m","user":"huge","messages":[{"role":"user","content":"x"}]}`)
	if e := decodeErr(t, resp0); resp0.StatusCode != 502 || e.code() != ErrTypeStreamError {
		t.Errorf("an event over the scanner's limit: status %d %+v; want 502 %s, never a 200 without it", resp0.StatusCode, e, ErrTypeStreamError)
	}

	resp := h.post("/v1/chat/completions", `{"model":"m","user":"boom","messages":[{"role":"user","content":"x"}]}`)
	if e := decodeErr(t, resp); resp.StatusCode != 503 || e.Error.Message != "engine overloaded" {
		t.Errorf("error event: status %d, %+v; want 503 with the engine's error", resp.StatusCode, e)
	}
	if b := seen.Load().(string); !strings.Contains(b, `"stream":true`) || !strings.Contains(b, `"include_usage":true`) {
		t.Errorf("engine got %s: want a stream with usage", b)
	}
	resp = h.post("/v1/chat/completions", `{"model":"m","user":"cut","stream":false,"messages":[{"role":"user","content":"x"}]}`)
	if e := decodeErr(t, resp); resp.StatusCode != 502 || e.code() != ErrTypeEngineDisconnect {
		t.Errorf("cut stream: status %d, %+v; want 502 %s", resp.StatusCode, e, ErrTypeEngineDisconnect)
	}
	if b := seen.Load().(string); !strings.Contains(b, `"stream":true,`) || strings.Contains(b, `"stream":false`) {
		t.Errorf("engine got %s: want stream:false replaced by true", b)
	}
	for _, body := range []string{
		`{"model":"m","prompt_logprobs":1,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}`,
	} {
		resp = h.post("/v1/chat/completions", body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"plain"`) || seen.Load().(string) != body {
			t.Errorf("%s: status %d %s; engine got %s; want it sent unchanged", body, resp.StatusCode, b, seen.Load())
		}
	}
	h.assertIdle()
	if et := h.errorTypes(); et[ErrTypeStreamError] != 2 || et[ErrTypeEngineDisconnect] != 1 {
		t.Errorf("error types %v", et)
	}
}

// TestObserveNonStreamingFaults runs the engine faults against observed
// non-streaming requests: each gets one real status (never a cut body:
// nothing reaches the client before the stream ends), its slot is released
// exactly once, from decode when a token had come and from prefill when
// not, and the gauges end at 0 and are never negative.
func TestObserveNonStreamingFaults(t *testing.T) {
	cases := []struct {
		fault   string
		status  int
		errType string
		phase   routing.Phase
	}{
		{"", 200, "", routing.PhaseDecode},
		{"keepalive,trickle=0s", 200, "", routing.PhaseDecode},
		{"no-content", 200, "", routing.PhasePrefill},
		{"close-after=2", 502, ErrTypeEngineDisconnect, routing.PhaseDecode},
		{"close-after-headers", 502, ErrTypeEngineDisconnect, routing.PhasePrefill},
		{"close-before-headers", 502, ErrTypeEngineDisconnect, routing.PhasePrefill},
		{"truncate", 502, ErrTypeEngineDisconnect, routing.PhaseDecode},
		{"stall-after=2", 504, ErrTypeIdleTimeout, routing.PhaseDecode},
		{"malformed", 502, ErrTypeStreamError, routing.PhasePrefill}, // the bad event precedes the first token; the answer is given at once
		{"status=503", 503, "503", routing.PhasePrefill},
	}
	for _, tc := range cases {
		t.Run(tc.fault, func(t *testing.T) {
			_, srv := sim(t, enginesim.Config{Models: []string{"m"}, TTFT: 5 * time.Millisecond, ITL: 5 * time.Millisecond, OutputTokens: 6})
			cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
			cfg.ObserveNonStreaming = true
			cfg.Timeouts.Idle = 300 * time.Millisecond
			cfg.MaxAttempts = 1
			h := newHarness(t, cfg)
			var released []routing.Phase
			var mu sync.Mutex
			h.gw.onRelease = func(_ string, p routing.Phase) { mu.Lock(); released = append(released, p); mu.Unlock() }
			hdr := []string{}
			if tc.fault != "" {
				hdr = append(hdr, enginesim.FaultHeader, tc.fault)
			}
			resp := h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, hdr...)
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("body cut: %v", err)
			}
			if resp.StatusCode != tc.status || !json.Valid(b) {
				t.Errorf("status %d, body %s; want %d with a JSON body", resp.StatusCode, b, tc.status)
			}
			h.waitIdle()
			mu.Lock()
			defer mu.Unlock()
			if len(released) != 1 || released[0] != tc.phase {
				t.Errorf("released %v, want once from %v", released, tc.phase)
			}
			et := h.errorTypes()
			delete(et, "") // the successes
			if tc.errType == "" && len(et) != 0 || tc.errType != "" && (et[tc.errType] != 1 || len(et) != 1) {
				t.Errorf("error types %v, want %q", et, tc.errType)
			}
		})
	}
}

// TestObserveNonStreamingBudget: the event data an observed request holds
// is reserved in the gateway-wide buffered-bytes budget; when it is full
// the client gets 503 gateway_overloaded, and what was reserved is given
// back.
func TestObserveNonStreamingBudget(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}, TTFT: time.Millisecond, ITL: time.Microsecond, OutputTokens: 1000})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	cfg.ObserveNonStreaming = true
	cfg.MaxBufferedBytes, cfg.MaxFormBytes, cfg.MaxBodyBytes, cfg.MaxResponseBufferBytes = 20<<10, 20<<10, 20<<10, 20<<10
	h := newHarness(t, cfg)
	// Other requests hold 16 KiB of the 20 KiB budget; the answer's 1000
	// tokens (about 6.9 KiB of text kept) need more than is left.
	const others = 16 << 10
	if !h.gw.buffered.take(others) {
		t.Fatal("budget")
	}
	resp := h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	if e := decodeErr(t, resp); resp.StatusCode != 503 || e.code() != ErrTypeOverloaded {
		t.Errorf("status %d %+v; want 503 %s", resp.StatusCode, e, ErrTypeOverloaded)
	}
	h.waitIdle()
	if used := h.gw.buffered.used.Load(); used != others {
		t.Errorf("%d bytes still reserved in the budget", used)
	}
	h.assertIdle()
}

// TestObserveChargesWhatIsKept: an observed answer is charged what its
// reassembler keeps (about its body), not its events' bytes: a 2000-token
// answer, whose stream is ~400 KiB of chunks but whose body is ~15 KiB,
// fits max_response_buffer_bytes 64 KiB, as it does when sent as it came.
func TestObserveChargesWhatIsKept(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}, TTFT: time.Millisecond, ITL: time.Microsecond})
	for _, observe := range []bool{false, true} {
		cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
		cfg.ObserveNonStreaming = observe
		cfg.MaxResponseBufferBytes = 64 << 10
		h := newHarness(t, cfg)
		status, _, body := h.do(http.MethodPost, "/v1/chat/completions", `{"model":"m","max_tokens":2000,"messages":[{"role":"user","content":"hi"}]}`)
		if status != http.StatusOK || !strings.Contains(string(body), `"completion_tokens":2000`) {
			t.Errorf("observe_non_streaming %v: status %d, body %.200s", observe, status, body)
		}
		h.waitIdle()
		if used := h.gw.buffered.used.Load(); used != 0 {
			t.Errorf("%d bytes still reserved in the budget", used)
		}
	}
}

// TestResponseBufferWithinBudget: a non-streaming response above the
// buffer cap is relayed whole (with the engine's length, or chunked), and
// every reservation it took in the buffered-bytes budget (the held prefix
// kept for its usage) is given back when the request ends.
func TestResponseBufferWithinBudget(t *testing.T) {
	big := `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("a", 100<<10) + `"}}]}`
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("chunked") == "" {
			w.Header().Set("Content-Length", strconv.Itoa(len(big)))
		}
		_, _ = io.WriteString(w, big)
	})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL})
	cfg.MaxBodyBytes = 16 << 10
	cfg.MaxFormBytes = 16 << 10
	cfg.MaxBufferedBytes = 64 << 10
	cfg.MaxResponseBufferBytes = 32 << 10
	h := newHarness(t, cfg)
	admin := httptest.NewServer(h.gw.AdminHandler(nil))
	defer admin.Close()
	for _, q := range []string{"", "?chunked=1"} {
		resp := h.post("/v1/chat/completions"+q, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || string(b) != big {
			t.Errorf("%q: status %d, %d bytes, %v: want the whole body", q, resp.StatusCode, len(b), err)
		}
	}
	h.waitIdle()
	var st struct {
		Buffered int64 `json:"buffered_bytes"`
		Requests int64 `json:"requests_in_flight"`
	}
	testutil.Poll(2*time.Second, func() bool {
		resp, err := http.Get(admin.URL + "/admin/engines")
		if err != nil {
			t.Fatal(err)
		}
		_ = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		return st.Buffered == 0 && st.Requests == 0
	})
	if st.Buffered != 0 || st.Requests != 0 {
		t.Errorf("after the requests: buffered %d bytes, %d requests, want 0 and 0", st.Buffered, st.Requests)
	}
}
