package telemetry

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of every Switchboard instrument.
const ScopeName = "github.com/switchboard-gw/switchboard/telemetry"

// Instrument names. They are a public contract: dashboards and alerts
// depend on them (docs/telemetry.md, "Instruments").
const (
	ActiveRequestsName = "switchboard.engine.active_requests"
	// ConnectionsName is the gateway's HTTP connections to each engine,
	// unit {connection}, by engine and AttrConnState: active (carrying a
	// request), idle (kept alive in the pool) and waiting (requests
	// waiting for a connection under the per-engine bound). Reported when
	// the engine client keeps the counts (server.engine_client: lean).
	ConnectionsName       = "switchboard.engine.connections"
	TimeToFirstTokenName  = "switchboard.engine.time_to_first_token"
	InterTokenLatencyName = "switchboard.engine.inter_token_latency"
	RequestDurationName   = "switchboard.engine.request.duration"
	ParseErrorsName       = "switchboard.engine.stream.parse_errors"

	// Engine-side stats, scraped from each engine's Prometheus /metrics
	// (vLLM names). An engine's points are reported only while its last
	// scrape is fresh, so a dashboard shows a gap, not a frozen value.

	// QueueDepthName is the engine's own queue: vllm:num_requests_waiting
	// summed over its models, {request}.
	QueueDepthName = "switchboard.engine.queue_depth"
	// KVCacheUsageName is the fraction of the engine's KV cache in use,
	// 0..1, unit 1.
	KVCacheUsageName = "switchboard.engine.kv_cache_usage"
	// PrefixCacheHitRatioName is the fraction of prompt tokens the engine
	// found in its prefix cache between the last two scrapes that saw new
	// queries (an idle engine keeps its last ratio), 0..1, unit 1.
	PrefixCacheHitRatioName = "switchboard.engine.prefix_cache_hit_ratio"
	// AccountingDriftName is running + waiting as the engine reports them
	// minus the gateway's own in-flight count on that engine at scrape
	// time, {request}: 0 when only this gateway talks to the engine and
	// nothing leaked; positive when other clients (or gateway replicas)
	// use the engine or the engine holds requests the gateway forgot;
	// negative when the gateway counts requests the engine no longer has.
	AccountingDriftName = "switchboard.engine.accounting_drift"
	// EngineStateName is 1 for the state each engine is in and 0 for the
	// others, with the engine and state attributes; state is one of
	// [EngineStates], unit 1.
	EngineStateName = "switchboard.engine.state"

	// Gateway overhead, measured by the gateway itself (as TensorZero,
	// Bifrost and NVIDIA Dynamo expose theirs).

	// GatewayOverheadName is the time one request spent in the gateway
	// itself: from its arrival to the handler's return, minus the time
	// spent waiting for the client (reading its body, writing the
	// response) and for the engines (their response headers and every
	// read of their bodies), s, with the operation attribute.
	GatewayOverheadName = "switchboard.gateway.overhead"
	// StepDurationName is the duration of one step of the gateway's own
	// work on a request, s, with the step attribute ([StepParse],
	// [StepPick], [StepPrepare]).
	StepDurationName = "switchboard.gateway.step.duration"
	// TimeToFirstByteName is the time from sending a request to an engine
	// to the engine's response headers (its first byte), per attempt, s,
	// with engine, model and operation.
	TimeToFirstByteName = "switchboard.engine.time_to_first_byte"
	// StreamMaxGapName is, per relayed event stream, the largest gap
	// between two reads that brought bytes from the engine after the
	// first (the wait for the first event is TTFT, not a gap), s, with
	// engine, model and operation.
	StreamMaxGapName = "switchboard.engine.stream.max_gap"

	// GenAI semantic-convention metrics, the client family (see the
	// package docs, "GenAI semantic conventions", for why a gateway emits
	// the client family and not gen_ai.server.*), as [GenAIConventions]
	// defines them.
	GenAIClientOperationDurationName  = "gen_ai.client.operation.duration"
	GenAIClientTimeToFirstChunkName   = "gen_ai.client.operation.time_to_first_chunk"
	GenAIClientTimePerOutputChunkName = "gen_ai.client.operation.time_per_output_chunk"
	GenAIClientTokenUsageName         = "gen_ai.client.token.usage"
)

// GenAIConventions names the OpenTelemetry GenAI semantic conventions the
// gen_ai.* instruments and span attributes follow: tag v1.41.1 of
// github.com/open-telemetry/semantic-conventions (commit
// ead83b9b0fa36540c1642fce46e874f002ac23f1, model/gen-ai/ and docs/gen-ai/),
// the newest tag with normative GenAI conventions: from v1.42.0 they moved
// to github.com/open-telemetry/semantic-conventions-genai, which has no
// release yet.
const GenAIConventions = "semantic-conventions v1.41.1 (ead83b9b0fa36540c1642fce46e874f002ac23f1)"

