package gateway

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/routing"
)

// Config is the gateway's operator configuration (the `server` and
// `engines` sections of the YAML file). Build it from defaults with
// [DefaultConfig], then override; [New] validates it.
type Config struct {
	// MaxBodyBytes caps a request body, in bytes. Larger bodies get 413.
	// Default 16 MiB. The buffer holding a body grows with the bytes that
	// arrive, never with the Content-Length the client declares.
	MaxBodyBytes int64 `koanf:"max_body_bytes"`
	// MaxFormBytes caps a multipart/form-data request body (audio uploads
	// to /v1/audio/transcriptions and /v1/audio/translations), in bytes.
	// Larger bodies get 413. Default 32 MiB (OpenAI takes files up to
	// 25 MB). Must be at most MaxBufferedBytes.
	MaxFormBytes int64 `koanf:"max_form_bytes"`
	// BodyReadTimeout bounds reading a whole request body, from the moment
	// the handler starts reading it. A client that trickles or stalls its
	// body gets 408 and its connection is closed. Default 60 s; 0 disables.
	BodyReadTimeout time.Duration `koanf:"body_read_timeout"`
	// MaxConcurrentRequests caps the proxied requests (every route that may
	// reach an engine) handled at once, across all clients. Over it a
	// request is answered 503 with Retry-After before its body is read and
	// without contacting an engine. Default 10000; 0 = no limit.
	MaxConcurrentRequests int `koanf:"max_concurrent_requests"`
	// MaxBufferedBytes caps the bytes held at once in request bodies and
	// buffered non-streaming responses, across all requests. A request
	// whose body would take the total over it is answered 503 with
	// Retry-After, without contacting an engine; a response that does not
	// fit is relayed unbuffered instead (see MaxResponseBufferBytes).
	// Default 512 MiB; 0 = no limit. Must be at least MaxBodyBytes.
	MaxBufferedBytes int64 `koanf:"max_buffered_bytes"`
	// MaxResponseBufferBytes is how much of a non-streaming engine response
	// is buffered before anything is sent to the client, so that an engine
	// failing before the end of its body gets a clean 502 instead of a 200
	// with a cut body. A larger body is relayed as it arrives, and a failure
	// then aborts the client connection. Default 4 MiB; 0 = never buffer.
	MaxResponseBufferBytes int64 `koanf:"max_response_buffer_bytes"`
	// StripRequestHeaders are client request headers never forwarded to an
	// engine, in addition to the built-in list (Authorization,
	// Proxy-Authorization, Cookie, X-Api-Key, Api-Key, OpenAI-Organization,
	// OpenAI-Project, hop-by-hop headers). Case-insensitive.
	StripRequestHeaders []string `koanf:"strip_request_headers"`
	// TrustedProxies are the CIDRs (or single IPs) of proxies in front of
	// the gateway whose X-Forwarded-For, X-Forwarded-Proto and
	// X-Forwarded-Host are believed: a request from one of them has its
	// X-Forwarded-For extended with the peer address; a request from any
	// other peer has them replaced. Empty (the default): trust no one.
	TrustedProxies []string `koanf:"trusted_proxies"`
	// MaxAttempts is how many engines a request may be tried on when the
	// connection to an engine fails before anything was sent (1 = no
	// retry). Default 2. Requests are never retried after an engine has
	// received them, nor after the first byte reached the client; only the
	// sticky Responses routes ask every engine in turn for a stored
	// response.
	MaxAttempts int `koanf:"max_attempts"`
	// Retry says which failures before the first byte reaches the client
	// go to another engine, within which budgets (RetryConfig).
	Retry RetryConfig `koanf:"retry"`
	// Migration is the top-level `migration` section (the loader fills
	// it in): the continuation of generations broken after their first
	// tokens reached the client (MigrationConfig).
	Migration MigrationConfig `koanf:"-"`
	// Disaggregation is the top-level `disaggregation` section (the
	// loader fills it): prefill/decode disaggregation
	// (DisaggregationConfig).
	Disaggregation DisaggregationConfig `koanf:"-"`
	// KVEvents is the top-level `kv_events` section (set by the
	// configuration loader, like Migration): KV-cache event subscriptions,
	// the precise index's bounds and request tokenization.
	KVEvents KVEventsConfig `koanf:"-"`
	// Pricing is the top-level `pricing` list: what an exchange costs
	// on an engine, from its usage (PriceConfig). Reloadable.
	Pricing []PriceConfig `koanf:"-"`
	// AdminAuth is `admin.auth` (the loader fills it in): the admin
	// listener's tokens; a reload reads them again.
	AdminAuth AdminAuthConfig `koanf:"-"`
	// MaxPendingPerModel caps, per model, the generative requests (chat,
	// completions, Responses, Messages, ...) in flight with no first token
	// yet: queued or prefilling in an engine. A non-streaming request shows
	// no first token, so it counts until it ends (observed, with
	// ObserveNonStreaming or because it may be continued, until its first
	// token like a stream); embeddings and the other
	// pooling and light routes are not counted. Over it a request for that
	// model is answered 503 with Retry-After at once, without contacting
	// an engine, rather than queued without bound. Requests admitted in
	// the same instant may pass it by a few. 0 (the default) = no limit.
	MaxPendingPerModel int `koanf:"max_pending_per_model"`
	// Timeouts bound each phase of an engine attempt.
	Timeouts Timeouts `koanf:"timeouts"`
	// Health configures active health checks and model discovery.
	Health fleet.HealthConfig `koanf:"health"`
	// Outlier configures outlier detection: engines failing traffic are
	// ejected for a while (routing.OutlierConfig).
	Outlier routing.OutlierConfig `koanf:"outlier"`
	// EngineStats configures the scraping of each engine's Prometheus
	// metrics (queue, KV cache, prefix cache, sleep state).
	EngineStats fleet.EngineStatsConfig `koanf:"engine_stats"`
	// EngineHeader, when true (the default), names the engine that served a
	// request in the X-Switchboard-Engine response header.
	EngineHeader bool `koanf:"engine_header"`
	// InjectUsage, when true (the default), asks the engine for the usage
	// chunk (stream_options.include_usage) on streamed requests whose
	// client did not (stream_options absent, null or {}, include_usage
	// false or null; not with continuous_usage_stats), so token usage is
	// recorded for every stream; the extra chunk is not forwarded to that
	// client.
	InjectUsage bool `koanf:"inject_usage"`
	// ObserveNonStreaming, when true, sends every non-streaming chat,
	// completions, Anthropic Messages or Responses (not background)
	// request to the engine as a stream (with usage; Messages and Responses
	// with "stream": true only, their streams carry usage)
	// and reassembles the events into the non-streaming body vLLM would
	// have sent (chat and completions: content, tool calls, reasoning,
	// logprobs, finish reason, usage, oai.Reassembler; Messages: text,
	// thinking and tool_use blocks, stop reason, usage,
	// oai.MessagesReassembler; Responses: the response object of
	// response.completed, oai.ResponsesReassembler), so the first token, the prefill -> decode
	// move, TTFT and ITL are observed for these requests too, not only for
	// streams. The client still gets one JSON body with Content-Length,
	// and an error in the route's envelope with a real status. Requests
	// that set prompt_logprobs or kv_transfer_params (a stream cannot
	// carry them), or stream_options without stream, are sent as they
	// came. The engine's silence before the first token is bounded by
	// Timeouts.FirstToken, as for a stream, the whole by Timeouts.Attempt.
	// What the reassembler keeps of the events (about the body's size,
	// not the events' framing) is held until the end, reserved in
	// MaxBufferedBytes, up to MaxResponseBufferBytes (which must then be
	// > 0), as is the body rebuilt from it (over it: 502; the budget full:
	// 503). Default false.
	//
	// Off, a non-streaming request is still observed the same way when
	// its generation may be continued (MigrationConfig: Limit > 0, and
	// the request continuable at arrival: none of the exclusions its body
	// alone shows) and MaxResponseBufferBytes > 0: a continuation goes on
	// from the token ids (Messages: the text) of the answer so far, which
	// only a stream gives. An excluded request goes as it came.
	ObserveNonStreaming bool `koanf:"observe_non_streaming"`
	// ReadyRequiresEngine, when true (the default), makes /ready answer
	// 503 no_ready_engine while no healthy engine has reported its
	// models. Set it false where readiness only decides whether the
	// gateway gets traffic at all (a Kubernetes Service): with every
	// engine gone (scaled to zero, an outage) the replicas stay ready and
	// clients get the gateway's 503 with Retry-After instead of refused
	// connections, and a rollout of the gateway does not stall. /ready
	// still waits for discovery's first sync and fails while draining.
	ReadyRequiresEngine bool `koanf:"ready_requires_engine"`
	// EngineClient is the HTTP client the gateway talks to its engines
	// with: EngineClientLean (the default), internal/h1's HTTP/1.1 client
	// made for this one job (no goroutine or channel per connection,
	// about 8 allocations per round trip; https engines and what it does
	// not speak go through net/http), or EngineClientNetHTTP, net/http's
	// http.Transport for everything. Needs a restart.
	EngineClient string `koanf:"engine_client"`
	// MaxEngineConnections bounds the lean engine client's connections to
	// one engine (host:port), in use and idle: a request that finds none
	// free waits for one, until its deadline or its client goes
	// (switchboard.engine.connections counts it as waiting). Default 1024,
	// above any engine's concurrency (vLLM's max_num_seqs is 256 by
	// default; each request in flight holds one connection). 0: no bound.
	// Not applied with EngineClientNetHTTP. Needs a restart.
	MaxEngineConnections int `koanf:"max_engine_connections"`
	// AccessLog, when true (the default), logs one line per request at
	// info level (the `log.access` key; the loader fills it in).
	AccessLog bool `koanf:"-"`
	// Engines is the static engine list (the top-level `engines` section;
	// the loader fills it in).
	Engines []fleet.EngineConfig `koanf:"-"`
	// Models is the top-level `models` section (the loader fills it in).
	Models ModelsConfig `koanf:"-"`
	// Auth is the top-level `auth` section (the loader fills it in): API
	// keys and the models each may use; a reload applies it.
	Auth AuthConfig `koanf:"-"`
	// Limits is the top-level `limits` section (the loader fills it in):
	// where the keys' limits are kept; Redis needs a restart, the rest
	// a reload applies.
	Limits LimitsConfig `koanf:"-"`
}

