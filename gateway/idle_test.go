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