// DefaultProvider is the gen_ai.provider.name of an engine whose
// configuration names none. The conventions list no value for self-hosted
// vLLM (their well-known values are API providers such as openai and
// anthropic, and "a custom value MAY be used"); "openai" would announce the
// openai.* attribute flavor, which a vLLM engine does not produce.
const DefaultProvider = "vllm"

// Histogram bucket boundaries, in seconds unless noted. They are
// unexported, so nothing outside this package can change an instrument's
// boundaries; [GenAIOperationBuckets] returns a fresh copy of the one that
// depends on configuration.
var (
	// ttftBuckets spans 1 ms to 60 s (vLLM's own TTFT histogram reaches
	// 2560 s for huge prompts; a gateway timeout cuts it far earlier).
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 60}
	// itlBuckets spans 1 ms to 2.5 s, dense where decode steps live
	// (10-100 ms).
	itlBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5}
	// durationBuckets spans 10 ms to 30 min, past the longest default
	// request timeout.
	durationBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300, 600, 1200, 1800}
	// genaiDurationBuckets are the conventions' advised boundaries for
	// gen_ai.client.operation.duration, time_to_first_chunk and
	// time_per_output_chunk (10 ms to 81.92 s, doubling).
	// gen_ai.client.operation.duration continues the doubling up to the
	// longest configured timeout ([WithLongestTimeout]), since a
	// generation may run that long.
	genaiDurationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	// overheadBuckets span 5 µs to 1 s: the gateway's own work on a
	// request is microseconds; the upper buckets catch stalls (GC, a
	// saturated CPU).
	overheadBuckets = []float64{0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}
	// tokenBuckets (in tokens) are the conventions' advised boundaries
	// for gen_ai.client.token.usage.
	tokenBuckets = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
)

// Metrics holds every Switchboard instrument. Create it once with
// [NewMetrics] and pass it to the gateway. All methods are safe for
// concurrent use; recording honours no context cancellation (OpenTelemetry
// records even after the client has gone, by contract).
type Metrics struct {
	meter  metric.Meter
	events *EventHistograms // nil: itl and genaiPerChunk record through the SDK

	activeRequests metric.Int64ObservableUpDownCounter
	connections    metric.Int64ObservableUpDownCounter
	ttft           metric.Float64Histogram
	itl            metric.Float64Histogram
	duration       metric.Float64Histogram
	parseErrors    metric.Int64Counter
	retry          retryInstruments
	migration      migrationInstruments
	disagg         disaggInstruments
	kv             kvInstruments
	cost           costInstruments
	tier           tierInstruments
	admin          adminInstruments
	fallback       fallbackInstruments
	keys           keyInstruments
	http           httpServer
	ttfb           metric.Float64Histogram
	maxGap         metric.Float64Histogram
	overhead       metric.Float64Histogram
	step           metric.Float64Histogram
	stepRec        [numSteps][]metric.RecordOption

	queueDepth     metric.Int64ObservableGauge
	kvCacheUsage   metric.Float64ObservableGauge
	prefixHitRatio metric.Float64ObservableGauge
	drift          metric.Int64ObservableGauge
	state          metric.Int64ObservableGauge
	reload         reloadInstruments

	genaiDuration   metric.Float64Histogram
	genaiFirstChunk metric.Float64Histogram
	genaiPerChunk   metric.Float64Histogram
	tokenUsage      metric.Int64Histogram

	phasePrefill attribute.KeyValue
	phaseDecode  attribute.KeyValue
}

// The descriptions of the per-event histograms, shared by the SDK
// instruments and [EventHistograms].
const (
	itlDescription   = "Time between consecutive content-bearing stream events from an engine."
	chunkDescription = "Time between consecutive output chunks of a streaming operation, after the first."
)

// MetricsOption configures [NewMetrics].
type MetricsOption func(*metricsConfig)

type metricsConfig struct {
	longest time.Duration
	version string
	events  *EventHistograms
}

// WithEventHistograms records the per-event histograms
// (switchboard.engine.inter_token_latency and
// gen_ai.client.operation.time_per_output_chunk) in h instead of through
// the meter provider: h's producers must be registered on every reader of
// the provider, or those two instruments reach no reader. One h serves one
// Metrics; NewMetrics fails on a second. nil (the default) records them
// through the provider like every other instrument.
func WithEventHistograms(h *EventHistograms) MetricsOption {
	return func(c *metricsConfig) { c.events = h }
}

