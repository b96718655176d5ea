package routing

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// ScorerName is the config name of [Scorer].
const ScorerName = "scorer"

// Scorer picks the candidate with the highest weighted sum of normalized
// scores, each in 0..1 with 1 best, ties at random. This is the shape of
// llm-d's endpoint picker (the Gateway API Inference Extension's scheduler:
// filters, then weighted scorers, then a max-score picker), whose default
// profile weighs queue 2, KV cache 2, prefix 3. The scorers:
//
//   - queue: the engine's queue depth (scraped vllm:num_requests_waiting plus
//     the requests sent since that scrape; the gateway's in-flight prefill
//     count when the stats are stale), min-max normalized over the
//     candidates: (max-q)/(max-min), 1 for all when equal (as the
//     Inference Extension's queue scorer).
//   - kv_cache: 1 - vllm:kv_cache_usage_perc; 0.5 when unknown or stale, so
//     an engine without stats is neither preferred nor avoided.
//   - prefix: the fraction of the prompt's blocks the engine was recently
//     sent ([PrefixIndex]); the chosen engine's blocks are recorded. With
//     precise_prefix, the fraction of its token blocks the engine reported
//     holding in its KV-cache events ([KVIndex]) when they are fresh and
//     the prompt's tokens are known, as in precise-prefix
//     ([NewPrecisePrefix]); llm-d's precise prefix-cache scorer is this
//     input of its picker.
//   - prefill, decode: the gateway's own in-flight counts, min-max
//     normalized like queue; exact and immediate where scraped stats lag.
//
// A scorer with weight 0 is not computed.
type Scorer struct {
	w      ScorerConfig
	m      prefixMatcher
	blocks PrefixConfig
}

var (
	_ Policy       = (*Scorer)(nil)
	_ PrefixHasher = (*Scorer)(nil)
	_ Forgetter    = (*Scorer)(nil)
	_ KVRouter     = (*Scorer)(nil)
)

// ScorerConfig holds the weights of [Scorer]'s scorers (routing.scorer),
// each >= 0 and at least one > 0. Its prompt blocks and index size are the
// shared routing.prefix ([PrefixConfig]).
type ScorerConfig struct {
	// Queue weighs the queue-depth scorer, default 2 (as llm-d's EPP).
	Queue float64 `koanf:"queue"`
	// KVCache weighs the KV-cache-usage scorer, default 2 (as llm-d).
	KVCache float64 `koanf:"kv_cache"`
	// Prefix weighs the prefix-match scorer, default 3 (as llm-d): a long
	// cached prefix saves more time than a short queue costs.
	Prefix float64 `koanf:"prefix"`
	// Prefill weighs the gateway's in-flight prefill count, default 0. It is
	// exact and immediate where scraped stats lag, but min-max normalized it
	// swings a whole weight on a difference of one request, which pulls
	// conversations off their cached engine: with weight 1 the scorer kept
	// 77% of prompt tokens cached on the routing benchmark, with 0 86%
	// (bench/routing). The queue scorer already counts the requests sent
	// since the last scrape.
	Prefill float64 `koanf:"prefill"`
	// Decode weighs the gateway's in-flight decode count, default 0: decode
	// load already shows in KV-cache usage.
	Decode float64 `koanf:"decode"`
	// PrecisePrefix measures the prefix input on the engines' KV-cache
	// events where they are fresh (as precise-prefix does), default false:
	// the gateway's approximate index only.
	PrecisePrefix bool `koanf:"precise_prefix"`
}

// defaultScorerConfig returns the weights documented on [ScorerConfig].
func defaultScorerConfig() ScorerConfig {
	return ScorerConfig{Queue: 2, KVCache: 2, Prefix: 3, Prefill: 0, Decode: 0}
}

// Validate reports every problem with c, joined; each message starts with
// its key under routing.scorer.
func (c ScorerConfig) Validate() error {
	var errs []error
	sum := 0.0
	for _, w := range []struct {
		name string
		v    float64
	}{{"queue", c.Queue}, {"kv_cache", c.KVCache}, {"prefix", c.Prefix}, {"prefill", c.Prefill}, {"decode", c.Decode}} {
		if !(w.v >= 0) || math.IsInf(w.v, 0) {
			errs = append(errs, fmt.Errorf("routing.scorer.%s must be a number >= 0, got %v", w.name, w.v))
			continue
		}
		sum += w.v
	}
	if sum == 0 {
		errs = append(errs, errors.New("routing.scorer: at least one weight must be > 0"))
	}
	if c.PrecisePrefix && !(c.Prefix > 0) {
		errs = append(errs, errors.New("routing.scorer.precise_prefix needs routing.scorer.prefix > 0: it is how the prefix input is measured"))
	}
	return errors.Join(errs...)
}

// scorerFactory is [Scorer]'s registry entry: it has a prefix index, of
// routing.prefix.index_entries, only when the prefix weight is above 0.
func scorerFactory() factory {
	return factory{
		build: func(c *Config) Policy {
			var index *PrefixIndex
			if c.Scorer.Prefix > 0 {
				index = NewPrefixIndex(c.Prefix.IndexEntries)
			}
			p := NewScorer(c.Scorer, index).withBlocks(c.Prefix)
			if c.Scorer.PrecisePrefix && c.Scorer.Prefix > 0 {
				p.m.kv, p.m.blockSize = c.kv, c.kvBlockSize
				if p.m.kv == nil {
					p.m.kv = NewKVIndex(DefaultKVIndexConfig())
				}
				if p.m.blockSize <= 0 {
					p.m.blockSize = DefaultKVBlockSize
				}
			}
			return p
		},
		defaults: func(c *Config) { c.Scorer = defaultScorerConfig() },
		validate: func(c *Config) error { return c.Scorer.Validate() },
	}
}

