package routing

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"unicode"

	"golang.org/x/net/http/httpguts"
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

	// known is how many leading PrefixHashes the engine picked last was
	// already recorded for when the pick recorded the rest: what a
	// [Forgetter]'s Forget keeps. Set by the prefix policies' Pick, so a
	// Request belongs to one request and is not shared by concurrent picks.
	known int
}

// Policy picks one endpoint for a request.
//
// candidates holds the healthy endpoints that serve req.Model; it is never
// modified by the policy and may be empty, in which case Pick returns
// [ErrNoEndpoint]. Implementations must be safe for concurrent use and should
// not allocate: Pick runs once per request attempt. Pick may note in req's
// unexported state what a later [Forgetter.Forget] for it needs, so a
// Request is not shared by concurrent picks.
type Policy interface {
	Pick(ctx context.Context, req *Request, candidates []*Endpoint) (*Endpoint, error)
}

// Config selects and tunes the routing policy. It is loaded from the
// `routing` section of the gateway configuration; each policy reads its own
// subsection, and the defaults are [DefaultConfig]'s.
type Config struct {
	// Policy is the policy's registered name: round-robin, least-loaded,
	// power-of-two, session-affinity, prefix-aware or scorer.
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
}

// PowerOfTwoConfig tunes [PowerOfTwo].
type PowerOfTwoConfig struct {
	// Choices is how many distinct random candidates are compared (the d of
	// "power of d choices"), 2..8, default 2: two already gives almost all
	// of the gain over one (Mitzenmacher, 2001), and more makes concurrent
	// picks herd onto the same engine again.
	Choices int `koanf:"choices"`
}

// SessionAffinityConfig tunes [SessionAffinity].
type SessionAffinityConfig struct {
	// Header is the request header carrying the session key, default
	// x-session-id; when it is absent the body's "user" field is the key.
	Header string `koanf:"header"`
	// VirtualNodes is how many points each engine has on the hash ring,
	// 1..10000, default 160 (libketama's 160 points per server): with n
	// engines the sessions an engine owns vary by about 1/sqrt(VirtualNodes)
	// around 1/n (about 8% at 160).
	VirtualNodes int `koanf:"virtual_nodes"`
	// LoadFactor is the ε of the load bound (1+ε)× the average in-flight
	// load, > 0, default 0.25 (HAProxy's hash-balance-factor 125 and SGLang's
	// prefix_hash_load_factor 1.25): small enough that a hot session moves
	// off an engine before it is a quarter above its share, large enough
	// that sessions rarely leave their home engine under even load.
	LoadFactor float64 `koanf:"load_factor"`
	// Fallback is the policy for requests without a session key, default
	// least-loaded; it must not be session-affinity.
	Fallback string `koanf:"fallback"`
}

// PrefixConfig sets how prompts are cut into blocks for prefix-aware and
// scorer, and the size of their [PrefixIndex].
type PrefixConfig struct {
	// BlockBytes is the size of a prompt block in bytes of prompt text,
	// 16..65536, default 64: about 16 tokens, vLLM's default KV block size,
	// and the Gateway API Inference Extension's default block of 64
	// characters.
	BlockBytes int `koanf:"block_bytes"`
	// MaxBlocks caps the blocks hashed per prompt, 1..65536, default 1024
	// (the first 64 KiB of prompt text at the default block size): longer
	// prompts are matched on their first MaxBlocks blocks.
	MaxBlocks int `koanf:"max_blocks"`
	// IndexEntries is the capacity of the index of recently routed
	// (block, engine) pairs, 8..2^28, default 1048576, which takes 16 bytes
	// per entry (16 MiB), allocated at start and never more; it is rounded
	// up to a power of two.
	// The default remembers 32 engines' worth of about 32,000 blocks each,
	// the ~500,000 tokens of KV cache of an 80 GB GPU serving an 8B model
	// (the Inference Extension sizes its per-server LRU the same way).
	IndexEntries int `koanf:"index_entries"`
}

// PrefixAwareConfig tunes [PrefixAware].
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

