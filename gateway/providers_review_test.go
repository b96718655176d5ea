package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/telemetry"
	"go.opentelemetry.io/otel/attribute"
)

// TestTierFallbackPastRetryAfter: a self-hosted engine's 503 asking for
// longer than retry_after_cap falls back to the provider tier at once:
// the provider is another engine, not the same one to wait for.
func TestTierFallbackPastRetryAfter(t *testing.T) {
	const key = "sk-ra"
	p := startProvider(t, enginesim.ProviderOpenAI, key, nil, 0)
	_, srv := sim(t, enginesim.Config{Name: "local", Models: []string{"m"}, Fault: "status=503,retry-after=30"})
	h := newHarness(t, testConfig(
		fleet.EngineConfig{Name: "local", URL: srv.URL, Models: []string{"m"}},
		p.openAI("openai", key),
	))
	st, hdr, b := h.do(http.MethodPost, "/v1/chat/completions", provChat)
	if st != http.StatusOK || hdr.Get("X-Switchboard-Engine") != "openai" {
		t.Fatalf("%d on %q: %s, want 200 from the provider tier", st, hdr.Get("X-Switchboard-Engine"), b)
	}
	h.waitIdle()
	if n := h.counter(telemetry.TierFallbacksName, attribute.Int("switchboard.tier", 0), attribute.Int("switchboard.tier.to", 1)); n != 1 {
		t.Errorf("fallbacks 0->1 = %d, want 1", n)
	}
	if n := h.counter(telemetry.TierOverflowsName); n != 0 {
		t.Errorf("%d overflows counted for a fallback, want 0", n)
	}
}

