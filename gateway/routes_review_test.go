package gateway

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
)

// TestLightStreamBoundByIdleNotFirstToken: GET /v1/responses/{id}?stream=true
// (a light route) relays an SSE stream whose events never count as content
// (a light attempt has no first token); its bytes are progress, so a steady
// stream is not cut at Timeouts.FirstToken (it was, once: the first-token
// timer was only disarmed by content).
func TestLightStreamBoundByIdleNotFirstToken(t *testing.T) {
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !strings.HasPrefix(r.URL.Path, "/v1/responses/") {
			http.NotFound(w, r)
			return
		}
		s := newSSE(w)
		for i := range 20 {
			s.raw(fmt.Sprintf("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"t%d\",\"sequence_number\":%d}\n\n", i, i))
			time.Sleep(50 * time.Millisecond)
		}
		s.raw("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"usage\":{\"input_tokens\":1,\"output_tokens\":20}}}\n\n")
	})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL, Models: []string{"m"}})
	cfg.Timeouts.FirstToken = 300 * time.Millisecond
	cfg.Timeouts.Idle = time.Minute
	h := newHarness(t, cfg)
	resp, err := h.client.Get(h.srv.URL + "/v1/responses/resp_1?stream=true")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "response.completed") || strings.Contains(string(b), "event: error") {
		t.Errorf("a steady 1 s stream on a light route was cut (first_token=300ms):\n%s", b)
	}
	h.waitIdle()
	if et := h.errorTypes(); et[ErrTypeFirstToken] != 0 {
		t.Errorf("error types %v", et)
	}
}

// TestStickyMissIsNotAnEngineError: a sticky lookup that asks an engine
// which does not hold the id (404, then found on the next engine) must not
// record the miss as a failed engine attempt (error.type "404") in
// switchboard.engine.request.duration: the request succeeded and no engine
// misbehaved.
func TestStickyMissIsNotAnEngineError(t *testing.T) {
	mk := func(has bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if !has || !strings.HasSuffix(r.URL.Path, "/resp_x") {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(404)
				_, _ = io.WriteString(w, `{"error":{"message":"not found","type":"invalid_request_error","param":null,"code":404}}`)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"resp_x","object":"response","status":"completed"}`)
		}
	}
	e1 := fakeEngine(t, []string{"m"}, mk(false))
	e2 := fakeEngine(t, []string{"m"}, mk(true))
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: e1.URL, Models: []string{"m"}}, fleet.EngineConfig{Name: "e2", URL: e2.URL, Models: []string{"m"}}))
	st, _, b := h.do(http.MethodGet, "/v1/responses/resp_x", "")
	if st != 200 {
		t.Fatalf("%d %s", st, b)
	}
	// An id no engine holds: 404 to the client, and still no engine error
	// (on the last engine asked either).
	if st, _, b := h.do(http.MethodGet, "/v1/responses/resp_gone", ""); st != 404 {
		t.Fatalf("unknown id: %d %s", st, b)
	}
	h.waitIdle()
	if et := h.errorTypes(); et["404"] != 0 || et[""] != 4 {
		t.Errorf("sticky misses counted as engine failures: error types %v, want 4 attempts without error", et)
	}
}

// TestUnflaggedStreamBoundByIdle: an engine that answers a request the
// client did not flag as a stream (speech) with event-stream headers, then
// goes silent, is cut by the idle timeout (not left holding its slot until
// the request timeout, with the attempt timeout stopped for the stream);
// nothing was relayed yet, so the client gets a 504.
func TestUnflaggedStreamBoundByIdle(t *testing.T) {
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		newSSE(w) // headers only
		<-r.Context().Done()
	})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL, Models: []string{"m"}})
	cfg.Timeouts.Idle = 200 * time.Millisecond
	cfg.Timeouts.Request = time.Minute
	h := newHarness(t, cfg)
	start := time.Now()
	st, _, b := h.do(http.MethodPost, "/v1/audio/speech", `{"model":"m","input":"hi","voice":"a"}`)
	if st != 504 || !strings.Contains(string(b), `"code":"idle_timeout"`) {
		t.Errorf("got %d %q, want 504 idle_timeout", st, b)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v", d)
	}
	h.waitIdle()
	if et := h.errorTypes(); et[ErrTypeIdleTimeout] != 1 {
		t.Errorf("error types %v, want one idle_timeout", et)
	}
}

// TestEngineErrorEventThenEOF: an engine that ends an Anthropic stream with
// its own error event and closes has ended the stream: the client gets that
// error event and no second one from the gateway, and the attempt is
// recorded as stream_error, not engine_disconnect.
func TestEngineErrorEventThenEOF(t *testing.T) {
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		s := newSSE(w)
		s.raw("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}\n\n")
		s.raw("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"engine overloaded\"}}\n\n")
	})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL, Models: []string{"m"}}))
	st, _, b := h.do(http.MethodPost, "/v1/messages", `{"model":"m","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if st != 200 || strings.Count(string(b), "event: error") != 1 || !strings.Contains(string(b), "engine overloaded") {
		t.Errorf("got %d %q, want the engine's one error event", st, b)
	}
	h.waitIdle()
	if et := h.errorTypes(); et[ErrTypeStreamError] != 1 {
		t.Errorf("error types %v, want one stream_error", et)
	}
}
