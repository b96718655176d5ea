package gateway

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// TestCaseL19HeaderHygiene: the client's credentials and hop-by-hop headers
// never reach the engine; the engine's configured key does; X-Request-Id is
// reused, forwarded, echoed and put on the spans; Content-Length matches
// what is forwarded.
func TestCaseL19HeaderHygiene(t *testing.T) {
	var rec recorder
	handler := func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Connection", "X-Engine-Private")
		w.Header().Set("X-Engine-Private", "secret")
		_, _ = io.WriteString(w, `{"id":"r1","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}
	withKey := fakeEngine(t, []string{"keyed"}, handler)
	noKey := fakeEngine(t, []string{"open"}, handler)
	h := newHarness(t, testConfig(
		fleet.EngineConfig{Name: "keyed", URL: withKey.URL, APIKey: "engine-key"},
		fleet.EngineConfig{Name: "open", URL: noKey.URL},
	))
	for _, tc := range []struct{ model, wantAuth string }{{"keyed", "Bearer engine-key"}, {"open", ""}} {
		t.Run(tc.model, func(t *testing.T) {
			body := `{"model":"` + tc.model + `","messages":[{"role":"user","content":"hi"}]}`
			req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer K_gw")
			req.Header.Set("Proxy-Authorization", "x")
			req.Header.Set("Connection", "keep-alive, X-Foo")
			req.Header.Set("X-Foo", "1")
			req.Header.Set("TE", "trailers")
			req.Header.Set("Upgrade", "h2c")
			req.Header.Set("Cookie", "session=abc")
			req.Header.Set("X-Request-Id", "req-abc")
			req.Header.Set("X-Custom", "kept")
			resp, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			got := rec.last()
			if a := got.Header.Get("Authorization"); a != tc.wantAuth {
				t.Errorf("engine saw Authorization %q, want %q", a, tc.wantAuth)
			}
			for _, k := range []string{"Proxy-Authorization", "X-Foo", "Te", "Upgrade", "Cookie", "Keep-Alive"} {
				if v := got.Header.Get(k); v != "" {
					t.Errorf("engine saw hop-by-hop/credential header %s: %q", k, v)
				}
			}
			if c := got.Header.Get("Connection"); strings.Contains(c, "X-Foo") {
				t.Errorf("engine saw Connection %q", c)
			}
			if v := got.Header.Get("X-Custom"); v != "kept" {
				t.Errorf("end-to-end header X-Custom = %q, want kept", v)
			}
			if id := got.Header.Get("X-Request-Id"); id != "req-abc" {
				t.Errorf("engine saw X-Request-Id %q, want req-abc", id)
			}
			// (The request is observed: the engine gets it as a stream.)
			rec.mu.Lock()
			sent := rec.body[len(rec.body)-1]
			rec.mu.Unlock()
			if got.ContentLength != int64(len(sent)) || !strings.HasPrefix(sent, body[:len(body)-1]) {
				t.Errorf("engine saw Content-Length %d for %d bytes %q, want the client's body edited", got.ContentLength, len(sent), sent)
			}
			if id := resp.Header.Get("X-Request-Id"); id != "req-abc" {
				t.Errorf("client got X-Request-Id %q, want req-abc", id)
			}
			if v := resp.Header.Get("X-Engine-Private"); v != "" {
				t.Errorf("client got the engine's Connection-listed header: %q", v)
			}
			if !strings.HasPrefix(got.Header.Get("Traceparent"), "00-") {
				t.Errorf("engine saw no W3C traceparent: %q", got.Header.Get("Traceparent"))
			}
		})
	}
	var found int
	for _, s := range h.spans.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == "switchboard.request_id" && kv.Value.AsString() == "req-abc" && s.SpanKind() == trace.SpanKindClient {
				found++
			}
		}
	}
	if found != 2 {
		t.Errorf("%d engine spans carry switchboard.request_id=req-abc, want 2", found)
	}
	var onServer int
	for _, s := range h.spans.Ended() {
		if s.SpanKind() == trace.SpanKindServer && attrValue(s.Attributes(), "switchboard.request_id") == "req-abc" {
			onServer++
		}
	}
	if onServer != 2 {
		t.Errorf("%d server spans carry switchboard.request_id=req-abc, want 2", onServer)
	}
	h.waitIdle()
}

// TestCaseL19EngineKeyFailsClosed: an engine whose key comes from an
// environment variable that is not set makes the gateway refuse to start,
// instead of sending requests without the key; when it is set, the engine
// gets it.
func TestCaseL19EngineKeyFailsClosed(t *testing.T) {
	var rec recorder
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{}`)
	})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL, APIKeyEnv: "SWITCHBOARD_TEST_ENGINE_KEY"})
	t.Setenv("SWITCHBOARD_TEST_ENGINE_KEY", "")
	m, _ := telemetry.NewMetrics(nil)
	if _, err := New(cfg, routing.NewRoundRobin(), m); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "SWITCHBOARD_TEST_ENGINE_KEY") {
		t.Fatalf("New with the key variable unset: %v, want an ErrInvalidConfig naming it", err)
	}
	t.Setenv("SWITCHBOARD_TEST_ENGINE_KEY", "from-env")
	h := newHarness(t, cfg)
	resp := h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "Authorization", "Bearer K_gw")
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if got := rec.last().Header.Get("Authorization"); got != "Bearer from-env" {
		t.Errorf("engine saw Authorization %q, want the key from the environment", got)
	}
	bad := fleet.EngineConfig{Name: "e2", URL: eng.URL, APIKey: "k", APIKeyEnv: "X"}
	if err := bad.Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("api_key and api_key_env together: %v, want ErrInvalidConfig", err)
	}
	h.waitIdle()
}

