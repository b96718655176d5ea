package gateway

import (
	"fmt"
	"math"
)

// PriceConfig is one entry of the top-level pricing list: what a request
// costs on an engine, from its usage, in US dollars. A hosted provider's
// engine carries its list price; a self-hosted engine may carry an
// internal price derived from what its GPUs cost an hour (GPUHour), so
// that the two compare. The most specific entry wins for an engine and a
// model: one naming both, then one naming the engine, then one naming the
// model; an engine and model no entry matches cost nothing (unpriced).
// See docs/keys-and-limits.md (Cost).
type PriceConfig struct {
	// Model is the model the engines serve (after aliases), "" for any.
	Model string `koanf:"model"`
	// Engine is an engine's name (engines[].name, or a discovered
	// engine's), "" for any.
	Engine string `koanf:"engine"`
	// Input is the price of a million input (prompt) tokens the engine
	// did not find cached, USD.
	Input float64 `koanf:"input"`
	// CachedInput is the price of a million input tokens the engine found
	// in its prefix cache (usage.prompt_tokens_details.cached_tokens), USD;
	// nil (absent) is Input's. OpenAI bills them at a half to a tenth of
	// Input, Anthropic's cache reads at a tenth.
	CachedInput *float64 `koanf:"cached_input"`
	// Output is the price of a million output (completion) tokens, USD.
	Output float64 `koanf:"output"`
	// Request is a price per engine exchange, USD (a per-call fee; 0 for
	// none).
	Request float64 `koanf:"request"`
	// GPUHour derives Input and Output from what the engine's GPUs cost,
	// for a self-hosted engine: set it instead of Input and Output.
	GPUHour *GPUHourPrice `koanf:"gpu_hour"`
}

// GPUHourPrice is a self-hosted engine's internal price: its GPUs' hourly
// cost spread over the tokens they compute at full load. A million input
// tokens costs USD x GPUs / 3600 / InputTokensPerSecond x 10^6, and the
// same for output. The throughputs are the engine's own at a typical
// batch (vLLM's benchmark_serving.py measures both); e.g. an 8B model on
// one H100 at $2.50/h, 20,000 prompt and 2,500 output tokens/s, prices
// $0.035 and $0.28 per million.
type GPUHourPrice struct {
	// USD is one GPU's price per hour.
	USD float64 `koanf:"usd"`
	// GPUs is how many GPUs the engine runs on, default 1.
	GPUs int `koanf:"gpus"`
	// InputTokensPerSecond and OutputTokensPerSecond are the engine's
	// prompt and output throughput, in tokens per second, > 0.
	InputTokensPerSecond  float64 `koanf:"input_tokens_per_second"`
	OutputTokensPerSecond float64 `koanf:"output_tokens_per_second"`
}

// validatePricing reports every problem with the pricing list, joined;
// each wraps ErrInvalidConfig and names its entry.
func validatePricing(ps []PriceConfig) []error {
	var errs []error
	bad := func(i int, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: pricing[%d]: "+format, append([]any{ErrInvalidConfig, i}, a...)...))
	}
	price := func(v float64) bool { return v >= 0 && !math.IsInf(v, 0) } // NaN fails
	type at struct{ engine, model string }
	seen := map[at]int{}
	for i, p := range ps {
		if j, ok := seen[at{p.Engine, p.Model}]; ok {
			bad(i, "engine %q and model %q are priced by pricing[%d] already", p.Engine, p.Model, j)
		}
		seen[at{p.Engine, p.Model}] = i
		if !price(p.Input) || !price(p.Output) || !price(p.Request) || p.CachedInput != nil && !price(*p.CachedInput) {
			bad(i, "prices must be numbers >= 0 (USD per million tokens, per request)")
		} else if p.CachedInput != nil && *p.CachedInput > p.Input && p.GPUHour == nil {
			bad(i, "cached_input (%v) must not be above input (%v): a cache hit costs at most a miss", *p.CachedInput, p.Input)
		}
		if g := p.GPUHour; g != nil {
			if p.Input != 0 || p.Output != 0 {
				bad(i, "set gpu_hour or input and output, not both")
			}
			if !(g.USD >= 0) || math.IsInf(g.USD, 0) || g.GPUs < 0 {
				bad(i, "gpu_hour.usd and gpu_hour.gpus must be >= 0")
			}
			if !(g.InputTokensPerSecond > 0) || !(g.OutputTokensPerSecond > 0) || math.IsInf(g.InputTokensPerSecond, 0) || math.IsInf(g.OutputTokensPerSecond, 0) {
				bad(i, "gpu_hour.input_tokens_per_second and output_tokens_per_second must be > 0")
			}
		}
	}
	return errs
}

// price is a PriceConfig resolved to USD per token.
type price struct {
	input, cachedInput, output, request float64
}

// resolve returns p's per-token prices.
func (p PriceConfig) resolve() price {
	in, out := p.Input, p.Output
	if g := p.GPUHour; g != nil {
		perSecond := g.USD * float64(max(g.GPUs, 1)) / 3600
		in, out = perSecond/g.InputTokensPerSecond*1e6, perSecond/g.OutputTokensPerSecond*1e6
	}
	cached := in
	if p.CachedInput != nil {
		cached = *p.CachedInput
	}
	return price{input: in / 1e6, cachedInput: cached / 1e6, output: out / 1e6, request: p.Request}
}

// cost returns the USD of an exchange with in input tokens, cached of
// them found in the engine's cache, and out output tokens. Negative or
// inconsistent counts are clamped: cached to 0..in.
func (p *price) cost(in, cached, out int64) float64 {
	in, out = max(in, 0), max(out, 0)
	cached = min(max(cached, 0), in)
	return float64(in-cached)*p.input + float64(cached)*p.cachedInput + float64(out)*p.output + p.request
}

// pricing is the resolved pricing list, looked up per exchange.
type pricing struct {
	entries []PriceConfig
	prices  []price
}

// newPricing resolves a validated pricing list.
func newPricing(ps []PriceConfig) pricing {
	out := pricing{entries: ps, prices: make([]price, len(ps))}
	for i, p := range ps {
		out.prices[i] = p.resolve()
	}
	return out
}

// reservation returns the most a request for model with prompt input
// tokens and out output tokens can cost on any engine: its cost at every
// entry that can apply to the model (naming it or any model), the
// highest, in USD; 0 when none applies. A spend budget reserves it at
// admission, before an engine is picked. It does not allocate.
func (ps *pricing) reservation(model string, prompt, out int64) float64 {
	var worst float64
	for i, p := range ps.entries {
		if p.Model == "" || p.Model == model {
			worst = max(worst, ps.prices[i].cost(prompt, 0, out))
		}
	}
	return worst
}

// lookup returns the price of engine serving model, nil when none
// applies: the entry naming both, else the engine, else the model. It
// does not allocate.
func (ps *pricing) lookup(engine, model string) *price {
	best, rank := -1, 0
	for i, p := range ps.entries {
		r := 0
		switch {
		case p.Engine == engine && p.Model == model:
			r = 4
		case p.Engine == engine && p.Model == "":
			r = 3
		case p.Engine == "" && p.Model == model:
			r = 2
		case p.Engine == "" && p.Model == "":
			r = 1
		}
		if r > rank {
			best, rank = i, r
		}
	}
	if best < 0 {
		return nil
	}
	return &ps.prices[best]
}
