package gateway

import (
	"errors"
	"fmt"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/routing"
)

// KVEventsConfig is the top-level kv_events section: the subscriptions to
// the engines' KV-cache events (vLLM's --kv-events-config), the precise
// prefix index built from them, and the tokenization of requests that
// routing on it needs. An engine is subscribed when it has a kv_events
// endpoint (engines[].kv_events, or the named port of its EndpointSlice
// under Kubernetes discovery); the index is used by routing.policy
// precise-prefix and by the scorer with routing.scorer.precise_prefix.
// See docs/kv-events.md.
type KVEventsConfig struct {
	// BlockSize is the engines' KV-cache block size in tokens (vLLM's
	// --block-size), 1..1024, default 16: requests' token keys are cut
	// into blocks of this size, so it must be the engines'; an engine
	// whose events carry another size is logged.
	BlockSize int `koanf:"block_size"`
	// Topic is the subscription's topic prefix, default "" (every topic;
	// vLLM's own default topic is "").
	Topic string `koanf:"topic"`
	// StaleAfter is how long an engine that was sent new blocks may
	// publish nothing before its index is stale and it is routed on the
	// approximate index, with a log line and
	// switchboard.kv_index.fallbacks, until its events resume. Default
	// 10 s; at least 100 ms.
	StaleAfter time.Duration `koanf:"stale_after"`
	// ReplayTimeout bounds one exchange with an engine's replay socket
	// (engines[].kv_events_replay). Default 2 s.
	ReplayTimeout time.Duration `koanf:"replay_timeout"`
	// Index bounds the precise index.
	Index KVIndexConfig `koanf:"index"`
	// Tokenize is how requests are tokenized for the precise index.
	Tokenize TokenizeConfig `koanf:"tokenize"`
}

// KVIndexConfig bounds the precise prefix index (kv_events.index).
type KVIndexConfig struct {
	// MaxBlocks is the most blocks the index holds per engine, beyond
	// which it forgets the engine's least recently stored ones. Default
	// 262144 (4 M tokens at 16 tokens a block: several times an 80 GB
	// GPU's KV cache, plus a CPU offload tier).
	MaxBlocks int `koanf:"max_blocks"`
	// SpeculativeTTL is how long the blocks of a prompt just routed to an
	// engine count as held there before its events confirm them. Default
	// 2 s (llm-d's and vllm-project/router's default); 0 turns it off.
	SpeculativeTTL time.Duration `koanf:"speculative_ttl"`
	// SpeculativeEntries is the capacity of the speculative entries'
	// table, shared by the engines. Default 65536.
	SpeculativeEntries int `koanf:"speculative_entries"`
}

// TokenizeConfig sets how requests are tokenized for the precise index
// (kv_events.tokenize): by the engines' own /tokenize, through a cache.
type TokenizeConfig struct {
	// MaxWait is the longest a request waits for its prompt's
	// tokenization when its cache misses; after it, the request is routed
	// on the approximate index and the tokens arrive for the next request
	// with the same prompt. Default 2 ms; 0 never waits.
	MaxWait time.Duration `koanf:"max_wait"`
	// Timeout bounds one /tokenize call. Default 2 s.
	Timeout time.Duration `koanf:"timeout"`
	// Concurrency is the most /tokenize calls in flight; a prompt that
	// finds them all busy is not tokenized. Default 8.
	Concurrency int `koanf:"concurrency"`
	// CacheBlocks bounds the token cache, in token blocks held: each
	// cached prompt takes its blocks' keys (8 bytes each) and one entry
	// per 64 bytes of its text. Default 1048576 (about 40 MiB).
	CacheBlocks int `koanf:"cache_blocks"`
}

// DefaultKVEventsConfig returns the defaults documented on
// [KVEventsConfig].
func DefaultKVEventsConfig() KVEventsConfig {
	return KVEventsConfig{
		BlockSize:     routing.DefaultKVBlockSize,
		StaleAfter:    10 * time.Second,
		ReplayTimeout: 2 * time.Second,
		Index:         KVIndexConfig{MaxBlocks: 262144, SpeculativeTTL: 2 * time.Second, SpeculativeEntries: 65536},
		Tokenize:      TokenizeConfig{MaxWait: 2 * time.Millisecond, Timeout: 2 * time.Second, Concurrency: 8, CacheBlocks: 1 << 20},
	}
}

