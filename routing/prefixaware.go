package routing

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// PrefixAwareName is the config name of [PrefixAware].
const PrefixAwareName = "prefix-aware"

// PrefixAware routes a prompt to the engine that was most recently sent its
// longest prefix, where the prompt's KV cache most likely still is, so the
// engine skips recomputing it (the gain is the prefill time of the matched
// part: the largest share of TTFT for long system prompts, few-shot
// examples, RAG context and multi-turn chats). It follows SGLang's
// cache-aware router (sgl-router, policies/cache_aware.rs), with block
// hashes in a bounded [PrefixIndex] in place of its radix tree:
//
//  1. Match every candidate against the prompt's block hashes
//     ([Request.PrefixHashes]); the best is the longest match, ties to the
//     least loaded, then at random.
//  2. If the best match covers more than CacheThreshold of the prompt's
//     blocks and the best engine is not overloaded, it wins. Overloaded
//     means its load exceeds the least loaded candidate's by more than
//     BalanceAbs requests and by a factor of more than BalanceRel (both
//     must hold, as in sgl-router): past that point waiting behind the
//     queue costs more than recomputing the prefix elsewhere.
//  3. Otherwise (a new prompt, a weak match, or an overloaded engine), the
//     least loaded candidate wins, ties at random.
//
// Load is the gateway's in-flight score prefill*PrefillWeight + decode.
// The chosen engine's blocks are then recorded in the index. A prompt
// shorter than one block goes by load alone.
type PrefixAware struct {
	m             prefixMatcher
	blocks        PrefixConfig
	threshold     float64
	balanceAbs    int64
	balanceRel    float64
	prefillWeight int64
}

var (
	_ Policy       = (*PrefixAware)(nil)
	_ PrefixHasher = (*PrefixAware)(nil)
	_ Forgetter    = (*PrefixAware)(nil)
	_ KVRouter     = (*PrefixAware)(nil)
)

// PrefixAwareConfig tunes [PrefixAware] (routing.prefix_aware); its
// prompt blocks and index size are the shared routing.prefix
// ([PrefixConfig]) and its load score uses routing.prefill_weight.
type PrefixAwareConfig struct {
	// CacheThreshold is the fraction of a prompt's blocks the best match must
	// exceed to route by cache, 0 <= t < 1, default 0.3 (SGLang's
	// cache_threshold).
	CacheThreshold float64 `koanf:"cache_threshold"`
	// BalanceAbsThreshold is how many in-flight load units the best-matching
	// engine may carry above the least loaded one before the request goes
	// by load instead, >= 0, default 16. SGLang uses 64 for fleets whose
	// engines each run hundreds of sequences; 16 keeps small fleets (the
	// usual 2-8 engines behind one gateway) from piling onto one engine.
	BalanceAbsThreshold int `koanf:"balance_abs_threshold"`
	// BalanceRelThreshold is the factor by which the best-matching engine's
	// load must also exceed the least loaded one's, >= 1, default 1.5
	// (SGLang's balance_rel_threshold).
	BalanceRelThreshold float64 `koanf:"balance_rel_threshold"`
}

// defaultPrefixAwareConfig returns the defaults documented on
// [PrefixAwareConfig].
func defaultPrefixAwareConfig() PrefixAwareConfig {
	return PrefixAwareConfig{CacheThreshold: 0.3, BalanceAbsThreshold: 16, BalanceRelThreshold: 1.5}
}

// Validate reports every problem with c, joined; each message starts with
// its key under routing.prefix_aware.
func (c PrefixAwareConfig) Validate() error {
	var errs []error
	if !(c.CacheThreshold >= 0 && c.CacheThreshold < 1) {
		errs = append(errs, fmt.Errorf("routing.prefix_aware.cache_threshold must be >= 0 and < 1 (the match must exceed it), got %v", c.CacheThreshold))
	}
	if c.BalanceAbsThreshold < 0 {
		errs = append(errs, fmt.Errorf("routing.prefix_aware.balance_abs_threshold must be >= 0, got %d", c.BalanceAbsThreshold))
	}
	if !(c.BalanceRelThreshold >= 1) || math.IsInf(c.BalanceRelThreshold, 0) {
		errs = append(errs, fmt.Errorf("routing.prefix_aware.balance_rel_threshold must be >= 1, got %v", c.BalanceRelThreshold))
	}
	return errors.Join(errs...)
}