// ModelsConfig is what the gateway does with model names.
type ModelsConfig struct {
	// Aliases map a public model name to the engine model it stands for
	// (`models.aliases: {public-name: engine-model}`). A request naming the
	// alias goes to the engines serving the target, with the model field
	// of its body (JSON or multipart form) rewritten to the target, and
	// GET /v1/models lists the alias beside its target. An alias shadows
	// an engine model of the same name; an alias may not point at another
	// alias.
	Aliases map[string]string `koanf:"aliases"`
	// Fallbacks map a model to the models that answer for it, in order,
	// when it cannot (`models.fallbacks: {model: [other, ...]}`, LiteLLM's
	// fallbacks): every engine serving it failed before anything reached
	// the client (the failures server.retry retries: refused connection,
	// reset, timeouts before the first token, 429, 500, 502, 503, 504),
	// or none is available (down, ejected, drained, every one at its
	// max_in_flight, or none serves it any more). The request then goes
	// to the first of them with an engine that can take it, with the
	// body's model rewritten to it and the X-Switchboard-Fallback response
	// header naming it; each gets its own attempts. Keys and entries are
	// model names as clients name them (an alias works on either side).
	// Only the requested model's list is followed: a fallback's own
	// fallbacks are not, so no chain can loop. Neither side need be
	// served when the configuration is loaded (engines come and go); a
	// reload logs the fallbacks no engine serves at that moment. A
	// sticky route (a stored response) never falls back.
	Fallbacks map[string][]string `koanf:"fallbacks"`
	// ContextFallbacks map a model to longer-context models, in order
	// (`models.context_fallbacks: {model: [longer-model, ...]}`), for a
	// request too long for it: its max_tokens alone over the model's
	// max_model_len (checked before any engine is asked), or an engine's
	// context-length 400 ("maximum context length", vLLM's message). The
	// request goes to the first of them that is available and whose
	// max_model_len (GET /v1/models) is unknown or larger, instead of
	// failing; the same rules as Fallbacks otherwise.
	ContextFallbacks map[string][]string `koanf:"context_fallbacks"`
}