// Validate reports every problem with c, joined; each wraps
// [ErrInvalidConfig] and starts with its key.
func (c KVEventsConfig) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if c.BlockSize < 1 || c.BlockSize > 1024 {
		bad("kv_events.block_size must be 1..1024, got %d", c.BlockSize)
	}
	if c.StaleAfter < 100*time.Millisecond {
		bad("kv_events.stale_after must be at least 100ms, got %s", c.StaleAfter)
	}
	if c.ReplayTimeout <= 0 {
		bad("kv_events.replay_timeout must be > 0, got %s", c.ReplayTimeout)
	}
	if err := c.IndexConfig().Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidConfig, err))
	}
	t := c.Tokenize
	if t.MaxWait < 0 || t.MaxWait > time.Second {
		bad("kv_events.tokenize.max_wait must be 0..1s, got %s", t.MaxWait)
	}
	if t.Timeout <= 0 {
		bad("kv_events.tokenize.timeout must be > 0, got %s", t.Timeout)
	}
	if t.Concurrency < 1 || t.Concurrency > 1024 {
		bad("kv_events.tokenize.concurrency must be 1..1024, got %d", t.Concurrency)
	}
	if t.CacheBlocks < 1024 || t.CacheBlocks > 1<<28 {
		bad("kv_events.tokenize.cache_blocks must be 1024..%d, got %d", 1<<28, t.CacheBlocks)
	}
	return errors.Join(errs...)
}

// IndexConfig returns the routing.KVIndexConfig of c, for
// routing.NewKVIndex.
func (c KVEventsConfig) IndexConfig() routing.KVIndexConfig {
	return routing.KVIndexConfig{MaxBlocks: c.Index.MaxBlocks, SpeculativeTTL: c.Index.SpeculativeTTL,
		StaleAfter: c.StaleAfter, SpeculativeEntries: c.Index.SpeculativeEntries}
}

// fleetConfig returns the fleet's subscription settings of c.
func (c KVEventsConfig) fleetConfig() fleet.KVEventsConfig {
	return fleet.KVEventsConfig{Topic: c.Topic, ReplayTimeout: c.ReplayTimeout, BlockSize: c.BlockSize}
}

// kvIndexStatus is the precise prefix index as GET /admin/engines shows
// it (each engine's own part is under its kv_events).
type kvIndexStatus struct {
	Engines     int   `json:"engines"`     // engines with an index
	Stale       int   `json:"stale"`       // of them, routed on the approximate index
	Blocks      int   `json:"blocks"`      // blocks held, all engines
	Speculative int   `json:"speculative"` // speculative entries live
	Bytes       int64 `json:"bytes"`       // memory of the index
	// TokenCache is the request tokens' cache.
	TokenCache tokenCacheStatus `json:"token_cache"`
}

// tokenCacheStatus is the tokenizer's cache as /admin/engines shows it.
type tokenCacheStatus struct {
	Prompts int `json:"prompts"` // prompts cached
	Blocks  int `json:"blocks"`  // blocks held (keys plus text hashes), against kv_events.tokenize.cache_blocks
}

// kvIndexStatus returns the index's status, nil without one.
func (s *Server) kvIndexStatus() *kvIndexStatus {
	x := s.fleet.KVIndex()
	if x == nil {
		return nil
	}
	st := x.Stats()
	out := &kvIndexStatus{Engines: st.Engines, Stale: st.Stale, Blocks: st.Blocks, Speculative: st.Speculative, Bytes: st.Bytes}
	if t := s.tok; t != nil {
		t.mu.Lock()
		out.TokenCache = tokenCacheStatus{Prompts: t.lru.Len(), Blocks: t.held}
		t.mu.Unlock()
	}
	return out
}
