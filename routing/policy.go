package routing

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode"
)

// ErrNoEndpoint is returned by a policy when no candidate can take the
// request. The gateway answers it with 503 and a Retry-After header.
var ErrNoEndpoint = errors.New("no engine available")

// ErrUnknownPolicy is returned by [NewPolicy] for a name that no policy is
// registered under.
var ErrUnknownPolicy = errors.New("unknown routing policy")

// Request is what a policy may look at: the routing fields parsed once from
// the request body, never the *http.Request.
type Request struct {
	// Model is the requested model name, already known to be served by
	// every candidate.
	Model string
	// Stream is true for a streamed (SSE) request.
	Stream bool
	// SessionKey identifies a conversation for session affinity: the
	// session header's value, else the body's "user" field ("" when the
	// client sent neither).
	SessionKey string
	// PromptBytes is the prompt's size in bytes (a proxy for prefill cost).
	PromptBytes int
	// PrefixHashes are the chained hashes of the prompt's leading
	// fixed-size blocks (see oai.Parser): PrefixHashes[i] identifies the
	// whole prompt up to the end of block i, so two prompts share their
	// first k hashes exactly when they share their first k blocks. Empty
	// when the prompt is shorter than one block or hashing is off.
	PrefixHashes []uint64
}

// Policy picks one endpoint for a request.
//
// candidates holds the healthy endpoints that serve req.Model; it is never
// modified by the policy and may be empty, in which case Pick returns
// [ErrNoEndpoint]. Implementations must be safe for concurrent use and should
// not allocate: Pick runs once per request attempt.
type Policy interface {
	Pick(ctx context.Context, req *Request, candidates []*Endpoint) (*Endpoint, error)
}

// Config selects and tunes the routing policy. It is loaded from the
// `routing` section of the gateway configuration.
type Config struct {
	// Policy is the policy's registered name, for example "round-robin"
	// or "least-loaded".
	Policy string `koanf:"policy"`
	// PrefillWeight is how many decode requests one prefill request counts
	// as in the least-loaded score (an integer >= 1, default 2): prefill is
	// compute-bound and about to become a decode sequence as well.
	PrefillWeight int `koanf:"prefill_weight"`
}

// DefaultConfig returns the defaults: round-robin, prefill weight 2.
func DefaultConfig() Config {
	return Config{Policy: RoundRobinName, PrefillWeight: 2}
}

// Validate reports every problem with c, joined.
func (c Config) Validate() error {
	var errs []error
	if _, ok := factories()[c.Policy]; !ok {
		errs = append(errs, fmt.Errorf("routing.policy: %w %q (known: %s)%s", ErrUnknownPolicy, c.Policy, strings.Join(Names(), ", "), nearestName(c.Policy)))
	}
	if c.PrefillWeight < 1 {
		errs = append(errs, fmt.Errorf("routing.prefill_weight must be >= 1, got %d", c.PrefillWeight))
	}
	return errors.Join(errs...)
}

// nearestName suggests the registered policy name that differs from name
// only in case or punctuation ("LeastLoaded", "least_loaded" for
// least-loaded), or returns "".
func nearestName(name string) string {
	norm := func(s string) string {
		return strings.Map(func(r rune) rune {
			if r == '-' || r == '_' || r == ' ' {
				return -1
			}
			return unicode.ToLower(r)
		}, s)
	}
	for _, n := range Names() {
		if norm(n) == norm(name) {
			return "; did you mean " + n + "?"
		}
	}
	return ""
}

// factory builds a policy from its validated config.
type factory func(Config) Policy

// registerPolicies is the one place built-in policies are registered.
func registerPolicies(r map[string]factory) {
	r[RoundRobinName] = func(Config) Policy { return NewRoundRobin() }
	r[LeastLoadedName] = func(c Config) Policy { return NewLeastLoaded(c.PrefillWeight) }
}

func factories() map[string]factory {
	r := make(map[string]factory)
	registerPolicies(r)
	return r
}

// Names returns the registered policy names, sorted.
func Names() []string {
	r := factories()
	names := make([]string, 0, len(r))
	for n := range r {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// NewPolicy validates cfg and builds the policy it names. Errors wrap
// [ErrUnknownPolicy] or describe the invalid setting.
func NewPolicy(cfg Config) (Policy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return factories()[cfg.Policy](cfg), nil
}
