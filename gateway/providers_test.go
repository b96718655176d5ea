package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/enginetest"
	"github.com/switchboard-gw/switchboard/internal/oai"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/telemetry"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"
)

// providerSim is a simulated hosted provider served over TLS with HTTP/2
// (a certificate from enginesim.NewTestTLS), as a gateway reaches one.
type providerSim struct {
	eng    *enginesim.Engine
	srv    *httptest.Server
	caFile string // the test CA, PEM, for engines[].ca_file
	// seen records what reached the provider: protocol, path and query,
	// and the credential headers.
	mu   sync.Mutex
	seen []seenRequest
}

type seenRequest struct {
	proto, path, query                 string
	auth, apiKey, xAPIKey, anthVersion string
	body, forwarded, org               string
}

func (p *providerSim) requests() []seenRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]seenRequest(nil), p.seen...)
}

// startProvider serves a simulated provider of kind with key, its model
// names mapped to the sim's served model "m".
func startProvider(t *testing.T, kind, key string, models map[string]string, rpm int, simCfg ...func(*enginesim.Config)) *providerSim {
	t.Helper()
	cfg := enginesim.Config{Name: "prov-" + kind, Models: []string{"m"},
		Provider: enginesim.ProviderConfig{Kind: kind, Key: key, Models: models, RequestsPerMinute: rpm}}
	for _, f := range simCfg {
		f(&cfg)
	}
	eng, err := enginesim.New(enginetest.Fast(cfg))
	if err != nil {
		t.Fatal(err)
	}
	p := &providerSim{eng: eng}
	h := eng.Handler()
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		p.mu.Lock()
		p.seen = append(p.seen, seenRequest{proto: r.Proto, path: r.URL.Path, query: r.URL.RawQuery, auth: r.Header.Get("Authorization"),
			apiKey: r.Header.Get("Api-Key"), xAPIKey: r.Header.Get("X-Api-Key"), anthVersion: r.Header.Get("Anthropic-Version"), body: string(b),
			forwarded: r.Header.Get("X-Forwarded-For") + r.Header.Get("Forwarded"), org: r.Header.Get("Openai-Organization")})
		p.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	cert, caPEM, err := enginesim.NewTestTLS()
	if err != nil {
		t.Fatal(err)
	}
	p.srv.EnableHTTP2 = true
	p.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
	p.srv.StartTLS()
	t.Cleanup(p.srv.Close)
	p.caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p.caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// openAI returns the engine config of an OpenAI provider engine named
// name that reaches p (its base URL with /v1, its CA) with key, serving
// model m.
func (p *providerSim) openAI(name, key string) fleet.EngineConfig {
	return fleet.EngineConfig{Name: name, URL: p.srv.URL + "/v1", Provider: fleet.ProviderOpenAI, APIKey: key, CAFile: p.caFile, Models: []string{"m"}}
}

// spendMinute spends p's one request of the minute (its rpm 1) from
// another client than the gateway, with key.
func (p *providerSim) spendMinute(t *testing.T, key string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, p.srv.URL+"/v1/chat/completions", strings.NewReader(provChat))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := providerClient(t, p.caFile).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("spending the provider's minute: status %d", resp.StatusCode)
	}
}