// WithVersion sets the version of the instrumentation scope, the
// application's version ("0.1.0"): the binary passes its own, so the
// exported scope says which build recorded the data. Empty (the default):
// the scope has no version.
func WithVersion(v string) MetricsOption {
	return func(c *metricsConfig) { c.version = v }
}

// WithLongestTimeout sets the longest request timeout the gateway is
// configured with: the gen_ai.client.operation.duration buckets double
// past the conventions' last boundary (81.92 s) until they reach it.
// Zero or negative: the conventions' boundaries only.
func WithLongestTimeout(d time.Duration) MetricsOption {
	return func(c *metricsConfig) { c.longest = d }
}

// GenAIOperationBuckets returns the gen_ai.client.operation.duration
// boundaries for a longest timeout, a new slice: the conventions' advised
// boundaries (10 ms to 81.92 s, doubling), then doubling on until a
// boundary is at least longest seconds.
func GenAIOperationBuckets(longest time.Duration) []float64 {
	b := slices.Clone(genaiDurationBuckets)
	for last := b[len(b)-1]; last < longest.Seconds(); {
		last = math.Round(last*2*100) / 100
		b = append(b, last)
	}
	return b
}

// NewMetrics creates every instrument under a meter scoped to [ScopeName].
// A nil mp uses a no-op provider. On error it still returns a usable
// *Metrics (failed instruments fall back to no-ops) together with the
// errors.Join of every failure, as the OpenTelemetry Go guidelines advise.
func NewMetrics(mp metric.MeterProvider, opts ...MetricsOption) (*Metrics, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	var cfg metricsConfig
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	m := &Metrics{
		events:       cfg.events,
		meter:        mp.Meter(ScopeName, metric.WithInstrumentationVersion(cfg.version)),
		phasePrefill: AttrPhase.String("prefill"),
		phaseDecode:  AttrPhase.String("decode"),
	}
	var errs []error
	fh := func(name, unit, desc string, bounds []float64) metric.Float64Histogram {
		h, err := m.meter.Float64Histogram(name, metric.WithUnit(unit), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(bounds...))
		if err != nil {
			errs = append(errs, err)
			h, _ = noop.NewMeterProvider().Meter("").Float64Histogram(name)
		}
		return h
	}
	m.ttft = fh(TimeToFirstTokenName, "s", "Time from sending the request to an engine to the first generated token (streamed from the engine).", ttftBuckets)
	if m.events != nil {
		if err := m.events.bind(instrumentation.Scope{Name: ScopeName, Version: cfg.version}); err != nil {
			errs = append(errs, err)
			m.events = nil
		}
	}
	if m.events == nil {
		m.itl = fh(InterTokenLatencyName, "s", itlDescription, itlBuckets)
		m.genaiPerChunk = fh(GenAIClientTimePerOutputChunkName, "s", chunkDescription, genaiDurationBuckets)
	}
	m.duration = fh(RequestDurationName, "s", "Duration of one engine attempt, from span start to span end.", durationBuckets)
	m.ttfb = fh(TimeToFirstByteName, "s", "Time from sending a request to an engine to its response headers, per attempt.", ttftBuckets)
	m.maxGap = fh(StreamMaxGapName, "s", "Largest gap between two reads bringing bytes of one event stream from an engine, after its first.", ttftBuckets)
	m.overhead = fh(GatewayOverheadName, "s", "Time a request spent in the gateway itself: its duration minus the waits for the client (body, writes) and for the engines.", overheadBuckets)
	m.step = fh(StepDurationName, "s", "Duration of one step of the gateway's own work on a request (parse, pick, prepare).", overheadBuckets)
	for i, name := range stepNames {
		m.stepRec[i] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(AttrStep.String(name)))}
	}
	m.genaiDuration = fh(GenAIClientOperationDurationName, "s", "GenAI operation duration: one engine attempt, from sending the request to its last byte.", GenAIOperationBuckets(cfg.longest))
	m.genaiFirstChunk = fh(GenAIClientTimeToFirstChunkName, "s", "Time to receive the first chunk of output in a streaming operation.", genaiDurationBuckets)

	var err error
	if m.tokenUsage, err = m.meter.Int64Histogram(GenAIClientTokenUsageName, metric.WithUnit("{token}"),
		metric.WithDescription("Number of input and output tokens used."), metric.WithExplicitBucketBoundaries(tokenBuckets...)); err != nil {
		errs = append(errs, err)
		m.tokenUsage, _ = noop.NewMeterProvider().Meter("").Int64Histogram(GenAIClientTokenUsageName)
	}
	errs = append(errs, m.retry.init(m.meter)...)
	errs = append(errs, m.migration.init(m.meter)...)
	errs = append(errs, m.disagg.init(m.meter)...)
	errs = append(errs, m.kv.init(m.meter)...)
	errs = append(errs, m.cost.init(m.meter)...)
	errs = append(errs, m.tier.init(m.meter)...)
	errs = append(errs, m.admin.init(m.meter)...)
	errs = append(errs, m.fallback.init(m.meter)...)
	errs = append(errs, m.keys.init(m.meter)...)
	errs = append(errs, m.http.init(m.meter)...)
	if m.parseErrors, err = m.meter.Int64Counter(ParseErrorsName, metric.WithUnit("{event}"),
		metric.WithDescription("Stream events from an engine whose JSON could not be parsed (still forwarded).")); err != nil {
		errs = append(errs, err)
		m.parseErrors, _ = noop.NewMeterProvider().Meter("").Int64Counter(ParseErrorsName)
	}
	if m.activeRequests, err = m.meter.Int64ObservableUpDownCounter(ActiveRequestsName, metric.WithUnit("{request}"),
		metric.WithDescription("Requests in flight on each engine, by phase (prefill: no generated token yet; decode: generating).")); err != nil {
		errs = append(errs, err)
		m.activeRequests, _ = noop.NewMeterProvider().Meter("").Int64ObservableUpDownCounter(ActiveRequestsName)
	}
	if m.connections, err = m.meter.Int64ObservableUpDownCounter(ConnectionsName, metric.WithUnit("{connection}"),
		metric.WithDescription("The gateway's HTTP connections to each engine, by state (active, idle), and requests waiting for one (waiting).")); err != nil {
		errs = append(errs, err)
		m.connections, _ = noop.NewMeterProvider().Meter("").Int64ObservableUpDownCounter(ConnectionsName)
	}
	ig := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		if err != nil {
			errs = append(errs, err)
			g, _ = noop.NewMeterProvider().Meter("").Int64ObservableGauge(name)
		}
		return g
	}
	fg := func(name, unit, desc string) metric.Float64ObservableGauge {
		g, err := m.meter.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		if err != nil {
			errs = append(errs, err)
			g, _ = noop.NewMeterProvider().Meter("").Float64ObservableGauge(name)
		}
		return g
	}
	m.queueDepth = ig(QueueDepthName, "{request}",
		"Requests waiting in the engine's own queue (vllm:num_requests_waiting over its models), from its last fresh scrape.")
	m.kvCacheUsage = fg(KVCacheUsageName, "1",
		"Fraction of the engine's KV cache in use, 0..1 (vllm:kv_cache_usage_perc), from its last fresh scrape.")
	m.prefixHitRatio = fg(PrefixCacheHitRatioName, "1",
		"Fraction of prompt tokens found in the engine's prefix cache between the last two scrapes that saw new queries, 0..1.")
	m.drift = ig(AccountingDriftName, "{request}",
		"Requests the engine reports (running + waiting) minus the requests the gateway has in flight on it at scrape time; 0 when only this gateway uses the engine.")
	m.state = ig(EngineStateName, "1",
		"1 for the state the engine is in (ready, unhealthy, sleeping, draining, ejected), 0 for the others; role is its prefill/decode role.")
	errs = append(errs, m.reload.init(m.meter)...)
	return m, errors.Join(errs...)
}

