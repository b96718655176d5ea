package fleet

import (
	"errors"
	"github.com/switchboard-gw/switchboard/routing"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestRateLimitBackOff(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		status int
		hdr    http.Header
		want   time.Duration
	}{
		{"429 without headers", 429, h(), time.Second},
		{"429 retry-after seconds", 429, h("Retry-After", "7"), 7 * time.Second},
		{"429 retry-after date", 429, h("Retry-After", now.Add(20*time.Second).Format(http.TimeFormat)), 20 * time.Second},
		{"429 retry-after-ms wins", 429, h("Retry-After", "7", "Retry-After-Ms", "1500"), 1500 * time.Millisecond},
		{"429 exhausted reset", 429, h("X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "6m0s"), maxBackOff},
		{"429 hour capped", 429, h("Retry-After", "3600"), maxBackOff},
		{"200 exhausted requests", 200, h("X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "20ms"), 20 * time.Millisecond},
		{"200 exhausted tokens, longer", 200, h("X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "1s",
			"X-Ratelimit-Remaining-Tokens", "0", "X-Ratelimit-Reset-Tokens", "3s"), 3 * time.Second},
		{"200 remaining", 200, h("X-Ratelimit-Remaining-Requests", "5", "X-Ratelimit-Reset-Requests", "1s"), 0},
		{"200 anthropic exhausted", 200, h("Anthropic-Ratelimit-Requests-Remaining", "0",
			"Anthropic-Ratelimit-Requests-Reset", now.Add(30*time.Second).Format(time.RFC3339)), 30 * time.Second},
		{"200 anthropic output tokens", 200, h("Anthropic-Ratelimit-Output-Tokens-Remaining", "0",
			"Anthropic-Ratelimit-Output-Tokens-Reset", now.Add(2*time.Second).Format(time.RFC3339)), 2 * time.Second},
		{"500", 500, h("Retry-After", "5"), 0},
		{"429 garbage", 429, h("Retry-After", "soon", "X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "later"), time.Second},
	} {
		if got := RateLimitBackOff(tc.status, tc.hdr, now); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func newTestEngine(t *testing.T, ec EngineConfig) *Engine {
	t.Helper()
	f, err := New(Config{Health: DefaultHealthConfig(), Stats: DefaultEngineStatsConfig()}, mustMetrics(t))
	if err != nil {
		t.Fatal(err)
	}
	e, err := f.newEngine(ec)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestProviderRequestShape(t *testing.T) {
	for _, tc := range []struct {
		ec               EngineConfig
		path, query, mdl string
		wantURL          string
		wantHdr          map[string]string
		clientHdr        map[string]string
		tier             int
		providerName     string
		servesTokenize   bool
		servesMessages   bool
		servesEmbeddings bool
	}{
		{ec: EngineConfig{Name: "v", URL: "http://10.0.0.1:8000", APIKey: "k1"}, path: "/v1/chat/completions", query: "a=b", mdl: "m",
			wantURL: "http://10.0.0.1:8000/v1/chat/completions?a=b", wantHdr: map[string]string{"Authorization": "Bearer k1"},
			providerName: "vllm", servesTokenize: true, servesMessages: true, servesEmbeddings: true},
		{ec: EngineConfig{Name: "o", Provider: ProviderOpenAI, APIKey: "k2", Models: []string{"m"}}, path: "/v1/chat/completions", query: "api-version=x", mdl: "m",
			wantURL: "https://api.openai.com/v1/chat/completions?api-version=x", wantHdr: map[string]string{"Authorization": "Bearer k2", "Api-Key": "", "X-Api-Key": ""},
			clientHdr: map[string]string{"Api-Key": "client", "X-Api-Key": "client"}, tier: 1, providerName: "openai", servesEmbeddings: true},
		{ec: EngineConfig{Name: "a", URL: "https://res.openai.azure.com/", Provider: ProviderAzure, APIKey: "k3", ModelMap: map[string]string{"m": "dep 1"}},
			path: "/v1/embeddings", query: "api-version=client&x=1", mdl: "dep 1",
			wantURL: "https://res.openai.azure.com/openai/deployments/dep%201/embeddings?api-version=" + DefaultAzureAPIVersion + "&x=1", wantHdr: map[string]string{"Api-Key": "k3", "Authorization": ""},
			clientHdr: map[string]string{"Authorization": "Bearer client"}, tier: 1, providerName: "azure.ai.openai", servesEmbeddings: true},
		{ec: EngineConfig{Name: "c", Provider: ProviderAnthropic, APIKey: "k4", Models: []string{"claude"}, Tier: ptr(3)}, path: "/v1/messages", mdl: "claude",
			wantURL: "https://api.anthropic.com/v1/messages", wantHdr: map[string]string{"X-Api-Key": "k4", "Anthropic-Version": DefaultAnthropicVersion, "Authorization": ""},
			tier: 3, providerName: "anthropic", servesMessages: true},
		{ec: EngineConfig{Name: "c3", URL: "https://api.anthropic.com", Provider: ProviderAnthropic, APIKey: "k4", Models: []string{"claude"}}, path: "/v1/messages", mdl: "claude",
			wantURL: "https://api.anthropic.com/v1/messages", wantHdr: map[string]string{"X-Api-Key": "k4"}, tier: 1, providerName: "anthropic", servesMessages: true},
		{ec: EngineConfig{Name: "c2", Provider: ProviderAnthropic, APIKey: "k4", Models: []string{"claude"}}, path: "/v1/chat/completions", mdl: "claude",
			wantURL: "https://api.anthropic.com/v1/chat/completions", wantHdr: map[string]string{"Authorization": "Bearer k4", "X-Api-Key": ""},
			tier: 1, providerName: "anthropic", servesMessages: true},
		{ec: EngineConfig{Name: "g", URL: "https://api.groq.com/openai/v1", Provider: ProviderOpenAICompatible, APIKey: "k5", Models: []string{"llama"}},
			path: "/v1/completions", mdl: "llama", wantURL: "https://api.groq.com/openai/v1/completions", wantHdr: map[string]string{"Authorization": "Bearer k5"},
			tier: 1, providerName: "groq", servesEmbeddings: true},
		{ec: EngineConfig{Name: "x", URL: "https://llm.example.com/v1", Provider: ProviderOpenAICompatible, Models: []string{"llama"}, ProviderName: "acme"},
			path: "/v1/completions", mdl: "llama", wantURL: "https://llm.example.com/v1/completions", wantHdr: map[string]string{"Authorization": ""},
			clientHdr: map[string]string{"Authorization": "Bearer client"}, tier: 1, providerName: "acme", servesEmbeddings: true},
		{ec: EngineConfig{Name: "u", URL: "https://user:pw@llm.example.com/v1", Provider: ProviderOpenAICompatible, Models: []string{"llama"}},
			path: "/v1/completions", mdl: "llama", wantURL: "https://llm.example.com/v1/completions", wantHdr: map[string]string{"Authorization": "Basic dXNlcjpwdw=="},
			clientHdr: map[string]string{"Authorization": "Bearer client"}, tier: 1, providerName: "llm.example.com", servesEmbeddings: true},
	} {
		e := newTestEngine(t, tc.ec)
		if got := e.RequestURL(tc.path, tc.query, tc.mdl); got != tc.wantURL {
			t.Errorf("%s: URL %s, want %s", tc.ec.Name, got, tc.wantURL)
		}
		h := http.Header{}
		for k, v := range tc.clientHdr {
			h.Set(k, v)
		}
		e.SetAuth(h, tc.path)
		for k, want := range tc.wantHdr {
			if got := h.Get(k); got != want {
				t.Errorf("%s: header %s = %q, want %q", tc.ec.Name, k, got, want)
			}
		}
		if e.Tier() != tc.tier {
			t.Errorf("%s: tier %d, want %d", tc.ec.Name, e.Tier(), tc.tier)
		}
		if got := e.tel.Provider(); got != tc.providerName {
			t.Errorf("%s: gen_ai.provider.name %q, want %q", tc.ec.Name, got, tc.providerName)
		}
		if e.ServesOperation("tokenize") != tc.servesTokenize || e.ServesOperation("messages") != tc.servesMessages || e.ServesOperation("embeddings") != tc.servesEmbeddings {
			t.Errorf("%s: serves tokenize %v messages %v embeddings %v, want %v %v %v", tc.ec.Name, e.ServesOperation("tokenize"),
				e.ServesOperation("messages"), e.ServesOperation("embeddings"), tc.servesTokenize, tc.servesMessages, tc.servesEmbeddings)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestProviderBackOffLatestWins(t *testing.T) {
	e := newTestEngine(t, EngineConfig{Name: "o", Provider: ProviderOpenAI, Models: []string{"m"}})
	now := time.Now()
	e.BackOff(now.Add(10 * time.Second))
	e.BackOff(now.Add(time.Second)) // earlier: ignored
	if !e.BackingOff(now.Add(5*time.Second)) || e.BackingOff(now.Add(11*time.Second)) {
		t.Error("the later back-off did not win")
	}
	if n := e.prov.backoffs.Load(); n != 1 {
		t.Errorf("%d back-offs counted, want 1", n)
	}
	self := newTestEngine(t, EngineConfig{Name: "v", URL: "http://x:1"})
	self.BackOff(now.Add(time.Hour))
	if self.BackingOff(now) {
		t.Error("a self-hosted engine backed off (its 429s are outlier detection's)")
	}
}

func TestProviderConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		ec   EngineConfig
		want string
	}{
		{EngineConfig{Name: "a", Provider: "acme", URL: "http://x:1"}, "provider must be empty"},
		{EngineConfig{Name: "a", Provider: ProviderOpenAI}, "needs models or model_map"},
		{EngineConfig{Name: "a", Provider: ProviderAzure, Models: []string{"m"}}, "url must not be empty"},
		{EngineConfig{Name: "a", Provider: ProviderOpenAI, Models: []string{"m"}, Role: "decode"}, "no prefill/decode role"},
		{EngineConfig{Name: "a", Provider: ProviderOpenAI, Models: []string{"m"}, KVEvents: "tcp://x:1"}, "publishes no KV-cache events"},
		{EngineConfig{Name: "a", Provider: ProviderOpenAI, Models: []string{"m"}, APIVersion: "x"}, "api_version is Azure's"},
		{EngineConfig{Name: "a", Provider: ProviderOpenAI, Models: []string{"m"}, MaxQueueDepth: 3}, "max_queue_depth needs the engine's stats"},
		{EngineConfig{Name: "a", URL: "http://x:1", Tier: ptr(-1)}, "tier must be >= 0"},
		{EngineConfig{Name: "a", URL: "http://x:1", ModelMap: map[string]string{"m": " "}}, "model_map has an empty model name"},
		{EngineConfig{Name: "a", URL: "http://x:1", ModelMap: map[string]string{"m": "n"}}, "model_map is for provider engines"},
		{EngineConfig{Name: "a", URL: "http://api.openai.com/v1", Provider: ProviderOpenAI, Models: []string{"m"}}, "needs an https url"},
	} {
		err := tc.ec.Validate()
		if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error containing %q", tc.ec, err, tc.want)
		}
	}
	if err := (EngineConfig{Name: "a", Provider: ProviderOpenAI, ModelMap: map[string]string{"m": "gpt"}}).Validate(); err != nil {
		t.Errorf("openai with a model map and its default URL: %v", err)
	}
}

// TestProviderKeyRotation: a provider engine's key from api_key_file goes
// in its own header (Azure's api-key), and a reload that finds the file
// rotated sends the new key from the next request, on the same
// incarnation.
func TestProviderKeyRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(path, []byte("az-one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ec := EngineConfig{Name: "az", URL: "https://r.openai.azure.com", Provider: ProviderAzure, ModelMap: map[string]string{"m": "dep"}, APIKeyFile: path}
	f, err := New(Config{Engines: []EngineConfig{ec}, Health: DefaultHealthConfig(), Stats: DefaultEngineStatsConfig()}, mustMetrics(t), WithLogger(discard))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	key := func() string {
		h := http.Header{}
		f.engines[0].SetAuth(h, "/v1/chat/completions")
		return h.Get("Api-Key")
	}
	if got := key(); got != "az-one" {
		t.Fatalf("api-key %q, want az-one", got)
	}
	first := f.engines[0]
	if err := os.WriteFile(path, []byte("az-two"), 0o600); err != nil {
		t.Fatal(err)
	}
	ch, err := f.SetConfigured([]EngineConfig{ec}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ch.Changed, []string{"az"}) {
		t.Errorf("a reload that rotated the key reports changes %+v, want the engine changed", ch)
	}
	if got := key(); got != "az-two" || f.engines[0] != first {
		t.Errorf("after the rotation and a reload: %q (same incarnation %v), want az-two on the same engine", got, f.engines[0] == first)
	}
	// A tier change is applied in place too.
	ec.Tier = ptr(5)
	if _, err := f.SetConfigured([]EngineConfig{ec}, nil); err != nil {
		t.Fatal(err)
	}
	if f.engines[0] != first || first.Tier() != 5 {
		t.Errorf("after a tier change: same incarnation %v, tier %d; want the same engine at tier 5", f.engines[0] == first, first.Tier())
	}
}

// TestNewNamesEveryMissingKey: a start with several engines missing their
// keys names every one, not only the first.
func TestNewNamesEveryMissingKey(t *testing.T) {
	t.Setenv("SB_TEST_UNSET_A", "")
	t.Setenv("SB_TEST_UNSET_B", "")
	_, err := New(Config{Engines: []EngineConfig{
		{Name: "a", URL: "http://x:1", APIKeyEnv: "SB_TEST_UNSET_A"},
		{Name: "b", Provider: ProviderOpenAI, Models: []string{"m"}, APIKeyEnv: "SB_TEST_UNSET_B"},
	}, Health: DefaultHealthConfig(), Stats: DefaultEngineStatsConfig()}, mustMetrics(t), WithLogger(discard))
	if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "SB_TEST_UNSET_A") || !strings.Contains(err.Error(), "SB_TEST_UNSET_B") {
		t.Errorf("error %v, want one naming both variables", err)
	}
}

// TestRouteEngineLookup: a route finds each endpoint's engine, through a
// map from indexedRoute engines, and nil for an endpoint not its own.
func TestRouteEngineLookup(t *testing.T) {
	for _, n := range []int{3, indexedRoute + 4} {
		var ecs []EngineConfig
		for i := range n {
			ecs = append(ecs, EngineConfig{Name: "e" + strconv.Itoa(i), URL: "http://127.0.0.1:" + strconv.Itoa(9000+i), Models: []string{"m"}})
		}
		f, err := New(Config{Engines: ecs, Health: DefaultHealthConfig(), Stats: DefaultEngineStatsConfig()}, mustMetrics(t), WithLogger(discard))
		if err != nil {
			t.Fatal(err)
		}
		rt, err := f.Lookup("m")
		if err != nil {
			t.Fatal(err)
		}
		if (rt.byEP != nil) != (n >= indexedRoute) {
			t.Errorf("%d engines: indexed %v", n, rt.byEP != nil)
		}
		for i, ep := range rt.Endpoints() {
			if e := rt.Engine(ep); e != rt.Engines()[i] {
				t.Errorf("%d engines: endpoint %d maps to %v", n, i, e)
			}
		}
		if e := rt.Engine(routing.NewEndpoint("stranger", nil)); e != nil {
			t.Errorf("%d engines: a foreign endpoint maps to %v", n, e.Name())
		}
		f.Close()
	}
}
