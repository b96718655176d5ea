package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
)

// TestCaseL13ModelAwareRouting: /v1/models is the sorted, deduplicated union
// answered by the gateway; requests go only to engines serving the model;
// an unknown model is a 404 without contacting any engine; before any
// engine has reported its models, /v1/models is 503, not an empty list.
func TestCaseL13ModelAwareRouting(t *testing.T) {
	e1, s1 := sim(t, enginesim.Config{Name: "e1", Models: []string{"llama-8b"}})
	e2, s2 := sim(t, enginesim.Config{Name: "e2", Models: []string{"qwen-7b", "qwen-7b-lora"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: s1.URL}, fleet.EngineConfig{Name: "e2", URL: s2.URL}), withoutStart())

	t.Run("before discovery", func(t *testing.T) {
		resp, err := h.client.Get(h.srv.URL + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("status %d, want 503", resp.StatusCode)
		}
		decodeErr(t, resp)
		// A model request before discovery is 503 (retry), not 404.
		r2 := h.post("/v1/chat/completions", `{"model":"qwen-7b","messages":[{"role":"user","content":"x"}]}`)
		if r2.StatusCode != http.StatusServiceUnavailable || r2.Header.Get("Retry-After") == "" {
			t.Fatalf("status %d Retry-After %q, want 503 with Retry-After", r2.StatusCode, r2.Header.Get("Retry-After"))
		}
		decodeErr(t, r2)
	})

	h.gw.Start()
	// The sorted union, each model with the card of the engine serving it,
	// the same bytes every time.
	var first string
	for i := range 20 {
		resp, err := h.client.Get(h.srv.URL + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if i == 0 {
			first = string(b)
			var list struct {
				Data []fleet.ModelCard `json:"data"`
			}
			_ = json.Unmarshal(b, &list)
			var ids []string
			for _, m := range list.Data {
				ids = append(ids, m.ID)
				if m.OwnedBy != "vllm" || m.Created == 0 {
					t.Errorf("card %+v is not the engine's", m)
				}
			}
			if strings.Join(ids, ",") != "llama-8b,qwen-7b,qwen-7b-lora" {
				t.Fatalf("GET /v1/models: %d %s", resp.StatusCode, b)
			}
		}
		if resp.StatusCode != http.StatusOK || string(b) != first {
			t.Fatalf("GET /v1/models #%d: %d %s\nwant %s", i, resp.StatusCode, b, first)
		}
	}

	for range 20 {
		resp := h.post("/v1/chat/completions", `{"model":"qwen-7b-lora","max_tokens":2,"messages":[{"role":"user","content":"x"}]}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Switchboard-Engine") != "e2" {
			t.Fatalf("status %d engine %q, want 200 from e2", resp.StatusCode, resp.Header.Get("X-Switchboard-Engine"))
		}
	}
	if n := e1.Stats().Received; n != 0 {
		t.Errorf("e1 (llama-8b only) received %d requests, want 0", n)
	}
	if n := e2.Stats().Received; n != 20 {
		t.Errorf("e2 received %d requests, want 20", n)
	}

	resp := h.post("/v1/chat/completions", `{"model":"does-not-exist","messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown model: status %d, want 404", resp.StatusCode)
	}
	e := decodeErr(t, resp)
	if e.Error.Type != "invalid_request_error" || e.code() != "model_not_found" || !strings.Contains(e.Error.Message, "does-not-exist") {
		t.Errorf("unknown model error %+v", e.Error)
	}
	if n := e1.Stats().Received + e2.Stats().Received; n != 20 {
		t.Errorf("engines received %d requests, want 20 (the unknown model must not reach one)", n)
	}
	h.waitIdle()
}

// TestRoutingSpreadsAcrossEngines: round-robin alternates between the two
// engines serving a model (least-loaded spreading is checked in
// TestCaseL02DisconnectsBeforeHeadersRelease).
func TestRoutingSpreadsAcrossEngines(t *testing.T) {
	e1, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	e2, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}, fleet.EngineConfig{Name: "e2", URL: s2.URL, Models: []string{"m"}}))
	for range 10 {
		resp := h.post("/v1/completions", `{"model":"m","prompt":"a","max_tokens":1}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if a, b := e1.Stats().Received, e2.Stats().Received; a != 5 || b != 5 {
		t.Errorf("round-robin split %d/%d, want 5/5", a, b)
	}
	h.waitIdle()
}
