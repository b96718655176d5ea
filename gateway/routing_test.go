package gateway

import (
	"bytes"
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
	// The alias replaced in place, and the request observed (continuation
	// is on): a stream with usage and token ids.
	if got := string(rec.last().body); got != `{"model":"org/base-8b","max_tokens":2,"messages":[{"role":"user","content":"hi"}],"return_token_ids":true,"stream":true,"stream_options":{"include_usage":true}}` {
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
