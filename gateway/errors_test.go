package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/telemetry"
)

func ptr(s string) *string { return &s }

// TestCaseL15ErrorStatuses: every error the gateway produces is an OpenAI
// error object with the right status; bad input never reaches an engine,
// never takes a slot and records no engine metric.
func TestCaseL15ErrorStatuses(t *testing.T) {
	engine, s1 := sim(t, enginesim.Config{Models: []string{"m", "down-model"}})
	down, sDown := sim(t, enginesim.Config{Models: []string{"down-model"}})
	// An engine that answers its first probe, then stops listening:
	// connection refused.
	deadSrv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	deadURL := deadSrv.URL

	cfg := testConfig(
		fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}},
		fleet.EngineConfig{Name: "down", URL: sDown.URL, Models: []string{"down-model"}},
		fleet.EngineConfig{Name: "dead", URL: deadURL, Models: []string{"dead-model"}},
	)
	cfg.MaxBodyBytes = 1024
	cfg.Timeouts.ResponseHeader = 150 * time.Millisecond
	// "down" fails its probe (unhealthy); "dead" passes it, then dies: it
	// died after its last probe.
	down.SetHealthy(false)
	h := newHarness(t, cfg)
	deadSrv.Close()

	chat := func(model, extra string) string {
		return `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]` + extra + `}`
	}
	tests := []struct {
		name       string
		path, body string
		hdr        []string
		status     int
		typ        string
		code       *string
		param      *string
		engineHits int64 // requests e1 must have received
	}{
		{name: "malformed json", body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true, x}`, status: 400, typ: "invalid_request_error"},
		{name: "empty body", body: ``, status: 400, typ: "invalid_request_error"},
		{name: "missing model", body: `{"messages":[{"role":"user","content":"hi"}]}`, status: 400, typ: "invalid_request_error", param: ptr("model")},
		{name: "model not a string", body: `{"model":7,"messages":[]}`, status: 400, typ: "invalid_request_error", param: ptr("model")},
		// A body the route cannot read as sent is refused before it is
		// parsed, naming what was sent (OpenAI's 415).
		{name: "text/plain", body: `{"model":"m", x}`, hdr: []string{"Content-Type", "text/plain"}, status: 415, typ: "invalid_request_error", code: ptr("unsupported_media_type")},
		{name: "form type", body: chat("m", ""), hdr: []string{"Content-Type", "application/x-www-form-urlencoded"}, status: 415, typ: "invalid_request_error", code: ptr("unsupported_media_type")},
		{name: "multipart on a JSON route", body: chat("m", ""), hdr: []string{"Content-Type", "multipart/form-data; boundary=x"}, status: 415, typ: "invalid_request_error", code: ptr("unsupported_media_type")},
		{name: "gzip body", body: "\x1f\x8b\x08\x00", hdr: []string{"Content-Encoding", "gzip"}, status: 415, typ: "invalid_request_error", code: ptr("unsupported_content_encoding")},
		{name: "unknown model", body: chat("nope", ""), status: 404, typ: "invalid_request_error", code: ptr("model_not_found"), param: ptr("model")},
		{name: "no healthy engine", body: chat("down-model", ""), status: 503, typ: "service_unavailable_error", code: ptr("no_healthy_engine")},
		{name: "engine unreachable", body: chat("dead-model", ""), status: 502, typ: "server_error", code: ptr("engine_unreachable")},
		{name: "body too large", body: chat("m", `,"pad":"`+strings.Repeat("x", 2000)+`"`), status: 413, typ: "invalid_request_error", code: ptr("request_too_large")},
		{name: "engine timeout", body: chat("m", `,"stream":true`), hdr: []string{"X-Enginesim-Fault", "stall-before-headers"}, status: 504, typ: "timeout_error", code: ptr("header_timeout"), engineHits: 1},
		{name: "engine 400 passes through", body: chat("m", ""), hdr: []string{"X-Enginesim-Fault", "status=400"}, status: 400, engineHits: 1},
		{name: "engine 401 passes through", body: chat("m", ""), hdr: []string{"X-Enginesim-Fault", "status=401"}, status: 401, engineHits: 1},
		// The only engine of m answers 503 to both attempts (server.retry.on
		// has 503 by default, max_attempts 2): the last 503 passes through.
		{name: "engine 503 passes through", body: chat("m", `,"stream":true`), hdr: []string{"X-Enginesim-Fault", "status=503"}, status: 503, engineHits: 2},
		{name: "wrong method", path: "GET /v1/chat/completions", status: 405, typ: "invalid_request_error"},
		{name: "unknown route", path: "POST /v2/nothing", body: chat("m", ""), status: 404, typ: "invalid_request_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := engine.Stats().Received
			durBefore := h.histCount(telemetry.RequestDurationName)
			method, path := "POST", "/v1/chat/completions"
			if tt.path != "" {
				method, path, _ = strings.Cut(tt.path, " ")
			}
			req, _ := http.NewRequest(method, h.srv.URL+path, strings.NewReader(tt.body))
			req.Header.Set("Content-Type", "application/json")
			for i := 0; i+1 < len(tt.hdr); i += 2 {
				req.Header.Set(tt.hdr[i], tt.hdr[i+1])
			}
			resp, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tt.status {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d, want %d (body %s)", resp.StatusCode, tt.status, b)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
			if tt.status == 405 && resp.Header.Get("Allow") != "POST" {
				t.Errorf("405 with Allow %q, want POST", resp.Header.Get("Allow"))
			}
			e := decodeErr(t, resp)
			if tt.typ != "" && e.Error.Type != tt.typ {
				t.Errorf("type %q, want %q", e.Error.Type, tt.typ)
			}
			if tt.code != nil && e.code() != *tt.code {
				t.Errorf("code %v, want %q", e.Error.Code, *tt.code)
			}
			if tt.param != nil && (e.Error.Param == nil || *e.Error.Param != *tt.param) {
				t.Errorf("param %v, want %q", e.Error.Param, *tt.param)
			}
			if got := engine.Stats().Received - before; got != tt.engineHits {
				t.Errorf("engine received %d requests, want %d", got, tt.engineHits)
			}
			if tt.status == 400 && tt.engineHits == 0 || tt.status == 404 || tt.status == 413 || tt.status == 405 || tt.status == 415 {
				if d := h.histCount(telemetry.RequestDurationName) - durBefore; d != 0 {
					t.Errorf("bad input recorded %d engine durations, want 0", d)
				}
			}
			h.waitIdle()
		})
	}
	// connect_error and 503 twice: each was tried again on the same (only)
	// engine after a back-off (RetryConfig), as its own attempt.
	if et := h.errorTypes(); et["connect_error"] != 2 || et["header_timeout"] != 1 || et["400"] != 1 || et["401"] != 1 || et["503"] != 2 {
		t.Errorf("error types %v", et)
	}
}

// TestEngineErrorEnvelope: an engine error body already in the OpenAI
// envelope passes byte for byte; another shape (vLLM's older
// {"object":"error",...} or plain text) is wrapped, status unchanged.
func TestEngineErrorEnvelope(t *testing.T) {
	const openaiBody = `{"error":{"message":"bad thing","type":"BadRequestError","param":"messages","code":400}}`
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("X-Shape") {
		case "openai":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(400)
			_, _ = io.WriteString(w, openaiBody)
		case "vllm-old":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(422)
			_, _ = io.WriteString(w, `{"object":"error","message":"max_tokens is too large","type":"BadRequestError","param":null,"code":422}`)
		default:
			w.WriteHeader(502)
			_, _ = io.WriteString(w, "upstream exploded\n")
		}
	})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL}))
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

	resp := h.post("/v1/chat/completions", body, "X-Shape", "openai")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || string(b) != openaiBody {
		t.Errorf("openai shape: %d %s", resp.StatusCode, b)
	}
	resp = h.post("/v1/chat/completions", body, "X-Shape", "vllm-old")
	if resp.StatusCode != 422 {
		t.Errorf("vllm-old status %d, want 422", resp.StatusCode)
	}
	if e := decodeErr(t, resp); e.Error.Message != "max_tokens is too large" || e.Error.Type != "invalid_request_error" {
		t.Errorf("vllm-old wrapped as %+v", e.Error)
	}
	resp = h.post("/v1/chat/completions", body, "X-Shape", "text")
	if resp.StatusCode != 502 {
		t.Errorf("text status %d, want 502", resp.StatusCode)
	}
	// Not JSON: not shown (it may be a stack trace); a generic message
	// names the engine and the status.
	if e := decodeErr(t, resp); e.Error.Message != "engine e1 answered 502 Bad Gateway" || e.Error.Type != "server_error" || e.Error.Code != "502" {
		t.Errorf("text replaced by %+v", e.Error)
	}
	h.waitIdle()
	if et := h.errorTypes(); et["400"] != 1 || et["422"] != 1 || et["502"] != 1 {
		t.Errorf("error types %v", et)
	}
}

// TestBodyMediaTypesAccepted: the JSON types a client may declare reach
// the engine: JSON with parameters, a +json type, no Content-Type at all,
// and the identity encoding; the refused ones are in
// TestCaseL15ErrorStatuses.
func TestBodyMediaTypesAccepted(t *testing.T) {
	engine, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}}))
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	for _, hdr := range [][]string{
		{"Content-Type", "application/json; charset=utf-8"},
		{"Content-Type", "application/vnd.example+json"},
		{"Content-Type", ""},
		{"Content-Encoding", "identity"},
	} {
		before := engine.Stats().Received
		req, _ := http.NewRequest("POST", h.srv.URL+"/v1/chat/completions", strings.NewReader(body))
		if hdr[1] != "" {
			req.Header.Set(hdr[0], hdr[1])
		}
		resp, err := h.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s %q: status %d, want 200 (%s)", hdr[0], hdr[1], resp.StatusCode, b)
		}
		if got := engine.Stats().Received - before; got != 1 {
			t.Errorf("%s %q: engine received %d requests, want 1", hdr[0], hdr[1], got)
		}
	}
}

// anthropicErr is the decoded Anthropic error object.
type anthropicErr struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// TestAnthropicEnvelope checks that every error on /v1/messages comes in
// Anthropic's envelope, whoever produced it: the gateway (bad JSON, unknown
// model, missing messages, no engine), or the engine (an injected 500 with
// an OpenAI-shaped or HTML body, a 529 overloaded), and that a stream
// broken mid-way ends with an Anthropic error event.
func TestAnthropicEnvelope(t *testing.T) {
	_, _, srv := recordedSim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 6})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}}))
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name, body, fault string
		status            int
		typ               string
	}{
		{"invalid json", `{"model":"m",` + msgs + `, x}`, "", 400, "invalid_request_error"},
		{"missing messages", `{"model":"m","max_tokens":3}`, "", 400, "invalid_request_error"},
		{"unknown model", `{"model":"nope","max_tokens":3,` + msgs + `}`, "", 404, "not_found_error"},
		{"engine 500", `{"model":"m","max_tokens":3,` + msgs + `}`, "status=500", 500, "api_error"},
		{"engine html 502", `{"model":"m","max_tokens":3,` + msgs + `}`, "status=502,error-body=html", 502, "api_error"},
		{"engine 529", `{"model":"m","max_tokens":3,` + msgs + `}`, "status=529", 529, "overloaded_error"},
		{"count_tokens unknown model", `{"model":"nope",` + msgs + `}`, "", 404, "not_found_error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := "/v1/messages"
			if strings.HasPrefix(tc.name, "count_tokens") {
				path = "/v1/messages/count_tokens"
			}
			var hdr []string
			if tc.fault != "" {
				hdr = []string{enginesim.FaultHeader, tc.fault}
			}
			st, _, b := h.do(http.MethodPost, path, tc.body, hdr...)
			var e anthropicErr
			if err := json.Unmarshal(b, &e); err != nil || st != tc.status || e.Type != "error" || e.Error.Type != tc.typ || e.Error.Message == "" {
				t.Errorf("got %d %s, want %d with an Anthropic %s", st, b, tc.status, tc.typ)
			}
		})
	}
	t.Run("no route or method under /v1/messages", func(t *testing.T) {
		for _, tc := range []struct {
			method, path string
			status       int
		}{{http.MethodPost, "/v1/messages/batches", 404}, {http.MethodGet, "/v1/messages", 405}} {
			st, _, b := h.do(tc.method, tc.path, "")
			var e anthropicErr
			if err := json.Unmarshal(b, &e); err != nil || st != tc.status || e.Type != "error" || e.Error.Message == "" {
				t.Errorf("%s %s: %d %s, want %d in the Anthropic envelope", tc.method, tc.path, st, b, tc.status)
			}
		}
	})
	t.Run("stream cut", func(t *testing.T) {
		st, _, b := h.do(http.MethodPost, "/v1/messages", `{"model":"m","max_tokens":6,"stream":true,`+msgs+`}`, enginesim.FaultHeader, "close-after=2")
		s := string(b)
		if st != 200 || strings.Contains(s, "message_stop") || !strings.HasSuffix(s, "\n\n") {
			t.Fatalf("got %d %q", st, tail(s))
		}
		last := s[strings.LastIndex(strings.TrimSuffix(s, "\n\n"), "\n\n")+2:]
		if !strings.HasPrefix(last, "event: error\ndata: ") {
			t.Fatalf("last event %q, want an Anthropic error event", last)
		}
		var e anthropicErr
		if err := json.Unmarshal([]byte(strings.TrimSpace(strings.TrimPrefix(last, "event: error\ndata: "))), &e); err != nil || e.Type != "error" || e.Error.Type != "api_error" {
			t.Errorf("error event %q", last)
		}
	})
	h.waitIdle()
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

// TestBrokenJSONParameterAccepted: a JSON content type whose parameter is
// malformed (`application/json; charset`) is still JSON, as before the
// media-type check.
func TestBrokenJSONParameterAccepted(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}}))
	for _, ct := range []string{"application/json; charset", "application/json;;"} {
		st, _, b := h.do(http.MethodPost, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "Content-Type", ct)
		if st != 200 {
			t.Errorf("Content-Type %q: %d %s, want 200", ct, st, b)
		}
	}
}