// keyFile writes key to a file for engines[].api_key_file.
func keyFile(t *testing.T, key string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(f, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

const provChat = `{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":4}`
const provChatStream = `{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":4,"stream":true}`

// TestProviderOpenAI: an OpenAI provider engine gets the request over
// HTTP/2 at its base URL's path, with its Bearer key (read from a file),
// the model under its provider name, and no vLLM-only member; the client
// gets the answer without the provider's account headers, streamed and
// not, with usage.
func TestProviderOpenAI(t *testing.T) {
	const key = "sk-test-openai-0123456789"
	p := startProvider(t, enginesim.ProviderOpenAI, key, map[string]string{"gpt-test": "m"}, 1000)
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "openai", URL: p.srv.URL + "/v1", Provider: fleet.ProviderOpenAI,
		APIKeyFile: keyFile(t, key), CAFile: p.caFile, ModelMap: map[string]string{"m": "gpt-test"}}))

	for _, body := range []string{provChat, provChatStream} {
		resp := h.post("/v1/chat/completions", body, "Authorization", "Bearer client-key-must-not-pass", "OpenAI-Organization", "org-client")
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		for k := range resp.Header {
			if strings.HasPrefix(k, "X-Ratelimit-") || k == "Set-Cookie" || k == "Openai-Organization" {
				t.Errorf("provider account header %s reached the client", k)
			}
		}
		if !strings.Contains(string(b), `"gpt-test"`) {
			t.Errorf("answer does not name the provider's model: %s", b)
		}
	}
	reqs := p.requests()
	if len(reqs) != 2 {
		t.Fatalf("provider got %d requests, want 2 (never a probe or a scrape)", len(reqs))
	}
	for _, r := range reqs {
		if r.proto != "HTTP/2.0" || r.path != "/v1/chat/completions" || r.query != "" {
			t.Errorf("provider got %s %s?%s, want HTTP/2.0 /v1/chat/completions", r.proto, r.path, r.query)
		}
		if r.auth != "Bearer "+key {
			t.Errorf("Authorization %q, want the engine's key", r.auth)
		}
		if r.forwarded != "" || r.org != "" {
			t.Errorf("the provider got the client's address %q or organization %q", r.forwarded, r.org)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(r.body), &m); err != nil {
			t.Fatal(err)
		}
		if m["model"] != "gpt-test" {
			t.Errorf("body model %v, want gpt-test", m["model"])
		}
		if _, ok := m["return_token_ids"]; ok {
			t.Errorf("a provider got vLLM's return_token_ids: %s", r.body)
		}
	}
	h.waitIdle()
	if n := h.counter(telemetry.TierLegsName, attribute.Int("switchboard.tier", 1)); n != 2 {
		t.Errorf("tier 1 legs %d, want 2", n)
	}
	engineSpans := 0
	for _, sp := range h.spans.Ended() {
		if sp.SpanKind() != trace.SpanKindClient {
			continue
		}
		engineSpans++
		attrs := attribute.NewSet(sp.Attributes()...)
		if v, _ := attrs.Value(telemetry.AttrGenAIProvider); v.AsString() != "openai" {
			t.Errorf("engine span %q: gen_ai.provider.name %q, want openai", sp.Name(), v.AsString())
		}
	}
	if engineSpans != 2 {
		t.Errorf("%d engine spans, want 2", engineSpans)
	}
}

// TestProviderAzure: Azure gets its deployment path with api-version and
// the api-key header; an embeddings request too; a route Azure's API does
// not have gets a 404 from the gateway, and never reaches it.
func TestProviderAzure(t *testing.T) {
	const key = "azure-key-abcdef"
	t.Setenv("TEST_AZURE_KEY", key)
	p := startProvider(t, enginesim.ProviderAzure, key, map[string]string{"my-deploy": "m"}, 0)
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "azure", URL: p.srv.URL, Provider: fleet.ProviderAzure,
		APIKeyEnv: "TEST_AZURE_KEY", CAFile: p.caFile, ModelMap: map[string]string{"m": "my-deploy"}, APIVersion: "2024-10-21"}))
	st, _, b := h.do(http.MethodPost, "/v1/chat/completions", provChat)
	if st != http.StatusOK {
		t.Fatalf("chat status %d: %s", st, b)
	}
	st, _, b = h.do(http.MethodPost, "/v1/embeddings", `{"model":"m","input":"hi"}`)
	if st != http.StatusOK {
		t.Fatalf("embeddings status %d: %s", st, b)
	}
	st, _, b = h.do(http.MethodPost, "/tokenize", `{"model":"m","prompt":"hi"}`)
	if st != http.StatusNotFound || !strings.Contains(string(b), "model_not_found") {
		t.Errorf("tokenize on an Azure-only model: %d %s, want 404 model_not_found", st, b)
	}
	reqs := p.requests()
	if len(reqs) != 2 {
		t.Fatalf("provider got %d requests, want 2", len(reqs))
	}
	for i, want := range []string{"/openai/deployments/my-deploy/chat/completions", "/openai/deployments/my-deploy/embeddings"} {
		if r := reqs[i]; r.path != want || r.query != "api-version=2024-10-21" || r.apiKey != key || r.auth != "" {
			t.Errorf("request %d: %s?%s api-key %q auth %q, want %s?api-version=2024-10-21 with the api-key", i, r.path, r.query, r.apiKey, r.auth, want)
		}
	}
}

