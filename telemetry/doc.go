// Package telemetry owns Switchboard's OpenTelemetry SDK set-up and every
// instrument the gateway records.
//
// # Providers
//
// [Setup] builds the tracer and meter providers. Export follows the standard
// OTEL_* environment variables through the contrib autoexport package
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_EXPORTER, OTEL_METRICS_EXPORTER,
// OTEL_TRACES_SAMPLER, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, ...). With
// none of them set, nothing is exported over OTLP and the metrics are served
// only on the Prometheus handler. Exporters run in the background: an
// unreachable collector never blocks a request.
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
//	switchboard.engine.state                  Gauge         1          engine, state
//	switchboard.engine.queue_depth            Gauge         {request}  engine
//	switchboard.engine.kv_cache_usage         Gauge         1          engine
//	switchboard.engine.prefix_cache_hit_ratio Gauge         1          engine
//	switchboard.engine.accounting_drift       Gauge         {request}  engine
//
// operation is the gateway route's row of its operation table ("chat",
// "responses", "messages", "rerank", ...). switchboard.engine.state is 1
// for the state each engine is in ([EngineStates]) and 0 for the others
// ([Metrics.ObserveEngineState]).
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
// plus the OpenTelemetry GenAI semantic-convention instruments
// gen_ai.server.request.duration, gen_ai.server.time_to_first_token,
// gen_ai.server.time_per_output_token and gen_ai.client.token.usage. The Go
// semconv package dropped the gen_ai.server.* instruments in v1.42.0, so
// their names and advised buckets are defined here, from the GenAI metrics
// semantic conventions.
//
// # Cardinality
//
// Attribute values are bounded: engine names come from configuration and
// model names from the set the engines report, never from raw request fields.
// The meter provider's cardinality limit is a backstop. Attribute sets are
// built once per engine and (engine, model, GenAI operation, operation) and reused, so
// recording on the request path does not allocate on success.
package telemetry
