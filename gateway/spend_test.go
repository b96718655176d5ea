package gateway

import (
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/redistest"
	"github.com/switchboard-gw/switchboard/quota"
)

// spendConfig is a gateway config with one engine e1 at url serving m at
// $1 per million input tokens and $100 per million output tokens, and key
// k-1 (team-1) with a daily budget of usd.
func spendConfig(url string, usd float64) Config {
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: url, Models: []string{"m"}})
	cfg.Auth = AuthConfig{Keys: []KeyConfig{{Name: "team-1", SHA256: sha("k-1"), Models: []string{"*"},
		Limits: KeyLimits{MaxSpendPerDay: usd}}}}
	cfg.Pricing = []PriceConfig{{Model: "m", Input: 1, Output: 100}}
	return cfg
}

// spendBody is a request of 4 prompt words (1 token estimated per 4 bytes
// of prompt text, so 5 reserved) for maxTokens output tokens.
func spendBody(maxTokens int) string {
	return `{"model":"m","max_tokens":` + strconv.Itoa(maxTokens) + `,"messages":[{"role":"user","content":"one two three four"}]}`
}

// TestSpendBudget: a key's requests are admitted while their worst-case
// cost fits what is left of its daily budget, settled to their real cost,
// and then refused with OpenAI's 429 insufficient_quota; the spend never
// passes the budget.
func TestSpendBudget(t *testing.T) {
	// Each request: 4 input tokens and its max_tokens of 10 output
	// tokens: $0.000004 + $0.001 = $0.001004; reserved: 5 estimated input
	// tokens (18 bytes / 4) and 10 output: $0.001005.
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarness(t, spendConfig(srv.URL, 0.01))
	const cost = 0.001004
	ok, refused := 0, 0
	var last []byte
	for range 12 {
		resp := h.post("/v1/chat/completions", spendBody(10), "Authorization", "Bearer k-1")
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			refused++
			last = b
			if resp.Header.Get("Retry-After") == "" {
				t.Error("a refused budget has no Retry-After (the next UTC day)")
			}
		default:
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
	}
	// Admitted while spent + 0.001005 <= 0.01: the 9th fits
	// (0.001004 x 8 + 0.001005 = 0.009037), the 10th does not (0.010041).
	if ok != 9 || refused != 3 {
		t.Errorf("%d admitted, %d refused; want 9 and 3", ok, refused)
	}
	var e struct {
		Error struct{ Type, Code, Message string }
	}
	if err := json.Unmarshal(last, &e); err != nil || e.Error.Type != "insufficient_quota" || e.Error.Code != "insufficient_quota" ||
		!strings.Contains(e.Error.Message, "spend budget") {
		t.Errorf("refusal body %s: want OpenAI's insufficient_quota", last)
	}
	ks := h.gw.Keys()
	if len(ks) != 1 || math.Abs(ks[0].Spend-9*cost) > 1e-9 || ks[0].Spend > 0.01 {
		t.Errorf("spend %+v, want 9 x %v, within the $0.01 budget", ks, cost)
	}
	// Over its budget, the key can still tokenize (no tokens, no cost).
	resp := h.post("/tokenize", `{"model":"m","prompt":"one two"}`, "Authorization", "Bearer k-1")
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("tokenize over the budget: %d, want 200", resp.StatusCode)
	}
}

// TestSpendBudgetSharedByReplicas: two gateways on one Redis share a key's
// budget: concurrent requests through both never spend past it by more than
// one request's reservation, and both refuse once it is used.
func TestSpendBudgetSharedByReplicas(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	rds := redistest.Start(t)
	var hs []*harness
	for range 2 {
		rc := quota.DefaultRedisConfig()
		rc.Address = rds.Addr()
		// Slow machines (-race) must not turn a late answer into an
		// admission without limits (fail open): a long timeout, and
		// fail closed below.
		rc.Timeout = 5 * time.Second
		st, err := quota.NewRedis(rc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		cfg := spendConfig(srv.URL, 0.02)
		cfg.Limits.Redis = rc
		cfg.Limits.FailMode = FailClosed
		hs = append(hs, newHarnessWith(t, cfg, []Option{WithQuotaStore(st)}))
	}
	var mu sync.Mutex
	ok := 0
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := hs[i%2].post("/v1/chat/completions", spendBody(10), "Authorization", "Bearer k-1")
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				mu.Lock()
				ok++
				mu.Unlock()
			} else if resp.StatusCode != http.StatusTooManyRequests {
				t.Errorf("status %d", resp.StatusCode)
			}
		}()
	}
	wg.Wait()
	for _, h := range hs {
		h.waitIdle()
	}
	spent := 0.0
	for _, h := range hs {
		spent += h.gw.Keys()[0].Spend
	}
	// $0.001004 each, $0.001005 reserved: 19 fit $0.02 whatever the order
	// of reservations and settlements (19 x 0.001005 = 0.019095), a 20th
	// never (19 x 0.001004 + 0.001005 = 0.020081), and nothing passes it.
	if ok != 19 || spent > 0.02 || math.Abs(spent-float64(ok)*0.001004) > 1e-9 {
		t.Errorf("%d admitted, $%v spent; want 19, $0.001004 each, never past $0.02", ok, spent)
	}
	// Both replicas refuse now.
	for i, h := range hs {
		resp := h.post("/v1/chat/completions", spendBody(10), "Authorization", "Bearer k-1")
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Errorf("replica %d after the budget: %d, want 429", i, resp.StatusCode)
		}
	}
}