// EngineStates are the values of the state attribute of
// switchboard.engine.state, in the order [Metrics.ObserveEngineState]
// takes their index: ready (receives traffic), unhealthy (failed its
// probes), sleeping (put to sleep through the admin API or reporting
// vllm:engine_sleep_state, or reporting itself unhealthy in fresh stats),
// draining (removed from the pool, finishing its requests), ejected (taken
// out by outlier detection after failing traffic, until its ejection time
// has passed and a probe passes). The order is routing.State's.
var EngineStates = [5]string{"ready", "unhealthy", "sleeping", "draining", "ejected"}

// EngineStateFunc reports every engine's state as an index into
// [EngineStates], by calling report once per engine.
type EngineStateFunc func(report func(e *Engine, state int))

// ObserveEngineState registers fn as the source of
// switchboard.engine.state. Unregister the returned registration on
// shutdown.
func (m *Metrics) ObserveEngineState(fn EngineStateFunc) (metric.Registration, error) {
	return m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		fn(func(e *Engine, state int) {
			for i := range EngineStates {
				v := int64(0)
				if i == state {
					v = 1
				}
				o.ObserveInt64(m.state, v, e.stateObs[i]...)
			}
		})
		return nil
	}, m.state)
}

// EngineStats is one engine's scraped state as the engine gauges report
// it. Negative KVCacheUsage or PrefixCacheHitRatio means unknown: that
// gauge is then not observed for the engine.
type EngineStats struct {
	// QueueDepth is the engine's waiting requests, in requests.
	QueueDepth int64
	// KVCacheUsage is the fraction of the KV cache in use, 0..1.
	KVCacheUsage float64
	// PrefixCacheHitRatio is the prefix cache hit fraction, 0..1.
	PrefixCacheHitRatio float64
	// AccountingDrift is running + waiting minus the gateway's in-flight
	// count at scrape time, in requests.
	AccountingDrift int64
}

