package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// recordedSim starts a simulated engine behind a bodyRecorder.
func recordedSim(t testing.TB, cfg enginesim.Config) (*enginesim.Engine, *bodyRecorder, *httptest.Server) {
	t.Helper()
	e := newSim(t, cfg)
	rec := &bodyRecorder{next: e.Handler()}
	return e, rec, serveSim(t, rec)
}

// do sends method path with body and returns the status, the Content-Type
// and the body.
func (h *harness) do(method, path, body string, hdr ...string) (int, http.Header, []byte) {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, h.srv.URL+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// TestResponsesSticky creates stored responses through the gateway and
// reads and cancels them: the request goes to the engine that created the
// response (remembered by the gateway), and a gateway that never saw the
// creation (another replica, or a restart) still finds it by asking each
// engine; an unknown id is a 404 after every engine said so, and an id
// that is not a plain token is refused before any engine is asked.
func TestResponsesSticky(t *testing.T) {
	// Background responses that run for seconds, so they can be cancelled.
	_, rec1, srv1 := recordedSim(t, enginesim.Config{Models: []string{"m"}, ITL: 20 * time.Millisecond})
	_, rec2, srv2 := recordedSim(t, enginesim.Config{Models: []string{"m"}, ITL: 20 * time.Millisecond})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv1.URL, Models: []string{"m"}}, fleet.EngineConfig{Name: "e2", URL: srv2.URL, Models: []string{"m"}})
	h := newHarness(t, cfg)

	ids := map[string]string{} // response id -> engine that made it
	for range 4 {
		st, hdr, b := h.do(http.MethodPost, "/v1/responses", `{"model":"m","input":"hi","background":true,"max_output_tokens":500}`)
		if st != 200 {
			t.Fatalf("create: %d %s", st, b)
		}
		var r struct{ ID string }
		_ = json.Unmarshal(b, &r)
		ids[r.ID] = hdr.Get("X-Switchboard-Engine")
	}
	if len(ids) != 4 {
		t.Fatalf("ids %v", ids)
	}
	count := func(rec *bodyRecorder, prefix string) int {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		n := 0
		for _, g := range rec.got {
			if strings.HasPrefix(g.path, prefix) {
				n++
			}
		}
		return n
	}
	for id, engine := range ids {
		st, hdr, b := h.do(http.MethodGet, "/v1/responses/"+id, "")
		if st != 200 || hdr.Get("X-Switchboard-Engine") != engine || !strings.Contains(string(b), id) {
			t.Errorf("GET %s: %d from %q, want 200 from %s: %.200s", id, st, hdr.Get("X-Switchboard-Engine"), engine, b)
		}
	}
	// Remembered: each GET asked one engine only.
	if n := count(rec1, "/v1/responses/") + count(rec2, "/v1/responses/"); n != len(ids) {
		t.Errorf("engines were asked %d times for %d stored responses", n, len(ids))
	}

	// A replica that did not create them finds them by asking around.
	other := newHarness(t, cfg)
	for id, engine := range ids {
		st, hdr, _ := other.do(http.MethodPost, "/v1/responses/"+id+"/cancel", "")
		if st != 200 || hdr.Get("X-Switchboard-Engine") != engine {
			t.Errorf("cancel %s via another gateway: %d from %q, want 200 from %s", id, st, hdr.Get("X-Switchboard-Engine"), engine)
		}
	}
	st, _, b := h.do(http.MethodGet, "/v1/responses/resp_unknown", "")
	if st != 404 {
		t.Errorf("unknown id: %d %s, want 404", st, b)
	}
	before := count(rec1, "/v1/responses/") + count(rec2, "/v1/responses/")
	st, _, _ = h.do(http.MethodGet, "/v1/responses/a%2F..%2Fsleep", "")
	if st != 400 {
		t.Errorf("an id with a slash: %d, want 400", st)
	}
	if after := count(rec1, "/v1/responses/") + count(rec2, "/v1/responses/"); after != before {
		t.Errorf("an invalid id reached an engine")
	}
	h.waitIdle()
	other.waitIdle()
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

