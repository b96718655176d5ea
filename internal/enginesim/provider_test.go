package enginesim

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// tlsProvider serves a new engine for cfg over HTTPS with HTTP/2 (a certificate from
// NewTestTLS) and returns it with a client that trusts only the test CA. setup, if not
// nil, runs on the engine before it serves.
func tlsProvider(t *testing.T, cfg Config, setup func(*Engine)) (*Engine, *httptest.Server, *http.Client) {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if setup != nil {
		setup(e)
	}
	cert, caPEM, err := NewTestTLS()
	if err != nil {
		t.Fatalf("NewTestTLS: %v", err)
	}
	srv := httptest.NewUnstartedServer(e.Handler())
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("CA PEM not parsed")
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	return e, srv, &http.Client{Transport: tr}
}

// callTLS sends a request and returns the response (ProtoMajor checked to be 2) with its body.
func callTLS(t *testing.T, c *http.Client, method, url, body string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	if resp.ProtoMajor != 2 {
		t.Errorf("%s %s: protocol %s, want HTTP/2", method, url, resp.Proto)
	}
	return resp, string(b)
}

func providerConfig(kind string) Config {
	cfg := fastConfig()
	cfg.Provider = ProviderConfig{Kind: kind, Key: "sk-test-secret", Models: map[string]string{"gpt-4o": "m1", "claude-x": "m2"}}
	return cfg
}

const chatBody = `{"model":"gpt-4o","messages":[{"role":"user","content":"hi there"}],"max_tokens":3}`

