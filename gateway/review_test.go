package gateway

import (
	"bufio"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// TestFirstTokenBoundsHeaderWait: the first-token deadline also bounds the
// wait for a stream's response headers, so an engine that never answers is
// cut at timeouts.first_token even when the response-header timeout is
// longer (or off) and there is no request timeout.
func TestFirstTokenBoundsHeaderWait(t *testing.T) {
	eng, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}})
	cfg.Timeouts.ResponseHeader = 0
	cfg.Timeouts.Request = 0
	cfg.Timeouts.FirstToken = 300 * time.Millisecond
	h := newHarness(t, cfg)
	start := time.Now()
	resp := h.post("/v1/chat/completions", chatStream, enginesim.FaultHeader, "stall-before-headers")
	e := decodeErr(t, resp)
	if resp.StatusCode != http.StatusGatewayTimeout || e.Error.Code != ErrTypeFirstToken {
		t.Fatalf("%d %+v, want 504 %s", resp.StatusCode, e.Error, ErrTypeFirstToken)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 3*time.Second {
		t.Errorf("answered after %s, want about the first-token timeout (300ms)", d)
	}
	h.waitIdle()
	if et := h.errorTypes(); et[ErrTypeFirstToken] != 1 {
		t.Errorf("error types %v", et)
	}
	waitAborted(t, eng, 1)
}

// TestUsageChunkDropOnlyUsageOnly: when the gateway asked for usage on the
// client's behalf, only the usage-only chunk ("choices": []) is kept from
// the client: a chunk that carries choices and usage (an engine reporting
// usage on every chunk) still reaches it, the role chunk included. A client
// that set vLLM's continuous_usage_stats is not injected at all.
func TestUsageChunkDropOnlyUsageOnly(t *testing.T) {
	var rec recorder
	const usage = `"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}`
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []string{
			`{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],` + usage + `}`,
			`{"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}],` + usage + `}`,
			`{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],` + usage + `}`,
			`{"id":"c","choices":[],` + usage + `}`,
			`[DONE]`,
		} {
			_, _ = io.WriteString(w, "data: "+ev+"\n\n")
			http.NewResponseController(w).Flush()
		}
	})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL}))
	resp := h.post("/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"a b"}]}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	got := string(b)
	if strings.Count(got, "data: ") != 4 || !strings.Contains(got, `"role":"assistant"`) || !strings.Contains(got, `"content":"hi"`) ||
		!strings.Contains(got, `"finish_reason":"stop"`) || strings.Contains(got, `"choices":[],`) {
		t.Errorf("client stream (want role, content and finish chunks and [DONE], no usage-only chunk):\n%s", got)
	}
	// continuous_usage_stats: the body goes through as the client sent it.
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true},"messages":[{"role":"user","content":"a b"}]}`
	resp = h.post("/v1/chat/completions", body)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	rec.mu.Lock()
	sent := rec.body[len(rec.body)-1]
	rec.mu.Unlock()
	if sent != body {
		t.Errorf("engine got %q, want the client's body unchanged", sent)
	}
	if !strings.Contains(string(b), `"choices":[],`) {
		t.Errorf("not injected, so nothing is dropped: the usage-only chunk must reach the client:\n%s", b)
	}
	h.waitIdle()
}

// TestAccessLogAbortedRequest: a request whose response is cut after it
// started (a relayed body the engine drops; the gateway aborts the client
// connection) still gets its access-log line, with the error type.
func TestAccessLogAbortedRequest(t *testing.T) {
	_, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	var buf testutil.LockedBuffer
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}})
	cfg.MaxResponseBufferBytes = 64 // relay every body, so a cut one aborts the client
	h := newHarnessWith(t, cfg, []Option{WithLogger(slog.New(slog.NewJSONHandler(&buf, nil)))})
	resp := h.post("/v1/chat/completions", `{"model":"m","max_tokens":30,"messages":[{"role":"user","content":"hi"}]}`,
		enginesim.FaultHeader, "close-after=3", "X-Request-Id", "r-cut")
	_, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || err == nil {
		t.Fatalf("status %d, read error %v: want a 200 whose body is cut", resp.StatusCode, err)
	}
	h.waitIdle()
	var line map[string]any
	deadline := time.Now().Add(2 * time.Second)
	for line == nil && time.Now().Before(deadline) {
		sc := bufio.NewScanner(strings.NewReader(buf.String()))
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "request" && m["request_id"] == "r-cut" {
				line = m
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	if line == nil || line["error.type"] != ErrTypeEngineDisconnect || line["status"] != 200.0 {
		t.Errorf("access-log line %v, want one with status 200 and error.type %s\n%s", line, ErrTypeEngineDisconnect, buf.String())
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
	deadline := time.Now().Add(2 * time.Second)
	for {
		resp, err := http.Get(admin.URL + "/admin/engines")
		if err != nil {
			t.Fatal(err)
		}
		_ = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if st.Buffered == 0 && st.Requests == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	if st.Buffered != 0 || st.Requests != 0 {
		t.Errorf("after the requests: buffered %d bytes, %d requests, want 0 and 0", st.Buffered, st.Requests)
	}
}

// TestEngineJSONErrorShapes: JSON error bodies outside the OpenAI envelope
// keep their message: {"error":"text"} and FastAPI's {"detail":"text"} or
// {"detail":[...]} (as compact JSON), each wrapped with the engine's status.
func TestEngineJSONErrorShapes(t *testing.T) {
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Query().Get("shape") {
		case "error-string":
			w.WriteHeader(429)
			_, _ = io.WriteString(w, `{"error":"rate limited, slow down"}`)
		case "detail-string":
			w.WriteHeader(400)
			_, _ = io.WriteString(w, `{"detail":"Not Found"}`)
		default:
			w.WriteHeader(422)
			_, _ = io.WriteString(w, `{"detail": [ {"loc": ["body","messages"], "msg": "field required"} ]}`)
		}
	})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL}))
	for _, tc := range []struct {
		shape, msg string
		status     int
	}{
		{"error-string", "rate limited, slow down", 429},
		{"detail-string", "Not Found", 400},
		{"detail-list", `[{"loc":["body","messages"],"msg":"field required"}]`, 422},
	} {
		resp := h.post("/v1/chat/completions?shape="+tc.shape, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
		e := decodeErr(t, resp)
		if resp.StatusCode != tc.status || e.Error.Message != tc.msg || e.Error.Type != TypeInvalidRequest {
			t.Errorf("%s: %d %+v, want %d with message %q", tc.shape, resp.StatusCode, e.Error, tc.status, tc.msg)
		}
	}
	h.waitIdle()
}

// TestAccessLogUnmatchedPath: a request no route matches is logged with
// its path, so an operator sees what was asked for.
func TestAccessLogUnmatchedPath(t *testing.T) {
	_, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	var buf testutil.LockedBuffer
	h := newHarnessWith(t, testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}}),
		[]Option{WithLogger(slog.New(slog.NewJSONHandler(&buf, nil)))})
	for _, c := range []struct {
		method, path string
		status       int
	}{{http.MethodGet, "/v1/nope", 404}, {http.MethodGet, "/v1/chat/completions", 405}} {
		req, _ := http.NewRequest(c.method, h.srv.URL+c.path, nil)
		resp, err := h.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		found := false
		for _, l := range strings.Split(buf.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "request" && m["path"] == c.path && m["status"] == float64(c.status) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s %s: no access-log line with its path and status %d:\n%s", c.method, c.path, c.status, buf.String())
		}
	}
}
