package enginesim

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"
)

// Defaults applied by [New] to zero-valued [Config] fields.
const (
	// DefaultName is the engine name used when Config.Name is empty.
	DefaultName = "enginesim"
	// DefaultModel is the served model name used when Config.Models is empty.
	DefaultModel = "sim-model"
	// DefaultTTFT is the base time to first token (prefill time).
	DefaultTTFT = 20 * time.Millisecond
	// DefaultITL is the inter-token latency (one decode step).
	DefaultITL = 10 * time.Millisecond
	// DefaultOutputTokens is the number of tokens generated when a request sets no max_tokens.
	DefaultOutputTokens = 16
	// DefaultMaxOutputTokens is the cap applied to a request's max_tokens, in tokens.
	DefaultMaxOutputTokens = 4096
	// DefaultMaxNumSeqs is the number of sequences that may run at once (vLLM max_num_seqs).
	DefaultMaxNumSeqs = 256
	// DefaultKVCacheBlocks is the simulated KV cache capacity, in blocks.
	DefaultKVCacheBlocks = 1024
	// DefaultBlockSize is the number of tokens per KV cache block (vLLM's default).
	DefaultBlockSize = 16
	// DefaultEmbeddingDim is the length of embedding vectors, in float elements.
	DefaultEmbeddingDim = 16
	// DefaultMaxModelLen is the default context length (vLLM's max_model_len), in tokens.
	DefaultMaxModelLen = 8192
	// DefaultKVLeaseDuration is how long a prefill engine holds a prompt's KV blocks for the
	// decode engine to pull them: vLLM's NixlConnector kv_lease_duration (30 s).
	DefaultKVLeaseDuration = 30 * time.Second
	// DefaultMaxNumBatchedTokens is the token budget of one engine step under
	// Config.PrefillInterference: vLLM's max_num_batched_tokens default for the OpenAI API
	// server (vllm/engine/arg_utils.py, EngineArgs' batch defaults: 2048 with
	// UsageContext.OPENAI_API_SERVER, 8192 on GPUs of 70 GiB or more other than the A100).
	DefaultMaxNumBatchedTokens = 2048
)

// KV load failure policies (vLLM's kv_transfer_config kv_load_failure_policy).
const (
	// KVLoadFail fails a decode request whose KV could not be loaded (vLLM's default).
	KVLoadFail = "fail"
	// KVLoadRecompute makes the decode engine compute the prompt itself instead.
	KVLoadRecompute = "recompute"

	// The values of Config.KVRole: vLLM's kv_role.
	KVRoleBoth     = "kv_both"
	KVRoleProducer = "kv_producer"
	KVRoleConsumer = "kv_consumer"
)

