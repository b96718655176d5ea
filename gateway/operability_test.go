package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
)

const chatStream = `{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"a b c"}]}`

// TestFirstTokenSilenceIsNotIdle: vLLM sends the headers and the role chunk
// at once and then nothing while the request queues and prefills. That
// silence is bounded by timeouts.first_token, not by timeouts.idle: with an
// idle timeout of 100 ms a 500 ms time to first token completes; with a
// first-token timeout of 200 ms the same stream ends with a
// first_token_timeout error event and the engine aborts the request.
func TestFirstTokenSilenceIsNotIdle(t *testing.T) {
	for _, tc := range []struct {
		name       string
		firstToken time.Duration
		wantErr    string
	}{
		{"generous first token", 2 * time.Second, ""},
		{"first token timeout", 200 * time.Millisecond, ErrTypeFirstToken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng, simSrv := sim(t, enginesim.Config{Models: []string{"m"}, TTFT: 500 * time.Millisecond})
			cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}})
			cfg.Timeouts.Idle = 100 * time.Millisecond
			cfg.Timeouts.ResponseHeader = 100 * time.Millisecond
			cfg.Timeouts.FirstToken = tc.firstToken
			h := newHarness(t, cfg)
			resp := h.post("/v1/chat/completions", chatStream)
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("status %d, read error %v", resp.StatusCode, err)
			}
			done := strings.HasSuffix(string(b), "data: [DONE]\n\n")
			if tc.wantErr == "" && (!done || strings.Count(string(b), `"content":"tok`) != 4) {
				t.Errorf("want a whole stream, got %q", b)
			}
			if tc.wantErr != "" && (done || !strings.Contains(string(b), `"code":"`+tc.wantErr+`"`)) {
				t.Errorf("want a final %s error event, got %q", tc.wantErr, b)
			}
			h.waitIdle()
			if et := h.errorTypes(); et[tc.wantErr] != 1 {
				t.Errorf("error types %v, want one %q", et, tc.wantErr)
			}
			if tc.wantErr != "" {
				waitAborted(t, eng, 1)
			}
		})
	}
}

// TestDiscoveryDownEngineUnknownModel404: an engine without configured
// models that is down at start keeps discovery pending only until its
// first probe fails; after that a misspelled model answers 404
// model_not_found (not 503 for as long as the engine stays down), and the
// models of the other engines still route.
func TestDiscoveryDownEngineUnknownModel404(t *testing.T) {
	_, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	dead := testutil.RefusedURL
	h := newHarness(t, testConfig(
		fleet.EngineConfig{Name: "static", URL: simSrv.URL, Models: []string{"m"}},
		fleet.EngineConfig{Name: "down", URL: dead}, // models to be discovered
	), withoutStart())
	typo := `{"model":"mm","messages":[{"role":"user","content":"hi"}]}`
	if resp := h.post("/v1/chat/completions", typo); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("before the first probe: %d, want 503 (discovery pending)", resp.StatusCode)
		resp.Body.Close()
	} else {
		resp.Body.Close()
	}
	h.gw.Start() // the first probe of "down" fails
	resp := h.post("/v1/chat/completions", typo)
	if e := decodeErr(t, resp); resp.StatusCode != http.StatusNotFound || e.Error.Code != "model_not_found" {
		t.Errorf("after the failed first probe: %d %+v, want 404 model_not_found", resp.StatusCode, e.Error)
	}
	resp = h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("a served model: %d", resp.StatusCode)
	}
	h.waitIdle()
}

// TestEngineHeaderOnGatewayErrors: X-Switchboard-Engine names the engine
// tried on the gateway's own error answers (connect failure, timeout), and
// is absent when no engine was tried (unknown model).
func TestEngineHeaderOnGatewayErrors(t *testing.T) {
	dead := testutil.RefusedURL
	_, simSrv := sim(t, enginesim.Config{Models: []string{"slow"}})
	cfg := testConfig(fleet.EngineConfig{Name: "dead", URL: dead, Models: []string{"m"}}, fleet.EngineConfig{Name: "staller", URL: simSrv.URL, Models: []string{"slow"}})
	cfg.MaxAttempts = 1
	cfg.Timeouts.Attempt = 200 * time.Millisecond
	h := newHarness(t, cfg, withoutStart()) // no probe marks the dead engine down first
	for _, c := range []struct {
		model, fault, want string
		status             int
	}{
		{"m", "", "dead", 502},
		{"slow", "stall-before-headers", "staller", 504},
		{"nope", "", "", 404},
	} {
		resp := h.post("/v1/chat/completions", `{"model":"`+c.model+`","messages":[{"role":"user","content":"hi"}]}`, enginesim.FaultHeader, c.fault)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || resp.Header.Get("X-Switchboard-Engine") != c.want {
			t.Errorf("model %s: %d with X-Switchboard-Engine %q, want %d and %q", c.model, resp.StatusCode, resp.Header.Get("X-Switchboard-Engine"), c.status, c.want)
		}
	}
	h.waitIdle()
}

// TestProbesNotTraced: /health, /ready and the admin /metrics produce no
// spans (the public handler starts no server span for the probes; the admin
// handler must stay unwrapped); a proxied request still does.
func TestProbesNotTraced(t *testing.T) {
	_, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}}))
	admin := httptest.NewServer(h.gw.AdminHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "# metrics\n") })))
	defer admin.Close()
	for _, u := range []string{h.srv.URL + "/health", h.srv.URL + "/ready", admin.URL + "/metrics", admin.URL + "/admin/engines"} {
		resp, err := h.client.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s: %d", u, resp.StatusCode)
		}
	}
	if n := len(h.spans.Ended()); n != 0 {
		t.Errorf("probes produced %d spans, want 0", n)
	}
	resp := h.post("/v1/chat/completions", chatStream)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	h.waitIdle()
	var server int
	for _, s := range h.spans.Ended() {
		if s.SpanKind() == trace.SpanKindServer {
			server++
		}
	}
	if server != 1 {
		t.Errorf("%d server spans for one chat request, want 1", server)
	}
}
