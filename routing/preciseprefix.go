package routing

// PrecisePrefixName is the config name of the precise prefix policy: a
// [PrefixAware] that measures engines on what they report holding.
const PrecisePrefixName = "precise-prefix"

// DefaultKVBlockSize is the tokens per KV-cache block the gateway cuts
// prompts into for a [KVRouter] when none is configured: vLLM's default
// --block-size on GPUs (vllm/config/cache.py).
const DefaultKVBlockSize = 16

// NewPrecisePrefix returns the precise-prefix policy: [PrefixAware]'s
// choice (same thresholds, load score and approximate index, which it
// keeps recording), with each candidate measured on the blocks its engine
// reported storing in kv (vLLM's KV-cache events) when its events are
// fresh and the request's token keys are known ([Request.TokenKeys], cut
// into blockSize tokens), and on the approximate index otherwise. The
// engine it picks gets speculative entries ([KVIndex.Speculate]) so that a
// burst of same-prefix requests stays together before the engine's events
// arrive, as llm-d's precise prefix-cache scorer and Dynamo's KV router do.
// kv nil: a new, empty index of [DefaultKVIndexConfig] (every engine then
// goes by the approximate index); blockSize <= 0: [DefaultKVBlockSize].
func NewPrecisePrefix(kv *KVIndex, blockSize int, approx *PrefixIndex, cacheThreshold float64, balanceAbs int, balanceRel float64, prefillWeight int) *PrefixAware {
	p := NewPrefixAware(approx, cacheThreshold, balanceAbs, balanceRel, prefillWeight)
	if kv == nil {
		kv = NewKVIndex(DefaultKVIndexConfig())
	}
	if blockSize <= 0 {
		blockSize = DefaultKVBlockSize
	}
	p.m.kv, p.m.blockSize = kv, blockSize
	return p
}

// precisePrefixFactory is the precise-prefix registry entry: prefix-aware's
// section (routing.prefix_aware) and blocks (routing.prefix), and the KV
// index and block size given to [NewPolicy] with [WithKVIndex].
func precisePrefixFactory() factory {
	return factory{
		build: func(c *Config) Policy {
			pa := c.PrefixAware
			return NewPrecisePrefix(c.kv, c.kvBlockSize, NewPrefixIndex(c.Prefix.IndexEntries), pa.CacheThreshold,
				pa.BalanceAbsThreshold, pa.BalanceRelThreshold, c.PrefillWeight).withBlocks(c.Prefix)
		},
	}
}

// KVBlockSize returns the tokens per block of [Request.TokenKeys] for the
// precise-prefix policy, 0 for prefix-aware (which does not use them).
func (p *PrefixAware) KVBlockSize() int {
	if p.m.kv == nil {
		return 0
	}
	return p.m.blockSize
}

// PolicyOption configures [NewPolicy].
type PolicyOption func(*Config)

// WithKVIndex gives the policies that route on the engines' KV-cache
// events (precise-prefix; scorer with precise_prefix) the gateway's index
// and the block size, in tokens, their requests' token keys are cut into
// (<= 0: [DefaultKVBlockSize]). The index outlives policies: a reload that
// builds a new policy passes the same one. A nil index is ignored.
func WithKVIndex(x *KVIndex, blockSize int) PolicyOption {
	return func(c *Config) {
		if x != nil {
			c.kv, c.kvBlockSize = x, blockSize
		}
	}
}