// TestProviderAnthropic: /v1/messages reaches Anthropic with x-api-key
// and the default anthropic-version (a client's own kept), chat
// completions its OpenAI-compatible endpoint with a Bearer key.
func TestProviderAnthropic(t *testing.T) {
	const key = "sk-ant-test-key"
	p := startProvider(t, enginesim.ProviderAnthropic, key, map[string]string{"claude-test": "m"}, 0)
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "anthropic", URL: p.srv.URL + "/v1", Provider: fleet.ProviderAnthropic,
		APIKey: key, CAFile: p.caFile, ModelMap: map[string]string{"claude": "claude-test"}}))
	msg := `{"model":"claude","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	if st, _, b := h.do(http.MethodPost, "/v1/messages", msg); st != http.StatusOK {
		t.Fatalf("messages status %d: %s", st, b)
	}
	if st, _, b := h.do(http.MethodPost, "/v1/messages", msg, "Anthropic-Version", "2099-01-01", "X-Api-Key", "client-key"); st != http.StatusOK {
		t.Fatalf("messages status %d: %s", st, b)
	}
	if st, _, b := h.do(http.MethodPost, "/v1/chat/completions", strings.Replace(provChat, `"m"`, `"claude"`, 1)); st != http.StatusOK {
		t.Fatalf("chat status %d: %s", st, b)
	}
	reqs := p.requests()
	if len(reqs) != 3 {
		t.Fatalf("provider got %d requests, want 3", len(reqs))
	}
	if r := reqs[0]; r.path != "/v1/messages" || r.xAPIKey != key || r.anthVersion != fleet.DefaultAnthropicVersion || r.auth != "" {
		t.Errorf("messages: %s x-api-key %q version %q auth %q", r.path, r.xAPIKey, r.anthVersion, r.auth)
	}
	if r := reqs[1]; r.xAPIKey != key || r.anthVersion != "2099-01-01" {
		t.Errorf("messages with the client's version and key: x-api-key %q version %q, want the engine's key and the client's version", r.xAPIKey, r.anthVersion)
	}
	if r := reqs[2]; r.path != "/v1/chat/completions" || r.auth != "Bearer "+key || r.xAPIKey != "" {
		t.Errorf("chat: %s auth %q x-api-key %q", r.path, r.auth, r.xAPIKey)
	}
}

// TestProviderAuthFailureHidesKey: a provider refusing the gateway's key
// is retried on another engine (a second provider engine with a good key
// serves it), and without one is a 502 provider_auth_failed for the
// client; neither its body, the logs, the spans nor /admin/engines ever
// show a key.
func TestProviderAuthFailureHidesKey(t *testing.T) {
	const good, bad = "sk-good-key-7f3a9c", "sk-wrong-key-e81b2d"
	p := startProvider(t, enginesim.ProviderOpenAI, good, nil, 0)
	var logs bytes.Buffer
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := testConfig(
		p.openAI("bad", bad),
		p.openAI("good", good),
	)
	h := newHarnessWith(t, cfg, []Option{WithLogger(log)})
	// Round robin: the first request goes to bad, refused unrun, and is
	// retried on good (as a connect failure: default retry conditions).
	st, hdr, b := h.do(http.MethodPost, "/v1/chat/completions", provChat)
	if st != http.StatusOK || hdr.Get("X-Switchboard-Engine") != "good" {
		t.Fatalf("status %d on %q: %s, want 200 from good after bad's refusal", st, hdr.Get("X-Switchboard-Engine"), b)
	}
	// Without good, the client gets the 502.
	if !h.gw.fleet.Remove("good") {
		t.Fatal("good not removed")
	}
	st, _, b = h.do(http.MethodPost, "/v1/chat/completions", provChat)
	if st != http.StatusBadGateway || !strings.Contains(string(b), "provider_auth_failed") {
		t.Fatalf("status %d %s, want 502 provider_auth_failed", st, b)
	}
	resp := h.post("/v1/chat/completions", provChatStream)
	sb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("stream: status %d %s, want 502", resp.StatusCode, sb)
	}
	_, _, admin := adminGet(t, h, "/admin/engines")
	h.waitIdle()
	logMu.Lock()
	all := logs.String() + string(b) + string(sb) + string(admin)
	logMu.Unlock()
	for _, s := range h.spans.Ended() {
		for _, kv := range s.Attributes() {
			all += kv.Value.Emit()
		}
		for _, ev := range s.Events() {
			for _, kv := range ev.Attributes {
				all += kv.Value.Emit()
			}
		}
		all += s.Status().Description
	}
	for _, secret := range []string{bad, bad[len(bad)-4:], good} {
		if strings.Contains(all, secret) {
			t.Errorf("%q appears in a log line, a span, an error body or /admin", secret)
		}
	}
	if !strings.Contains(logs.String(), "refused the gateway's credentials") {
		t.Errorf("no log line says the provider refused the key:\n%s", logs.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// adminGet reads an admin path from the gateway's admin handler.
func adminGet(t *testing.T, h *harness, path string) (int, http.Header, []byte) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.gw.AdminHandler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Header(), rec.Body.Bytes()
}

// TestTierOverflow: with the self-hosted engine at its max_in_flight, a
// request spills to the provider tier (counted once, shown on
// /admin/engines), and the next one, with room again, stays self-hosted.
func TestTierOverflow(t *testing.T) {
	const key = "sk-overflow"
	p := startProvider(t, enginesim.ProviderOpenAI, key, nil, 0)
	local, srv := sim(t, enginesim.Config{Name: "local", Models: []string{"m"}, ITL: 20 * time.Millisecond})
	h := newHarness(t, testConfig(
		fleet.EngineConfig{Name: "local", URL: srv.URL, Models: []string{"m"}, MaxInFlight: 1},
		p.openAI("openai", key),
	))
	long := `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":50,"stream":true}`
	held := h.post("/v1/chat/completions", long)
	defer held.Body.Close()
	testutil.Poll(2*time.Second, func() bool { pf, dc := endpointLoad(h, "local"); return pf+dc == 1 })
	st, hdr, b := h.do(http.MethodPost, "/v1/chat/completions", provChat)
	if st != http.StatusOK || hdr.Get("X-Switchboard-Engine") != "openai" {
		t.Fatalf("overflowed request: %d on %q: %s, want 200 from openai", st, hdr.Get("X-Switchboard-Engine"), b)
	}
	_, _ = io.Copy(io.Discard, held.Body)
	h.waitIdle()
	st, hdr, _ = h.do(http.MethodPost, "/v1/chat/completions", provChat)
	if st != http.StatusOK || hdr.Get("X-Switchboard-Engine") != "local" {
		t.Errorf("request with room: on %q, want local", hdr.Get("X-Switchboard-Engine"))
	}
	if n := h.counter(telemetry.TierOverflowsName, attribute.Int("switchboard.tier", 0), attribute.Int("switchboard.tier.to", 1)); n != 1 {
		t.Errorf("overflows 0->1 = %d, want 1", n)
	}
	if got := local.Stats().Received; got != 2 {
		t.Errorf("local engine got %d requests, want 2", got)
	}
	_, _, body := adminGet(t, h, "/admin/engines")
	var admin struct {
		Tiers []TierStatus `json:"tiers"`
	}
	if err := json.Unmarshal(body, &admin); err != nil {
		t.Fatal(err)
	}
	if len(admin.Tiers) != 2 || admin.Tiers[0].Legs != 2 || admin.Tiers[1].Legs != 1 || admin.Tiers[1].OverflowsIn != 1 || admin.Tiers[0].OverflowsOut != 1 {
		t.Errorf("tiers %+v, want tier 0 with 2 legs and 1 overflow out, tier 1 with 1 leg and 1 overflow in", admin.Tiers)
	}
	if s := admin.Tiers[1].Share; s < 0.33 || s > 0.34 {
		t.Errorf("tier 1 share %v, want 1/3", s)
	}
}