// prefixAwareFactory is [PrefixAware]'s registry entry: its index takes
// routing.prefix.index_entries, its blocks the rest of routing.prefix.
func prefixAwareFactory() factory {
	return factory{
		build: func(c *Config) Policy {
			pa := c.PrefixAware
			return NewPrefixAware(NewPrefixIndex(c.Prefix.IndexEntries), pa.CacheThreshold, pa.BalanceAbsThreshold,
				pa.BalanceRelThreshold, c.PrefillWeight).withBlocks(c.Prefix)
		},
		defaults: func(c *Config) { c.PrefixAware = defaultPrefixAwareConfig() },
		validate: func(c *Config) error { return c.PrefixAware.Validate() },
	}
}

// NewPrefixAware returns a prefix-aware policy over index (nil: a new index
// of [PrefixConfig]'s default size) with the thresholds described on
// [PrefixAware], cutting prompts into PrefixConfig's default blocks.
func NewPrefixAware(index *PrefixIndex, cacheThreshold float64, balanceAbs int, balanceRel float64, prefillWeight int) *PrefixAware {
	blocks := defaultPrefixConfig()
	if index == nil {
		index = NewPrefixIndex(blocks.IndexEntries)
	}
	return &PrefixAware{m: prefixMatcher{approx: index}, blocks: blocks, threshold: cacheThreshold, balanceAbs: int64(balanceAbs),
		balanceRel: balanceRel, prefillWeight: int64(max(prefillWeight, 1))}
}

// withBlocks sets the block cutting the gateway is told about.
func (p *PrefixAware) withBlocks(c PrefixConfig) *PrefixAware { p.blocks = c; return p }

// PrefixBlocks returns the block size in bytes and the most blocks hashed
// per prompt (routing.prefix).
func (p *PrefixAware) PrefixBlocks() (blockBytes, maxBlocks int) {
	return p.blocks.BlockBytes, p.blocks.MaxBlocks
}

// Index returns the policy's prefix index.
func (p *PrefixAware) Index() *PrefixIndex { return p.m.approx }

// Forget removes the blocks of req that its pick recorded for e beyond
// those e already had ([PrefixIndex.Forget]), and for precise-prefix the
// speculative entries it added ([KVIndex.Unspeculate]).
func (p *PrefixAware) Forget(req *Request, e *Endpoint) { p.m.forget(req, e) }

// Pick returns the engine chosen as described on [PrefixAware] and records
// the prompt's blocks against it, or returns [ErrNoEndpoint] when there is
// no candidate. It does not allocate.
func (p *PrefixAware) Pick(_ context.Context, req *Request, candidates []*Endpoint) (*Endpoint, error) {
	if len(candidates) == 0 {
		return nil, ErrNoEndpoint
	}
	now := p.m.now()
	matching := len(req.PrefixHashes) > 0 || p.m.precise(req)
	var (
		least, best         *Endpoint
		leastLoad, bestLoad int64
		leastMatch          prefixMatch
		bestMatch           = prefixMatch{frac: -1}
		leastTies, bestTies uint64
	)
	for _, e := range candidates {
		l := inFlightLoad(e, p.prefillWeight)
		m := prefixMatch{approx: 0, precise: -1}
		if matching {
			m = p.m.match(req, e, now)
		}
		switch {
		case least == nil || l < leastLoad:
			least, leastLoad, leastMatch, leastTies = e, l, m, 1
		case l == leastLoad:
			leastTies++
			if rand.Uint64N(leastTies) == 0 {
				least, leastMatch = e, m
			}
		}
		if !matching {
			continue
		}
		switch {
		case m.frac > bestMatch.frac || m.frac == bestMatch.frac && l < bestLoad:
			best, bestMatch, bestLoad, bestTies = e, m, l, 1
		case m.frac == bestMatch.frac && l == bestLoad:
			bestTies++
			if rand.Uint64N(bestTies) == 0 {
				best, bestMatch = e, m
			}
		}
	}
	pick, pm := least, leastMatch
	if best != nil && bestMatch.frac > p.threshold && !p.overloaded(bestLoad, leastLoad) {
		pick, pm = best, bestMatch
	}
	p.m.picked(req, pick, pm, now)
	return pick, nil
}

// overloaded reports whether an engine at load is too far above the least
// loaded one, at least, to be sent more work for its cache.
func (p *PrefixAware) overloaded(load, least int64) bool {
	return load-least > p.balanceAbs && float64(load) > p.balanceRel*float64(least)
}