// Config configures one simulated engine. Zero values get the documented defaults; negative
// values are rejected by [Config.Validate].
type Config struct {
	// Name is the engine name used in logs. Default [DefaultName].
	Name string
	// Models lists the served model names; the first one is also the model used when a request
	// names none. Default [DefaultModel].
	Models []string
	// TTFT is the base time to first token (prefill), before any per-token cost. Default
	// [DefaultTTFT]; since zero selects the default, use 1ns for an (almost) instant prefill.
	TTFT time.Duration
	// TTFTPerPromptToken is added to TTFT for every prompt token not found in the prefix cache.
	// Default 0.
	TTFTPerPromptToken time.Duration
	// TTFTPerRunning is added to the time to first token for every other sequence running on
	// the engine (all models) when the sequence's prefill starts, modelling prefill contention.
	// Default 0 (off): the time to first token does not depend on load.
	TTFTPerRunning time.Duration
	// ITL is the inter-token latency: the time between two generated tokens (one decode step).
	// Default [DefaultITL]; use 1ns for (almost) none.
	ITL time.Duration
	// ITLPerRunning is added to every token's ITL for every other sequence running on the
	// engine (all models), read again before each token, modelling decode batch contention:
	// itl = ITL + ITLPerRunning*(running-1). Default 0 (off): the ITL does not depend on load.
	ITLPerRunning time.Duration
	// PrefillInterference turns on the model of continuous batching with chunked prefill
	// (see Prefill interference in the package documentation): a prompt's uncached tokens
	// are prefilled in chunks of at most the step's token budget (MaxNumBatchedTokens) left
	// after one token per decoding sequence, and each decode step of the other running
	// sequences is stretched by the compute of the chunk in that step (its tokens times
	// TTFTPerPromptToken). Default false: a sequence's ITL does not depend on others'
	// prefills.
	PrefillInterference bool
	// MaxNumBatchedTokens is the token budget of one engine step (vLLM's
	// max_num_batched_tokens), used by PrefillInterference. It must be at least MaxNumSeqs
	// when PrefillInterference is on, as vLLM requires. Default
	// [DefaultMaxNumBatchedTokens].
	MaxNumBatchedTokens int
	// OutputTokens is the number of tokens generated when the request sets no max_tokens; such
	// requests finish with finish_reason "stop". Default [DefaultOutputTokens].
	OutputTokens int
	// MaxOutputTokens caps a request's max_tokens / max_completion_tokens, in tokens. Default
	// [DefaultMaxOutputTokens].
	MaxOutputTokens int
	// MaxModelLen is every served model's context length (vLLM's --max-model-len), in
	// tokens: /v1/models and /tokenize report it, and a request whose prompt plus
	// max_tokens exceeds it is rejected with vLLM's 400 (see the package documentation).
	// Default [DefaultMaxModelLen].
	MaxModelLen int
	// MaxNumSeqs is the maximum number of sequences running at once (vLLM max_num_seqs); further
	// requests wait in a FIFO queue. Default [DefaultMaxNumSeqs].
	MaxNumSeqs int
	// KVCacheBlocks is the simulated KV cache capacity in blocks. It bounds the prefix cache
	// (LRU) and is the denominator of vllm:kv_cache_usage_perc. Default [DefaultKVCacheBlocks].
	KVCacheBlocks int
	// BlockSize is the number of tokens per KV cache block. Default [DefaultBlockSize].
	BlockSize int
	// EmbeddingDim is the length of the vectors returned by /v1/embeddings. Default
	// [DefaultEmbeddingDim].
	EmbeddingDim int
	// Fault is the fault spec applied to requests that carry no X-Enginesim-Fault header, in
	// the same syntax as the header (see the package documentation). Default "" (no fault).
	Fault string
	// LoRAs lists the LoRA adapters loaded at start, as vLLM's --lora-modules does; more can
	// be loaded and unloaded at run time (POST /v1/load_lora_adapter, /v1/unload_lora_adapter).
	// Default none.
	LoRAs []LoRA
	// KVRole is the engine's kv_role in vLLM's --kv-transfer-config (KVTransferConfig,
	// vllm/config/kv_transfer.py): KVRoleBoth (the default, what the NixlConnector examples
	// run every engine with: either leg), KVRoleProducer (it only produces: a decode leg's
	// do_remote_prefill is not acted on, so the prompt is computed here as for a plain
	// request, and nothing is pulled) or KVRoleConsumer (it only consumes: a prefill leg's
	// do_remote_decode is not acted on, so the answer carries no kv_transfer_params and
	// nothing is held).
	KVRole string
	// PromptTokensDetails is vLLM's --enable-prompt-tokens-details: chat and completions
	// usage then carries prompt_tokens_details {"cached_tokens": n} whenever n, the prompt
	// tokens found in the prefix cache, is not 0. Default false (a decode leg that pulled its
	// KV reports its cached tokens either way).
	PromptTokensDetails bool
	// KVEngineID is the engine's id in the KV transfer params it returns
	// (remote_engine_id) and checks on a pull, as vLLM's NixlConnector engine_id. Default a
	// random id, new for every [New].
	KVEngineID string
	// KVSideChannelHost and KVSideChannelPort are where decode engines pull this engine's
	// KV from (remote_host and remote_port in the params it returns; vLLM's
	// VLLM_NIXL_SIDE_CHANNEL_HOST and _PORT). The simulator's side channel is its own
	// HTTP listener (POST /sim/kv/pull). Default the local address of the connection the
	// prefill request arrived on, which is the listener's address.
	KVSideChannelHost string
	KVSideChannelPort int
	// KVLeaseDuration is how long a prefill engine holds a prompt's KV blocks after
	// answering, for the decode engine to pull them (vLLM's kv_lease_duration). Default
	// [DefaultKVLeaseDuration].
	KVLeaseDuration time.Duration
	// KVTransferPerToken is a decode engine's time to pull one prompt token's KV from the
	// prefill engine, waited in place of the prefill compute. Default 0.
	KVTransferPerToken time.Duration
	// KVLoadFailurePolicy is what a decode engine does when its KV transfer params are
	// invalid or the pull fails: [KVLoadFail] (the request fails, vLLM's default) or
	// [KVLoadRecompute] (it computes the prompt itself). Default [KVLoadFail].
	KVLoadFailurePolicy string
	// KVEvents turns on KV-cache events (see KV-cache events in the package documentation):
	// the ZMQ endpoint the engine's PUB socket binds, "tcp://host:port" (host "*" for every
	// interface; port 0 picks a free port, see [Engine.KVEventsAddr]) or "ipc://path". It is
	// vLLM's --kv-events-config endpoint, except that the simulator always binds (vLLM
	// connects to an endpoint without "*", "::" or ipc://). An engine with KV events owns
	// goroutines: stop them with [Engine.Close]. Default "": off.
	KVEvents string
	// KVEventsReplay is the endpoint of the ROUTER socket that replays buffered batches
	// (vLLM's replay_endpoint), in the syntax of KVEvents; see [Engine.KVReplayAddr]. It
	// needs KVEvents. Default "": no replay socket.
	KVEventsReplay string
	// KVEventsEncoding is how events are written: [KVEventsEncodingMap] (maps, vLLM since
	// PR #42892, the default) or [KVEventsEncodingArray] (positional arrays, vLLM before).
	// The KV-events defaults are applied only when KVEvents is set.
	KVEventsEncoding string
	// KVEventsTopic is the first frame of every PUB message (vLLM's topic). Default "".
	KVEventsTopic string
	// KVEventsBuffer is the number of published batches kept for replay (vLLM's
	// buffer_steps). Default [DefaultKVEventsBuffer].
	KVEventsBuffer int
	// KVEventsQueue is the number of batches that may wait for the publisher goroutine
	// (vLLM's max_queue_size). When it is full a new batch is dropped and counted
	// ([KVEventsStats].QueueDrops): its sequence number is skipped, so subscribers see a
	// gap, and it is not in the replay buffer. vLLM's queue blocks the scheduler instead;
	// the simulator's never blocks a request. At most 1<<20 (the queue is allocated whole).
	// Default [DefaultKVEventsQueue].
	KVEventsQueue int
	// KVEventsDrop is the KV-events drop fault at start: "N" or "N-M" (inclusive), the
	// sequence numbers of batches that are not sent on PUB but kept for replay, as a PUB
	// high-water-mark drop behaves. POST /admin/kv-events/drop replaces it while the engine
	// runs ([Engine.SetKVEventsDrop]). Default "": none.
	KVEventsDrop string
	// TracerProvider, when set, makes the engine emit one SERVER span per request on the
	// text generation routes (POST /v1/chat/completions, /v1/completions, /v1/responses,
	// /v1/messages), as vLLM does with --otlp-traces-endpoint: vLLM's "llm_request" span
	// ([SpanName]), parented on the request's W3C traceparent, with vLLM's attributes
	// (gen_ai.request.id, gen_ai.request.max_tokens / temperature / top_p / n,
	// gen_ai.response.model, gen_ai.response.finish_reasons, gen_ai.usage.prompt_tokens /
	// completion_tokens, gen_ai.latency.*). Like vLLM, it starts the span at the request's
	// arrival and ends it when the request is over; requests rejected with a 4xx get none.
	//
	// A request whose client disconnects first gets finish_reasons ["abort"], an "exception"
	// event (context canceled) and status Error "request aborted: the client disconnected";
	// one cut by a fault (close-*, truncate) or answered 5xx gets status Error too.
	//
	// The span is built from outside the simulator's internals (the request body and the
	// response as it is written), so: time_to_first_token and the prefill / decode /
	// inference times are set on streams only (a non-stream body arrives whole);
	// time_in_queue is 0 when a running slot was free at arrival, else time_to_first_token
	// minus Config.TTFT (an upper bound), and absent on a queued non-stream request.
	//
	// Default nil: no spans, and the handler is not wrapped.
	TracerProvider trace.TracerProvider
	// Provider turns the engine into a hosted provider (OpenAI, Azure OpenAI or Anthropic)
	// as a gateway sees one: keys, provider model names, Azure's paths and rate limits (see
	// Hosted providers in the package documentation). Default off.
	Provider ProviderConfig
}