// Validate reports every problem of the `models` section, each wrapping
// [ErrInvalidConfig], joined with errors.Join: an alias that is empty,
// has a control character, points at itself or at another alias; a
// fallback list (Fallbacks, ContextFallbacks) that is empty, has an empty
// or control-character name, lists its own model, or lists a model twice.
func (m ModelsConfig) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	for _, name := range slices.Sorted(maps.Keys(m.Aliases)) {
		target := m.Aliases[name]
		switch {
		case name == "" || target == "":
			bad("models.aliases: empty name or target (%q: %q)", name, target)
		case hasControl(name) || hasControl(target):
			bad("models.aliases: %q: %q has a control character", name, target)
		case name == target:
			bad("models.aliases: %q points at itself", name)
		default:
			if _, chained := m.Aliases[target]; chained {
				bad("models.aliases: %q points at %q, which is an alias too", name, target)
			}
		}
	}
	for _, sec := range []struct {
		key   string
		lists map[string][]string
	}{{"models.fallbacks", m.Fallbacks}, {"models.context_fallbacks", m.ContextFallbacks}} {
		for _, model := range slices.Sorted(maps.Keys(sec.lists)) {
			list := sec.lists[model]
			switch {
			case model == "" || hasControl(model):
				bad("%s: model %q: empty or has a control character", sec.key, model)
				continue
			case len(list) == 0:
				bad("%s: %q: the list is empty", sec.key, model)
			}
			for i, fb := range list {
				switch {
				case fb == "" || hasControl(fb):
					bad("%s: %q[%d]: %q is empty or has a control character", sec.key, model, i, fb)
				case fb == model:
					bad("%s: %q lists itself", sec.key, model)
				case slices.Contains(list[:i], fb):
					bad("%s: %q lists %q twice", sec.key, model, fb)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// Timeouts bound an engine attempt. Zero disables a timeout.
type Timeouts struct {
	// Connect bounds the TCP (and TLS) connection to an engine. Default 5 s.
	Connect time.Duration `koanf:"connect"`
	// ResponseHeader bounds the wait for an engine's response headers on
	// streaming requests (vLLM sends them at once). Non-streaming
	// responses only start when generation ends, so they are bounded by
	// Attempt. Default 60 s.
	ResponseHeader time.Duration `koanf:"response_header"`
	// FirstToken bounds a streaming attempt from the moment it is sent to
	// its first content-bearing event (for a stream that is not SSE: its
	// first body bytes), the wait for its headers included. Under load vLLM sends the headers and the role
	// chunk at once, then nothing while the request waits in its queue and
	// prefills; that silence is governed by FirstToken, not Idle, so it is
	// generous. Keep-alive comments do not extend it. Default 5 min.
	FirstToken time.Duration `koanf:"first_token"`
	// Idle bounds the engine's silence (no bytes at all) on a stream after
	// its first content, and between two reads of a non-streaming body.
	// Default 60 s.
	Idle time.Duration `koanf:"idle"`
	// Attempt bounds one non-streaming attempt, from sending the request to
	// the end of the response body, so one hung engine does not hold a
	// request for the whole Request timeout. Default 5 min.
	Attempt time.Duration `koanf:"attempt"`
	// ClientWrite bounds each write to the client: a client that stops
	// reading for this long is cut off (error.type client_stalled), its
	// slot released and the engine request cancelled. It applies whatever
	// Idle is. Default 60 s.
	ClientWrite time.Duration `koanf:"client_write"`
	// Request bounds a whole request, all attempts included. Default 10 min.
	Request time.Duration `koanf:"request"`
}

// DefaultConfig returns the gateway defaults documented on each field.
func DefaultConfig() Config {
	return Config{
		MaxBodyBytes:           16 << 20,
		MaxFormBytes:           32 << 20,
		BodyReadTimeout:        60 * time.Second,
		MaxConcurrentRequests:  10000,
		MaxBufferedBytes:       512 << 20,
		MaxResponseBufferBytes: 4 << 20,
		MaxAttempts:            2,
		Retry:                  DefaultRetryConfig(),
		Migration:              DefaultMigrationConfig(),
		Disaggregation:         DefaultDisaggregationConfig(),
		KVEvents:               DefaultKVEventsConfig(),
		Limits:                 DefaultLimitsConfig(),
		EngineHeader:           true,
		InjectUsage:            true,
		ReadyRequiresEngine:    true,
		EngineClient:           EngineClientLean,
		MaxEngineConnections:   1024,
		AccessLog:              true,
		Timeouts: Timeouts{
			Connect:        5 * time.Second,
			ResponseHeader: 60 * time.Second,
			FirstToken:     5 * time.Minute,
			Idle:           60 * time.Second,
			Attempt:        5 * time.Minute,
			ClientWrite:    60 * time.Second,
			Request:        10 * time.Minute,
		},
		Health:      fleet.DefaultHealthConfig(),
		Outlier:     routing.DefaultOutlierConfig(),
		EngineStats: fleet.DefaultEngineStatsConfig(),
	}
}

// hasControl reports whether s has an ASCII control character (a model
// name with one could break the multipart body it is written into).
func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return true
		}
	}
	return false
}

// ErrInvalidConfig wraps every configuration error. It is
// fleet.ErrInvalidConfig, which the engine, health and stats settings'
// errors wrap, so one errors.Is finds every configuration error.
var ErrInvalidConfig = fleet.ErrInvalidConfig

// Validate reports every problem with c, each wrapping [ErrInvalidConfig],
// joined with errors.Join.
func (c Config) Validate() error { return c.validate(false) }

// validate is Validate; dynamic allows an empty engine list (a discovery
// source adds engines at run time, [WithDynamicEngines]).
func (c Config) validate(dynamic bool) error {
	errs := []error{c.ValidateSettings()}
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if len(c.Engines) == 0 && !dynamic {
		bad("no engines configured")
	}
	if c.MaxEngineConnections < 0 {
		bad("server.max_engine_connections must be >= 0, got %d", c.MaxEngineConnections)
	}
	if c.EngineClient != EngineClientLean && c.EngineClient != EngineClientNetHTTP {
		bad("server.engine_client must be %q or %q, got %q", EngineClientLean, EngineClientNetHTTP, c.EngineClient)
	}
	seen := map[string]bool{}
	for i, e := range c.Engines {
		if err := e.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("engines[%d]: %w", i, err))
		}
		if seen[e.Name] {
			bad("engines[%d]: duplicate engine name %q", i, e.Name)
		}
		seen[e.Name] = true
	}
	return errors.Join(errs...)
}