func TestProviderAuth(t *testing.T) {
	const (
		openAI401    = `{"error":{"message":"Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`
		azure401     = `{"error":{"code":"401","message":"Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource."}}`
		anthropic401 = `{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}`
	)
	azurePath := "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21"
	msgBody := `{"model":"claude-x","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	tests := []struct {
		name, kind, path, body string
		hdr                    map[string]string
		status                 int
		want                   string // the exact body of an error
	}{
		{"openai ok", ProviderOpenAI, "/v1/chat/completions", chatBody, map[string]string{"Authorization": "Bearer sk-test-secret"}, 200, ""},
		{"openai wrong key", ProviderOpenAI, "/v1/chat/completions", chatBody, map[string]string{"Authorization": "Bearer sk-wrong"}, 401, openAI401},
		{"openai missing key", ProviderOpenAI, "/v1/chat/completions", chatBody, nil, 401, openAI401},
		{"openai key without Bearer", ProviderOpenAI, "/v1/chat/completions", chatBody, map[string]string{"Authorization": "sk-test-secret"}, 401, openAI401},
		{"openai models keyed too", ProviderOpenAI, "/v1/models", "", nil, 401, openAI401},
		{"azure ok", ProviderAzure, azurePath, chatBody, map[string]string{"api-key": "sk-test-secret"}, 200, ""},
		{"azure bearer is not its key", ProviderAzure, azurePath, chatBody, map[string]string{"Authorization": "Bearer sk-test-secret"}, 401, azure401},
		{"azure wrong key", ProviderAzure, azurePath, chatBody, map[string]string{"api-key": "nope"}, 401, azure401},
		{"anthropic messages ok", ProviderAnthropic, "/v1/messages", msgBody, map[string]string{"x-api-key": "sk-test-secret", "anthropic-version": "2023-06-01"}, 200, ""},
		{"anthropic messages wrong key", ProviderAnthropic, "/v1/messages", msgBody, map[string]string{"x-api-key": "nope", "anthropic-version": "2023-06-01"}, 401, anthropic401},
		{"anthropic messages bearer only", ProviderAnthropic, "/v1/messages", msgBody, map[string]string{"Authorization": "Bearer sk-test-secret", "anthropic-version": "2023-06-01"}, 401, anthropic401},
		{"anthropic messages no version", ProviderAnthropic, "/v1/messages", msgBody, map[string]string{"x-api-key": "sk-test-secret"}, 400,
			`{"type":"error","error":{"type":"invalid_request_error","message":"anthropic-version: header is required"}}`},
		{"anthropic count_tokens keyed", ProviderAnthropic, "/v1/messages/count_tokens", msgBody, nil, 401, anthropic401},
		{"anthropic openai-compatible bearer", ProviderAnthropic, "/v1/chat/completions", strings.Replace(chatBody, "gpt-4o", "claude-x", 1), map[string]string{"Authorization": "Bearer sk-test-secret"}, 200, ""},
		{"anthropic openai-compatible wrong", ProviderAnthropic, "/v1/chat/completions", chatBody, map[string]string{"Authorization": "Bearer nope"}, 401, openAI401},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, srv, c := tlsProvider(t, providerConfig(tc.kind), nil)
			method := http.MethodPost
			if tc.body == "" {
				method = http.MethodGet
			}
			resp, body := callTLS(t, c, method, srv.URL+tc.path, tc.body, tc.hdr)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d; body %s", resp.StatusCode, tc.status, body)
			}
			if tc.want != "" && body != tc.want {
				t.Errorf("body\n%s\nwant\n%s", body, tc.want)
			}
			if strings.Contains(body, "sk-test-secret") {
				t.Errorf("the key appears in the body %s", body)
			}
			if tc.status == 200 && resp.Header.Get("x-ratelimit-limit-requests") != "" {
				t.Errorf("rate-limit headers without a limit: %v", resp.Header)
			}
		})
	}
	// The simulator's own probes need no key.
	_, srv, c := tlsProvider(t, providerConfig(ProviderOpenAI), nil)
	if resp, _ := callTLS(t, c, http.MethodGet, srv.URL+"/health", "", nil); resp.StatusCode != 200 {
		t.Errorf("/health: %d, want 200", resp.StatusCode)
	}
}

func TestProviderModelMap(t *testing.T) {
	_, srv, c := tlsProvider(t, providerConfig(ProviderOpenAI), nil)
	auth := map[string]string{"Authorization": "Bearer sk-test-secret"}
	resp, body := callTLS(t, c, http.MethodPost, srv.URL+"/v1/chat/completions", chatBody, auth)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	got := decode[struct {
		Model   string `json:"model"`
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}](t, []byte(body))
	if got.Model != "gpt-4o" || len(got.Choices) != 1 || got.Choices[0].Message.Content != "tok0 tok1 tok2 " {
		t.Errorf("model %q choices %+v, want gpt-4o with tok0 tok1 tok2", got.Model, got.Choices)
	}
	// No model names none of the provider's: 404.
	resp, body = callTLS(t, c, http.MethodPost, srv.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, auth)
	if resp.StatusCode != 404 {
		t.Errorf("no model: %d %s, want 404", resp.StatusCode, body)
	}
	// The served model's name is not the provider's: 404.
	resp, body = callTLS(t, c, http.MethodPost, srv.URL+"/v1/chat/completions", strings.Replace(chatBody, "gpt-4o", "m1", 1), auth)
	if resp.StatusCode != 404 || !strings.Contains(body, "The model `m1` does not exist.") {
		t.Errorf("served name: %d %s, want 404", resp.StatusCode, body)
	}
}

func TestProviderAzurePaths(t *testing.T) {
	_, srv, c := tlsProvider(t, providerConfig(ProviderAzure), nil)
	key := map[string]string{"api-key": "sk-test-secret"}
	const notFound = `{"error":{"code":"404","message":"Resource not found"}}`
	tests := []struct {
		name, path, body string
		status           int
		want             string // exact error body, or the echoed model
	}{
		{"chat", "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, 200, "gpt-4o"},
		{"completions", "/openai/deployments/claude-x/completions?api-version=2024-10-21", `{"prompt":"a b c","max_tokens":2}`, 200, "claude-x"},
		{"embeddings", "/openai/deployments/gpt-4o/embeddings?api-version=2024-10-21", `{"input":"a b"}`, 200, "gpt-4o"},
		{"body model ignored", "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21", `{"model":"other","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, 200, "gpt-4o"},
		{"no api-version", "/openai/deployments/gpt-4o/chat/completions", `{"messages":[]}`, 404, notFound},
		{"empty api-version", "/openai/deployments/gpt-4o/chat/completions?api-version=", `{"messages":[]}`, 404, notFound},
		{"openai path", "/v1/chat/completions?api-version=2024-10-21", chatBody, 404, notFound},
		{"unknown operation", "/openai/deployments/gpt-4o/images?api-version=2024-10-21", `{}`, 404, notFound},
		{"unknown deployment", "/openai/deployments/m1/chat/completions?api-version=2024-10-21", `{"messages":[]}`, 404,
			`{"error":{"code":"DeploymentNotFound","message":"The API deployment for this resource does not exist. If you created the deployment within the last 5 minutes, please wait a moment and try again."}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := callTLS(t, c, http.MethodPost, srv.URL+tc.path, tc.body, key)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if tc.status != 200 {
				if body != tc.want {
					t.Errorf("body %s, want %s", body, tc.want)
				}
				return
			}
			if m := decode[struct{ Model string }](t, []byte(body)).Model; m != tc.want {
				t.Errorf("model %q, want %q", m, tc.want)
			}
		})
	}
}

func TestProviderRateLimit(t *testing.T) {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, kind := range []string{ProviderOpenAI, ProviderAzure, ProviderAnthropic} {
		t.Run(kind, func(t *testing.T) {
			clk := testutil.NewClock(start)
			cfg := providerConfig(kind)
			cfg.Provider.RequestsPerMinute = 2
			_, srv, c := tlsProvider(t, cfg, func(e *Engine) { e.now = clk.Now })
			path, body, hdr := "/v1/chat/completions", chatBody, map[string]string{"Authorization": "Bearer sk-test-secret"}
			limitH, remH, resetH := "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"
			want429 := `{"error":{"message":"Rate limit reached for requests on requests per min (RPM): Limit 2, Used 2, Requested 1. Please try again in 50s.","type":"requests","param":null,"code":"rate_limit_exceeded"}}`
			resets := []string{"1m0s", "50s", "50s"}
			switch kind {
			case ProviderAzure:
				path, hdr = "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21", map[string]string{"api-key": "sk-test-secret"}
				want429 = `{"error":{"code":"429","message":"Requests to the Azure OpenAI API have exceeded the call rate limit of 2 requests per minute. Please retry after 50 seconds."}}`
			case ProviderAnthropic:
				path = "/v1/messages"
				body = `{"model":"claude-x","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
				hdr = map[string]string{"x-api-key": "sk-test-secret", "anthropic-version": "2023-06-01"}
				limitH, remH, resetH = "anthropic-ratelimit-requests-limit", "anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset"
				want429 = `{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed your organization's rate limit of 2 requests per minute. Please retry after 50 seconds."}}`
				resets = []string{"2026-01-02T03:05:05Z", "2026-01-02T03:05:05Z", "2026-01-02T03:05:05Z"}
			}
			for i, want := range []struct {
				status    int
				remaining string
			}{{200, "1"}, {200, "0"}, {429, "0"}} {
				resp, got := callTLS(t, c, http.MethodPost, srv.URL+path, body, hdr)
				if resp.StatusCode != want.status {
					t.Fatalf("request %d: status %d, want %d: %s", i, resp.StatusCode, want.status, got)
				}
				h := resp.Header
				if h.Get(limitH) != "2" || h.Get(remH) != want.remaining || h.Get(resetH) != resets[i] {
					t.Errorf("request %d: %s=%q %s=%q %s=%q, want 2, %s, %s", i, limitH, h.Get(limitH), remH, h.Get(remH),
						resetH, h.Get(resetH), want.remaining, resets[i])
				}
				if want.status == 429 {
					if ra := h.Get("Retry-After"); ra != "50" {
						t.Errorf("Retry-After %q, want 50", ra)
					}
					if got != want429 {
						t.Errorf("429 body\n%s\nwant\n%s", got, want429)
					}
				}
				if i == 0 {
					clk.Advance(10 * time.Second)
				}
			}
			// A refused request is not counted; the next window admits again.
			clk.Advance(50 * time.Second)
			if resp, got := callTLS(t, c, http.MethodPost, srv.URL+path, body, hdr); resp.StatusCode != 200 || resp.Header.Get(remH) != "1" {
				t.Errorf("new window: %d remaining %q: %s", resp.StatusCode, resp.Header.Get(remH), got)
			}
		})
	}
}