// endpointLoad returns the named engine's prefill and decode counts.
func endpointLoad(h *harness, name string) (int64, int64) {
	for _, e := range h.gw.fleet.Engines() {
		if e.Name() == name {
			return e.Endpoint().InFlight()
		}
	}
	return -1, -1
}

// TestTierFallback: the self-hosted engine failing before content (its
// 500), the retry goes to the provider tier and the client gets its
// answer; the fallback is counted.
func TestTierFallback(t *testing.T) {
	const key = "sk-fallback"
	p := startProvider(t, enginesim.ProviderOpenAI, key, nil, 0)
	_, srv := sim(t, enginesim.Config{Name: "local", Models: []string{"m"}, Fault: "status=500"})
	cfg := testConfig(
		fleet.EngineConfig{Name: "local", URL: srv.URL, Models: []string{"m"}},
		p.openAI("openai", key),
	)
	cfg.Retry.On = []string{"500"}
	h := newHarness(t, cfg)
	for _, body := range []string{provChat, provChatStream} {
		st, hdr, b := h.do(http.MethodPost, "/v1/chat/completions", body)
		if st != http.StatusOK || hdr.Get("X-Switchboard-Engine") != "openai" {
			t.Fatalf("status %d on %q: %s, want 200 from openai", st, hdr.Get("X-Switchboard-Engine"), b)
		}
	}
	h.waitIdle()
	if n := h.counter(telemetry.TierFallbacksName, attribute.Int("switchboard.tier", 0), attribute.Int("switchboard.tier.to", 1)); n != 2 {
		t.Errorf("fallbacks 0->1 = %d, want 2", n)
	}
}