// TestFormLimits sends bad multipart requests to the transcription route:
// each gets its error in the OpenAI envelope with the right status, and no
// engine is contacted (no slot taken).
func TestFormLimits(t *testing.T) {
	_, rec, srv := recordedSim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	cfg.MaxFormBytes = 4096
	h := newHarness(t, cfg)
	big, bigCT := audioForm(t, "m", false)
	for len(big) <= 4096 {
		big, bigCT = audioForm(t, strings.Repeat("m", 10), false)
		big = append(big, bytes.Repeat([]byte{'x'}, 4096)...)
	}
	noFile := "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--b--\r\n"
	for _, tc := range []struct {
		name, ct string
		body     []byte
		status   int
		param    string
	}{
		{"json body", "application/json", []byte(`{"model":"m"}`), 415, ""},
		{"no file", "multipart/form-data; boundary=b", []byte(noFile), 400, "file"},
		{"no boundary", "multipart/form-data", []byte(noFile), 400, ""},
		{"malformed content type", "multi part", []byte(noFile), 415, ""},
		{"malformed parameters", "multipart/form-data; boundary", []byte(noFile), 400, ""},
		{"too large", bigCT, big, 413, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/audio/transcriptions", bytes.NewReader(tc.body))
			req.Header.Set("Content-Type", tc.ct)
			resp, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			e := decodeErr(t, resp)
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d (%s)", resp.StatusCode, tc.status, e.Error.Message)
			}
			if tc.param != "" && (e.Error.Param == nil || *e.Error.Param != tc.param) {
				t.Errorf("param %v, want %s", e.Error.Param, tc.param)
			}
		})
	}
	if n := rec.n(); n != 0 {
		t.Errorf("the engine got %d requests, want 0", n)
	}
	if n := h.histCount(telemetry.RequestDurationName); n != 0 {
		t.Errorf("%d engine attempts recorded, want 0", n)
	}
	h.assertIdle()
}