// EngineStatsFunc reports the scraped stats of every engine whose stats
// are fresh, by calling report once per engine; an engine without fresh
// stats must not be reported. It is called on each metric collection.
type EngineStatsFunc func(report func(e *Engine, s EngineStats))

// ObserveEngineStats registers fn as the source of
// switchboard.engine.queue_depth, switchboard.engine.kv_cache_usage,
// switchboard.engine.prefix_cache_hit_ratio and
// switchboard.engine.accounting_drift, with the engine attribute only.
// Unregister the returned registration on shutdown.
func (m *Metrics) ObserveEngineStats(fn EngineStatsFunc) (metric.Registration, error) {
	return m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		fn(func(e *Engine, s EngineStats) {
			o.ObserveInt64(m.queueDepth, s.QueueDepth, e.engineObs...)
			o.ObserveInt64(m.drift, s.AccountingDrift, e.engineObs...)
			if s.KVCacheUsage >= 0 {
				o.ObserveFloat64(m.kvCacheUsage, s.KVCacheUsage, e.engineObs...)
			}
			if s.PrefixCacheHitRatio >= 0 {
				o.ObserveFloat64(m.prefixHitRatio, s.PrefixCacheHitRatio, e.engineObs...)
			}
		})
		return nil
	}, m.queueDepth, m.kvCacheUsage, m.prefixHitRatio, m.drift)
}

// InFlightFunc reports the in-flight counts of every engine that has any,
// or is configured, by calling report once per engine. It is called on each
// metric collection.
type InFlightFunc func(report func(e *Engine, prefill, decode int64))

// ObserveInFlight registers fn as the source of
// switchboard.engine.active_requests. The counts are read from the
// engines' own atomic counters at collection time, so the gauge can never
// drift from what the router sees. Unregister the returned registration on
// shutdown.
func (m *Metrics) ObserveInFlight(fn InFlightFunc) (metric.Registration, error) {
	return m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		fn(func(e *Engine, prefill, decode int64) {
			o.ObserveInt64(m.activeRequests, prefill, metric.WithAttributeSet(e.prefillSet))
			o.ObserveInt64(m.activeRequests, decode, metric.WithAttributeSet(e.decodeSet))
		})
		return nil
	}, m.activeRequests)
}

// AttrConnState is the state attribute of switchboard.engine.connections:
// "active", "idle" or "waiting".
const AttrConnState = attribute.Key("state")

// ConnectionsFunc reports every engine's connection counts (active, idle,
// and requests waiting for a connection), by calling report once per
// engine name. It is called on each metric collection.
type ConnectionsFunc func(report func(e *Engine, active, idle, waiting int64))

// ObserveConnections registers fn as the source of
// switchboard.engine.connections. Unregister the returned registration on
// shutdown.
func (m *Metrics) ObserveConnections(fn ConnectionsFunc) (metric.Registration, error) {
	return m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		fn(func(e *Engine, active, idle, waiting int64) {
			eng := AttrEngine.String(e.name)
			o.ObserveInt64(m.connections, active, metric.WithAttributes(eng, AttrConnState.String("active")))
			o.ObserveInt64(m.connections, idle, metric.WithAttributes(eng, AttrConnState.String("idle")))
			o.ObserveInt64(m.connections, waiting, metric.WithAttributes(eng, AttrConnState.String("waiting")))
		})
		return nil
	}, m.connections)
}

// Engine holds the pre-built attribute sets of one engine. Create it with
// [Metrics.Engine] when the engine is configured; it is safe for concurrent
// use.
type Engine struct {
	name       string
	events     *EventHistograms // the Metrics'; nil: the SDK records
	prefillSet attribute.Set
	decodeSet  attribute.Set
	engineSet  attribute.Set          // engine only, for the engine stats gauges
	engineObs  []metric.ObserveOption // WithAttributeSet(engineSet), built once
	engineAdd  []metric.AddOption     // the same, to add
	engineRec  []metric.RecordOption  // and to record
	kvPred     [len(kvPredictions)][]metric.AddOption
	stateObs   [len(EngineStates)][]metric.ObserveOption
	// server are the GenAI attributes of the engine itself:
	// gen_ai.provider.name, and server.address and server.port when known.
	server []attribute.KeyValue

	mu    sync.Mutex
	attrs atomic.Pointer[map[attrsKey]*Attrs] // copy-on-write
}