// TestProviderBackOff: a provider whose rate-limit headers say its limit
// is exhausted, or that answers 429 with Retry-After, is backed off: the
// next requests go to the other provider engine of the tier, not to it,
// and /admin/engines shows the back-off.
func TestProviderBackOff(t *testing.T) {
	const key = "sk-backoff"
	for _, tc := range []struct {
		name string
		// spent: the minute's one request was spent by another client
		// first, so the gateway's first request gets the 429.
		spent bool
	}{{"exhausted headers", false}, {"429 retry-after", true}} {
		t.Run(tc.name, func(t *testing.T) {
			limited := startProvider(t, enginesim.ProviderOpenAI, key, nil, 1)
			other := startProvider(t, enginesim.ProviderOpenAI, key, nil, 0)
			if tc.spent {
				limited.spendMinute(t, key)
			}
			h := newHarness(t, testConfig(
				limited.openAI("limited", key),
				other.openAI("other", key),
			))
			for i := range 6 {
				if st, _, b := h.do(http.MethodPost, "/v1/chat/completions", provChat); st != http.StatusOK {
					t.Fatalf("request %d: %d %s, want 200 (a 429 is retried on the other engine)", i, st, b)
				}
			}
			// Round robin: the first request goes to limited; it passes and
			// says the minute's limit is exhausted, or gets the 429 (retried
			// on other). Either way limited is backed off and every later
			// request goes to other.
			got := len(limited.requests()) - btoi(tc.spent)
			if got != 1 {
				t.Errorf("the limited engine got %d requests from the gateway, want 1", got)
			}
			wantOther := 5 + btoi(tc.spent)
			if n := len(other.requests()); n != wantOther {
				t.Errorf("the other engine got %d requests, want %d", n, wantOther)
			}
			var status []fleet.EngineStatus
			for _, s := range h.gw.fleet.Status() {
				if s.Name == "limited" {
					status = append(status, s)
				}
			}
			if len(status) != 1 || status[0].BackingOffUntil == nil || status[0].BackOffs != 1 || status[0].Tier != 1 || status[0].Provider != "openai" {
				t.Errorf("status %+v, want one back-off, tier 1, provider openai", status)
			} else if d := time.Until(*status[0].BackingOffUntil); d < 30*time.Second || d > 61*time.Second {
				t.Errorf("backing off for %v more, want the rest of the provider's minute", d)
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// providerClient returns a client trusting the CA in caFile.
func providerClient(t *testing.T, caFile string) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// TestEventUsageCache: an Anthropic stream's prompt is its input_tokens
// plus the tokens read from and written to its cache (reported apart,
// and per field in later events), its cached part the tokens read; a
// Responses usage's input_tokens is the prompt, with its cached part.
func TestEventUsageCache(t *testing.T) {
	var a attempt
	for _, ev := range []string{
		`{"type":"message_start","message":{"id":"m","usage":{"input_tokens":3,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":1}}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}`,
		`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}`,
	} {
		e, err := oai.InspectAnthropicEvent([]byte(ev))
		if err != nil {
			t.Fatal(err)
		}
		a.noteEventUsage(&e, true)
	}
	if !a.hasUsage || a.usage.PromptTokens != 2103 || a.usage.CompletionTokens != 15 || !a.usage.HasCached || a.usage.CachedTokens != 2000 {
		t.Errorf("anthropic usage %+v, want prompt 2103 (3 + 2000 read + 100 written), cached 2000, output 15", a.usage)
	}
	var r attempt
	e, err := oai.InspectResponsesEvent([]byte(`{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":32},"output_tokens":2}}}`))
	if err != nil {
		t.Fatal(err)
	}
	r.noteEventUsage(&e, false)
	if r.usage.PromptTokens != 50 || r.usage.CachedTokens != 32 || !r.usage.HasCached || r.usage.CompletionTokens != 2 {
		t.Errorf("responses usage %+v, want prompt 50, cached 32, output 2", r.usage)
	}
}

// TestTierOverflowOnQueueDepth: a self-hosted engine whose scraped queue
// (vllm:num_requests_waiting) is at its max_queue_depth counts as full:
// the next request spills to the provider tier; with no provider tier it
// still goes to the engine (a queue is not a refusal).
func TestTierOverflowOnQueueDepth(t *testing.T) {
	const key = "sk-queue"
	p := startProvider(t, enginesim.ProviderOpenAI, key, nil, 0)
	for _, withProvider := range []bool{true, false} {
		_, srv := sim(t, enginesim.Config{Name: "local", Models: []string{"m"}, MaxNumSeqs: 1, ITL: 20 * time.Millisecond})
		engines := []fleet.EngineConfig{{Name: "local", URL: srv.URL, Models: []string{"m"}, MaxQueueDepth: 1}}
		if withProvider {
			engines = append(engines, p.openAI("openai", key))
		}
		h := newHarness(t, testConfig(engines...))
		long := `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":25,"stream":true}`
		var held []*http.Response
		for range 2 { // one runs, one waits in the engine's queue
			held = append(held, h.post("/v1/chat/completions", long))
		}
		testutil.Poll(2*time.Second, func() bool {
			h.gw.fleet.ScrapeNow(context.Background())
			st := h.gw.fleet.Status()[0].Stats
			return st != nil && st.Waiting >= 1
		})
		st, hdr, b := h.do(http.MethodPost, "/v1/chat/completions", provChat)
		want := "local"
		if withProvider {
			want = "openai"
		}
		if st != http.StatusOK || hdr.Get("X-Switchboard-Engine") != want {
			t.Errorf("provider tier %v: %d on %q (%s), want 200 on %s", withProvider, st, hdr.Get("X-Switchboard-Engine"), b, want)
		}
		for _, r := range held {
			_, _ = io.Copy(io.Discard, r.Body)
			r.Body.Close()
		}
		h.waitIdle()
	}
}

// TestProviderCost: a request that overflowed to a provider is priced at
// the provider's list price from the usage it answered with, streamed and
// not, one that stayed self-hosted at the self-hosted price; both in the
// key's spend and switchboard.request.cost by engine.
func TestProviderCost(t *testing.T) {
	const key = "sk-cost"
	p := startProvider(t, enginesim.ProviderOpenAI, key, map[string]string{"gpt-test": "m"}, 0)
	_, srv := sim(t, enginesim.Config{Name: "local", Models: []string{"m"}, ITL: 20 * time.Millisecond})
	cfg := testConfig(
		fleet.EngineConfig{Name: "local", URL: srv.URL, Models: []string{"m"}, MaxInFlight: 1},
		fleet.EngineConfig{Name: "openai", URL: p.srv.URL + "/v1", Provider: fleet.ProviderOpenAI, APIKey: key, CAFile: p.caFile, ModelMap: map[string]string{"m": "gpt-test"}},
	)
	cfg.Auth = AuthConfig{Keys: []KeyConfig{{Name: "team-1", SHA256: sha("k-1"), Models: []string{"*"}}}}
	cfg.Pricing = []PriceConfig{
		{Engine: "openai", Input: 0.15, Output: 0.60},
		{Model: "m", Input: 0.02, Output: 0.08},
	}
	h := newHarness(t, cfg)
	usage := func(b []byte, stream bool) (in, out float64) {
		t.Helper()
		s := string(b)
		if stream {
			i := strings.LastIndex(s, `"usage":`)
			if i < 0 {
				t.Fatalf("no usage in %s", s)
			}
			s = "{" + s[i:strings.Index(s[i:], "}")+i+1] + "}"
		}
		var u struct {
			Usage struct {
				PromptTokens     float64 `json:"prompt_tokens"`
				CompletionTokens float64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(s), &u); err != nil || u.Usage.PromptTokens == 0 || u.Usage.CompletionTokens == 0 {
			t.Fatalf("usage of %s: %v", s, err)
		}
		return u.Usage.PromptTokens, u.Usage.CompletionTokens
	}
	var wantProvider, wantLocal float64
	long := `{"model":"m","messages":[{"role":"user","content":"hold the slot"}],"max_tokens":40,"stream":true,"stream_options":{"include_usage":true}}`
	for _, stream := range []bool{false, true} {
		held := h.post("/v1/chat/completions", long, "Authorization", "Bearer k-1")
		testutil.Poll(2*time.Second, func() bool { pf, dc := endpointLoad(h, "local"); return pf+dc == 1 })
		body := `{"model":"m","messages":[{"role":"user","content":"what does it cost"}],"max_tokens":6,"stream":` + fmt.Sprint(stream) + `,"stream_options":{"include_usage":true}}`
		if !stream {
			body = `{"model":"m","messages":[{"role":"user","content":"what does it cost"}],"max_tokens":6}`
		}
		resp := h.post("/v1/chat/completions", body, "Authorization", "Bearer k-1")
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Switchboard-Engine") != "openai" {
			t.Fatalf("stream %v: %d on %q: %s", stream, resp.StatusCode, resp.Header.Get("X-Switchboard-Engine"), b)
		}
		in, out := usage(b, stream)
		wantProvider += in*0.15e-6 + out*0.60e-6
		hb, _ := io.ReadAll(held.Body)
		held.Body.Close()
		in, out = usage(hb, true)
		wantLocal += in*0.02e-6 + out*0.08e-6
	}
	h.waitIdle()
	byEngine := map[string]float64{}
	m, ok := findMetric(h.collect(), telemetry.RequestCostName)
	if !ok {
		t.Fatalf("%s not recorded", telemetry.RequestCostName)
	}
	for _, dp := range m.Data.(metricdata.Sum[float64]).DataPoints {
		e, _ := dp.Attributes.Value(telemetry.AttrEngine)
		byEngine[e.AsString()] += dp.Value
	}
	if math.Abs(byEngine["openai"]-wantProvider) > 1e-12 || math.Abs(byEngine["local"]-wantLocal) > 1e-12 {
		t.Errorf("cost by engine %v, want openai %v, local %v", byEngine, wantProvider, wantLocal)
	}
	if ks := h.gw.Keys(); len(ks) != 1 || math.Abs(ks[0].Spend-(wantProvider+wantLocal)) > 1e-8 {
		t.Errorf("key spend %+v, want %v", ks, wantProvider+wantLocal)
	}
}

// TestTierOverflowUnderLoad: 16 concurrent streams against two
// self-hosted engines of max_in_flight 2 and a provider tier: every one is
// answered, the self-hosted engines take about their capacity (the
// breaker is checked at admission, so concurrent admissions may pass it
// by a few), the rest overflows, and each overflow is one provider leg.
func TestTierOverflowUnderLoad(t *testing.T) {
	const key = "sk-load"
	p := startProvider(t, enginesim.ProviderOpenAI, key, nil, 0)
	l1, s1 := sim(t, enginesim.Config{Name: "l1", Models: []string{"m"}, ITL: 10 * time.Millisecond})
	l2, s2 := sim(t, enginesim.Config{Name: "l2", Models: []string{"m"}, ITL: 10 * time.Millisecond})
	h := newHarness(t, testConfig(
		fleet.EngineConfig{Name: "l1", URL: s1.URL, Models: []string{"m"}, MaxInFlight: 2},
		fleet.EngineConfig{Name: "l2", URL: s2.URL, Models: []string{"m"}, MaxInFlight: 2},
		p.openAI("openai", key),
	))
	const n = 16
	body := `{"model":"m","messages":[{"role":"user","content":"load"}],"max_tokens":30,"stream":true}`
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for range n {
		wg.Go(func() {
			resp := h.post("/v1/chat/completions", body)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "[DONE]") {
				errs <- fmt.Sprintf("%d %s", resp.StatusCode, b)
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	h.waitIdle()
	local := l1.Stats().Received + l2.Stats().Received
	provider := int64(len(p.requests()))
	overflows := h.counter(telemetry.TierOverflowsName)
	if local+provider != n || provider == 0 || local < 4 {
		t.Errorf("self-hosted %d, provider %d, want %d in all, the self-hosted engines at least their capacity 4 and the rest on the provider", local, provider, n)
	}
	if overflows != provider {
		t.Errorf("%d overflows counted, %d provider legs", overflows, provider)
	}
}
