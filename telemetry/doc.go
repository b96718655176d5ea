// Package telemetry owns Switchboard's OpenTelemetry SDK set-up, every
// instrument the gateway records, and every span attribute key and span
// event name it sets (attrs.go): the gateway spells none of them itself.
//
// # Providers
//
// [Setup] builds the tracer and meter providers. Export follows the standard
// OTEL_* environment variables through the contrib autoexport package
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_EXPORTER, OTEL_METRICS_EXPORTER,
// OTEL_TRACES_SAMPLER, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, ...). With
// none of them set, nothing is exported over OTLP and the metrics are served
// only on the Prometheus handler. Exporters run in the background: an
// unreachable collector never blocks a request. The OTLP metric exporter is
// built as autoexport builds it (same variables, same defaults) but by
// Setup itself, so that its data points can be filtered (see Cardinality).
//
// # Metrics
//
// [NewMetrics] creates every instrument once. The names are a public
// contract (dashboards depend on them):
//
//	switchboard.engine.active_requests        UpDownCounter {request}  engine, phase
//	switchboard.engine.time_to_first_token    Histogram     s          engine, model, operation
//	switchboard.engine.inter_token_latency    Histogram     s          engine, model, operation
//	switchboard.engine.request.duration       Histogram     s          engine, model, operation, error.type
//	switchboard.engine.stream.parse_errors    Counter       {event}    engine, model, operation
//	switchboard.engine.state                  Gauge         1          engine, state, role
//	switchboard.engine.queue_depth            Gauge         {request}  engine
//	switchboard.engine.kv_cache_usage         Gauge         1          engine
//	switchboard.engine.prefix_cache_hit_ratio Gauge         1          engine
//	switchboard.engine.accounting_drift       Gauge         {request}  engine
//	switchboard.request.retries               Counter       {retry}    reason
//	switchboard.request.retry_budget_exhausted Counter      {retry}
//	switchboard.request.migrations            Counter       {continuation} reason, outcome
//	switchboard.request.migration_exclusions  Counter       {request}  exclusion
//	switchboard.request.migration_gap         Histogram     s          engine, model, operation
//	switchboard.request.fallbacks             Counter       {request}  model, fallback, reason
//
// switchboard.request.retries counts the attempts a request was tried
// again before anything reached its client, by reason ([AttrRetryReason]:
// connect_failure, reset, header_timeout, first_token_timeout or the
// engine's 429, 500, 502, 503, 504); retry_budget_exhausted the retries
// refused because too many requests were already retrying.
// switchboard.request.fallbacks counts the requests sent to a fallback
// model (gateway models.fallbacks and models.context_fallbacks), by the
// model asked for, the fallback and the reason ([AttrFallbackReason]:
// failed, unavailable, context, continuation); the model names are
// configured ones.
//
// The migration instruments follow generations broken after their first
// tokens reached the client and continued on another engine
// ([MigrationsName], [MigrationExclusionsName], [MigrationGapName]).
//
// operation is the gateway route's row of its operation table ("chat",
// "responses", "messages", "rerank", ...). switchboard.engine.state is 1
// for the state each engine is in ([EngineStates]) and 0 for the others
// ([Metrics.ObserveEngineState]); its role is the engine's prefill/decode
// role ([WithRole]: both, prefill or decode), so a dashboard can count the
// ready engines of each role. The per-request instruments do not carry
// the role.
//
// The last four come from each engine's own Prometheus /metrics, scraped by
// the gateway ([Metrics.ObserveEngineStats]): the engine's queue
// (vllm:num_requests_waiting), its KV cache usage (0..1), its prefix cache
// hit ratio between two scrapes (0..1), and the accounting drift, running +
// waiting as the engine reports them minus the gateway's in-flight count on
// that engine at scrape time (0 when only this gateway talks to the engine
// and nothing leaked). An engine's points are reported only while its stats
// are fresh, and a value the engine does not report is not observed, so a
// dashboard shows a gap rather than a frozen or made-up value.
//
// The gateway's own overhead, measured by itself:
//
//	switchboard.gateway.overhead              Histogram     s          operation
//	switchboard.gateway.step.duration         Histogram     s          step (parse, pick, prepare)
//	switchboard.engine.time_to_first_byte     Histogram     s          engine, model, operation
//	switchboard.engine.stream.max_gap         Histogram     s          engine, model, operation
//
// overhead is a request's time in the gateway (from the request-id
// middleware to the handler's return) minus the time it waited for the
// client (reading its body, each write of the response) and for engines
// (response headers and every blocked read of an engine body): parsing,
// routing, building the engine request, scanning events, telemetry. Its buckets start at 5 µs. The
// steps are the parts of it that happen once per request or attempt.
// time_to_first_byte is an attempt's wait for the engine's response
// headers; max_gap the largest gap, in one event stream, between two reads
// that brought bytes after the first (a stalled engine shows here before
// its idle timeout fires).
//
// switchboard.engine.inter_token_latency and
// gen_ai.client.operation.time_per_output_chunk are recorded once per
// stream event, not once per request: [Setup] keeps them outside the SDK
// in [EventHistograms] (see there) when every reader it builds can take
// them ([Providers.Events]), and [NewMetrics] takes them with
// [WithEventHistograms].
//
// # GenAI semantic conventions
//
// The gen_ai.* instruments and span attributes follow [GenAIConventions]:
// tag v1.41.1 of github.com/open-telemetry/semantic-conventions, the
// newest with normative GenAI conventions (they moved to
// semantic-conventions-genai in v1.42.0, which has tagged no release).
// A test compares what is emitted with a table transcribed from it.
//
// A gateway emits the client family. The conventions define
// gen_ai.client.* for "Generative AI client applications" and
// gen_ai.server.* for "model servers' operational metrics"; toward the
// engines the gateway is a client (its engine span is the conventions'
// CLIENT inference span, server.address is the engine behind it), and the
// engines themselves report the server view (vLLM's vllm:* metrics).
// Emitting gen_ai.server.* from the gateway would count the same requests
// twice in a fleet-wide query and label a network hop as the model
// server's time. So, per engine attempt:
//
//	gen_ai.client.operation.duration               Histogram  s        (+ error.type on failure)
//	gen_ai.client.operation.time_to_first_chunk    Histogram  s        streaming calls only
//	gen_ai.client.operation.time_per_output_chunk  Histogram  s        each content chunk after the first
//	gen_ai.client.token.usage                      Histogram  {token}  + gen_ai.token.type (input, output)
//
// with gen_ai.operation.name, gen_ai.provider.name (the engine's
// configured provider, default [DefaultProvider]: the conventions list no
// value for self-hosted vLLM), gen_ai.request.model (the served model,
// a bounded set), gen_ai.response.model (when the engine's answer names the
// model it was asked for; an answer naming another is not recorded, to keep
// the set bounded), and server.address and server.port of the engine. The
// buckets are the conventions' advised ones; operation.duration's go on
// doubling past 81.92 s up to the longest configured timeout
// ([WithLongestTimeout]). Switchboard's own switchboard.engine.*
// histograms keep their finer buckets (TTFT 1 ms to 60 s).
//
// The engine span (kind CLIENT, named "{gen_ai.operation.name}
// {gen_ai.request.model}") carries, besides those, gen_ai.request.stream
// (streaming requests only), the request's sampling parameters when set
// (temperature, top_p, top_k, penalties, seed, stop sequences, max tokens,
// choice count when not 1, output type), gen_ai.response.id,
// gen_ai.response.finish_reasons, gen_ai.response.time_to_first_chunk,
// gen_ai.usage.input_tokens and gen_ai.usage.output_tokens, and error.type.
//
// # Cardinality
//
// Attribute values are bounded: engine names come from configuration and
// model names from the set the engines report, never from raw request fields.
// The meter provider's cardinality limit is a backstop. Attribute sets are
// built once per engine and (engine, model, GenAI operation, operation) and reused, so
// recording on the request path does not allocate on success.
//
// Engines come and go (a reload, Kubernetes pods replaced on every
// rollout). The observable gauges stop reporting an engine once it is gone
// and drained, but under cumulative temporality the SDK keeps every series
// of a synchronous instrument (the switchboard.engine.* histograms and
// counters) for the life of the meter provider and reports it on every
// collection: it cannot forget one yet (open-telemetry/opentelemetry-go#8905
// covers Int64Counter only, and not in v1.47). [Providers.SetEngineLive]
// drops them at the export boundary instead: the Prometheus handler and the
// OTLP exporter leave out the points whose engine attribute names an engine
// that is no longer live, once it has been gone for [DefaultSeriesLinger]
// (5 min, so its last samples are exported at least once more). The GenAI
// client instruments (gen_ai.client.*) carry no engine attribute but
// server.address and server.port, the engine's URL host and port (under
// Kubernetes discovery, each pod's IP): with [WithServerLive] their points
// are dropped the same way once no live engine has that address and port.
// Other points without an engine attribute (and GenAI points without
// server.address), and delta points, are never dropped. The SDK's own
// memory for the dropped series stays bounded by the cardinality limit
// only; an engine that comes back under its name (a server at its address
// and port) is exported again.
package telemetry
