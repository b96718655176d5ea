package routing

import (
	"context"
	"fmt"
	"math/rand/v2"
)

// PowerOfTwoName is the config name of [PowerOfTwo].
const PowerOfTwoName = "power-of-two"

// PowerOfTwo picks two distinct candidates uniformly at random and sends the
// request to the less loaded one (load = prefill*PrefillWeight + decode, the
// gateway's own exact counters; a tie goes to either at random). This is "the
// power of two random choices" (Mitzenmacher, 2001; Azar et al., "Balanced
// Allocations", 1994): the most loaded engine's excess falls from
// O(log n / log log n) for one random choice to O(log log n), at a cost of two
// counter reads, and unlike least-loaded, concurrent gateways (or a burst of
// concurrent picks reading the same counters) do not all herd onto the one
// least-loaded engine. Envoy's and Caddy's least-request balancers use it.
//
// With Choices d > 2 it compares d distinct random candidates instead
// ("power of d choices").
type PowerOfTwo struct {
	choices       int
	prefillWeight int64
}

var _ Policy = (*PowerOfTwo)(nil)

// maxChoices bounds PowerOfTwoConfig.Choices, so the sample fits in a fixed
// array on the stack.
const maxChoices = 8

// PowerOfTwoConfig tunes [PowerOfTwo] (routing.power_of_two); its load
// score also uses the shared routing.prefill_weight.
type PowerOfTwoConfig struct {
	// Choices is how many distinct random candidates are compared (the d of
	// "power of d choices"), 2..8, default 2: two already gives almost all
	// of the gain over one (Mitzenmacher, 2001), and more makes concurrent
	// picks herd onto the same engine again.
	Choices int `koanf:"choices"`
}

// defaultPowerOfTwoConfig returns the defaults documented on
// [PowerOfTwoConfig].
func defaultPowerOfTwoConfig() PowerOfTwoConfig { return PowerOfTwoConfig{Choices: 2} }

// Validate reports a problem with c; the message starts with its key,
// routing.power_of_two.choices.
func (c PowerOfTwoConfig) Validate() error {
	if c.Choices < 2 || c.Choices > maxChoices {
		return fmt.Errorf("routing.power_of_two.choices must be 2..%d, got %d", maxChoices, c.Choices)
	}
	return nil
}

// powerOfTwoFactory is [PowerOfTwo]'s registry entry.
func powerOfTwoFactory() factory {
	return factory{
		build:    func(c *Config) Policy { return NewPowerOfChoices(c.PowerOfTwo.Choices, c.PrefillWeight) },
		defaults: func(c *Config) { c.PowerOfTwo = defaultPowerOfTwoConfig() },
		validate: func(c *Config) error { return c.PowerOfTwo.Validate() },
	}
}

// NewPowerOfTwo returns a power-of-two-choices policy; prefillWeight below 1
// is treated as 1.
func NewPowerOfTwo(prefillWeight int) *PowerOfTwo { return NewPowerOfChoices(2, prefillWeight) }

// NewPowerOfChoices returns the policy comparing choices distinct random
// candidates (clamped to 2..8); prefillWeight below 1 is treated as 1.
func NewPowerOfChoices(choices, prefillWeight int) *PowerOfTwo {
	return &PowerOfTwo{choices: min(max(choices, 2), maxChoices), prefillWeight: int64(max(prefillWeight, 1))}
}

// Pick returns the less loaded of two distinct random candidates (the only
// one when there is one), or [ErrNoEndpoint] when there is none. It does not
// allocate.
func (p *PowerOfTwo) Pick(_ context.Context, _ *Request, candidates []*Endpoint) (*Endpoint, error) {
	n := len(candidates)
	switch n {
	case 0:
		return nil, ErrNoEndpoint
	case 1:
		return candidates[0], nil
	}
	if p.choices > 2 && n > 2 {
		return p.pickD(candidates), nil
	}
	i := rand.IntN(n)
	j := rand.IntN(n - 1)
	if j >= i {
		j++ // distinct, and uniform over the other n-1
	}
	a, b := candidates[i], candidates[j]
	la, lb := inFlightLoad(a, p.prefillWeight), inFlightLoad(b, p.prefillWeight)
	if lb < la || lb == la && rand.Uint64()&1 == 0 {
		return b, nil
	}
	return a, nil
}

// pickD compares min(choices, len(candidates)) distinct random candidates,
// drawn by rejection (choices is at most 8), ties at random.
func (p *PowerOfTwo) pickD(candidates []*Endpoint) *Endpoint {
	d := min(p.choices, len(candidates))
	var seen [maxChoices]int
	var (
		best     *Endpoint
		bestLoad int64
		ties     uint64
	)
	for k := 0; k < d; k++ {
		i := rand.IntN(len(candidates))
		dup := false
		for _, s := range seen[:k] {
			dup = dup || s == i
		}
		if dup {
			k--
			continue
		}
		seen[k] = i
		e := candidates[i]
		l := inFlightLoad(e, p.prefillWeight)
		switch {
		case best == nil || l < bestLoad:
			best, bestLoad, ties = e, l, 1
		case l == bestLoad:
			ties++
			if rand.Uint64N(ties) == 0 {
				best = e
			}
		}
	}
	return best
}
