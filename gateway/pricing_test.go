package gateway

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/telemetry"
)

func f64(v float64) *float64 { return &v }

// TestPricingLookup: the most specific entry wins (engine and model,
// engine, model, neither), and an unpriced pair has none.
func TestPricingLookup(t *testing.T) {
	ps := newPricing([]PriceConfig{
		{Model: "m", Input: 1},
		{Engine: "e1", Input: 2},
		{Engine: "e1", Model: "m", Input: 3},
		{Engine: "e9", Model: "other", Input: 4},
	})
	for _, tc := range []struct {
		engine, model string
		want          float64 // input USD per million; 0 = no price
	}{
		{"e1", "m", 3},
		{"e1", "x", 2},
		{"e2", "m", 1},
		{"e2", "x", 0},
		{"e9", "other", 4},
	} {
		p := ps.lookup(tc.engine, tc.model)
		switch {
		case tc.want == 0 && p != nil:
			t.Errorf("%s/%s priced %v, want none", tc.engine, tc.model, *p)
		case tc.want != 0 && (p == nil || p.input*1e6 != tc.want):
			t.Errorf("%s/%s: %v, want input %v per million", tc.engine, tc.model, p, tc.want)
		}
	}
	catchAll := newPricing([]PriceConfig{{Output: 5}, {Model: "m", Output: 6}})
	if p := catchAll.lookup("e7", "z"); p == nil || p.output*1e6 != 5 {
		t.Errorf("catch-all entry: %v, want output 5 per million", p)
	}
	if n := testing.AllocsPerRun(100, func() { ps.lookup("e1", "m") }); n != 0 {
		t.Errorf("lookup: %v allocs, want 0", n)
	}
}

// TestPriceCost: cost = uncached input x input + cached x cached_input +
// output x output + per request, per million tokens; cached_input absent
// is input's; a GPU-hour price is its cost spread over the throughput.
func TestPriceCost(t *testing.T) {
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-12 }
	p := PriceConfig{Input: 2.5, CachedInput: f64(1.25), Output: 10, Request: 0.001}.resolve()
	// 1,000 prompt tokens of which 400 cached, 200 out:
	// 600 x 2.5e-6 + 400 x 1.25e-6 + 200 x 1e-5 + 0.001 = 0.0015 + 0.0005 + 0.002 + 0.001.
	if got := p.cost(1000, 400, 200); !near(got, 0.005) {
		t.Errorf("cost = %v, want 0.005", got)
	}
	if got := p.cost(10, 50, -3); !near(got, 10*1.25e-6+0.001) {
		t.Errorf("cached clamped to the input, output to 0: %v", got)
	}
	q := PriceConfig{Input: 2, Output: 8}.resolve()
	if got := q.cost(1e6, 5e5, 1e6); !near(got, 10) {
		t.Errorf("cached_input absent (= input): %v, want 10", got)
	}
	// $2.50/h, 20,000 prompt and 2,500 output tokens/s: $0.034722.../M in, $0.2777.../M out.
	g := PriceConfig{GPUHour: &GPUHourPrice{USD: 2.5, InputTokensPerSecond: 20000, OutputTokensPerSecond: 2500}}.resolve()
	if !near(g.input*1e6, 2.5/3600/20000*1e6) || !near(g.output*1e6, 2.5/3600/2500*1e6) || g.cachedInput != g.input {
		t.Errorf("gpu-hour price: %+v", g)
	}
	g2 := PriceConfig{GPUHour: &GPUHourPrice{USD: 2.5, GPUs: 8, InputTokensPerSecond: 20000, OutputTokensPerSecond: 2500}}.resolve()
	if !near(g2.output, 8*g.output) {
		t.Errorf("8 GPUs: output %v, want 8 x %v", g2.output, g.output)
	}
}

func TestPricingValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		ps   []PriceConfig
		want string // substring; "" = valid
	}{
		{"valid", []PriceConfig{{Model: "m", Input: 1, Output: 2}, {Engine: "e", GPUHour: &GPUHourPrice{USD: 1, InputTokensPerSecond: 1, OutputTokensPerSecond: 1}}}, ""},
		{"negative", []PriceConfig{{Input: -1}}, "pricing[0]: prices must be numbers >= 0"},
		{"NaN", []PriceConfig{{Output: math.NaN()}}, "pricing[0]: prices must be numbers >= 0"},
		{"negative cached", []PriceConfig{{CachedInput: f64(-1)}}, "pricing[0]: prices must be numbers >= 0"},
		{"twice", []PriceConfig{{Model: "m"}, {Model: "m", Input: 1}}, "pricing[1]: engine \"\" and model \"m\" are priced by pricing[0] already"},
		{"gpu and tokens", []PriceConfig{{Input: 1, GPUHour: &GPUHourPrice{USD: 1, InputTokensPerSecond: 1, OutputTokensPerSecond: 1}}}, "set gpu_hour or input and output"},
		{"no throughput", []PriceConfig{{GPUHour: &GPUHourPrice{USD: 1}}}, "tokens_per_second must be > 0"},
		{"cache hit dearer than a miss", []PriceConfig{{Input: 1, CachedInput: f64(2)}}, "cached_input (2) must not be above input (1)"},
	} {
		err := errors.Join(validatePricing(tc.ps)...)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrInvalidConfig)):
			t.Errorf("%s: %v, want an ErrInvalidConfig containing %q", tc.name, err, tc.want)
		}
	}
}

// TestRequestCost: an exchange's cost is its engine's usage at its price,
// exactly, streamed or not: in the access log (cost_usd), in
// switchboard.request.cost by engine, model and key, and in the key's
// spend_usd; an unpriced engine costs nothing.
func TestRequestCost(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 8, PromptTokensDetails: true, BlockSize: 4})
	_, free := sim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 8})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	cfg.Auth = AuthConfig{Keys: []KeyConfig{{Name: "team-1", SHA256: sha("k-1"), Models: []string{"*"}}}}
	cfg.Pricing = []PriceConfig{{Engine: "e1", Model: "m", Input: 3, CachedInput: f64(0.3), Output: 15, Request: 0.0001}}
	var logs bytes.Buffer
	h := newHarnessWith(t, cfg, []Option{WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))})
	prompt := strings.Repeat("word ", 13) // 13 tokens: 3 whole blocks of 4 cached the second time
	body := func(stream bool) string {
		return `{"model":"m","stream":` + strconv.FormatBool(stream) + `,"stream_options":{"include_usage":true},"max_tokens":8,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	}
	want := 0.0
	for i, stream := range []bool{false, true, false} {
		resp := h.post("/v1/chat/completions", body(stream), "Authorization", "Bearer k-1")
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
		cached := 0.0
		if i > 0 {
			cached = 12
		}
		want += (13-cached)*3e-6 + cached*0.3e-6 + 8*15e-6 + 0.0001
	}
	h.waitIdle()
	got := 0.0
	m, ok := findMetric(h.collect(), telemetry.RequestCostName)
	if !ok {
		t.Fatalf("%s not recorded", telemetry.RequestCostName)
	}
	for _, dp := range m.Data.(metricdata.Sum[float64]).DataPoints {
		e, _ := dp.Attributes.Value(telemetry.AttrEngine)
		k, _ := dp.Attributes.Value(telemetry.AttrKeyName)
		md, _ := dp.Attributes.Value(telemetry.AttrModel)
		if e.AsString() != "e1" || k.AsString() != "team-1" || md.AsString() != "m" {
			t.Errorf("cost recorded with %v, want engine e1, model m, key team-1", dp.Attributes.ToSlice())
		}
		got += dp.Value
	}
	if math.Abs(got-want) > 1e-12 {
		t.Errorf("%s = %v, want %v", telemetry.RequestCostName, got, want)
	}
	ks := h.gw.Keys()
	if len(ks) != 1 || math.Abs(ks[0].Spend-want) > 1e-8 {
		t.Errorf("key spend %+v, want %v", ks, want)
	}
	var logged float64
	for _, line := range strings.Split(logs.String(), "\n") {
		if _, v, ok := strings.Cut(line, "cost_usd="); ok {
			f, err := strconv.ParseFloat(strings.Fields(v)[0], 64)
			if err != nil {
				t.Fatal(err)
			}
			logged += f
		}
	}
	if math.Abs(logged-want) > 1e-8 {
		t.Errorf("access log cost_usd sums to %v, want %v:\n%s", logged, want, logs.String())
	}

	// An engine no entry prices: nothing recorded, no cost in the log.
	cfg2 := testConfig(fleet.EngineConfig{Name: "e2", URL: free.URL, Models: []string{"m"}})
	cfg2.Pricing = []PriceConfig{{Engine: "e1", Output: 1}}
	var logs2 bytes.Buffer
	h2 := newHarnessWith(t, cfg2, []Option{WithLogger(slog.New(slog.NewTextHandler(&logs2, nil)))})
	resp := h2.post("/v1/chat/completions", body(false))
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	h2.waitIdle()
	if _, ok := findMetric(h2.collect(), telemetry.RequestCostName); ok || strings.Contains(logs2.String(), "cost_usd") {
		t.Errorf("an unpriced engine's request has a cost:\n%s", logs2.String())
	}
}

// TestCostNoFeeForRefusedExchange: an exchange the engine refused (a 500)
// costs nothing, not even the per-request fee; a light route (tokenize)
// costs nothing either.
func TestCostNoFeeForRefusedExchange(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 4})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	cfg.MaxAttempts = 1
	cfg.Pricing = []PriceConfig{{Model: "m", Input: 1, Output: 1, Request: 0.01}}
	h := newHarness(t, cfg)
	resp := h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, enginesim.FaultHeader, "status=500")
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("status %d, want the engine's 500", resp.StatusCode)
	}
	resp = h.post("/tokenize", `{"model":"m","prompt":"hello there"}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	h.waitIdle()
	if m, ok := findMetric(h.collect(), telemetry.RequestCostName); ok {
		t.Errorf("a refused exchange and a tokenize were charged: %+v", m.Data)
	}
}

