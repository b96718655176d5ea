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
)

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