func TestProviderAnthropicMessages(t *testing.T) {
	_, srv, c := tlsProvider(t, providerConfig(ProviderAnthropic), nil)
	hdr := map[string]string{"x-api-key": "sk-test-secret", "anthropic-version": "2023-06-01"}
	resp, body := callTLS(t, c, http.MethodPost, srv.URL+"/v1/messages",
		`{"model":"claude-x","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, hdr)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var m struct {
		Type, Model string
		Content     []struct{ Type, Text string }
	}
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatal(err)
	}
	if m.Type != "message" || m.Model != "claude-x" || len(m.Content) != 1 || m.Content[0].Text != "tok0 tok1 " {
		t.Errorf("message %+v, want claude-x with tok0 tok1", m)
	}
	// An unknown model gets Anthropic's 404.
	resp, body = callTLS(t, c, http.MethodPost, srv.URL+"/v1/messages",
		`{"model":"m2","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, hdr)
	if resp.StatusCode != 404 || !strings.Contains(body, `"type":"not_found_error"`) {
		t.Errorf("unknown model: %d %s", resp.StatusCode, body)
	}
}

func TestProviderConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		p    ProviderConfig
		want string // "" for valid
	}{
		{"off", ProviderConfig{}, ""},
		{"openai", ProviderConfig{Kind: ProviderOpenAI, Key: "k", Models: map[string]string{"gpt": "m1"}, RequestsPerMinute: 5}, ""},
		{"bad kind", ProviderConfig{Kind: "gemini", Key: "k"}, `provider kind must be`},
		{"no key", ProviderConfig{Kind: ProviderAzure}, "provider azure needs a key"},
		{"negative rpm", ProviderConfig{Kind: ProviderOpenAI, Key: "k", RequestsPerMinute: -1}, "must not be negative"},
		{"unserved model", ProviderConfig{Kind: ProviderOpenAI, Key: "k", Models: map[string]string{"gpt": "nope"}}, `"nope" is not one of the served models`},
		{"slash in deployment", ProviderConfig{Kind: ProviderAzure, Key: "k", Models: map[string]string{"a/b": "m1"}}, "has a slash"},
		{"fields without kind", ProviderConfig{Key: "k"}, "need a provider kind"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := fastConfig()
			cfg.Provider = tc.p
			err := cfg.Validate()
			if tc.want == "" && err != nil {
				t.Errorf("Validate: %v", err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Validate: %v, want %q", err, tc.want)
			}
		})
	}
}