// ValidateSettings is Validate without the engine list, for a loader that
// checks the settings before it knows every engine (simulated engines are
// added later). Errors wrap [ErrInvalidConfig], joined with errors.Join.
func (c Config) ValidateSettings() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if c.MaxBodyBytes <= 0 {
		bad("server.max_body_bytes must be > 0, got %d", c.MaxBodyBytes)
	}
	if c.MaxFormBytes <= 0 {
		bad("server.max_form_bytes must be > 0, got %d", c.MaxFormBytes)
	}
	if c.MaxBufferedBytes > 0 && c.MaxFormBytes > c.MaxBufferedBytes {
		bad("server.max_buffered_bytes (%d) is smaller than server.max_form_bytes (%d): a form at the size limit could never be accepted", c.MaxBufferedBytes, c.MaxFormBytes)
	}
	errs = append(errs, c.Models.Validate())
	errs = append(errs, c.Auth.Validate(), c.Limits.Validate())
	if c.Auth.Required && len(c.Auth.Keys) == 0 && c.Limits.Redis.Address == "" && c.Auth.KeysFilePath == "" {
		bad("auth.required with no key and nowhere for the keys api to keep one (limits.redis.address or auth.keys_file) would refuse every request for good: configure a key, or one of those")
	}
	errs = append(errs, c.Retry.validate()...)
	errs = append(errs, c.Migration.validate()...)
	if err := c.KVEvents.Validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, validatePricing(c.Pricing)...)
	if err := c.AdminAuth.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Disaggregation.Validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.retryTimingErrors()...)
	if c.MaxPendingPerModel < 0 {
		bad("server.max_pending_per_model must be >= 0, got %d", c.MaxPendingPerModel)
	}
	if c.MaxAttempts < 1 {
		bad("server.max_attempts must be >= 1, got %d", c.MaxAttempts)
	}
	if c.ObserveNonStreaming && c.MaxResponseBufferBytes <= 0 {
		bad("server.observe_non_streaming needs server.max_response_buffer_bytes > 0 (the reassembled body is held up to it), got %d", c.MaxResponseBufferBytes)
	}
	if c.BodyReadTimeout < 0 {
		bad("server.body_read_timeout must be >= 0, got %s", c.BodyReadTimeout)
	}
	if c.MaxConcurrentRequests < 0 {
		bad("server.max_concurrent_requests must be >= 0, got %d", c.MaxConcurrentRequests)
	}
	if c.MaxBufferedBytes < 0 {
		bad("server.max_buffered_bytes must be >= 0, got %d", c.MaxBufferedBytes)
	}
	if c.MaxResponseBufferBytes < 0 {
		bad("server.max_response_buffer_bytes must be >= 0, got %d", c.MaxResponseBufferBytes)
	}
	if c.MaxBufferedBytes > 0 && c.MaxBodyBytes > c.MaxBufferedBytes {
		bad("server.max_buffered_bytes (%d) is smaller than server.max_body_bytes (%d): a body at the size limit could never be accepted", c.MaxBufferedBytes, c.MaxBodyBytes)
	}
	if c.MaxBufferedBytes > 0 && c.MaxResponseBufferBytes > c.MaxBufferedBytes {
		bad("server.max_response_buffer_bytes (%d) is larger than server.max_buffered_bytes (%d): such a response could never be buffered", c.MaxResponseBufferBytes, c.MaxBufferedBytes)
	}
	for _, h := range c.StripRequestHeaders {
		if !httpguts.ValidHeaderFieldName(h) {
			bad("server.strip_request_headers: %q is not a header name", h)
		}
	}
	if _, err := parseTrustedProxies(c.TrustedProxies); err != nil {
		bad("server.trusted_proxies: %v", err)
	}
	errs = append(errs, c.Timeouts.validate()...)
	errs = append(errs, c.Health.Validate(), c.EngineStats.Validate())
	errs = append(errs, outlierConfigErrors(c.Outlier.Validate())...)
	return errors.Join(errs...)
}

