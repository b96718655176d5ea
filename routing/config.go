package routing

import (
	"errors"
	"fmt"
)

// Config selects and tunes the routing policy. It is loaded from the
// `routing` section of the gateway configuration, and its defaults are
// [DefaultConfig]'s.
//
// Config itself holds what several policies share: the selected policy, the
// prefill weight and the prompt blocks. Each other section belongs to one
// policy, which declares its type, defaults and validation in its own file
// next to the policy (poweroftwo.go has [PowerOfTwoConfig], ...) and
// registers them with the policy's factory.
type Config struct {
	// Policy is the policy's registered name ([Names]): round-robin,
	// least-loaded, power-of-two, session-affinity, prefix-aware,
	// precise-prefix or scorer.
	Policy string `koanf:"policy"`
	// PrefillWeight is how many decode requests one prefill request counts
	// as in the in-flight load score of least-loaded, power-of-two and
	// prefix-aware (an integer 1..1000, default 2): prefill is compute-bound
	// and about to become a decode sequence as well.
	PrefillWeight int `koanf:"prefill_weight"`

	// The policies' own sections (routing.power_of_two, ...); every one
	// is validated whichever policy is selected.
	PowerOfTwo      PowerOfTwoConfig      `koanf:"power_of_two"`
	SessionAffinity SessionAffinityConfig `koanf:"session_affinity"`
	// Prefix is shared by prefix-aware and scorer (and a session-affinity
	// fallback to either).
	Prefix      PrefixConfig      `koanf:"prefix"`
	PrefixAware PrefixAwareConfig `koanf:"prefix_aware"`
	Scorer      ScorerConfig      `koanf:"scorer"`

	// kv and kvBlockSize are what [WithKVIndex] gave [NewPolicy].
	kv          *KVIndex
	kvBlockSize int
}

// defaultPrefillWeight is Config.PrefillWeight's default.
const defaultPrefillWeight = 2

// DefaultConfig returns the defaults: round-robin, prefill weight 2, the
// default prompt blocks ([PrefixConfig]) and every registered policy's
// documented defaults.
func DefaultConfig() Config {
	c := Config{Policy: RoundRobinName, PrefillWeight: defaultPrefillWeight, Prefix: defaultPrefixConfig()}
	r := registered()
	for _, name := range r.order {
		if f := r.byName[name]; f.defaults != nil {
			f.defaults(&c)
		}
	}
	return c
}

// Validate reports every problem with c, joined; each message starts with
// its key under `routing.`. Every section is checked, not only the selected
// policy's, so a typo is found before it matters. An unknown policy name
// wraps [ErrUnknownPolicy].
func (c Config) Validate() error {
	r := registered()
	var errs []error
	if !r.has(c.Policy) {
		errs = append(errs, r.unknown("routing.policy", c.Policy))
	}
	if c.PrefillWeight < 1 || c.PrefillWeight > 1000 {
		errs = append(errs, fmt.Errorf("routing.prefill_weight must be 1..1000, got %d", c.PrefillWeight))
	}
	errs = append(errs, c.Prefix.Validate())
	for _, name := range r.order {
		if f := r.byName[name]; f.validate != nil {
			errs = append(errs, f.validate(&c))
		}
	}
	return errors.Join(errs...)
}