func TestNewTestTLS(t *testing.T) {
	cert, caPEM, err := NewTestTLS()
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("CA PEM not parsed")
	}
	for _, name := range []string{"127.0.0.1", "::1", "localhost"} {
		if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: name}); err != nil {
			t.Errorf("verify for %s: %v", name, err)
		}
	}
	if d := cert.Leaf.NotAfter.Sub(cert.Leaf.NotBefore); d != 24*time.Hour {
		t.Errorf("validity %v, want 24h", d)
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "example.com"}); err == nil {
		t.Error("verified for example.com")
	}
}

func TestProviderStream(t *testing.T) {
	cfg := providerConfig(ProviderOpenAI)
	cfg.Provider.RequestsPerMinute = 5
	_, srv, c := tlsProvider(t, cfg, nil)
	resp, body := callTLS(t, c, http.MethodPost, srv.URL+"/v1/chat/completions",
		`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`,
		map[string]string{"Authorization": "Bearer sk-test-secret"})
	if resp.StatusCode != 200 || resp.Header.Get("x-ratelimit-remaining-requests") != "4" {
		t.Fatalf("status %d remaining %q: %s", resp.StatusCode, resp.Header.Get("x-ratelimit-remaining-requests"), body)
	}
	evs, err := readEvents(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	data := dataEvents(evs)
	if len(data) != 5 || data[4] != "[DONE]" {
		t.Fatalf("events %q, want role, 2 tokens, finish, [DONE]", data)
	}
	for _, d := range data[:4] {
		if m := decode[struct{ Model string }](t, []byte(d)).Model; m != "gpt-4o" {
			t.Errorf("chunk model %q, want gpt-4o: %s", m, d)
		}
	}
}

func TestProviderRateLimitConcurrentSafe(t *testing.T) {
	clk := testutil.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	cfg := providerConfig(ProviderOpenAI)
	cfg.Provider.RequestsPerMinute = 7
	_, srv, c := tlsProvider(t, cfg, func(e *Engine) { e.now = clk.Now })
	const n = 20
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"model":"gpt-4o","prompt":"a","max_tokens":1}`))
			req.Header.Set("Authorization", "Bearer sk-test-secret")
			resp, err := c.Do(req)
			if err != nil {
				codes <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	wg.Wait()
	close(codes)
	count := map[int]int{}
	for code := range codes {
		count[code]++
	}
	if count[200] != 7 || count[429] != n-7 {
		t.Errorf("statuses %v, want 7 × 200 and %d × 429", count, n-7)
	}
}