// named lists each timeout with its key, in documentation order.
func (t Timeouts) named() []struct {
	key string
	d   time.Duration
} {
	return []struct {
		key string
		d   time.Duration
	}{
		{"connect", t.Connect}, {"response_header", t.ResponseHeader}, {"first_token", t.FirstToken},
		{"idle", t.Idle}, {"attempt", t.Attempt}, {"client_write", t.ClientWrite}, {"request", t.Request},
	}
}

// validate reports negative timeouts and combinations that cannot work: a
// stalled engine or client must always be bounded by something. A timeout
// longer than one that contains it (first_token above request, say) is
// allowed: the shorter one fires first.
func (t Timeouts) validate() []error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	for _, n := range t.named() {
		if n.d < 0 {
			bad("server.timeouts.%s must be >= 0, got %s", n.key, n.d)
		}
	}
	unbounded := func(other, what string) {
		bad("server.timeouts.request and server.timeouts.%s are both 0: %s would hold its engine slot forever; set one of them", other, what)
	}
	if t.Request == 0 && t.FirstToken == 0 {
		unbounded("first_token", "a stream whose engine never sends its first token")
	}
	if t.Request == 0 && t.Idle == 0 {
		unbounded("idle", "a stream whose engine stalls after its first token")
	}
	if t.Request == 0 && t.Attempt == 0 {
		unbounded("attempt", "a non-streaming request whose engine hangs")
	}
	if t.Request == 0 && t.ClientWrite == 0 {
		unbounded("client_write", "a client that stops reading")
	}
	return errs
}

// outlierConfigErrors puts each of routing's outlier config errors under
// the server section, wrapping ErrInvalidConfig.
func outlierConfigErrors(err error) []error {
	if err == nil {
		return nil
	}
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			errs = append(errs, fmt.Errorf("%w: server.%w", ErrInvalidConfig, e))
		}
		return errs
	}
	return []error{fmt.Errorf("%w: server.%w", ErrInvalidConfig, err)}
}
