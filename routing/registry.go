package routing

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
)

// ErrUnknownPolicy is returned by [NewPolicy] and [Config.Validate] for a
// name that no policy is registered under.
var ErrUnknownPolicy = errors.New("unknown routing policy")

// factory is one policy's registry entry: how it is built from [Config]
// and, for a policy with a section of Config of its own, that section's
// defaults and validation. Each policy's file has a function returning its
// entry (roundRobinFactory, ...), so the policy, its config and its
// factory sit together.
type factory struct {
	// build returns the policy for c, which [Config.Validate] accepted.
	build func(c *Config) Policy
	// defaults sets the policy's section of c to its defaults; nil when
	// the policy has no section.
	defaults func(c *Config)
	// validate reports the problems of the policy's section of c, joined,
	// each starting with its key; nil when the policy has no section.
	validate func(c *Config) error
}

// registry maps policy names to their factories.
type registry struct {
	byName map[string]factory
	order  []string // registration order: defaults and validation run in it
}

// register adds f under name. (A name registered twice would show twice in
// [Names]; TestNewPolicyBuildsEveryName counts them.)
func (r *registry) register(name string, f factory) {
	r.byName[name] = f
	r.order = append(r.order, name)
}

// registerInTreePolicies is the one place the built-in policies are
// registered (the shape of llm-d's registerInTreePlugins; no init()).
// Adding a policy is its file, with its type, name constant, config and
// factory, and one line here.
func registerInTreePolicies(r *registry) {
	r.register(RoundRobinName, roundRobinFactory())
	r.register(LeastLoadedName, leastLoadedFactory())
	r.register(PowerOfTwoName, powerOfTwoFactory())
	r.register(SessionAffinityName, sessionAffinityFactory())
	r.register(PrefixAwareName, prefixAwareFactory())
	r.register(PrecisePrefixName, precisePrefixFactory())
	r.register(ScorerName, scorerFactory())
}

// registered returns the registry of the built-in policies. It is built on
// each call (only configuration loading calls it, never a request) rather
// than kept in a package variable, whose initializer would reach back to
// itself through session-affinity's fallback.
func registered() *registry {
	r := &registry{byName: make(map[string]factory)}
	registerInTreePolicies(r)
	return r
}

// has reports whether a policy is registered under name.
func (r *registry) has(name string) bool {
	_, ok := r.byName[name]
	return ok
}

// sorted returns the registered names, sorted.
func (r *registry) sorted() []string {
	return slices.Sorted(slices.Values(r.order))
}

// unknown is the error for name, which nothing is registered under, set
// at key: it wraps [ErrUnknownPolicy], lists the known names and suggests
// the nearest.
func (r *registry) unknown(key, name string) error {
	return fmt.Errorf("%s: %w %q (known: %s)%s", key, ErrUnknownPolicy, name, strings.Join(r.sorted(), ", "), r.nearest(name))
}

// Names returns the registered policy names, sorted.
func Names() []string { return registered().sorted() }

// NewPolicy validates cfg and builds the policy it names, with opts.
// Errors wrap [ErrUnknownPolicy] or describe the invalid setting.
func NewPolicy(cfg Config, opts ...PolicyOption) (Policy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	for _, o := range opts {
		o(&cfg)
	}
	return registered().byName[cfg.Policy].build(&cfg), nil
}

// nearest suggests the registered name nearest to name: one that differs
// only in case or punctuation ("LeastLoaded", "least_loaded" for
// least-loaded), else the one within two edits of it ("sesion-affinity"),
// as "; did you mean NAME?", or returns "".
func (r *registry) nearest(name string) string {
	norm := func(s string) string {
		return strings.Map(func(r rune) rune {
			if r == '-' || r == '_' || r == ' ' {
				return -1
			}
			return unicode.ToLower(r)
		}, s)
	}
	best, bestDist := "", 3
	for _, n := range r.sorted() {
		if norm(n) == norm(name) {
			return "; did you mean " + n + "?"
		}
		if d := editDistance(strings.ToLower(name), n); d < bestDist {
			best, bestDist = n, d
		}
	}
	if best == "" || len(name) < 3 {
		return ""
	}
	return "; did you mean " + best + "?"
}

// editDistance is the Levenshtein distance between a and b, in bytes
// (names are short and ASCII; only config errors call it).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