// TestDisaggregatedCost: a disaggregated request pays its prefill engine
// the prompt (its own usage, not an estimate and a whole max_tokens) and
// its decode engine the output (it read the prompt's KV cache): the
// prompt is charged once, and the key's tokens count it once.
func TestDisaggregatedCost(t *testing.T) {
	_, cfg := pdFleet(t, nil, "prefill", "decode")
	cfg.Auth = AuthConfig{Keys: []KeyConfig{{Name: "team-1", SHA256: sha("k-1"), Models: []string{"*"}}}}
	cfg.Pricing = []PriceConfig{{Model: "m", Input: 1, Output: 100}}
	h := newHarness(t, cfg)
	resp := h.post("/v1/chat/completions", `{"model":"m","max_tokens":6,"messages":[{"role":"user","content":"`+longPrompt+`"}]}`, "Authorization", "Bearer k-1")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Switchboard-Engine") == "p1" {
		t.Fatalf("%d from %q: %s", resp.StatusCode, resp.Header.Get("X-Switchboard-Engine"), b)
	}
	h.waitIdle()
	// 200 prompt tokens at $1/M on p1, 6 output tokens at $100/M on d1.
	byEngine := map[string]float64{}
	m, ok := findMetric(h.collect(), telemetry.RequestCostName)
	if !ok {
		t.Fatal("no cost recorded")
	}
	for _, dp := range m.Data.(metricdata.Sum[float64]).DataPoints {
		e, _ := dp.Attributes.Value(telemetry.AttrEngine)
		byEngine[e.AsString()] += dp.Value
	}
	if math.Abs(byEngine["p1"]-200e-6) > 1e-12 || math.Abs(byEngine["d1"]-6*100e-6) > 1e-12 {
		t.Errorf("cost by engine %v, want p1 $0.0002 (the prompt) and d1 $0.0006 (the output)", byEngine)
	}
	if ks := h.gw.Keys(); ks[0].TokensIn != 200 || ks[0].TokensOut != 6 {
		t.Errorf("key tokens in %d, out %d; want 200 and 6 (the prompt once)", ks[0].TokensIn, ks[0].TokensOut)
	}
}