func TestRequestIDGeneratedAndCapped(t *testing.T) {
	var rec recorder
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{}`)
	})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL}))
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct{ sent, wantLen int }{{0, 32}, {500, MaxRequestIDLen}} {
		var hdr []string
		if tc.sent > 0 {
			hdr = []string{"X-Request-Id", strings.Repeat("a", tc.sent)}
		}
		resp := h.post("/v1/chat/completions", body, hdr...)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		id := resp.Header.Get("X-Request-Id")
		if len(id) != tc.wantLen || rec.last().Header.Get("X-Request-Id") != id {
			t.Errorf("sent %d bytes: client id %q (len %d, want %d), engine id %q", tc.sent, id, len(id), tc.wantLen, rec.last().Header.Get("X-Request-Id"))
		}
	}
	h.waitIdle()
}

// TestTracing: the server span is named by chi's route pattern with
// http.route set; the engine span is its CLIENT child named
// "{operation} {model}" with GenAI attributes; the engine receives the
// engine span's context in traceparent.
func TestTracing(t *testing.T) {
	var rec recorder
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		s := newSSE(w)
		s.data(`{"id":"chatcmpl-42","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`)
		s.data(`{"id":"chatcmpl-42","choices":[{"index":0,"delta":{"content":"hi"}}]}`)
		s.data(`{"id":"chatcmpl-42","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":1,"total_tokens":8}}`)
		s.data("[DONE]")
	})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL}))
	resp := h.post("/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":9,"messages":[{"role":"user","content":"hi"}]}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	h.waitIdle()

	var server, client []attribute.KeyValue
	var serverName, clientName string
	var serverSC, clientParent, clientSC trace.SpanContext
	var events []string
	for _, s := range h.spans.Ended() {
		switch s.SpanKind() {
		case trace.SpanKindServer:
			server, serverName, serverSC = s.Attributes(), s.Name(), s.SpanContext()
		case trace.SpanKindClient:
			client, clientName, clientParent, clientSC = s.Attributes(), s.Name(), s.Parent(), s.SpanContext()
			for _, ev := range s.Events() {
				events = append(events, ev.Name)
			}
		}
	}
	if serverName != "POST /v1/chat/completions" {
		t.Errorf("server span name %q", serverName)
	}
	if v := attrValue(server, "http.route"); v != "/v1/chat/completions" {
		t.Errorf("http.route = %q", v)
	}
	if clientName != "chat m" {
		t.Errorf("engine span name %q, want %q", clientName, "chat m")
	}
	if clientParent.SpanID() != serverSC.SpanID() {
		t.Errorf("engine span parent %s, want server span %s", clientParent.SpanID(), serverSC.SpanID())
	}
	want := map[string]string{
		"gen_ai.operation.name":      "chat",
		"gen_ai.request.model":       "m",
		"gen_ai.response.id":         "chatcmpl-42",
		"gen_ai.usage.input_tokens":  "7",
		"gen_ai.usage.output_tokens": "1",
		"gen_ai.request.max_tokens":  "9",
		"server.address":             "127.0.0.1",
		"switchboard.engine":         "e1",
		"switchboard.released_phase": "decode",
	}
	for k, v := range want {
		if got := attrValue(client, k); got != v {
			t.Errorf("engine span %s = %q, want %q", k, got, v)
		}
	}
	if len(events) != 1 || events[0] != "first_token" {
		t.Errorf("engine span events %v, want [first_token]", events)
	}
	tp := rec.last().Header.Get("Traceparent")
	if !strings.Contains(tp, clientSC.TraceID().String()) || !strings.Contains(tp, clientSC.SpanID().String()) {
		t.Errorf("engine got traceparent %q, want trace %s span %s", tp, clientSC.TraceID(), clientSC.SpanID())
	}
}