type attrsKey struct {
	model     string
	op        string
	operation string
}

// EngineOption sets what the GenAI attributes say about an engine.
type EngineOption func(*engineInfo)

type engineInfo struct {
	provider string
	address  string
	port     int
	role     string
}

// DefaultRole is the role attribute of an engine built without
// [WithRole]: one that does whole generations.
const DefaultRole = "both"

// WithRole sets the engine's prefill/decode role, the [AttrRole]
// attribute of its switchboard.engine.state points: "both", "prefill" or
// "decode" (the caller keeps it to that set); "" keeps [DefaultRole].
func WithRole(role string) EngineOption {
	return func(i *engineInfo) {
		if role != "" {
			i.role = role
		}
	}
}

// WithProvider sets the engine's gen_ai.provider.name; "" keeps
// [DefaultProvider].
func WithProvider(name string) EngineOption {
	return func(i *engineInfo) {
		if name != "" {
			i.provider = name
		}
	}
}

// WithServer sets the engine's server.address and server.port (the host
// and port of its URL; port 0 when the URL names none and the scheme's
// default applies, which is then what is reported). An empty address sets
// neither.
func WithServer(address string, port int) EngineOption {
	return func(i *engineInfo) { i.address, i.port = address, port }
}

// Engine returns the attribute holder for the engine called name.
func (m *Metrics) Engine(name string, opts ...EngineOption) *Engine {
	info := engineInfo{provider: DefaultProvider, role: DefaultRole}
	for _, o := range opts {
		if o != nil {
			o(&info)
		}
	}
	e := &Engine{
		name:       name,
		events:     m.events,
		prefillSet: attribute.NewSet(AttrEngine.String(name), m.phasePrefill),
		decodeSet:  attribute.NewSet(AttrEngine.String(name), m.phaseDecode),
		engineSet:  attribute.NewSet(AttrEngine.String(name)),
		server:     []attribute.KeyValue{AttrGenAIProvider.String(info.provider)},
	}
	if info.address != "" {
		// server.port is conditionally required when server.address is set.
		e.server = append(e.server, AttrServerAddress.String(info.address), AttrServerPort.Int(info.port))
	}
	e.engineObs = []metric.ObserveOption{metric.WithAttributeSet(e.engineSet)}
	e.engineAdd = []metric.AddOption{metric.WithAttributeSet(e.engineSet)}
	e.engineRec = []metric.RecordOption{metric.WithAttributeSet(e.engineSet)}
	for i, o := range kvPredictions {
		e.kvPred[i] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(AttrEngine.String(name), AttrKVPrediction.String(o)))}
	}
	for i, st := range EngineStates {
		e.stateObs[i] = []metric.ObserveOption{metric.WithAttributeSet(attribute.NewSet(AttrEngine.String(name), AttrState.String(st), AttrRole.String(info.role)))}
	}
	empty := map[attrsKey]*Attrs{}
	e.attrs.Store(&empty)
	return e
}

// Name returns the engine name.
func (e *Engine) Name() string { return e.name }

// Provider returns the engine's gen_ai.provider.name.
func (e *Engine) Provider() string { return e.server[0].Value.AsString() }

// Attrs are the attribute sets recorded for one (engine, model, GenAI
// operation, gateway operation).
// The model must come from a bounded set (a model the engines serve), never
// straight from a request.
//
// Each Attrs has a twin that adds gen_ai.response.model (the same model) to
// the GenAI sets, for an attempt whose engine answered with the model it
// was asked for ([Attrs.Answered]); an engine answering with another name,
// or none, keeps the sets without it, so the attribute's values stay
// bounded.
type Attrs struct {
	engineModel attribute.Set // engine, model, operation
	kvs         []attribute.KeyValue
	genaiKVs    []attribute.KeyValue // gen_ai.operation.name, gen_ai.provider.name, gen_ai.request.model, [gen_ai.response.model,] [server.address, server.port]
	spanName    string
	spanStart   []trace.SpanStartOption
	model       string
	answered    *Attrs // the twin with gen_ai.response.model; itself on the twin

	// Pre-built options for the sets above. Building an option on each
	// call costs two allocations (the boxed option and the variadic
	// slice); passing a stored slice with ... costs none.
	engineModelRec []metric.RecordOption
	engineModelAdd []metric.AddOption
	genaiRec       []metric.RecordOption
	genaiInRec     []metric.RecordOption // + gen_ai.token.type=input
	genaiOutRec    []metric.RecordOption // + gen_ai.token.type=output

	// The per-event series, when the Metrics has [EventHistograms]:
	// inter-token latency on engineModel, time per output chunk on the
	// GenAI set.
	itlSeries, chunkSeries *eventSeries
}