// ScorerConfig holds the weights of [Scorer]'s scorers, each >= 0 and at
// least one > 0.
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
}

// DefaultConfig returns the defaults: round-robin, prefill weight 2, and
// every policy's documented defaults.
func DefaultConfig() Config {
	return Config{
		Policy:          RoundRobinName,
		PrefillWeight:   2,
		PowerOfTwo:      PowerOfTwoConfig{Choices: 2},
		SessionAffinity: SessionAffinityConfig{Header: "x-session-id", VirtualNodes: 160, LoadFactor: 0.25, Fallback: LeastLoadedName},
		Prefix:          PrefixConfig{BlockBytes: 64, MaxBlocks: 1024, IndexEntries: 1 << 20},
		PrefixAware:     PrefixAwareConfig{CacheThreshold: 0.3, BalanceAbsThreshold: 16, BalanceRelThreshold: 1.5},
		Scorer:          ScorerConfig{Queue: 2, KVCache: 2, Prefix: 3, Prefill: 0, Decode: 0},
	}
}

// Validate reports every problem with c, joined. Every section is checked,
// not only the selected policy's, so a typo is found before it matters.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if _, ok := factories()[c.Policy]; !ok {
		bad("routing.policy: %w %q (known: %s)%s", ErrUnknownPolicy, c.Policy, strings.Join(Names(), ", "), nearestName(c.Policy))
	}
	if c.PrefillWeight < 1 || c.PrefillWeight > 1000 {
		bad("routing.prefill_weight must be 1..1000, got %d", c.PrefillWeight)
	}
	if ch := c.PowerOfTwo.Choices; ch < 2 || ch > maxChoices {
		bad("routing.power_of_two.choices must be 2..%d, got %d", maxChoices, ch)
	}
	sa := c.SessionAffinity
	if !httpguts.ValidHeaderFieldName(sa.Header) {
		bad("routing.session_affinity.header must be a header name (letters, digits and !#$%%&'*+-.^_`|~), got %q", sa.Header)
	}
	if sa.VirtualNodes < 1 || sa.VirtualNodes > 10000 {
		bad("routing.session_affinity.virtual_nodes must be 1..10000, got %d", sa.VirtualNodes)
	}
	if !(sa.LoadFactor > 0 && sa.LoadFactor <= 1000) {
		bad("routing.session_affinity.load_factor must be > 0 and <= 1000, got %v", sa.LoadFactor)
	}
	if sa.Fallback == SessionAffinityName {
		bad("routing.session_affinity.fallback must not be %s itself", SessionAffinityName)
	} else if _, ok := factories()[sa.Fallback]; !ok {
		bad("routing.session_affinity.fallback: %w %q (known: %s)%s", ErrUnknownPolicy, sa.Fallback, strings.Join(Names(), ", "), nearestName(sa.Fallback))
	}
	px := c.Prefix
	if px.BlockBytes < 16 || px.BlockBytes > 65536 {
		bad("routing.prefix.block_bytes must be 16..65536, got %d", px.BlockBytes)
	}
	if px.MaxBlocks < 1 || px.MaxBlocks > 65536 {
		bad("routing.prefix.max_blocks must be 1..65536, got %d", px.MaxBlocks)
	}
	if px.IndexEntries < prefixWays || px.IndexEntries > 1<<28 {
		bad("routing.prefix.index_entries must be %d..%d, got %d", prefixWays, 1<<28, px.IndexEntries)
	}
	pa := c.PrefixAware
	if !(pa.CacheThreshold >= 0 && pa.CacheThreshold < 1) {
		bad("routing.prefix_aware.cache_threshold must be >= 0 and < 1 (the match must exceed it), got %v", pa.CacheThreshold)
	}
	if pa.BalanceAbsThreshold < 0 {
		bad("routing.prefix_aware.balance_abs_threshold must be >= 0, got %d", pa.BalanceAbsThreshold)
	}
	if !(pa.BalanceRelThreshold >= 1) || math.IsInf(pa.BalanceRelThreshold, 0) {
		bad("routing.prefix_aware.balance_rel_threshold must be >= 1, got %v", pa.BalanceRelThreshold)
	}
	sc := c.Scorer
	sum := 0.0
	for _, w := range []struct {
		name string
		v    float64
	}{{"queue", sc.Queue}, {"kv_cache", sc.KVCache}, {"prefix", sc.Prefix}, {"prefill", sc.Prefill}, {"decode", sc.Decode}} {
		if !(w.v >= 0) || math.IsInf(w.v, 0) {
			bad("routing.scorer.%s must be a number >= 0, got %v", w.name, w.v)
			continue
		}
		sum += w.v
	}
	if sum == 0 {
		bad("routing.scorer: at least one weight must be > 0")
	}
	return errors.Join(errs...)
}

