package routing

import (
	"context"
	"math/rand/v2"
)

// LeastLoadedName is the config name of [LeastLoaded].
const LeastLoadedName = "least-loaded"

// LeastLoaded picks the candidate with the lowest in-flight score
// prefill*PrefillWeight + decode. Ties are broken uniformly at random by
// reservoir sampling (Caddy's least_conn does the same), so equally loaded
// engines share traffic evenly instead of the first one taking every tie.
type LeastLoaded struct {
	prefillWeight int64
}

var _ Policy = (*LeastLoaded)(nil)

// NewLeastLoaded returns a least-loaded policy. prefillWeight below 1 is
// treated as 1.
func NewLeastLoaded(prefillWeight int) *LeastLoaded {
	if prefillWeight < 1 {
		prefillWeight = 1
	}
	return &LeastLoaded{prefillWeight: int64(prefillWeight)}
}

// Pick returns the least-loaded candidate, or [ErrNoEndpoint] when there is
// none. It does not allocate.
func (p *LeastLoaded) Pick(_ context.Context, _ *Request, candidates []*Endpoint) (*Endpoint, error) {
	var (
		best      *Endpoint
		bestScore int64
		ties      uint64
	)
	for _, e := range candidates {
		score := inFlightLoad(e, p.prefillWeight)
		switch {
		case best == nil || score < bestScore:
			best, bestScore, ties = e, score, 1
		case score == bestScore:
			ties++
			if rand.Uint64N(ties) == 0 {
				best = e
			}
		}
	}
	if best == nil {
		return nil, ErrNoEndpoint
	}
	return best, nil
}

// leastLoadedFactory is [LeastLoaded]'s registry entry; its one setting is
// the shared routing.prefill_weight.
func leastLoadedFactory() factory {
	return factory{build: func(c *Config) Policy { return NewLeastLoaded(c.PrefillWeight) }}
}