// SpanName returns the GenAI span name "{operation} {model}".
func (a *Attrs) SpanName() string { return a.spanName }

// SpanStart returns the start options of the engine span: kind CLIENT and
// the attributes the GenAI conventions call sampling-relevant, to be set
// when the span starts (gen_ai.operation.name, gen_ai.provider.name,
// gen_ai.request.model, server.address, server.port). Built once; the
// caller must not modify them.
func (a *Attrs) SpanStart() []trace.SpanStartOption { return a.spanStart }

// Answered returns the attribute sets to record once the engine's answer
// named its model as respModel (raw bytes): the twin with
// gen_ai.response.model when respModel is the model asked for, else a
// itself. It does not allocate.
func (a *Attrs) Answered(respModel []byte) *Attrs {
	if string(respModel) == a.model {
		return a.answered
	}
	return a
}

// Attrs returns the cached attribute sets for model, GenAI operation op
// (gen_ai.operation.name: "chat", "text_completion", "embeddings", or the
// route's own name where GenAI defines none) and the gateway route's
// operation (the operation attribute of Switchboard's engine histograms).
// All three must come from bounded sets. The first call for a triple
// builds them; later calls do not allocate.
func (e *Engine) Attrs(model, op, operation string) *Attrs {
	k := attrsKey{model, op, operation}
	if a, ok := (*e.attrs.Load())[k]; ok {
		return a
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	cur := *e.attrs.Load()
	if a, ok := cur[k]; ok {
		return a
	}
	kvs := []attribute.KeyValue{AttrEngine.String(e.name), AttrModel.String(model), AttrOperation.String(operation)}
	build := func(respModel bool) *Attrs {
		g := []attribute.KeyValue{AttrGenAIOp.String(op), AttrGenAIReqModel.String(model)}
		if respModel {
			g = append(g, AttrGenAIRespModel.String(model))
		}
		g = append(g, e.server...)
		a := &Attrs{
			engineModel: attribute.NewSet(kvs...),
			kvs:         kvs,
			genaiKVs:    g,
			spanName:    op + " " + model,
			model:       model,
		}
		a.engineModelRec = []metric.RecordOption{metric.WithAttributeSet(a.engineModel)}
		a.engineModelAdd = []metric.AddOption{metric.WithAttributeSet(a.engineModel)}
		genaiSet := attribute.NewSet(g...)
		a.genaiRec = []metric.RecordOption{metric.WithAttributeSet(genaiSet)}
		if e.events != nil {
			a.itlSeries = e.events.itl.series(a.engineModel)
			a.chunkSeries = e.events.chunk.series(genaiSet)
		}
		a.genaiInRec = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(append(g[:len(g):len(g)], AttrGenAITokType.String("input"))...))}
		a.genaiOutRec = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(append(g[:len(g):len(g)], AttrGenAITokType.String("output"))...))}
		return a
	}
	a, twin := build(false), build(true)
	a.answered, twin.answered = twin, twin
	start := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(a.genaiKVs...)}
	a.spanStart, twin.spanStart = start, start
	next := make(map[attrsKey]*Attrs, len(cur)+1)
	for kk, v := range cur {
		next[kk] = v
	}
	next[k] = a
	e.attrs.Store(&next)
	return a
}

// RecordFirstToken records one time-to-first-token sample, in seconds
// (switchboard.engine.time_to_first_token and
// gen_ai.client.operation.time_to_first_chunk).
func (m *Metrics) RecordFirstToken(ctx context.Context, a *Attrs, seconds float64) {
	m.RecordFirstTokenSplit(ctx, a, seconds, seconds)
}

// RecordFirstTokenSplit records a first token whose engine and client
// waits differ, in seconds: the engine's (switchboard.engine.time_to_first_token,
// from its leg's start) and the client's
// (gen_ai.client.operation.time_to_first_chunk, from the request's
// acceptance), as on a disaggregated request's decode leg, whose client
// also waited for the prefill leg.
func (m *Metrics) RecordFirstTokenSplit(ctx context.Context, a *Attrs, engine, client float64) {
	m.ttft.Record(ctx, engine, a.engineModelRec...)
	m.genaiFirstChunk.Record(ctx, client, a.genaiRec...)
}