// nearestName suggests the registered policy name nearest to name: one that
// differs only in case or punctuation ("LeastLoaded", "least_loaded" for
// least-loaded), else the one within two edits of it ("sesion-affinity"),
// or returns "".
func nearestName(name string) string {
	norm := func(s string) string {
		return strings.Map(func(r rune) rune {
			if r == '-' || r == '_' || r == ' ' {
				return -1
			}
			return unicode.ToLower(r)
		}, s)
	}
	best, bestDist := "", 3
	for _, n := range Names() {
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

// factory builds a policy from its validated config.
type factory func(Config) Policy

// registerPolicies is the one place built-in policies are registered.
func registerPolicies(r map[string]factory) {
	r[RoundRobinName] = func(Config) Policy { return NewRoundRobin() }
	r[LeastLoadedName] = func(c Config) Policy { return NewLeastLoaded(c.PrefillWeight) }
	r[PowerOfTwoName] = func(c Config) Policy { return NewPowerOfChoices(c.PowerOfTwo.Choices, c.PrefillWeight) }
	r[SessionAffinityName] = func(c Config) Policy {
		sa := c.SessionAffinity
		return NewSessionAffinity(sa.VirtualNodes, sa.LoadFactor, factories()[sa.Fallback](c), sa.Header)
	}
	r[PrefixAwareName] = func(c Config) Policy {
		pa := c.PrefixAware
		return NewPrefixAware(NewPrefixIndex(c.Prefix.IndexEntries), pa.CacheThreshold, pa.BalanceAbsThreshold,
			pa.BalanceRelThreshold, c.PrefillWeight).withBlocks(c.Prefix)
	}
	r[ScorerName] = func(c Config) Policy {
		var index *PrefixIndex
		if c.Scorer.Prefix > 0 {
			index = NewPrefixIndex(c.Prefix.IndexEntries)
		}
		return NewScorer(c.Scorer, index).withBlocks(c.Prefix)
	}
}

// PrefixHasher is implemented by policies that route on
// [Request.PrefixHashes]; the gateway asks it how to cut prompts into
// blocks and computes the hashes only for such a policy.
type PrefixHasher interface {
	// PrefixBlocks returns the block size in bytes and the most blocks to
	// hash per prompt.
	PrefixBlocks() (blockBytes, maxBlocks int)
}

// Forgetter is implemented by policies that learn from where they route:
// [PrefixAware] and [Scorer] record a prompt's blocks against the engine
// they pick, as if it had cached them. The gateway calls Forget with the
// request and the engine of an attempt that ended before anything reached
// the client and that it is about to retry elsewhere (or on the same engine,
// which then records the prompt again): the engine that serves the retry
// computes the whole prompt, and the failing or slow one should not tie
// with it for the prompt's next turn. It must be safe for concurrent use
// and must not allocate.
type Forgetter interface {
	// Forget undoes what the Pick that returned e for req recorded: the
	// blocks beyond those e was already known to hold. req must be the
	// Request that Pick was given, before any other Pick with it.
	Forget(req *Request, e *Endpoint)
}

// SessionKeyed is implemented by policies that route on
// [Request.SessionKey]; the gateway reads the key from the header it names
// (else from the body's "user" field).
type SessionKeyed interface {
	// SessionHeader returns the header carrying the session key.
	SessionHeader() string
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