// NewScorer returns a scorer policy with weights w (negative weights count
// as 0) over index (nil: a new index of [PrefixConfig]'s default size when
// the prefix weight is above 0, none otherwise), cutting prompts into
// PrefixConfig's default blocks.
func NewScorer(w ScorerConfig, index *PrefixIndex) *Scorer {
	blocks := defaultPrefixConfig()
	w.Queue, w.KVCache, w.Prefix = max(w.Queue, 0), max(w.KVCache, 0), max(w.Prefix, 0)
	if index == nil && w.Prefix > 0 {
		index = NewPrefixIndex(blocks.IndexEntries)
	}
	w.Prefill, w.Decode = max(w.Prefill, 0), max(w.Decode, 0)
	return &Scorer{w: w, m: prefixMatcher{approx: index}, blocks: blocks}
}

// withBlocks sets the block cutting the gateway is told about.
func (p *Scorer) withBlocks(c PrefixConfig) *Scorer { p.blocks = c; return p }

// Forget removes the blocks of req that its pick recorded for e beyond
// those e already had ([PrefixIndex.Forget]); with a prefix weight of 0
// nothing was recorded.
func (p *Scorer) Forget(req *Request, e *Endpoint) {
	if p.w.Prefix > 0 {
		p.m.forget(req, e)
	}
}

// PrefixBlocks returns the block size in bytes and the most blocks hashed
// per prompt (routing.prefix); with a prefix weight of 0 it returns 0, 0 so
// the gateway does not hash at all.
func (p *Scorer) PrefixBlocks() (blockBytes, maxBlocks int) {
	if p.w.Prefix == 0 {
		return 0, 0
	}
	return p.blocks.BlockBytes, p.blocks.MaxBlocks
}

// Index returns the policy's prefix index.
func (p *Scorer) Index() *PrefixIndex { return p.m.approx }

// KVBlockSize returns the tokens per block of [Request.TokenKeys] with
// precise_prefix on, else 0.
func (p *Scorer) KVBlockSize() int {
	if p.m.kv == nil {
		return 0
	}
	return p.m.blockSize
}

// span is a running min and max.
type span struct{ lo, hi int64 }

func (s *span) add(v int64, first bool) {
	if first || v < s.lo {
		s.lo = v
	}
	if first || v > s.hi {
		s.hi = v
	}
}

// score is (hi-v)/(hi-lo): 1 at the minimum, 0 at the maximum, 1 for all
// when they are equal; clamped to 0..1, because the counters are read again
// after the span was taken and may have moved.
func (s span) score(v int64) float64 {
	if s.hi <= s.lo {
		return 1
	}
	return min(max(float64(s.hi-v)/float64(s.hi-s.lo), 0), 1)
}

// Pick returns the best-scoring candidate as described on [Scorer], or
// [ErrNoEndpoint] when there is none. It does not allocate.
func (p *Scorer) Pick(_ context.Context, req *Request, candidates []*Endpoint) (*Endpoint, error) {
	switch len(candidates) {
	case 0:
		return nil, ErrNoEndpoint
	case 1:
		if p.w.Prefix > 0 {
			// No match is needed to choose, so none is known: a Forget
			// takes the whole prompt, which a retry on this engine
			// records again.
			p.m.picked(req, candidates[0], prefixMatch{approx: 0, precise: -1}, p.m.now())
		}
		return candidates[0], nil
	}
	now := time.Now()
	var qs, pfs, dcs span
	for i, e := range candidates {
		pf, dc := e.InFlight()
		if p.w.Queue > 0 {
			qs.add(queueDepth(e, now), i == 0)
		}
		pfs.add(pf, i == 0)
		dcs.add(dc, i == 0)
	}
	matching := p.w.Prefix > 0 && (len(req.PrefixHashes) > 0 || p.m.precise(req))
	var (
		best      *Endpoint
		bestScore float64
		bestMatch prefixMatch
		ties      uint64
	)
	for _, e := range candidates {
		pf, dc := e.InFlight()
		s := 0.0
		if p.w.Queue > 0 {
			s += p.w.Queue * qs.score(queueDepth(e, now))
		}
		if p.w.KVCache > 0 {
			kv := 0.5
			if u := kvUsage(e, now); u >= 0 {
				kv = 1 - u
			}
			s += p.w.KVCache * kv
		}
		m := prefixMatch{approx: 0, precise: -1}
		if matching {
			m = p.m.match(req, e, now)
			s += p.w.Prefix * m.frac
		}
		if p.w.Prefill > 0 {
			s += p.w.Prefill * pfs.score(pf)
		}
		if p.w.Decode > 0 {
			s += p.w.Decode * dcs.score(dc)
		}
		switch {
		case best == nil || s > bestScore:
			best, bestScore, bestMatch, ties = e, s, m, 1
		case s == bestScore:
			ties++
			if rand.Uint64N(ties) == 0 {
				best, bestMatch = e, m
			}
		}
	}
	if p.w.Prefix > 0 {
		p.m.picked(req, best, bestMatch, now)
	}
	return best, nil
}