// TestModelAliases checks that a public alias routes to its target's
// engines with the body's model rewritten (JSON and multipart), that
// /v1/models lists the alias beside its target with the engine's card
// (created, owned_by, root, max_model_len), and that /v1/models/{model}
// answers both and 404s the rest in the OpenAI envelope.
func TestModelAliases(t *testing.T) {
	_, rec, srv := recordedSim(t, enginesim.Config{Models: []string{"org/base-8b"}, OutputTokens: 2})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL})
	cfg.Models.Aliases = map[string]string{"public": "org/base-8b"}
	h := newHarness(t, cfg)

	st, _, b := h.do(http.MethodPost, "/v1/chat/completions", `{"model":"public","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	if st != 200 {
		t.Fatalf("alias chat: %d %s", st, b)
	}
	if got := string(rec.last().body); got != `{"model":"org/base-8b","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}` {
		t.Errorf("engine body %s", got)
	}
	form, ct := audioForm(t, "public", false)
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/audio/transcriptions", bytes.NewReader(form))
	req.Header.Set("Content-Type", ct)
	resp, err := h.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("alias transcription: %d", resp.StatusCode)
	}
	want := bytes.Replace(form, []byte("\r\n\r\npublic\r\n"), []byte("\r\n\r\norg/base-8b\r\n"), 1)
	if got := rec.last().body; !bytes.Equal(got, want) {
		t.Errorf("engine form body differs from the client's with the model replaced:\n got %q\nwant %q", tail(string(got)), tail(string(want)))
	}

	st, _, b = h.do(http.MethodGet, "/v1/models", "")
	var list struct {
		Data []fleet.ModelCard `json:"data"`
	}
	if err := json.Unmarshal(b, &list); err != nil || st != 200 || len(list.Data) != 2 {
		t.Fatalf("models: %d %s", st, b)
	}
	if list.Data[0].ID != "org/base-8b" || list.Data[1].ID != "public" {
		t.Errorf("ids %s, %s", list.Data[0].ID, list.Data[1].ID)
	}
	for _, m := range list.Data {
		if m.OwnedBy != "vllm" || m.Created == 0 || m.Root == nil || *m.Root != "org/base-8b" || m.MaxModelLen == nil || *m.MaxModelLen <= 0 {
			t.Errorf("card %+v lost the engine's fields", m)
		}
	}
	for _, id := range []string{"public", "org/base-8b"} {
		st, _, b = h.do(http.MethodGet, "/v1/models/"+id, "")
		var m fleet.ModelCard
		if err := json.Unmarshal(b, &m); err != nil || st != 200 || m.ID != id {
			t.Errorf("GET /v1/models/%s: %d %s", id, st, b)
		}
		if st, _, b = h.do(http.MethodHead, "/v1/models/"+id, ""); st != 200 || len(b) != 0 {
			t.Errorf("HEAD /v1/models/%s: %d, %d bytes", id, st, len(b))
		}
	}
	// An alias whose target no engine serves: the 404 names the alias,
	// never the internal target.
	cfg2 := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL})
	cfg2.Models.Aliases = map[string]string{"pub": "internal-ghost"}
	h2 := newHarness(t, cfg2)
	st, _, b = h2.do(http.MethodPost, "/v1/chat/completions", `{"model":"pub","messages":[{"role":"user","content":"hi"}]}`)
	if st != 404 || !strings.Contains(string(b), "`pub`") || strings.Contains(string(b), "ghost") {
		t.Errorf("alias without a target: %d %s, want a 404 naming pub only", st, b)
	}
	st, _, b = h.do(http.MethodGet, "/v1/models/nope", "")
	var e apiErr
	if err := json.Unmarshal(b, &e); err != nil || st != 404 || e.code() != "model_not_found" {
		t.Errorf("unknown model: %d %s", st, b)
	}
	h.waitIdle()
}

// engineStates reads switchboard.engine.state: the state each engine is
// in (the one value at 1), by engine.
func (h *harness) engineStates() map[string]string {
	h.t.Helper()
	m, ok := findMetric(h.collect(), telemetry.EngineStateName)
	if !ok {
		return nil
	}
	out := map[string]string{}
	for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
		if dp.Value == 1 {
			e, _ := dp.Attributes.Value(telemetry.AttrEngine)
			s, _ := dp.Attributes.Value(telemetry.AttrState)
			out[e.AsString()] = s.AsString()
		}
	}
	return out
}