// RecordInterToken records one inter-token latency sample, in seconds
// (switchboard.engine.inter_token_latency and
// gen_ai.client.operation.time_per_output_chunk).
func (m *Metrics) RecordInterToken(ctx context.Context, a *Attrs, seconds float64) {
	if a.itlSeries != nil {
		a.itlSeries.record(seconds)
		a.chunkSeries.record(seconds)
		return
	}
	m.itl.Record(ctx, seconds, a.engineModelRec...)
	m.genaiPerChunk.Record(ctx, seconds, a.genaiRec...)
}

// RecordFirstByte records the time to an engine's response headers, in
// seconds.
func (m *Metrics) RecordFirstByte(ctx context.Context, a *Attrs, seconds float64) {
	m.ttfb.Record(ctx, seconds, a.engineModelRec...)
}

// RecordMaxGap records the largest gap between two reads of one event
// stream, in seconds.
func (m *Metrics) RecordMaxGap(ctx context.Context, a *Attrs, seconds float64) {
	m.maxGap.Record(ctx, seconds, a.engineModelRec...)
}

// Step is a step of the gateway's own work on a request, the step
// attribute of switchboard.gateway.step.duration.
type Step uint8

// The steps, in request order.
const (
	// StepParse is reading the routing fields from the request body
	// (the JSON schema's fields, or a multipart form); the wait for the
	// body's bytes is not in it.
	StepParse Step = iota
	// StepPick is the routing policy's choice of an engine, per attempt.
	StepPick
	// StepPrepare is building the engine request (URL, headers, trace
	// context), per attempt, up to handing it to the transport.
	StepPrepare
	numSteps
)

var stepNames = [numSteps]string{"parse", "pick", "prepare"}

// String returns the step's attribute value.
func (s Step) String() string { return stepNames[s] }

// RecordStep records one step's duration, in seconds.
func (m *Metrics) RecordStep(ctx context.Context, s Step, seconds float64) {
	m.step.Record(ctx, seconds, m.stepRec[s]...)
}

// Operation holds the pre-built attribute set of one gateway operation
// (an operation-table row's name), for switchboard.gateway.overhead.
type Operation struct {
	rec []metric.RecordOption
}

// Operation returns the attribute holder for the gateway operation
// called name (from the gateway's fixed operation table).
func (m *Metrics) Operation(name string) *Operation {
	return &Operation{rec: []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(AttrOperation.String(name)))}}
}

// RecordOverhead records the gateway's own time on one request, in
// seconds.
func (m *Metrics) RecordOverhead(ctx context.Context, o *Operation, seconds float64) {
	m.overhead.Record(ctx, seconds, o.rec...)
}

// RecordParseError counts one stream event whose JSON did not parse.
func (m *Metrics) RecordParseError(ctx context.Context, a *Attrs) {
	m.parseErrors.Add(ctx, 1, a.engineModelAdd...)
}

// Outcome is what an engine attempt ended with.
type Outcome struct {
	// Seconds is the attempt's duration, span start to span end.
	Seconds float64
	// ErrorType is "" on success, else a low-cardinality error class (an
	// HTTP status code such as "503", or a name such as "client_cancelled").
	ErrorType string
	// InputTokens and OutputTokens come from the engine's usage report;
	// negative when the engine reported none.
	InputTokens, OutputTokens int64
}

// RecordEnd records the end of an engine attempt: its duration (with
// error.type on failure), the GenAI operation duration and token usage.
func (m *Metrics) RecordEnd(ctx context.Context, a *Attrs, o Outcome) {
	if o.ErrorType == "" {
		m.duration.Record(ctx, o.Seconds, a.engineModelRec...)
		m.genaiDuration.Record(ctx, o.Seconds, a.genaiRec...)
	} else {
		// The failure path builds its sets on the fly; error types are a
		// small fixed vocabulary, so cardinality stays bounded.
		if m.duration.Enabled(ctx) {
			m.duration.Record(ctx, o.Seconds, metric.WithAttributes(append(a.kvs[:len(a.kvs):len(a.kvs)], AttrErrorType.String(o.ErrorType))...))
		}
		if m.genaiDuration.Enabled(ctx) {
			m.genaiDuration.Record(ctx, o.Seconds, metric.WithAttributes(append(a.genaiKVs[:len(a.genaiKVs):len(a.genaiKVs)], AttrErrorType.String(o.ErrorType))...))
		}
	}
	if o.InputTokens >= 0 {
		m.tokenUsage.Record(ctx, o.InputTokens, a.genaiInRec...)
	}
	if o.OutputTokens >= 0 {
		m.tokenUsage.Record(ctx, o.OutputTokens, a.genaiOutRec...)
	}
}