func attrValue(kvs []attribute.KeyValue, key string) string {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// TestUsageInjection (docs/cases.md L19, body rewrite): a stream whose client
// set no stream_options is sent to the engine with include_usage added and
// a Content-Length that matches the rewritten body; the usage chunk is
// recorded (token usage, span attributes) but not forwarded, so the client
// sees exactly the stream it asked for. A client that asked for usage gets
// the chunk; one that set stream_options itself is left alone.
func TestUsageInjection(t *testing.T) {
	_, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	var rec recorder
	proxy := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		// Forward to the simulator with the body the gateway sent.
		rec.mu.Lock()
		body := rec.body[len(rec.body)-1]
		rec.mu.Unlock()
		req, _ := http.NewRequest(http.MethodPost, simSrv.URL+r.URL.Path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			w.WriteHeader(502)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		rc := http.NewResponseController(w)
		buf := make([]byte, 512)
		for {
			n, err := resp.Body.Read(buf)
			_, _ = w.Write(buf[:n])
			_ = rc.Flush()
			if err != nil {
				return
			}
		}
	})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: proxy.URL})
	cfg.Migration.Limit = 0 // the body as sent, without return_token_ids (TestTokenIDsAsked)
	h := newHarness(t, cfg)
	const usage = `"include_usage":true`
	cases := []struct {
		name, opts string
		wantSent   string // the body's tail after messages as the engine gets it ("" = the client's body unchanged)
		wantChunk  bool   // the client sees the usage chunk
	}{
		{"no stream_options", ``, `,"stream_options":{` + usage + `}}`, false},
		{"include_usage true", `,"stream_options":{"include_usage":true}`, ``, true},
		// Not asked for usage: counted exactly as when stream_options is
		// absent (class 9 of the hardening issue).
		{"include_usage false", `,"stream_options":{"include_usage":false}`, `,"stream_options":{"include_usage":false,` + usage + "}}\n", false},
		{"include_usage null", `,"stream_options":{"include_usage":null}`, `,"stream_options":{"include_usage":null,` + usage + "}}\n", false},
		{"empty stream_options", `,"stream_options":{ }`, `,"stream_options":{ ` + usage + "}}\n", false},
		{"null stream_options", `,"stream_options":null`, `,"stream_options":null,"stream_options":{` + usage + `}}`, false},
		{"other stream options kept", `,"stream_options":{"continuous_usage_stats":false}`, `,"stream_options":{"continuous_usage_stats":false,` + usage + "}}\n", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"model":"m","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"a b c d"}]` + tc.opts + "}\n"
			resp := h.post("/v1/chat/completions", body)
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
				t.Fatalf("stream: %v %q", err, b)
			}
			sent := rec.last()
			rec.mu.Lock()
			got := rec.body[len(rec.body)-1]
			rec.mu.Unlock()
			want := body
			if tc.wantSent != "" {
				want = `{"model":"m","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"a b c d"}]` + tc.wantSent
			}
			if got != want {
				t.Errorf("engine got body\n%q, want\n%q", got, want)
			}
			if sent.ContentLength != int64(len(got)) {
				t.Errorf("engine saw Content-Length %d for a %d-byte body", sent.ContentLength, len(got))
			}
			if chunk := strings.Contains(string(b), `"choices":[],"usage"`); chunk != tc.wantChunk {
				t.Errorf("client saw the usage chunk: %v, want %v\n%s", chunk, tc.wantChunk, b)
			}
			if c := strings.Count(string(b), `"content":"tok`); c != 3 {
				t.Errorf("%d content events, want 3", c)
			}
		})
	}
	h.waitIdle()
	// Usage was recorded for every stream: injected or asked for.
	m, ok := findMetric(h.collect(), telemetry.GenAIClientTokenUsageName)
	if !ok {
		t.Fatal("no token usage metric")
	}
	var outputSamples uint64
	for _, dp := range m.Data.(metricdata.Histogram[int64]).DataPoints {
		if v, _ := dp.Attributes.Value(telemetry.AttrGenAITokType); v.AsString() == "output" {
			outputSamples += dp.Count
			if dp.Sum != 3*int64(len(cases)) {
				t.Errorf("output tokens sum %d, want %d (3 per stream)", dp.Sum, 3*len(cases))
			}
		}
	}
	if outputSamples != uint64(len(cases)) {
		t.Errorf("output token samples %d, want %d", outputSamples, len(cases))
	}
}

// TestNoopTracerPropagatesClientContext: with a no-op tracer provider (what
// cmd/gateway uses when no trace exporter is configured: no span is
// recorded), the client's traceparent still reaches the engine unchanged,
// so an engine that traces joins the client's trace.
func TestNoopTracerPropagatesClientContext(t *testing.T) {
	var rec recorder
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	})
	h := newHarnessWith(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL}), []Option{WithTracerProvider(tracenoop.NewTracerProvider())})
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	resp := h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "Traceparent", parent)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if got := rec.last().Header.Get("Traceparent"); got != parent {
		t.Errorf("engine got traceparent %q, want the client's %q", got, parent)
	}
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
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL})
	cfg.Migration.Limit = 0 // the body as sent, without return_token_ids (TestTokenIDsAsked)
	h := newHarness(t, cfg)
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