// TestEngineSleepWake puts an engine to sleep through the admin API: it
// leaves routing at once (its model answers 503 while it is the only
// engine), /admin/engines and switchboard.engine.state say sleeping, the
// engine itself says so; after wake_up it serves again. An engine woken
// behind the gateway's back comes back at the next probe.
func TestEngineSleepWake(t *testing.T) {
	_, _, srv := recordedSim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 2})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	// Stats on, scraped only when the test says (ScrapeNow), and trusted
	// all along: the engine's own sleep state is seen too.
	cfg.EngineStats.Enabled, cfg.EngineStats.Interval, cfg.EngineStats.MaxAge, cfg.EngineStats.Timeout = true, time.Hour, 2*time.Hour, time.Second
	h := newHarness(t, cfg)
	admin := httptest.NewServer(h.gw.AdminHandler(nil))
	t.Cleanup(admin.Close)
	call := func(method, path string) (int, string) {
		req, _ := http.NewRequest(method, admin.URL+path, nil)
		resp, err := admin.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	chat := `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
	state := func() string {
		for _, s := range h.gw.fleet.Status() {
			if s.Name == "e1" {
				return s.State
			}
		}
		return ""
	}
	if st, b := call(http.MethodPost, "/admin/engines/e1/sleep?level=1"); st != 200 {
		t.Fatalf("sleep: %d %s", st, b)
	}
	if st, _, b := h.do(http.MethodPost, "/v1/chat/completions", chat); st != 503 {
		t.Errorf("chat to a sleeping engine's model: %d %s, want 503", st, b)
	}
	if s := state(); s != "sleeping" {
		t.Errorf("admin state %q, want sleeping", s)
	}
	if s := h.engineStates()["e1"]; s != "sleeping" {
		t.Errorf("state gauge %q, want sleeping", s)
	}
	if st, b := call(http.MethodGet, "/admin/engines/e1/is_sleeping"); st != 200 || !strings.Contains(b, `"is_sleeping":true`) {
		t.Errorf("is_sleeping: %d %s", st, b)
	}
	// The scraped stats now say asleep too; wake_up must not wait for the
	// next scrape to bring the engine back.
	h.gw.fleet.ScrapeNow(t.Context())
	if st, b := call(http.MethodPost, "/admin/engines/e1/wake_up"); st != 200 {
		t.Fatalf("wake_up: %d %s", st, b)
	}
	if st, _, b := h.do(http.MethodPost, "/v1/chat/completions", chat); st != 200 {
		t.Errorf("chat right after wake_up: %d %s", st, b)
	}
	if s := h.engineStates()["e1"]; s != "ready" {
		t.Errorf("state gauge %q, want ready", s)
	}

	// Asleep through the gateway, woken directly: the probe brings it back.
	if st, b := call(http.MethodPost, "/admin/engines/e1/sleep"); st != 200 {
		t.Fatalf("sleep: %d %s", st, b)
	}
	resp, err := http.Post(srv.URL+"/wake_up", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	h.gw.fleet.ProbeNow(t.Context())
	if s := state(); s != "ready" {
		t.Errorf("after a direct wake-up and a probe: state %q, want ready", s)
	}
	if st, _ := call(http.MethodPost, "/admin/engines/nope/sleep"); st != 404 {
		t.Errorf("unknown engine: %d, want 404", st)
	}
	if st, _ := call(http.MethodPost, "/admin/engines/e1/bogus"); st != 404 {
		t.Errorf("unknown action: %d, want 404", st)
	}
	if st, _ := call(http.MethodGet, "/admin/engines/e1/sleep"); st != 405 {
		t.Errorf("GET on a POST action: %d, want 405", st)
	}
	h.waitIdle()
}

// TestLoRAAdapters loads an adapter on one of two engines through the
// admin API: /v1/models lists it with its parent at once, requests naming
// it go only to that engine, and after unloading it is unknown again.
// Loading it for a base model reaches every engine serving that model.
func TestLoRAAdapters(t *testing.T) {
	_, rec1, srv1 := recordedSim(t, enginesim.Config{Models: []string{"base"}, OutputTokens: 2})
	_, _, srv2 := recordedSim(t, enginesim.Config{Models: []string{"base"}, OutputTokens: 2})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: srv1.URL}, fleet.EngineConfig{Name: "e2", URL: srv2.URL}))
	admin := httptest.NewServer(h.gw.AdminHandler(nil))
	t.Cleanup(admin.Close)
	post := func(path, body string) (int, string) {
		resp, err := admin.Client().Post(admin.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, b := post("/admin/engines/e2/load_lora_adapter", `{"lora_name":"sql","lora_path":"/adapters/sql"}`); st != 200 {
		t.Fatalf("load: %d %s", st, b)
	}
	_, _, b := h.do(http.MethodGet, "/v1/models/sql", "")
	var card fleet.ModelCard
	if err := json.Unmarshal(b, &card); err != nil || card.Parent == nil || *card.Parent != "base" {
		t.Errorf("adapter card %s, want parent base", b)
	}
	chat := `{"model":"sql","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
	n1 := rec1.n()
	for range 4 {
		if st, hdr, b := h.do(http.MethodPost, "/v1/chat/completions", chat); st != 200 || hdr.Get("X-Switchboard-Engine") != "e2" {
			t.Errorf("adapter request: %d from %q: %s", st, hdr.Get("X-Switchboard-Engine"), b)
		}
	}
	if rec1.n() != n1 {
		t.Errorf("e1 (no adapter) got %d adapter requests", rec1.n()-n1)
	}
	if st, b := post("/admin/engines/e2/unload_lora_adapter", `{"lora_name":"sql"}`); st != 200 {
		t.Fatalf("unload: %d %s", st, b)
	}
	if st, _, _ := h.do(http.MethodPost, "/v1/chat/completions", chat); st != 404 {
		t.Errorf("unloaded adapter: %d, want 404", st)
	}
	st, out := post("/admin/models/load_lora_adapter?model=base", `{"lora_name":"sql","lora_path":"/adapters/sql"}`)
	if st != 200 || strings.Count(out, `"status":200`) != 2 {
		t.Fatalf("load on every engine serving base: %d %s", st, out)
	}
	seen := map[string]bool{}
	for range 4 {
		_, hdr, _ := h.do(http.MethodPost, "/v1/chat/completions", chat)
		seen[hdr.Get("X-Switchboard-Engine")] = true
	}
	if !seen["e1"] || !seen["e2"] {
		t.Errorf("adapter on both engines served by %v", seen)
	}
	h.waitIdle()
}

// TestModelFromPathAndQuery adds rows whose model comes from a path
// parameter and from a query parameter (no current vLLM route does, the
// table supports both): each request goes to the engine serving that
// model, and an unknown one is a 404 before any engine is asked.
func TestModelFromPathAndQuery(t *testing.T) {
	answer := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"served_by":"`+name+`"}`)
		}
	}
	e1 := fakeEngine(t, []string{"a"}, answer("e1"))
	e2 := fakeEngine(t, []string{"b"}, answer("e2"))
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: e1.URL, Models: []string{"a"}}, fleet.EngineConfig{Name: "e2", URL: e2.URL, Models: []string{"b"}}))
	h.gw.ops = append(slices.Clone(operations),
		&operation{name: "test.query", genai: "test", method: http.MethodGet, paths: []string{"/v1/test/query"},
			body: bodyNone, model: modelQuery, param: "model", class: classLight, framing: frameAny},
		&operation{name: "test.path", genai: "test", method: http.MethodGet, paths: []string{"/v1/test/{model}/info"},
			body: bodyNone, model: modelPath, param: "model", class: classLight, framing: frameAny},
	)
	srv := httptest.NewServer(h.gw.Handler())
	t.Cleanup(srv.Close)
	for _, tc := range []struct{ path, want string }{
		{"/v1/test/query?model=a", "e1"}, {"/v1/test/query?model=b", "e2"},
		{"/v1/test/a/info", "e1"}, {"/v1/test/b/info", "e2"},
	} {
		resp, err := srv.Client().Get(srv.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Switchboard-Engine") != tc.want {
			t.Errorf("GET %s: %d from %q (%s), want 200 from %s", tc.path, resp.StatusCode, resp.Header.Get("X-Switchboard-Engine"), b, tc.want)
		}
	}
	before := h.histCount(telemetry.RequestDurationName)
	resp, err := srv.Client().Get(srv.URL + "/v1/test/query?model=nope")
	if err != nil {
		t.Fatal(err)
	}
	if e := decodeErr(t, resp); resp.StatusCode != 404 || e.code() != "model_not_found" {
		t.Errorf("unknown model: %d %v", resp.StatusCode, e)
	}
	if n := h.histCount(telemetry.RequestDurationName); n != before {
		t.Errorf("an unknown model reached an engine")
	}
	h.waitIdle()
}