// TestSpendBudgetCapsOutput: a request of a key with a spend budget that
// sets no max_tokens gets the default_max_tokens its reservation holds in
// the engine's body, so it cannot cost more than it reserved; one that
// sets its own keeps it; a key without a budget is left alone.
func TestSpendBudgetCapsOutput(t *testing.T) {
	eng, srv := sim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 50})
	cfg := spendConfig(srv.URL, 1)
	cfg.Auth.Keys = append(cfg.Auth.Keys, KeyConfig{Name: "team-2", SHA256: sha("k-2"), Models: []string{"*"}})
	cfg.Limits.DefaultMaxTokens = 8
	h := newHarness(t, cfg)
	out := func(key, body string) int64 {
		t.Helper()
		resp := h.post("/v1/chat/completions", body, "Authorization", "Bearer "+key)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var r struct {
			Usage struct {
				CompletionTokens int64 `json:"completion_tokens"`
			}
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &r) != nil {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return r.Usage.CompletionTokens
	}
	noCap := `{"model":"m","messages":[{"role":"user","content":"one two three four"}]}`
	if n := out("k-1", noCap); n != 8 {
		t.Errorf("budgeted key, no max_tokens: %d output tokens, want default_max_tokens 8", n)
	}
	// A stream whose body gets the usage option too (inject_usage), and a
	// max_tokens null of the client's that the added one follows.
	resp := h.post("/v1/chat/completions", `{"model":"m","max_tokens":null,"stream":true,"messages":[{"role":"user","content":"one two"}]}`, "Authorization", "Bearer k-1")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if n := strings.Count(string(b), `"content":"tok`); resp.StatusCode != http.StatusOK || n != 8 {
		t.Errorf("budgeted key, stream with max_tokens null: %d, %d content events; want 200, 8:\n%s", resp.StatusCode, n, b)
	}
	if n := out("k-1", spendBody(12)); n != 12 {
		t.Errorf("budgeted key, max_tokens 12: %d output tokens, want 12", n)
	}
	// The Responses API's cap is max_output_tokens.
	rresp := h.post("/v1/responses", `{"model":"m","input":"one two three"}`, "Authorization", "Bearer k-1")
	rb, _ := io.ReadAll(rresp.Body)
	rresp.Body.Close()
	var rr struct {
		Usage struct {
			OutputTokens int64 `json:"output_tokens"`
		}
	}
	if rresp.StatusCode != http.StatusOK || json.Unmarshal(rb, &rr) != nil || rr.Usage.OutputTokens != 8 {
		t.Errorf("budgeted key, a Responses request without max_output_tokens: %d, %s; want 8 output tokens", rresp.StatusCode, rb)
	}
	if n := out("k-2", noCap); n != 50 {
		t.Errorf("key without a budget, no max_tokens: %d output tokens, want the engine's 50", n)
	}
	_ = eng
	prompt := func(b []byte) int64 {
		var r struct {
			Usage struct {
				InputTokens int64 `json:"input_tokens"`
			}
		}
		_ = json.Unmarshal(b, &r)
		return r.Usage.InputTokens
	}
	ks := h.gw.Keys()
	if want := (4*1e-6 + 8*100e-6) + (2*1e-6 + 8*100e-6) + (4*1e-6 + 12*100e-6) + (float64(prompt(rb))*1e-6 + 8*100e-6); math.Abs(ks[0].Spend-want) > 1e-9 {
		t.Errorf("budgeted key spent %v, want %v", ks[0].Spend, want)
	}
}