// LoRA is a LoRA adapter served on top of a base model. Requests naming the adapter run on
// the base model (its scheduler, prefix cache and metrics series) and echo the adapter's
// name; /v1/models lists it with the base model as its parent.
type LoRA struct {
	// Name is the adapter's model name in requests and in /v1/models.
	Name string
	// Path is where the adapter was loaded from; /v1/models reports it as the card's root.
	Path string
	// Base is the served model the adapter belongs to. Default the first of Config.Models.
	Base string
}

// Validate reports every problem in c, joined with [errors.Join]; nil means c is usable. Zero
// values are valid (they select defaults).
func (c Config) Validate() error {
	var errs []error
	durations := []struct {
		name string
		v    time.Duration
	}{
		{"ttft", c.TTFT},
		{"ttft per prompt token", c.TTFTPerPromptToken},
		{"ttft per running", c.TTFTPerRunning},
		{"itl", c.ITL},
		{"itl per running", c.ITLPerRunning},
		{"kv lease duration", c.KVLeaseDuration},
		{"kv transfer per token", c.KVTransferPerToken},
	}
	for _, d := range durations {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("enginesim: %s must not be negative, got %v", d.name, d.v))
		}
	}
	counts := []struct {
		name string
		v    int
	}{
		{"output tokens", c.OutputTokens},
		{"max output tokens", c.MaxOutputTokens},
		{"max model len", c.MaxModelLen},
		{"max num seqs", c.MaxNumSeqs},
		{"kv cache blocks", c.KVCacheBlocks},
		{"block size", c.BlockSize},
		{"embedding dim", c.EmbeddingDim},
		{"kv events buffer", c.KVEventsBuffer},
		{"kv events queue", c.KVEventsQueue},
	}
	for _, n := range counts {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("enginesim: %s must not be negative, got %d", n.name, n.v))
		}
	}
	seen := make(map[string]bool, len(c.Models))
	for i, m := range c.Models {
		switch {
		case m == "":
			errs = append(errs, fmt.Errorf("enginesim: model %d has an empty name", i))
		case seen[m]:
			errs = append(errs, fmt.Errorf("enginesim: model %q listed twice", m))
		}
		seen[m] = true
	}
	if c.KVSideChannelPort < 0 || c.KVSideChannelPort > 65535 {
		errs = append(errs, fmt.Errorf("enginesim: kv side channel port must be 0..65535, got %d", c.KVSideChannelPort))
	}
	if c.MaxNumBatchedTokens < 0 {
		errs = append(errs, fmt.Errorf("enginesim: max num batched tokens must not be negative, got %d", c.MaxNumBatchedTokens))
	} else if budget, seqs := cmp.Or(c.MaxNumBatchedTokens, DefaultMaxNumBatchedTokens), cmp.Or(c.MaxNumSeqs, DefaultMaxNumSeqs); c.PrefillInterference && budget < seqs {
		// vLLM's SchedulerConfig refuses a step budget below max_num_seqs.
		errs = append(errs, fmt.Errorf("enginesim: max num batched tokens (%d) must be greater than or equal to max num seqs (%d)", budget, seqs))
	}
	switch c.KVRole {
	case "", KVRoleBoth, KVRoleProducer, KVRoleConsumer:
	default:
		errs = append(errs, fmt.Errorf("enginesim: kv role must be %q, %q or %q, got %q", KVRoleBoth, KVRoleProducer, KVRoleConsumer, c.KVRole))
	}
	switch c.KVLoadFailurePolicy {
	case "", KVLoadFail, KVLoadRecompute:
	default:
		errs = append(errs, fmt.Errorf("enginesim: kv load failure policy must be %q or %q, got %q",
			KVLoadFail, KVLoadRecompute, c.KVLoadFailurePolicy))
	}
	errs = append(errs, c.validateKVEvents()...)
	errs = append(errs, c.validateLoRAs(seen)...)
	if len(c.Models) == 0 {
		errs = append(errs, c.Provider.validate(map[string]bool{DefaultModel: true})...)
	} else {
		errs = append(errs, c.Provider.validate(seen)...)
	}
	if _, err := parseFaults(c.Fault); err != nil {
		errs = append(errs, fmt.Errorf("enginesim: default fault: %w", err))
	}
	return errors.Join(errs...)
}