// TestContinuationOntoQueuedEngine: a stream broken on one engine is
// continued on the other, though that one's reported queue is at its
// max_queue_depth (a queue is not a refusal), with or without a provider
// tier the continuation cannot use.
func TestContinuationOntoQueuedEngine(t *testing.T) {
	const key = "sk-cont"
	p := startProvider(t, enginesim.ProviderOpenAI, key, nil, 0)
	for _, withProvider := range []bool{false, true} {
		busy, bsrv := sim(t, enginesim.Config{Name: "busy", Models: []string{"m"}, MaxNumSeqs: 1, ITL: 15 * time.Millisecond})
		_, ksrv := sim(t, enginesim.Config{Name: "breaker", Models: []string{"m"}, Fault: "close-after=3"})
		engines := []fleet.EngineConfig{
			{Name: "busy", URL: bsrv.URL, Models: []string{"m"}, MaxQueueDepth: 1},
			{Name: "breaker", URL: ksrv.URL, Models: []string{"m"}},
		}
		if withProvider {
			engines = append(engines, p.openAI("openai", key))
		}
		h := newHarness(t, testConfig(engines...))
		long := `{"model":"m","messages":[{"role":"user","content":"hold"}],"max_tokens":40,"stream":true}`
		var held []*http.Response
		for range 2 {
			req, _ := http.NewRequest(http.MethodPost, bsrv.URL+"/v1/chat/completions", strings.NewReader(long))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, resp)
		}
		testutil.Poll(2*time.Second, func() bool {
			h.gw.fleet.ScrapeNow(context.Background())
			st := h.gw.fleet.Status()[0].Stats
			return st != nil && st.Waiting >= 1
		})
		receivedBefore := busy.Stats().Received
		resp := h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"go on"}],"max_tokens":8,"stream":true}`)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "[DONE]") || strings.Contains(string(b), `"error"`) {
			t.Errorf("provider tier %v: %d %s, want the whole stream", withProvider, resp.StatusCode, b)
		}
		if got := busy.Stats().Received - receivedBefore; got != 1 {
			t.Errorf("provider tier %v: the queued engine got %d continuations, want 1", withProvider, got)
		}
		if withProvider && len(p.requests()) != 0 {
			t.Errorf("the provider got %d requests, want none (it takes no continuation)", len(p.requests()))
		}
		for _, r := range held {
			_, _ = io.Copy(io.Discard, r.Body)
			r.Body.Close()
		}
		h.waitIdle()
	}
}

// TestStickyRouteSkipsProviders: a stored response's lookup goes only to
// engines whose API has the route: not to Anthropic or Azure, whose APIs
// have no Responses retrieval.
func TestStickyRouteSkipsProviders(t *testing.T) {
	ant := startProvider(t, enginesim.ProviderAnthropic, "sk-ant", nil, 0)
	az := startProvider(t, enginesim.ProviderAzure, "az-key", map[string]string{"dep": "m"}, 0)
	_, srv := sim(t, enginesim.Config{Name: "local", Models: []string{"m"}})
	h := newHarness(t, testConfig(
		fleet.EngineConfig{Name: "local", URL: srv.URL, Models: []string{"m"}},
		fleet.EngineConfig{Name: "anthropic", URL: ant.srv.URL + "/v1", Provider: fleet.ProviderAnthropic, APIKey: "sk-ant", CAFile: ant.caFile, Models: []string{"m"}},
		fleet.EngineConfig{Name: "azure", URL: az.srv.URL, Provider: fleet.ProviderAzure, APIKey: "az-key", CAFile: az.caFile, ModelMap: map[string]string{"m": "dep"}},
	))
	st, _, b := h.do(http.MethodGet, "/v1/responses/resp_unknown123", "")
	if st != http.StatusNotFound {
		t.Errorf("status %d %s, want the self-hosted engine's 404", st, b)
	}
	if n, m := len(ant.requests()), len(az.requests()); n+m != 0 {
		t.Errorf("Anthropic got %d and Azure %d lookups, want none", n, m)
	}
	h.waitIdle()
	if n := h.counter(telemetry.TierLegsName); n != 0 {
		t.Errorf("%d tier legs counted for a lookup, want 0", n)
	}
}

// TestDisaggregationNeverOnProvider: with the prefill engine full (one
// disaggregated request in its prefill), the next disaggregable request
// is not prefilled on a provider (it reads no KV cache of ours): the
// provider gets no kv_transfer_params, and the client its answer.
func TestDisaggregationNeverOnProvider(t *testing.T) {
	const key = "sk-pd"
	p := startProvider(t, enginesim.ProviderOpenAI, key, nil, 0)
	_, cfg := pdFleet(t, func(name string, c *enginesim.Config) {
		if name == "p1" {
			c.TTFT = 400 * time.Millisecond // a slow prefill holds p1's one slot
		}
	}, "prefill", "decode")
	cfg.Engines[0].MaxInFlight = 1
	cfg.Engines = append(cfg.Engines, p.openAI("openai", key))
	h := newHarness(t, cfg)
	body := `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"` + longPrompt + `"}]}`
	first := make(chan int, 1)
	go func() {
		st, _, _ := h.do(http.MethodPost, "/v1/chat/completions", body)
		first <- st
	}()
	testutil.Poll(2*time.Second, func() bool { pf, dc := endpointLoad(h, "p1"); return pf+dc == 1 })
	st, _, b := h.do(http.MethodPost, "/v1/chat/completions", strings.Replace(body, "word", "other", 1))
	if st != http.StatusOK {
		t.Errorf("second request: %d %s", st, b)
	}
	if st := <-first; st != http.StatusOK {
		t.Errorf("first request: %d", st)
	}
	for _, r := range p.requests() {
		if strings.Contains(r.body, "kv_transfer_params") {
			t.Errorf("the provider got a disaggregated leg: %s", r.body)
		}
	}
	h.waitIdle()
}

// TestStickyLookupOnBackingOffProvider: a stored response created on a
// provider that is now backing off its rate limit is still looked for
// there (last, or first when remembered): the client gets the provider's
// rate limit as the gateway's 429, not a misleading 404 from an engine
// that never held it.
func TestStickyLookupOnBackingOffProvider(t *testing.T) {
	const key = "sk-sticky"
	p := startProvider(t, enginesim.ProviderOpenAI, key, map[string]string{"gpt-test": "m"}, 1)
	_, srv := sim(t, enginesim.Config{Name: "local", Models: []string{"m"}})
	h := newHarness(t, testConfig(
		fleet.EngineConfig{Name: "local", URL: srv.URL, Models: []string{"m"}},
		fleet.EngineConfig{Name: "openai", URL: p.srv.URL + "/v1", Provider: fleet.ProviderOpenAI, APIKey: key, CAFile: p.caFile, ModelMap: map[string]string{"gpt": "gpt-test"}},
	))
	st, _, b := h.do(http.MethodPost, "/v1/responses", `{"model":"gpt","input":"hi","store":true}`)
	if st != http.StatusOK {
		t.Fatalf("create: %d %s", st, b)
	}
	var created struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &created); err != nil || created.ID == "" {
		t.Fatalf("no id in %s", b)
	}
	// The provider's one request a minute is spent: it is backing off.
	if s := h.gw.fleet.Status(); s[1].BackingOffUntil == nil {
		t.Fatalf("the provider is not backing off: %+v", s[1])
	}
	st, hdr, b := h.do(http.MethodGet, "/v1/responses/"+created.ID, "")
	if st != http.StatusTooManyRequests || !strings.Contains(string(b), "provider_rate_limited") || hdr.Get("Retry-After") == "" {
		t.Errorf("lookup: %d %s (Retry-After %q), want 429 provider_rate_limited with Retry-After", st, b, hdr.Get("Retry-After"))
	}
}