// validateKVEvents checks the KV-events settings (not whether the endpoints can be bound:
// [New] reports that).
func (c Config) validateKVEvents() []error {
	var errs []error
	for _, ep := range []struct{ name, v string }{{"kv events endpoint", c.KVEvents}, {"kv events replay endpoint", c.KVEventsReplay}} {
		if ep.v == "" {
			continue
		}
		scheme, rest, _ := strings.Cut(ep.v, "://")
		switch scheme {
		case "tcp":
			if _, port, err := net.SplitHostPort(rest); err != nil {
				errs = append(errs, fmt.Errorf("enginesim: %s %q: %w", ep.name, ep.v, err))
			} else if _, err := strconv.ParseUint(port, 10, 16); err != nil && port != "*" {
				errs = append(errs, fmt.Errorf("enginesim: %s %q: bad port %q", ep.name, ep.v, port))
			}
		case "ipc":
			if rest == "" {
				errs = append(errs, fmt.Errorf("enginesim: %s %q: empty path", ep.name, ep.v))
			}
		default:
			errs = append(errs, fmt.Errorf("enginesim: %s %q: want tcp://host:port or ipc://path", ep.name, ep.v))
		}
	}
	if c.KVEventsReplay != "" && c.KVEvents == "" {
		errs = append(errs, errors.New("enginesim: kv events replay endpoint needs a kv events endpoint"))
	}
	switch c.KVEventsEncoding {
	case "", KVEventsEncodingMap, KVEventsEncodingArray:
	default:
		errs = append(errs, fmt.Errorf("enginesim: kv events encoding must be %q or %q, got %q",
			KVEventsEncodingMap, KVEventsEncodingArray, c.KVEventsEncoding))
	}
	if c.KVEventsQueue > maxKVEventsQueue {
		errs = append(errs, fmt.Errorf("enginesim: kv events queue must be at most %d, got %d", maxKVEventsQueue, c.KVEventsQueue))
	}
	if _, err := parseKVDrop(c.KVEventsDrop); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// validateLoRAs checks c.LoRAs against each other and the served models (models, or the
// default model when c.Models is empty).
func (c Config) validateLoRAs(models map[string]bool) []error {
	if len(c.Models) == 0 {
		models = map[string]bool{DefaultModel: true}
	}
	var errs []error
	seen := make(map[string]bool, len(c.LoRAs))
	for i, l := range c.LoRAs {
		switch {
		case l.Name == "":
			errs = append(errs, fmt.Errorf("enginesim: lora %d has an empty name", i))
		case seen[l.Name]:
			errs = append(errs, fmt.Errorf("enginesim: lora %q listed twice", l.Name))
		case models[l.Name]:
			errs = append(errs, fmt.Errorf("enginesim: lora %q has the name of a served model", l.Name))
		}
		seen[l.Name] = true
		if l.Path == "" {
			errs = append(errs, fmt.Errorf("enginesim: lora %q has an empty path", l.Name))
		}
		if l.Base != "" && !models[l.Base] {
			errs = append(errs, fmt.Errorf("enginesim: lora %q: base model %q is not served", l.Name, l.Base))
		}
	}
	if len(c.LoRAs) > maxLoRAs {
		errs = append(errs, fmt.Errorf("enginesim: %d loras, at most %d", len(c.LoRAs), maxLoRAs))
	}
	return errs
}

// withDefaults returns c with every zero field replaced by its default.
func (c Config) withDefaults() Config {
	c.Name = cmp.Or(c.Name, DefaultName)
	if len(c.Models) == 0 {
		c.Models = []string{DefaultModel}
	} else {
		c.Models = append([]string(nil), c.Models...)
	}
	c.TTFT = cmp.Or(c.TTFT, DefaultTTFT)
	c.ITL = cmp.Or(c.ITL, DefaultITL)
	c.OutputTokens = cmp.Or(c.OutputTokens, DefaultOutputTokens)
	c.MaxOutputTokens = cmp.Or(c.MaxOutputTokens, DefaultMaxOutputTokens)
	c.MaxModelLen = cmp.Or(c.MaxModelLen, DefaultMaxModelLen)
	c.MaxNumSeqs = cmp.Or(c.MaxNumSeqs, DefaultMaxNumSeqs)
	c.KVCacheBlocks = cmp.Or(c.KVCacheBlocks, DefaultKVCacheBlocks)
	c.BlockSize = cmp.Or(c.BlockSize, DefaultBlockSize)
	c.EmbeddingDim = cmp.Or(c.EmbeddingDim, DefaultEmbeddingDim)
	c.KVEngineID = cmp.Or(c.KVEngineID, uuid.NewString()) // vLLM's default engine_id is a uuid4 too
	c.KVLeaseDuration = cmp.Or(c.KVLeaseDuration, DefaultKVLeaseDuration)
	c.MaxNumBatchedTokens = cmp.Or(c.MaxNumBatchedTokens, DefaultMaxNumBatchedTokens)
	c.KVLoadFailurePolicy = cmp.Or(c.KVLoadFailurePolicy, KVLoadFail)
	if c.KVEvents != "" {
		c.KVEventsEncoding = cmp.Or(c.KVEventsEncoding, KVEventsEncodingMap)
		c.KVEventsBuffer = cmp.Or(c.KVEventsBuffer, DefaultKVEventsBuffer)
		c.KVEventsQueue = cmp.Or(c.KVEventsQueue, DefaultKVEventsQueue)
	}
	c.Provider.Models = maps.Clone(c.Provider.Models)
	if c.LoRAs != nil {
		c.LoRAs = append([]LoRA(nil), c.LoRAs...)
		for i := range c.LoRAs {
			c.LoRAs[i].Base = cmp.Or(c.LoRAs[i].Base, c.Models[0])
		}
	}
	return c
}
